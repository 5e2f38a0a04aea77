"""`rlctl status JOB`'s progress: read from hand-written run files, never a real run."""

import json
import os

import pytest

from rlctl import progress
from rlctl.jobs import JobState, JobStore
from rlctl.progress import Progress, format_progress, read_progress, sparkline
from tests.rlctl.test_cli import HEAVY, run_cli


def write_run(root, records, *, total=40, tail="", log=""):
    """A job directory as the local backend and the engine leave it."""
    (root / "run").mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(r) + "\n" for r in records)
    (root / "run" / "metrics.jsonl").write_text(lines + tail)
    steps = "null" if total is None else total
    (root / "engine.yaml").write_text(
        f"trainer:\n  total_training_steps: {steps}\n  default_local_dir: {root / 'run'}\n"
    )
    (root / "job.log").write_text(log)


def local_job(store, root, *, running=True):
    job = store.create(
        name="q", recipe_path="r.yaml", recipe_yaml="", plan_json="{}", backend="local"
    )
    # a live session (this test's own) reads as RUNNING; an exit code as SUCCEEDED
    sid = os.getsid(0) if running else 2**22 + 7
    if not running:
        (root / "exit_code").write_text("0\n")
    return store.set_handle(
        job.id, {"pid": sid, "sid": sid, "root": str(root), "log": str(root / "job.log")}
    )


# ten steps: scores 0.1 .. 1.0, seconds per step 1..10 (the median of the last ten: 5.5)
TEN = [
    {"step": i, "critic/score/mean": i / 10, "timing_s/step": float(i), "actor/pg_loss": 0.0}
    for i in range(1, 11)
]


def test_step_score_seconds_per_step_time_left_and_sparkline(tmp_path):
    write_run(tmp_path, TEN, total=40)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.step, p.total_steps, p.score, p.step_s) == (10, 40, 1.0, 5.5)
    assert p.eta_s == 30 * 5.5  # 165 s
    assert p.resumes == 0
    assert sparkline([s for _, s in p.scores]) == "▁▂▃▃▄▅▆▆▇█"
    assert format_progress(p) == [
        "progress: step 10/40 · score 1 · 5.5 s/step · 2m45s left",
        "score:    ▁▂▃▃▄▅▆▆▇█  min 0.1 max 1 (steps 1-10)",
    ]


def test_median_over_the_recent_steps_only(tmp_path):
    slow_start = [{"step": i, "timing_s/step": 100.0} for i in range(1, 21)]
    recent = [{"step": 20 + i, "timing_s/step": t} for i, t in enumerate([2, 2, 3, 9, 3] * 2, 1)]
    write_run(tmp_path, slow_start + recent, total=100)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.step, p.step_s, p.eta_s, p.score, p.scores) == (30, 3.0, 210.0, None, ())


def test_a_torn_last_line_and_corrupt_lines_are_skipped(tmp_path):
    write_run(tmp_path, TEN[:4], tail='not json\n{"step": 5, "critic/score/me')
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.step, p.score, p.step_s) == (4, 0.4, 2.5)


def test_only_the_tail_of_a_long_file_is_read(tmp_path, monkeypatch):
    records = [{"step": i, "critic/score/mean": 0.5, "timing_s/step": 1.0} for i in range(1, 3001)]
    write_run(tmp_path, records, total=6000)
    assert (tmp_path / "run" / "metrics.jsonl").stat().st_size > 2 * progress.TAIL_BYTES
    read = []
    real = progress._tail
    monkeypatch.setattr(progress, "_tail", lambda path, n: read.append(n) or real(path, n))
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.step, p.eta_s) == (3000, 3000.0)
    assert len(p.scores) == progress.SPARK_WIDTH and p.scores[0][0] == 2961
    assert progress.TAIL_BYTES in read and max(read) <= progress.LOG_TAIL_BYTES
    assert sparkline([0.5, 0.5]) == "▄▄"


def test_total_steps_from_the_engine_log_when_the_config_leaves_it_to_the_epochs(tmp_path):
    log = "step 1/25 | score 0.1\nstep 2/25 | score 0.2\nresumed from /x/global_step_2 at step 2\n"
    write_run(tmp_path, TEN[:3], total=None, log=log)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.total_steps, p.eta_s, p.resumes, p.last_resume_step) == (25, 22 * 2.0, 1, 2)
    assert "resumed 1x (last at step 2)" in format_progress(p)[0]


def test_a_finished_job_has_no_time_left(tmp_path):
    write_run(tmp_path, TEN, total=10)
    store = JobStore(tmp_path / "jobs.db")
    job = local_job(store, tmp_path, running=False)
    job = store.transition(job.id, JobState.SUCCEEDED)
    p = read_progress(job)
    assert (p.step, p.total_steps, p.eta_s) == (10, 10, None)
    assert "left" not in format_progress(p)[0]


