"""The job store against real SQLite files, real threads and real (spawned) processes."""

from __future__ import annotations

import json
import multiprocessing
import re
import sqlite3
import stat
import threading
import time
from pathlib import Path

import pytest

from rlctl.errors import RlctlError
from rlctl.home import job_dir, rlctl_home
from rlctl.store import jobs as jobs_module
from rlctl.store.jobs import SCHEMA_VERSION, SUBMISSION_INCOMPLETE, JobState, JobStore

P, V, R = JobState.PENDING, JobState.PROVISIONING, JobState.RUNNING
S, F, C = JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED

# The documented table, written out (not derived from the code): the moves that apply.
LEGAL = {
    (P, V), (P, R), (P, S), (P, F), (P, C),
    (V, R), (V, S), (V, F), (V, C),
    (R, S), (R, F), (R, C),
}  # fmt: skip


@pytest.fixture
def store(tmp_path: Path) -> JobStore:
    return JobStore(tmp_path / "jobs.db")


def _new(store: JobStore, name: str = "quickstart", **overrides):
    fields = {
        "name": name,
        "recipe_path": f"recipes/{name}.yaml",
        "recipe_yaml": f"name: {name}\n",
        "plan_json": json.dumps({"nodes": 1}),
        "backend": "local",
    }
    fields.update(overrides)
    return store.create(**fields)


def _fixed_suffixes(monkeypatch, *suffixes: str) -> None:
    it = iter(suffixes)
    monkeypatch.setattr(jobs_module, "_random_suffix", lambda: next(it))


# -- home -----------------------------------------------------------------------------


def test_home_from_env_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "state" / "rlctl"))
    home = rlctl_home()
    assert home == tmp_path / "state" / "rlctl"
    assert stat.S_IMODE(home.stat().st_mode) == 0o700
    d = job_dir("quickstart-k3x9a2")
    assert d == home / "jobs" / "quickstart-k3x9a2" and d.is_dir()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_home_defaults_to_dot_rlctl(tmp_path, monkeypatch):
    monkeypatch.delenv("RLCTL_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert rlctl_home() == tmp_path / ".rlctl"


@pytest.mark.parametrize("bad", ["", "..", "../x", "a/b", "/abs", "Upper-abc123"])
def test_job_dir_rejects_what_is_not_an_id(tmp_path, monkeypatch, bad):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    with pytest.raises(ValueError):
        job_dir(bad)


def test_default_store_lives_in_rlctl_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))
    store = JobStore()
    assert store.path == tmp_path / "home" / "jobs.db"
    job = _new(store)
    assert JobStore(tmp_path / "home" / "jobs.db").get(job.id) == job


# -- create, ids ----------------------------------------------------------------------


def test_create_stores_exactly_what_it_is_given(store):
    recipe = "name: q\nenv:\n  HF_TOKEN: ${HF_TOKEN}   # a name, never a value\nnote: 'ü ✓'\n"
    plan = json.dumps({"nodes": 2, "gpus_per_node": 8, "cmd": "python -m engine.main a='b c'"})
    before = time.time()
    job = store.create(
        name="quickstart",
        recipe_path="/abs/recipes/quickstart.yaml",
        recipe_yaml=recipe,
        plan_json=plan,
        backend="slurm",
        log_path="/tmp/x/run.log",
    )
    assert (job.name, job.recipe_path, job.recipe_yaml, job.plan_json) == (
        "quickstart",
        "/abs/recipes/quickstart.yaml",
        recipe,
        plan,
    )
    assert (job.backend, job.log_path, job.handle) == ("slurm", "/tmp/x/run.log", {})
    assert job.state is JobState.PENDING
    assert job.reason is None and job.exit_code is None
    assert before <= job.created_at == job.updated_at <= time.time()
    assert job.started_at is None and job.ended_at is None
    assert store.get(job.id) == job


def test_ids_are_readable_and_unique(store):
    ids = {_new(store).id for _ in range(50)}
    assert len(ids) == 50
    assert all(re.fullmatch(r"quickstart-[0-9a-z]{6}", i) for i in ids)


