"""Long runs: a run killed for real resumes exactly; SIGTERM saves and asks for a requeue;
a dead worker stops the run promptly with its rank; bad checkpoints are never resumed.

What a process is (a kill, a signal, an exit code) is tested on ``python -m engine.main``
as a process of its own; the rest runs in this process (tests/e2e/conftest.py), which the
killed run's first steps, logged by a process of its own, show to give the same numbers."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from engine.loop.metrics import MACHINE_METRICS  # times, throughput, memory

pytestmark = pytest.mark.slow

# Metrics that measure the machine, not the run: they differ between two identical runs.


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synthetic"), n_train=64, n_val=8)


def engine_args(model: Path, train: Path, run_dir: Path, *extra: str) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # two optimizer steps per step
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",  # and accumulation
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",  # a reference model too
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2",
        "trainer.save_freq=2",
        "trainer.total_training_steps=6",
        *extra,
    ]


def by_step(run_dir: Path) -> dict[int, dict]:
    """The last record of each step (a killed run may have logged a step it never saved)."""
    records = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        records[record["step"]] = {
            k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)
        }
    return records


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else "exited"
        assert time.monotonic() < deadline, f"{path} did not appear"
        time.sleep(0.2)


VLLM = ["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.calculate_log_probs=true"]


def test_killed_run_resumes_exactly(
    tiny_model_dir, synthetic_data, tmp_path, run_engine, engine_process, capsys
):
    """The run straight through here; the same run as a process of its own, killed once
    its step-4 checkpoint is complete, then resumed here. Its steps 1-4 (the process's)
    are the straight run's (a run in this process is a run of its own), and so are
    steps 5 and 6 (the resume restored everything)."""
    train, _ = synthetic_data
    straight = tmp_path / "straight"
    run_engine(*engine_args(tiny_model_dir, train, straight))
    expected = by_step(straight)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]

    # Killed (driver, Ray and workers: the whole process group) once the step-4
    # checkpoint is complete: what a lost node looks like.
    broken = tmp_path / "broken"
    proc = engine_process(*engine_args(tiny_model_dir, train, broken), popen=True,
                          start_new_session=True)  # fmt: skip
    try:
        wait_for(broken / "global_step_4" / "COMPLETE", proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    killed = by_step(broken)
    for step in (1, 2, 3, 4):
        assert killed[step] == expected[step], f"step {step} differs in a process of its own"

    capsys.readouterr()
    run_engine(*engine_args(tiny_model_dir, train, broken))
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 4" in out
    got = by_step(broken)
    for step in (5, 6):
        assert got[step] == expected[step], f"step {step} differs after resume"


@pytest.mark.vllm
def test_a_resumed_vllm_run_samples_as_the_straight_one(
    tiny_model_dir, synthetic_data, tmp_path, run_engine, capsys
):
    """A resumed vLLM run builds a new engine and pushes the checkpoint's weights into it;
    it samples from the run's restored random state, as the uninterrupted run did. The
    straight run's step-4 checkpoint alone in a new run folder (what a run killed after
    it leaves: the kill itself is the test above's) resumes to its steps 5 and 6."""
    train, _ = synthetic_data
    straight = tmp_path / "straight"
    run_engine(*engine_args(tiny_model_dir, train, straight, *VLLM))
    expected = by_step(straight)
    assert sorted(expected) == [1, 2, 3, 4, 5, 6]

    resumed = tmp_path / "resumed"
    shutil.copytree(straight / "global_step_4", resumed / "global_step_4")
    capsys.readouterr()
    run_engine(*engine_args(tiny_model_dir, train, resumed, *VLLM))
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 4" in out
    got = by_step(resumed)
    assert sorted(got) == [5, 6]
    for step in (5, 6):
        assert got[step] == expected[step], f"step {step} differs after resume"


def test_incomplete_checkpoint_is_never_resumed(
    tiny_model_dir, synthetic_data, tmp_path, run_engine, engine_main, base_overrides, capsys
):
    train, _ = synthetic_data
    run_dir = tmp_path / "run"
    run_engine(*engine_args(tiny_model_dir, train, run_dir, "trainer.total_training_steps=2"))
    # A checkpoint cut off mid-write: files, but no marker. Resume must skip it.
    partial = run_dir / "global_step_4"
    (partial / "actor").mkdir(parents=True)
    (partial / "trainer_state.json").write_text('{"step": 4}')
    capsys.readouterr()
    run_engine(*engine_args(tiny_model_dir, train, run_dir, "trainer.total_training_steps=3"))
    out = capsys.readouterr().out
    assert "resumed from" in out and "at step 2" in out
    # An explicit path to it is refused with the reason (the engine's command, here).
    explicit = engine_main(
        *base_overrides,
        *engine_args(
            tiny_model_dir,
            train,
            tmp_path / "other",
            "trainer.resume_mode=resume_path",
            f"trainer.resume_from_path={partial}",
        ),
    )
    assert explicit == 2
    assert "not a complete checkpoint" in capsys.readouterr().err


def test_sigterm_saves_and_exits_for_requeue(
    tiny_model_dir, synthetic_data, tmp_path, engine_process
):
    train, _ = synthetic_data
    run_dir = tmp_path / "run"
    proc = engine_process(
        *engine_args(
            tiny_model_dir,
            train,
            run_dir,
            "trainer.save_freq=100",
            "trainer.total_training_steps=100",
        ),
        popen=True,
    )
    wait_for(run_dir / "workers.json", proc)
    deadline = time.monotonic() + 300
    while not (run_dir / "metrics.jsonl").exists() or not (run_dir / "metrics.jsonl").read_text():
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 75, output[-3000:]
    assert "stopped on SIGTERM" in output
    saved = sorted(p.name for p in run_dir.glob("global_step_*") if (p / "COMPLETE").exists())
    assert len(saved) == 1
    last_logged = max(by_step(run_dir))
    assert saved == [f"global_step_{last_logged}"]  # the step it finished, saved


def test_dead_worker_stops_the_run_with_its_rank(
    tiny_model_dir, synthetic_data, tmp_path, engine_process
):
    train, _ = synthetic_data
    run_dir = tmp_path / "run"
    proc = engine_process(
        *engine_args(tiny_model_dir, train, run_dir, "trainer.total_training_steps=1000"),
        popen=True,
    )
    wait_for(run_dir / "global_step_2" / "COMPLETE", proc)
    workers = json.loads((run_dir / "workers.json").read_text())
    os.kill(workers[1]["pid"], signal.SIGKILL)  # as the OOM killer would
    killed_at = time.monotonic()
    output, _ = proc.communicate(timeout=120)
    assert time.monotonic() - killed_at < 60, "the run hung on the dead worker"
    assert proc.returncode == 1, output[-3000:]
    assert "worker rank 1 failed" in output
    assert (run_dir / "global_step_2" / "COMPLETE").exists()  # the last good checkpoint


def test_nan_updates_are_skipped_then_stop_the_run(
    tiny_model_dir, synthetic_data, tmp_path, engine_main, base_overrides, capsys
):
    """A reward that turns NaN poisons the loss: each such update is skipped (the weights
    stay finite) and counted, and N in a row stop the run with the likely causes (the
    engine's command, here: exit code 2)."""
    train, _ = synthetic_data
    reward = tmp_path / "nan_reward.py"
    reward.write_text(
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float('nan')\n"
    )
    run_dir = tmp_path / "run"
    code = engine_main(
        *base_overrides,
        *engine_args(
            tiny_model_dir,
            train,
            run_dir,
            f"custom_reward_function.path={reward}",
            "trainer.max_consecutive_skipped_updates=2",
            "trainer.total_training_steps=10",
        ),
    )
    err = capsys.readouterr().err
    assert code == 2, err[-3000:]
    assert "2 actor updates in a row had a NaN/inf loss or gradient norm" in err
    steps = by_step(run_dir)
    assert steps[1]["actor/skipped_updates"] >= 1
    assert not (run_dir / "global_step_2").exists()  # nothing saved from a poisoned run


# What a stop from outside may take: rlctl stop's default grace, after which it kills.
STOP_GRACE_S = 60


def test_sigterm_to_every_process_of_the_job_at_once(
    tiny_model_dir, synthetic_data, tmp_path, engine_process, run_engine, capsys
):
    """As a scheduler's stop may come: SIGTERM to the supervisor, the engine's driver,
    Ray's daemons and its workers at the same moment, mid-training. The job ends within
    the grace with nothing of it left, never taking a checkpoint that is not complete for
    a good one, and started again it resumes from its last complete checkpoint and
    finishes."""
    from rlctl.backends.local import _session_pids

    train, _ = synthetic_data
    run_dir, record = tmp_path / "run", tmp_path / "restarts.json"
    args = engine_args(tiny_model_dir, train, run_dir, "trainer.save_freq=1",
                       "trainer.total_training_steps=3")  # fmt: skip
    supervisor = ["--max-restarts", "2", "--record", str(record), "--delay-s", "0"]
    proc = engine_process(*args, supervisor=supervisor, popen=True, start_new_session=True)
    wait_for(run_dir / "global_step_1" / "COMPLETE", proc)
    everyone = _session_pids(proc.pid)  # the supervisor's session: the whole job
    for pid in everyone:
        os.kill(pid, signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=STOP_GRACE_S)
    finally:
        left = _session_pids(proc.pid)
        for pid in left:  # a failed run must not leave its Ray behind for the next test
            os.kill(pid, signal.SIGKILL)
    assert left == [], "a process of the job outlived it"
    # It could not save (its workers went with the signal): the stop ends it, no restart
    # here; with Slurm's requeue on, the supervisor leaves it to the scheduler.
    (attempt,) = json.loads(record.read_text())["attempts"]
    assert (attempt["reason"], attempt["next"]) in {("preempted", "stop"), ("worker_died", "stop")}
    assert proc.returncode == attempt["exit_code"], output[-3000:]
    complete = [
        int(p.parent.name.rsplit("_", 1)[1]) for p in run_dir.glob("global_step_*/COMPLETE")
    ]
    assert complete and max(complete) >= 1, sorted(p.name for p in run_dir.iterdir())

    # Started again (here: a run in this process is a run of its own, the kill above was
    # the process's part), it resumes from the last complete checkpoint and finishes.
    capsys.readouterr()
    run_engine(*args)
    out = capsys.readouterr().out
    assert re.search(rf"^resumed from \S+global_step_{max(complete)} at step {max(complete)}$",
                     out, re.MULTILINE), out[-3000:]  # fmt: skip
    assert sorted(by_step(run_dir)) == [1, 2, 3]
