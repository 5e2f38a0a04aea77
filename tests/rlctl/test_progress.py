"""`rlctl status JOB`'s progress: read from hand-written run files, never a real run."""

import json
import os

import pytest

from rlctl.store import progress
from rlctl.store.jobs import JobState, JobStore
from rlctl.store.progress import Progress, format_progress, read_progress, sparkline
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


def local_job(store, root, *, running=True, plan=None):
    job = store.create(
        name="q", recipe_path="r.yaml", recipe_yaml="", plan_json=json.dumps(plan or {}),
        backend="local",
    )  # fmt: skip
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


def test_checkpoints_in_a_bucket_leave_the_metrics_in_the_run_folder(tmp_path):
    """rlctl sets trainer.run_dir when the checkpoints are apart (spec.py): the
    metrics are read there, not under the engine's own runs/<project>/<experiment>."""
    import dataclasses

    from rlctl.api import bundled_recipes, plan_recipe
    from rlctl.backends.local import LocalBackend
    from rlctl.job.spec import build_spec

    recipe = {r.name: r for r in bundled_recipes()}["grpo-qwen05b-gsm8k"]
    recipe = dataclasses.replace(recipe, checkpoints="s3://b/runs/a")
    paths = LocalBackend().paths("j", recipe.checkpoints)
    spec = build_spec(recipe, plan_recipe(recipe), paths)
    assert f"run_dir: {paths.run_dir}\n" in spec.engine_yaml

    write_run(tmp_path, TEN, total=10)
    (tmp_path / "engine.yaml").write_text(
        f"trainer:\n  default_local_dir: s3://b/runs/a\n  run_dir: {tmp_path / 'run'}\n"
    )
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert (p.step, p.metrics_path) == (10, str(tmp_path / "run" / "metrics.jsonl"))


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
        "progress: not readable from here: the metrics are on the cloud's nodes (with a"
        " checkpoints: bucket in the recipe, status reads the run's progress there)"
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
    write_restarts(root, 3, HUNG, {})

    shown = run_cli(["status", job.id], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "RUNNING" in shown.stdout
    assert (
        "progress: step 10/40 · score 1 · 5.5 s/step · 2m45s left · resumed 1x (last at step 4)"
        in shown.stdout
    )
    assert "score:    ▁▂▃▃▄▅▆▆▇█  min 0.1 max 1 (steps 1-10)" in shown.stdout
    assert (
        "restarts: 1 of 3 (trainer.max_restarts)\n  1. exit 76, hung: see the log" in shown.stdout
    )
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


def write_restarts(root, max_restarts, *attempts):
    """The supervisor's record (engine/supervisor.py), through its own types."""
    from engine.schema import RESTARTS_FILE, Attempt, Restarts

    restarts = Restarts(
        max_restarts, [Attempt(i + 1, 1000.0 + i, **a) for i, a in enumerate(attempts)]
    )
    (root / RESTARTS_FILE).write_text(json.dumps(restarts.to_json()))


HUNG = {
    "ended_at": 1001.0,
    "exit_code": 76,
    "reason": "hung",
    "message": "the run hung at step 3: rollout.generate ran 16 s, past its bound of 15 s",
    "next": "restart",
    "why": "restart 1 of 3: from the last complete checkpoint",
}


def test_restarts_and_their_reasons(tmp_path):
    write_run(tmp_path, TEN, total=40)
    died = {**HUNG, "exit_code": 1, "reason": "worker_died", "message": "worker rank 1 failed"}
    died["why"] = "restart 2 of 3: from the last complete checkpoint"
    write_restarts(tmp_path, 3, HUNG, died, {})
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert format_progress(p)[2:] == [
        "restarts: 2 of 3 (trainer.max_restarts)",
        "  1. exit 76, hung: see the log for every worker's stacks (the run hung at step 3:"
        " rollout.generate ran 16 s, past its bound of 15 s); restart 1 of 3: from the last"
        " complete checkpoint",
        "  2. exit 1, a worker's process or its node died (worker rank 1 failed); restart 2 of"
        " 3: from the last complete checkpoint",
        "  3. running",
    ]
    got = p.to_json()["restarts"]
    assert (got["used"], got["max_restarts"], len(got["attempts"])) == (2, 3, 3)
    assert got["attempts"][0]["exit_code"] == 76 and got["attempts"][2]["running"]


def test_a_failure_that_is_not_retried_says_why_without_metrics(tmp_path):
    (tmp_path / "job.log").write_text("")
    config = {
        "ended_at": 1001.0,
        "exit_code": 2,
        "reason": "config",
        "message": "invalid engine config: data.train_files: no such file",
        "next": "stop",
        "why": "not retried: not a fault a restart cures",
    }
    write_restarts(tmp_path, 3, config)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path, running=False))
    assert format_progress(p) == [
        f"progress: no metrics yet ({tmp_path / 'run' / 'metrics.jsonl'})",
        "ended: exit 2, configuration or usage error: fix it and launch again (invalid engine"
        " config: data.train_files: no such file); not retried: not a fault a restart cures",
    ]