@pytest.mark.parametrize(
    ("name", "prefix"),
    [
        ("GRPO Qwen2.5-7B/gsm8k", "grpo-qwen2-5-7b-gsm8k"),
        ("--dapo__", "dapo"),
        ("", "job"),
        ("✓✓", "job"),
        ("x" * 100, "x" * 40),
    ],
)
def test_id_prefix_is_a_slug_of_the_name(store, name, prefix):
    job = _new(store, name=name)
    assert job.id.rsplit("-", 1)[0] == prefix
    assert job.name == name


def test_id_collision_draws_again(store, monkeypatch):
    _fixed_suffixes(monkeypatch, "aaaaaa", "aaaaaa", "aaaaaa", "bbbbbb")
    assert _new(store).id == "quickstart-aaaaaa"
    assert _new(store).id == "quickstart-bbbbbb"
    assert len(store.list()) == 2


# -- the state machine ----------------------------------------------------------------


def _job_in(store: JobStore, state: JobState):
    job = _new(store)
    if state is not P:
        job = store.transition(job.id, state, reason=f"reached {state}", exit_code=None)
    assert job.state is state
    return job


def test_documented_table_matches_can_transition():
    for src in JobState:
        for dst in JobState:
            assert jobs_module.can_transition(src, dst) == ((src, dst) in LEGAL), (src, dst)


@pytest.mark.parametrize("src", list(JobState), ids=str)
@pytest.mark.parametrize("dst", list(JobState), ids=str)
def test_every_transition(store, src, dst):
    job = _job_in(store, src)
    after = store.transition(job.id, dst, reason="why")
    assert store.get(job.id) == after
    if (src, dst) in LEGAL:
        assert after.state is dst
        assert after.reason == "why"
        assert after.updated_at >= job.updated_at
        assert (after.ended_at is not None) == dst.terminal
    elif src == dst and not src.terminal:
        # a self-move only updates the reason
        assert after.state is src and after.reason == "why"
        assert (after.started_at, after.ended_at) == (job.started_at, job.ended_at)
    else:
        assert after == job  # ignored: unchanged, not even updated_at


def test_terminal_is_final_first_writer_wins(store):
    job = _job_in(store, R)
    done = store.transition(job.id, C, reason="cancelled by user")
    for late in (R, P, V, S, F, C):
        assert store.transition(job.id, late, reason="late", exit_code=3) == done
    final = store.get(job.id)
    assert (final.state, final.reason, final.exit_code) == (C, "cancelled by user", None)


def test_no_regression_between_live_states(store):
    job = _job_in(store, R)
    assert store.transition(job.id, P) == job
    assert store.transition(job.id, V, reason="recovering") == job
    job = _job_in(store, V)
    assert store.transition(job.id, P) == job


def test_timestamps(store, monkeypatch):
    clock = iter([100.0, 110.0, 120.0, 130.0, 140.0, 150.0])
    monkeypatch.setattr(jobs_module.time, "time", lambda: next(clock))
    job = _new(store)
    assert (job.created_at, job.updated_at, job.started_at, job.ended_at) == (100, 100, None, None)
    job = store.transition(job.id, V)
    assert (job.updated_at, job.started_at, job.ended_at) == (110, None, None)
    job = store.transition(job.id, R)
    assert (job.updated_at, job.started_at, job.ended_at) == (120, 120, None)
    job = store.transition(job.id, R, reason="recovering")
    assert (job.updated_at, job.started_at, job.reason) == (130, 120, "recovering")
    job = store.transition(job.id, F, reason="exit code 2", exit_code=2)
    assert (job.created_at, job.updated_at, job.started_at, job.ended_at) == (100, 140, 120, 140)
    assert (job.state, job.exit_code, job.reason) == (F, 2, "exit code 2")


def test_straight_to_terminal_has_no_start(store):
    job = store.transition(_new(store).id, S, exit_code=0)
    assert job.started_at is None and job.ended_at is not None and job.exit_code == 0


