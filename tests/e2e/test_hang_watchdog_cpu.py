"""A run whose worker stops answering ends with every worker's stacks in its log and
exit code 76 (engine.watchdog). The process and its exit code are what is tested, so the
engine runs as a process of its own, and the hang is the test-only hook
RLCTL_TEST_HANG_AT (rank 1 never returns from its third rollout.generate: step 3)."""

import re

import pytest

from engine.errors import EXIT_HUNG
from engine.watchdog import TEST_HANG_ENV

pytestmark = pytest.mark.slow

FLOOR_S = 15  # low for a test (each second of it is CI time); first steps here take 1-5 s


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


def test_a_worker_that_stops_answering_ends_the_run_with_its_stacks(
    tiny_model_dir, synthetic_data, tmp_path, engine_process
):
    train, _ = synthetic_data
    run_dir = tmp_path / "run"
    done = engine_process(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        f"trainer.default_local_dir={run_dir}",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "algorithm.adv_estimator=grpo",
        "trainer.total_training_steps=5",
        "trainer.hang_timeout_factor=3",
        f"trainer.hang_timeout_floor_s={FLOOR_S}",
        env={TEST_HANG_ENV: "rollout.generate:3:1"},
        timeout=600,
    )
    log = done.stdout + done.stderr
    assert done.returncode == EXIT_HUNG, log[-5000:]
    # the phase, the step, the bound (the floor: 3 × a few seconds is below it)
    assert re.search(
        rf"hung at step 3: rollout\.generate ran \d+ s, past its bound of {FLOOR_S} s", log
    ), log[-5000:]
    assert "likely stuck: rank 1" in log
    # rank 1's stacks name the function it is stuck in; rank 0's do not
    stuck = section(log, "watchdog: ---- stacks of rank 1,")
    assert "in hang_forever_for_test" in stuck, stuck
    assert "in hang_forever_for_test" not in section(log, "watchdog: ---- stacks of rank 0,")
    assert "stacks of the driver" in log
    assert "error: the run hung at step 3" in done.stderr
    # steps 1 and 2 finished and were logged; step 3 never was
    steps = (run_dir / "metrics.jsonl").read_text().splitlines()
    assert len(steps) == 2