def test_one_attempt_running_or_finished_adds_nothing(tmp_path):
    write_run(tmp_path, TEN, total=40)
    write_restarts(tmp_path, 3, {})
    job = local_job(JobStore(tmp_path / "jobs.db"), tmp_path)
    assert len(format_progress(read_progress(job))) == 2
    write_restarts(tmp_path, 3, {"ended_at": 1001.0, "exit_code": 0, "reason": "finished",
                                 "next": "stop", "why": "finished"})  # fmt: skip
    assert len(format_progress(read_progress(job))) == 2


def test_an_attempt_open_in_a_job_that_is_over_ended_unrecorded(tmp_path):
    """rlctl stop past its grace SIGKILLs the supervisor: its last attempt stays open."""
    write_run(tmp_path, TEN, total=40)
    write_restarts(tmp_path, 3, HUNG, {})
    store = JobStore(tmp_path / "jobs.db")
    job = local_job(store, tmp_path, running=False)
    assert format_progress(read_progress(job))[-1] == "  2. running"  # as far as it knows
    job = store.transition(job.id, JobState.CANCELLED, reason="stopped by the user")
    assert format_progress(read_progress(job))[-1] == (
        "  2. no exit code seen, its end was not recorded"
    )


@pytest.mark.parametrize("text", ["", "{", '{"max_restarts": 3}', '{"attempts": [{"x": 1}]}'])
def test_an_unreadable_restarts_record_is_left_out(tmp_path, text):
    write_run(tmp_path, TEN, total=40)
    (tmp_path / "restarts.json").write_text(text)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path))
    assert p.restarts is None and p.step == 10


# The planner's per-device figures, as the job store keeps a plan (one H100 each).
H100_PLAN = {
    "accelerator": "H100",
    "memory": {"device_gib": 80.0, "train_peak_gib": 33.688, "rollout_peak_gib": 71.362,
               "judge_peak_gib": 0.0},
}  # fmt: skip


def test_peak_memory_per_role_against_the_plan_and_the_limit(tmp_path):
    """Each role's largest phase over the steps, beside the plan's figure and the
    device's limit; flagged above the plan, or within the engine's margin of the limit."""
    records = [
        {"step": 1, "memory/peak_gib/actor.update": 30.0, "memory/peak_gib/actor.log_probs": 20.0,
         "memory/peak_gib/rollout.generate": 60.0, "memory/peak_gib/ref.log_probs": 10.0,
         "memory/limit_gib": 79.1},
        {"step": 2, "memory/peak_gib/actor.update": 36.0, "memory/peak_gib/rollout.generate": 72.0,
         "memory/peak_gib/ref.log_probs": 9.0, "memory/peak_gib/teacher.score": 5.0,
         "memory/limit_gib": 79.1},
    ]  # fmt: skip
    write_run(tmp_path, records, total=2)
    job = local_job(JobStore(tmp_path / "jobs.db"), tmp_path, plan=H100_PLAN)
    p = read_progress(job)
    assert format_progress(p)[1:] == [
        "memory:   peak against the plan, of 79.1 GiB (a device's memory)",
        "  actor      36.00 GiB (actor.update)  plan 33.69 GiB  ABOVE THE PLAN (+2.31 GiB)",
        "  ref        10.00 GiB (ref.log_probs)  plan 33.69 GiB  ok",
        "  rollout    72.00 GiB (rollout.generate)  plan 71.36 GiB  NEAR THE LIMIT (91%);"
        " ABOVE THE PLAN (+0.64 GiB)",
        "  teacher     5.00 GiB (teacher.score)  no plan figure  ok",
    ]
    roles = {r["role"]: r for r in p.to_json()["memory"]["roles"]}
    assert p.to_json()["memory"]["limit_gib"] == 79.1
    assert roles["rollout"] == {
        "role": "rollout", "peak_gib": 72.0, "phase": "rollout.generate", "plan_gib": 71.362,
        "near_limit": True, "above_plan": True,
    }  # fmt: skip
    assert (roles["actor"]["near_limit"], roles["actor"]["above_plan"]) == (False, True)
    assert (roles["ref"]["near_limit"], roles["ref"]["above_plan"]) == (False, False)