def test_self_move_same_reason_writes_nothing(store):
    job = store.transition(_new(store).id, R, reason="r")
    assert store.transition(job.id, R, reason="r") == job
    assert store.transition(job.id, R) == job


def test_transition_takes_strings_and_rejects_unknown_states(store):
    job = _new(store)
    assert store.transition(job.id, "RUNNING").state is R
    with pytest.raises(ValueError):
        store.transition(job.id, "BOGUS")


def test_unknown_job_id_is_a_user_error(store):
    for call in (
        lambda: store.transition("nope-000000", R),
        lambda: store.set_handle("nope-000000", {"pid": 1}),
        lambda: store.delete("nope-000000"),
    ):
        with pytest.raises(RlctlError) as err:
            call()
        assert "rlctl list" in err.value.hint


# -- handle, persistence, delete ------------------------------------------------------


def test_handle_round_trip_and_persistence(store, tmp_path):
    job = _new(store, backend="skypilot")
    handle = {"cluster": "rlctl-quickstart", "job_id": 7, "ips": ["10.0.0.1"], "x": {"y": None}}
    stored = store.set_handle(job.id, handle)
    assert stored.handle == handle and stored.updated_at >= job.updated_at
    reopened = JobStore(tmp_path / "jobs.db")
    assert reopened.get(job.id).handle == handle
    assert reopened.get(job.id) == stored


def test_set_handle_records_even_after_a_stop(store):
    job = _new(store)
    store.transition(job.id, C, reason="cancelled by user")
    after = store.set_handle(job.id, {"pid": 123, "pgid": 123})
    assert after.state is C and after.handle == {"pid": 123, "pgid": 123}


def test_delete(store):
    a, b = _new(store), _new(store)
    store.delete(a.id)
    assert [j.id for j in store.list()] == [b.id]
    with pytest.raises(RlctlError):
        store.get(a.id)


# -- lookup by prefix -----------------------------------------------------------------


def test_get_by_exact_id_or_unique_prefix(store, monkeypatch):
    _fixed_suffixes(monkeypatch, "k3x9a2", "k3y000", "abcdef")
    a, b = _new(store), _new(store)
    c = _new(store, name="grpo")
    assert store.get("quickstart-k3x9a2") == a
    assert store.get("quickstart-k3x") == a
    assert store.get("quickstart-k3y") == b
    assert store.get("g") == c


def test_exact_id_wins_over_longer_ids(store, monkeypatch):
    _fixed_suffixes(monkeypatch, "bcdefg", "zzzzzz")
    short = _new(store, name="a")
    longer = _new(store, name="a-bcdefg")
    assert longer.id == "a-bcdefg-zzzzzz"
    assert store.get("a-bcdefg") == short


def test_ambiguous_prefix_lists_candidates(store, monkeypatch):
    _fixed_suffixes(monkeypatch, "k3x9a2", "k3y000")
    a, b = _new(store), _new(store)
    store.transition(b.id, R)
    with pytest.raises(RlctlError) as err:
        store.get("quickstart-k3")
    msg = str(err.value)
    assert "2 jobs" in msg and a.id in msg and b.id in msg and "RUNNING" in msg
    assert "rlctl list" in err.value.hint


def test_ambiguous_prefix_caps_the_candidates(store):
    for _ in range(15):
        _new(store)
    with pytest.raises(RlctlError) as err:
        store.get("quick")
    msg = str(err.value)
    assert "15 jobs" in msg and "and 5 more" in msg
    assert msg.count("quickstart-") == 10


@pytest.mark.parametrize("ref", ["nope", "", "%", "_", "quickstart-k3x9a2x"])
def test_unknown_ref(store, monkeypatch, ref):
    _fixed_suffixes(monkeypatch, "k3x9a2")
    _new(store)
    with pytest.raises(RlctlError) as err:
        store.get(ref)
    assert "no job matches" in str(err.value)
    assert "rlctl list" in err.value.hint


# -- list -----------------------------------------------------------------------------