@pytest.mark.parametrize("content", [None, "", '{"step": 1, "crit'])
def test_no_metrics_yet_is_one_plain_line(tmp_path, content):
    write_run(tmp_path, [])
    metrics = tmp_path / "run" / "metrics.jsonl"
    if content is None:
        metrics.unlink()
    else:
        metrics.write_text(content)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert not p.readable
    assert format_progress(p) == [f"progress: no metrics yet ({metrics})"]


def test_jobs_whose_files_are_elsewhere_say_so(tmp_path):
    store = JobStore(tmp_path / "jobs.db")
    sky = store.create(
        name="q", recipe_path="r", recipe_yaml="", plan_json="{}", backend="skypilot"
    )
    sky = store.set_handle(sky.id, {"mode": "managed", "job_id": 3})
    slurm = store.create(name="q", recipe_path="r", recipe_yaml="", plan_json="{}", backend="slurm")
    slurm = store.set_handle(slurm.id, {"root": "/shared/x", "ssh": "me@login"})
    unsent = store.create(
        name="q", recipe_path="r", recipe_yaml="", plan_json="{}", backend="local"
    )
    assert format_progress(read_progress(sky)) == [
        "progress: not readable from here: the metrics are on the cloud's nodes"
    ]
    assert "over ssh" in read_progress(slurm).note
    assert read_progress(unsent).note == "not submitted: no run to read"


def test_the_metrics_file_name_is_the_engines():
    from engine.tracking import CONSOLE_KEYS, METRICS_FILE

    assert progress.METRICS_FILE == METRICS_FILE
    keys = dict(CONSOLE_KEYS)
    assert keys[progress.SCORE_KEY] == "score" and keys[progress.STEP_TIME_KEY] == "step_s"


def test_status_of_one_job_shows_its_progress(tmp_path):
    root = tmp_path / "jobs" / "q"
    write_run(root, TEN, total=40, log="resumed from /r/global_step_4 at step 4\n")
    job = local_job(JobStore(tmp_path / "jobs.db"), root)

    shown = run_cli(["status", job.id], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "RUNNING" in shown.stdout
    assert (
        "progress: step 10/40 · score 1 · 5.5 s/step · 2m45s left · resumed 1x (last at step 4)"
        in shown.stdout
    )
    assert "score:    ▁▂▃▃▄▅▆▆▇█  min 0.1 max 1 (steps 1-10)" in shown.stdout
    assert shown.stderr.rstrip().endswith("HEAVY="), [m for m in HEAVY if m in shown.stderr]

    as_json = run_cli(["status", job.id, "--json"], tmp_path)
    [record] = json.loads(as_json.stdout)
    assert record["id"] == job.id and record["state"] == "RUNNING"
    got = record["progress"]
    assert (got["step"], got["total_steps"], got["score"], got["seconds_per_step"]) == (
        10,
        40,
        1.0,
        5.5,
    )
    assert (got["eta_s"], got["resumes"], got["sparkline"]) == (165.0, 1, "▁▂▃▃▄▅▆▆▇█")
    assert (got["score_min"], got["score_max"]) == (0.1, 1.0)


def test_status_says_plainly_when_there_is_nothing_to_read(tmp_path):
    root = tmp_path / "jobs" / "q"
    root.mkdir(parents=True)
    job = local_job(JobStore(tmp_path / "jobs.db"), root)
    shown = run_cli(["status", job.id], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert job.id in shown.stdout and "RUNNING" in shown.stdout
    assert f"progress: no metrics yet ({root / 'run' / 'metrics.jsonl'})" in shown.stdout
    # all jobs: the table as before, no progress lines
    every = run_cli(["status"], tmp_path)
    assert job.id in every.stdout and "progress:" not in every.stdout


def test_progress_never_fails_status(tmp_path, monkeypatch):
    write_run(tmp_path, TEN)
    job = local_job(JobStore(tmp_path / "jobs.db"), tmp_path)

    def broken(*_):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(progress, "_records", broken)
    p = read_progress(job)
    assert isinstance(p, Progress) and p.note == "could not read the run's progress: disk on fire"


def test_resumes_in_a_log_longer_than_its_read_tail_are_a_lower_bound(tmp_path):
    old = "resumed from /r/global_step_1 at step 1\n" + "x" * progress.LOG_TAIL_BYTES + "\n"
    write_run(tmp_path, TEN, log=old + "resumed from /r/global_step_6 at step 6\n")
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.resumes, p.resumes_partial, p.last_resume_step) == (1, True, 6)
    assert "resumed ≥1x (last at step 6)" in format_progress(p)[0]