def test_on_cpu_only_the_limit_is_flagged(tmp_path):
    """A CPU run's peaks are resident memory (the interpreter included) against the
    node's RAM: never "above" a plan that counts tensors; near the limit still is."""
    records = [{"step": 1, "memory/peak_gib/actor.update": 1.5,
                "memory/peak_gib/rollout.generate": 7.5, "memory/limit_gib": 8.0}]  # fmt: skip
    write_run(tmp_path, records, total=3)
    plan = {"accelerator": None, "memory": {"train_peak_gib": 0.126, "rollout_peak_gib": 0.03}}
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path, plan=plan))
    assert format_progress(p)[1:] == [
        "memory:   peak against the plan, of 8.0 GiB (a node's RAM, its workers together)",
        "  actor       1.50 GiB (actor.update)  plan 0.13 GiB  ok",
        "  rollout     7.50 GiB (rollout.generate)  plan 0.03 GiB  NEAR THE LIMIT (94%)",
        "  (CPU: resident memory, interpreter included; the plan counts tensors)",
    ]


def test_no_memory_lines_without_memory_metrics(tmp_path):
    write_run(tmp_path, TEN, total=40)
    p = read_progress(local_job(JobStore(tmp_path / "jobs.db"), tmp_path, plan=H100_PLAN))
    assert p.memory is None and p.to_json()["memory"] is None
    assert not any(line.startswith("memory:") for line in format_progress(p))