def test_list_newest_first_and_filters(store):
    a = _new(store, backend="local")
    b = _new(store, backend="slurm")
    c = _new(store, backend="slurm")
    d = _new(store, backend="skypilot")
    store.transition(b.id, R)
    store.transition(c.id, F)
    store.transition(d.id, R)
    ids = lambda jobs: [j.id for j in jobs]  # noqa: E731
    assert ids(store.list()) == [d.id, c.id, b.id, a.id]
    assert ids(store.list(limit=2)) == [d.id, c.id]
    assert ids(store.list(states=[R])) == [d.id, b.id]
    assert ids(store.list(states={"RUNNING", "PENDING"})) == [d.id, b.id, a.id]
    assert ids(store.list(backend="slurm")) == [c.id, b.id]
    assert ids(store.list(states=[R], backend="slurm")) == [b.id]
    assert ids(store.list(states=[])) == []
    assert ids(store.list(backend="kubernetes")) == []
    assert all(isinstance(j.state, JobState) for j in store.list())


def test_list_orders_by_creation_time_not_insertion(store, monkeypatch):
    times = iter([200.0, 100.0])  # one clock read per create
    monkeypatch.setattr(jobs_module.time, "time", lambda: next(times))
    late, early = _new(store), _new(store)
    assert [j.id for j in store.list()] == [late.id, early.id]


# -- stale submissions ----------------------------------------------------------------


def test_stale_pending_finds_crashed_submissions(store):
    crashed = _new(store)
    submitted = _new(store)
    store.set_handle(submitted.id, {"pid": 42})
    running_no_handle = _new(store)
    store.transition(running_no_handle.id, R)
    assert [j.id for j in store.stale_pending(0)] == [crashed.id]
    assert store.stale_pending(3600) == []
    marked = store.transition(crashed.id, F, reason=SUBMISSION_INCOMPLETE)
    assert marked.reason == "submission did not complete"
    assert store.stale_pending(0) == []


# -- the file: WAL, schema ------------------------------------------------------------


def test_wal_mode_and_schema_version(store):
    _new(store)
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT version FROM schema_version").fetchall() == [(SCHEMA_VERSION,)]
    finally:
        db.close()
    JobStore(store.path)  # reopening migrates nothing twice
    db = sqlite3.connect(store.path)
    try:
        assert db.execute("SELECT count(*) FROM schema_version").fetchone()[0] == 1
    finally:
        db.close()


def test_newer_schema_is_refused(store):
    db = sqlite3.connect(store.path)
    with db:
        db.execute("INSERT INTO schema_version (version) VALUES (?)", (SCHEMA_VERSION + 1,))
    db.close()
    with pytest.raises(RlctlError) as err:
        JobStore(store.path)
    assert "newer rlctl" in str(err.value) and "upgrade" in err.value.hint


def test_store_is_picklable(store):
    import pickle

    job = _new(store)
    assert pickle.loads(pickle.dumps(store)).get(job.id) == job


# -- concurrency: real processes and threads -------------------------------------------


def _launcher_proc(db_path, worker, n_jobs, barrier, out):
    """One `rlctl launch` after another: create, submit, refresh to a final state."""
    barrier.wait()
    store = JobStore(Path(db_path))  # all open a fresh file at once: schema and WAL race too
    done = []
    for i in range(n_jobs):
        job = store.create(
            name=f"w{worker}",
            recipe_path="r.yaml",
            recipe_yaml=f"job: {i}\n",
            plan_json="{}",
            backend="local",
        )
        store.set_handle(job.id, {"pid": worker * 1000 + i})
        store.transition(job.id, V)
        store.transition(job.id, R)
        store.transition(job.id, R, reason=f"step {i}")
        final = S if i % 2 == 0 else F
        store.transition(job.id, final, exit_code=0 if final is S else 1)
        store.transition(job.id, R)  # a late refresh: must not resurrect it
        done.append((job.id, worker * 1000 + i, final.value))
    out.put(done)


def _wait_all(procs, timeout=60):
    for p in procs:
        p.join(timeout)
    for p in procs:
        assert not p.is_alive(), "a worker hung"
        assert p.exitcode == 0, f"a worker failed with {p.exitcode} (see its stderr)"


