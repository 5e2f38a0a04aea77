"""A run whose worker stops answering ends with every worker's stacks in its log and
exit code 76 (engine.watchdog); under the job's supervisor (engine.supervisor) it is
started again from its last complete checkpoint and finishes, with the metrics of a run
that never hung. The processes and their exit codes are what is tested, so the engine
runs under the supervisor as a process of its own, and the hang is the test-only hook
RLCTL_TEST_HANG_AT (rank 1 never returns from its third rollout.generate: step 3; the
restarted workers are new processes whose third call would be step 5, past the end)."""

import json
import re

import pytest

from engine.errors import EXIT_HUNG
from engine.loop.metrics import MACHINE_METRICS  # times, throughput, memory
from engine.watchdog import TEST_HANG_ENV

pytestmark = pytest.mark.slow

FLOOR_S = 15  # low for a test (each second of it is CI time); first steps here take 1-5 s
# Metrics that measure the machine, not the run: they differ between two identical runs.


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synthetic"), n_train=64, n_val=8)


def section(log: str, header: str) -> str:
    """The lines of the log after ``header`` up to the next watchdog line."""
    start = log.index(header)
    rest = log[start + len(header) :]
    end = rest.find("watchdog: ----")
    return rest if end < 0 else rest[:end]


def run_args(model, train, run_dir) -> list[str]:
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=3",
        "trainer.save_freq=2",  # step 2's checkpoint is the one the restart resumes
        "trainer.hang_timeout_factor=3",
        f"trainer.hang_timeout_floor_s={FLOOR_S}",
    ]


def steps(records: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(MACHINE_METRICS)} for r in records]


def test_a_worker_that_stops_answering_ends_the_run_with_its_stacks_and_a_restart_finishes_it(
    tiny_model_dir, synthetic_data, tmp_path, engine_process, run_engine, read_metrics
):
    train, _ = synthetic_data
    run_dir, record = tmp_path / "run", tmp_path / "restarts.json"
    done = engine_process(
        *run_args(tiny_model_dir, train, run_dir),
        supervisor=["--max-restarts", "1", "--record", str(record), "--delay-s", "0"],
        env={TEST_HANG_ENV: "rollout.generate:3:1"},
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-5000:]

    # The first attempt: the phase, the step, the bound (the floor: 3 × a few seconds is
    # below it), rank 1 named, its stacks in the function it is stuck in, exit code 76.
    assert re.search(
        rf"hung at step 3: rollout\.generate ran \d+ s, past its bound of {FLOOR_S} s", log
    ), log[-5000:]
    assert "likely stuck: rank 1" in log
    stuck = section(log, "watchdog: ---- stacks of rank 1,")
    assert "in hang_forever_for_test" in stuck, stuck
    assert "in hang_forever_for_test" not in section(log, "watchdog: ---- stacks of rank 0,")
    assert "stacks of the driver" in log
    assert "error: the run hung at step 3" in done.stderr

    # The supervisor restarted it once, from step 2's checkpoint, and it finished.
    attempts = json.loads(record.read_text())["attempts"]
    assert [(a["exit_code"], a["reason"], a["next"]) for a in attempts] == [
        (EXIT_HUNG, "hung", "restart"),
        (0, "finished", "stop"),
    ]
    assert attempts[0]["message"].startswith("the run hung at step 3: rollout.generate ran")
    assert "supervisor: attempt 1 ended with exit code 76, hung" in done.stderr
    assert re.search(r"^resumed from \S+global_step_2 at step 2$", done.stdout, re.MULTILINE)

    # Its metrics are an uninterrupted run's: steps 1-2 from the first attempt, 3 from
    # the restart, each once. The uninterrupted run goes in this process (a run here is
    # a run of its own: tests/e2e/test_resume.py shows both give the same numbers).
    got = steps(read_metrics(run_dir))
    assert [r["step"] for r in got] == [1, 2, 3]
    straight = run_engine(*run_args(tiny_model_dir, train, tmp_path / "straight"))
    assert got == steps(straight.records)