def test_logs_end_with_the_peak_memory_against_the_plan(tmp_path):
    """``rlctl logs JOB``: the run's output, then the same memory lines as status."""
    root = tmp_path / "jobs" / "q"
    records = [{"step": 1, "memory/peak_gib/actor.update": 36.0, "memory/limit_gib": 79.1}]
    write_run(root, records, total=2, log="step 1/2 | score 0.5\n")
    job = local_job(JobStore(tmp_path / "jobs.db"), root, running=False, plan=H100_PLAN)
    shown = run_cli(["logs", job.id], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines() == [
        "step 1/2 | score 0.5",
        "",
        "memory:   peak against the plan, of 79.1 GiB (a device's memory)",
        "  actor      36.00 GiB (actor.update)  plan 33.69 GiB  ABOVE THE PLAN (+2.31 GiB)",
    ]
    write_run(root, [{"step": 1}], total=2, log="step 1/2 | score 0.5\n")  # none logged
    assert run_cli(["logs", job.id], tmp_path).stdout.splitlines() == ["step 1/2 | score 0.5"]


def test_a_skypilot_managed_jobs_restarts_are_read_from_its_bucket(tmp_path):
    """The supervisor on the head node keeps its record beside the checkpoints, in the
    bucket; status reads it there (any store engine.storage opens: a file:// one here)
    and says why when it cannot."""
    bucket = tmp_path / "bucket" / "runs" / "a"
    bucket.mkdir(parents=True)
    handed_back = {
        **HUNG,
        "next": "requeue",
        "why": "restart 1 of 3: SkyPilot starts the job again",
    }
    write_restarts(bucket, 3, handed_back, {})
    store = JobStore(tmp_path / "jobs.db")
    job = store.create(name="q", recipe_path="r.yaml", recipe_yaml="", plan_json="{}",
                       backend="skypilot")  # fmt: skip
    handle = {"mode": "managed", "job_id": 7, "restarts": f"file://{bucket}/restarts.json"}
    job = store.set_handle(job.id, handle)
    lines = format_progress(read_progress(job))
    assert lines[0].startswith("progress: not readable from here: the metrics are on the cloud's")
    assert lines[1:3] == [
        "restarts: 1 of 3 (trainer.max_restarts)",
        "  1. exit 76, hung: see the log for every worker's stacks (the run hung at step 3:"
        " rollout.generate ran 16 s, past its bound of 15 s); restart 1 of 3: SkyPilot starts"
        " the job again",
    ]
    assert read_progress(job, bucket=False).restarts is None  # rlctl logs' memory: no bucket read
    job = store.set_handle(job.id, {**handle, "restarts": "hdfs://b/restarts.json"})
    p = read_progress(job)
    assert (
        p.restarts is None
        and "the restarts not read from hdfs://b/restarts.json: unsupported" in (p.note or "")
    )


def test_a_skypilot_jobs_progress_is_read_from_its_bucket(tmp_path):
    """The run writes progress.json beside its checkpoints (engine.progress_file):
    status shows step, score, pace, time left and memory from it, as from a local run."""
    bucket = tmp_path / "bucket" / "runs" / "a"
    bucket.mkdir(parents=True)
    memory = {"memory/peak_gib/actor.update": 60.0, "memory/limit_gib": 80.0}
    steps = [{**r, **memory} for r in TEN]
    store = JobStore(tmp_path / "jobs.db")
    job = store.create(name="q", recipe_path="r.yaml", recipe_yaml="",
                       plan_json=json.dumps(H100_PLAN), backend="skypilot")  # fmt: skip
    url = f"file://{bucket}/progress.json"
    job = store.set_handle(job.id, {"mode": "managed", "job_id": 7, "progress": url})
    p = read_progress(job)
    assert (p.note, p.step) == (f"no metrics yet ({url})", None)

    (bucket / "progress.json").write_text(json.dumps({"total_steps": 40, "steps": steps}))
    p = read_progress(job)
    assert (p.step, p.total_steps, p.score, p.step_s, p.eta_s) == (10, 40, 1.0, 5.5, 165.0)
    assert (p.note, p.metrics_path) == (None, url)
    lines = format_progress(p)
    assert lines[:2] == [
        "progress: step 10/40 · score 1 · 5.5 s/step · 2m45s left",
        "score:    ▁▂▃▃▄▅▆▆▇█  min 0.1 max 1 (steps 1-10)",
    ]
    assert any(line.startswith("memory:") for line in lines)
    assert read_progress(job, bucket=False).step is None  # rlctl logs: no bucket read

    job = store.set_handle(job.id, {"mode": "managed", "job_id": 7, "progress": "hdfs://b/p"})
    p = read_progress(job)
    assert p.step is None and "the progress not read from hdfs://b/p: unsupported" in p.note


def test_the_files_in_the_bucket_are_where_the_checkpoints_are():
    import dataclasses

    from rlctl.api import bundled_recipes, plan_recipe
    from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
    from rlctl.backends.skypilot_recovery import bucket_handle
    from rlctl.job.spec import build_spec

    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
    recipe = {r.name: r for r in bundled_recipes()}["grpo-qwen05b-gsm8k"]
    engine_bucket = {**recipe.engine, "trainer.default_local_dir": "s3://x/y"}
    for changes, managed, cluster in [
        ({"checkpoints": "gs://b/runs/a/"}, {
            "restarts": "gs://b/runs/a/restarts.json",
            "progress": "gs://b/runs/a/progress.json",
        }, {"progress": "gs://b/runs/a/progress.json"}),
        # written by the engine itself (not mounted): the restarts stay on the head node
        ({"engine": engine_bucket}, {"progress": "s3://x/y/progress.json"}, None),
        ({"checkpoints": None}, {}, {}),
    ]:  # fmt: skip
        r = dataclasses.replace(recipe, **changes)
        spec = build_spec(r, plan_recipe(r), backend.paths("j", r.checkpoints))
        assert bucket_handle(spec, managed=True) == managed
        assert bucket_handle(spec, managed=False) == (managed if cluster is None else cluster)