def test_many_launchers_at_once(tmp_path):
    n_procs, n_jobs = 4, 50
    db_path = tmp_path / "jobs.db"
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(n_procs), ctx.Queue()
    procs = [
        ctx.Process(target=_launcher_proc, args=(str(db_path), w, n_jobs, barrier, out))
        for w in range(n_procs)
    ]
    for p in procs:
        p.start()
    results = [out.get(timeout=60) for _ in procs]
    _wait_all(procs)

    expected = {job_id: (pid, state) for done in results for job_id, pid, state in done}
    assert len(expected) == n_procs * n_jobs
    store = JobStore(db_path)
    jobs = {j.id: j for j in store.list()}
    assert set(jobs) == set(expected)
    for job_id, (pid, state) in expected.items():
        job = jobs[job_id]
        assert (job.handle, job.state.value) == ({"pid": pid}, state)
        assert job.started_at is not None and job.ended_at is not None


def _writer_proc(db_path, n_jobs, started, out):
    store = JobStore(Path(db_path))
    started.wait(60)  # the readers are reading before the first write
    ids = []
    for _ in range(n_jobs):
        job = store.create(
            name="w", recipe_path="r", recipe_yaml="", plan_json="{}", backend="local"
        )
        ids.append(job.id)
        for state in (V, R, S):
            store.transition(job.id, state, exit_code=0 if state is S else None)
    out.put(ids)


def _reader_proc(db_path, started, stop, out):
    """`rlctl status` in a loop: every read succeeds and no job is ever seen going back."""
    store = JobStore(Path(db_path))
    started.wait(60)  # with the writer and the other reader
    seen: dict[str, int] = {}
    order = {P: 0, V: 1, R: 2, S: 3}
    reads = regressions = 0
    while True:  # at least one read, even when this process started late
        for job in store.list():
            rank = order[job.state]
            regressions += rank < seen.get(job.id, 0)
            seen[job.id] = rank
            assert store.get(job.id).id == job.id
        reads += 1
        if stop.is_set():
            break
    out.put((reads, regressions, len(seen)))


def test_a_writer_and_readers_at_once(tmp_path):
    n_jobs = 40
    db_path = tmp_path / "jobs.db"
    JobStore(db_path)
    ctx = multiprocessing.get_context("spawn")
    # a barrier: a reader spawned slowly (a loaded machine) once missed every write
    started, stop = ctx.Barrier(3), ctx.Event()
    written, read = ctx.Queue(), ctx.Queue()
    readers = [
        ctx.Process(target=_reader_proc, args=(str(db_path), started, stop, read)) for _ in range(2)
    ]
    writer = ctx.Process(target=_writer_proc, args=(str(db_path), n_jobs, started, written))
    for p in [*readers, writer]:
        p.start()
    ids = written.get(timeout=60)
    stop.set()
    stats = [read.get(timeout=60) for _ in readers]
    _wait_all([*readers, writer])

    assert len(ids) == n_jobs
    assert {j.state for j in JobStore(db_path).list()} == {S}
    for reads, regressions, _ in stats:
        assert reads > 0 and regressions == 0


def test_racing_refreshes_cannot_resurrect_a_cancelled_job(store):
    """Threads: a stop and several status refreshes race on each job; CANCELLED sticks."""
    for _ in range(5):
        job = store.transition(_new(store).id, R)
        go = threading.Barrier(9)
        errors: list[BaseException] = []

        def refresh(job_id=job.id, go=go, errors=errors):
            try:
                go.wait()
                for _ in range(20):
                    store.transition(job_id, R, reason="refresh")
            except BaseException as err:
                errors.append(err)

        def stop(job_id=job.id, go=go, errors=errors):
            try:
                go.wait()
                store.transition(job_id, C, reason="cancelled by user")
            except BaseException as err:
                errors.append(err)

        threads = [threading.Thread(target=refresh) for _ in range(8)]
        threads.append(threading.Thread(target=stop))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not errors
        final = store.get(job.id)
        assert (final.state, final.reason) == (C, "cancelled by user")
        assert store.transition(job.id, R) == final
