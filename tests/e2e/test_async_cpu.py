"""The rollout on workers of its own (rollout.placement=separate) and generation
overlapped with training (async_training.mode=one_step_off and fully_async), through the
real command line on the two CPU cores: one worker trains, the other generates.

- Separate and synchronous, a run's numbers are the colocated run's, step for step: the
  actor's weights reach the rollout's own engine over the bridge after every update (a
  push that did not land leaves the rollout sampling with old weights, and step 2
  differs).
- One step off, the synthetic task is learned with every batch one update stale.
- A checkpoint taken while the next batch generates resumes without losing or repeating
  a prompt: the data loader is saved from before that batch drew its prompts.
- Fully asynchronous, the task is learned with stale samples in the batches; samples in
  flight at a weight sync continue under the new weights (partial rollouts: tokens of
  two versions in one sample) or, without, finish first (each sample one version's, at
  most ⌈staleness_threshold⌉ syncs old); a resume from a checkpoint taken with samples in
  flight trains every prompt drawn once, or keeps it pending.
- A dead worker of the rollout's own group, or of the reward model's
  (reward_model.enable_resource_pool), stops the run within a minute, naming its group
  and rank.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SEPARATE = [
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
]
ONE_STEP_OFF = [
    *SEPARATE,
    "async_training.mode=one_step_off",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.rollout_is=token",
]
FULLY_ASYNC = [
    *SEPARATE,
    "async_training.mode=fully_async",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
    "algorithm.rollout_correction.rollout_is=token",
]
SMALL = ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
         "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # fmt: skip
# long responses in short chunks: generation outlasts a training step, so samples are in
# flight at each sync
LONG = ["data.max_response_length=64", "async_training.stream_chunk_tokens=8",
        "async_training.staleness_threshold=1"]  # fmt: skip
COMPARED = ("critic/score/mean", "actor/grad_norm", "actor/entropy", "actor/pg_loss")


def run(overrides: list[str], timeout: int = 600) -> subprocess.CompletedProcess:
    repo = str(Path(__file__).parents[2])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-m", "engine.main", *overrides],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def common(tiny_model_dir, synthetic_data, base_overrides, run_dir, steps: int) -> list[str]:
    train, val = synthetic_data
    return [
        *base_overrides,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "algorithm.adv_estimator=grpo",
        f"trainer.total_training_steps={steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
    ]


def steps_of(read_metrics, run_dir) -> list[dict]:
    return [r for r in read_metrics(run_dir) if "critic/score/mean" in r]


def test_separate_and_synchronous_is_the_colocated_run(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    small = ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8"]  # fmt: skip
    runs = {}
    for name, placement in (("colocated", ["trainer.n_gpus_per_node=1"]), ("separate", SEPARATE)):
        run_dir = tmp_path / name
        run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 3), *small,
             *placement])  # fmt: skip
        runs[name] = steps_of(read_metrics, run_dir)
    for colocated, separate in zip(runs["colocated"], runs["separate"], strict=True):
        assert [colocated[k] for k in COMPARED] == [separate[k] for k in COMPARED]
    assert "training/staleness" not in runs["separate"][0]


def test_one_step_off_learns_the_synthetic_task(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    run_dir = tmp_path / "run"
    run(
        [
            *common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 24),
            *ONE_STEP_OFF,
            "actor_rollout_ref.rollout.n=8",
            "data.train_batch_size=32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        ]
    )
    records = steps_of(read_metrics, run_dir)
    assert [r["step"] for r in records] == list(range(1, 25))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last > first + 0.04, f"score did not rise: {scores}"
    # the first batch is on-policy; every later one was sampled one update before
    assert [r["training/staleness"] for r in records] == [0.0] + [1.0] * 23
    # π_old is the proximal policy (its own pass), the engine's log-probs the sampler's:
    # once stale, the ratio between them is no longer 1
    assert all("timing_s/old_log_prob" in r and "timing_s/wait_prev_gen" in r for r in records)
    assert records[0]["training/rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert any(abs(r["training/rollout_is_weight_mean"] - 1.0) > 1e-3 for r in records[1:])


def test_one_step_off_resumes_without_losing_or_repeating_prompts(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    run_dir = tmp_path / "run"
    small = ["actor_rollout_ref.rollout.n=4", "data.train_batch_size=8",
             "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.save_freq=2"]  # fmt: skip

    def loader_position(step: int) -> int:
        state = json.loads((run_dir / f"global_step_{step}" / "trainer_state.json").read_text())
        return state["loader"]["batches_done"]

    args = [*ONE_STEP_OFF, *small]
    run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 4), *args])
    # at step 2 the third batch was already generating: the loader is saved before it
    assert loader_position(2) == 2
    resumed = run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 6), *args])
    assert "resumed from" in resumed.stdout and "at step 4" in resumed.stdout
    assert loader_position(6) == 6  # six steps, six batches: none lost, none twice
    records = steps_of(read_metrics, run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    # after the resume the first batch is generated anew with the restored weights
    assert [r["training/staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0, 0.0, 1.0]


def own_reward_model_pool(tmp_path) -> list[str]:
    """The reward model (a tiny classifier built here) on a worker of its own
    (reward_model.enable_resource_pool), scoring every row; the rollout colocated."""
    from engine.models.tiny import build_tiny_reward_model

    rm_dir = build_tiny_reward_model(tmp_path / "rm", seed=1)
    return ["trainer.n_gpus_per_node=1", "reward_model.enable=true",
            f"reward_model.model.path={rm_dir}", "reward_model.enable_resource_pool=true",
            "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"]  # fmt: skip


@pytest.mark.parametrize(
    ("mode", "group"),
    [("one_step_off", "rollout"), ("fully_async", "rollout"), ("rm_pool", "rm")],
)
def test_a_dead_worker_of_its_own_group_stops_the_run_with_its_group_and_rank(
    mode, group, tiny_model_dir, synthetic_data, tmp_path, base_overrides
):
    """The rollout's own group (one step off, fully async) or the reward model's."""
    import signal
    import time

    run_dir = tmp_path / "run"
    placement = {"one_step_off": ONE_STEP_OFF, "fully_async": FULLY_ASYNC}.get(mode)
    if placement is None:
        placement = own_reward_model_pool(tmp_path)
    repo = str(Path(__file__).parents[2])
    path = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "engine.main",
         *common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 200),
         *placement, *SMALL],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONPATH": path},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        metrics = run_dir / "metrics.jsonl"
        while not metrics.exists() or not metrics.read_text():  # training has started
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
        table = json.loads((run_dir / "workers.json").read_text())
        (victim,) = [w for w in table if w.get("group") == group]
        os.kill(victim["pid"], signal.SIGKILL)
        killed_at = time.monotonic()
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert time.monotonic() - killed_at < 60, f"the run hung on the dead {group} worker"
    assert proc.returncode != 0
    assert f"worker rank 0 of the {group} group failed" in output, output[-2000:]


def test_one_step_off_in_bypass_mode_takes_the_samplers_log_probs_as_pi_old(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    """verl's bypass mode: no π_old pass of its own; the PPO ratio is to the sampler, so
    it starts at 1 on the on-policy first batch and moves once the batches are stale."""
    run_dir = tmp_path / "run"
    bypass = [a for a in ONE_STEP_OFF if "rollout_is=" not in a]
    run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 4), *bypass,
         "algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.rollout.n=4",
         "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"])  # fmt: skip
    records = steps_of(read_metrics, run_dir)
    assert not any("timing_s/old_log_prob" in r for r in records)
    assert [r["training/staleness"] for r in records] == [0.0, 1.0, 1.0, 1.0]
    assert abs(records[0]["actor/ppo_kl"]) < 1e-3  # the sampler's weights are the update's
    assert all(abs(r["actor/ppo_kl"]) > 1e-6 for r in records[1:])


def test_fully_async_learns_the_synthetic_task(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    run_dir = tmp_path / "run"
    run(
        [
            *common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 20),
            *FULLY_ASYNC,
            "async_training.staleness_threshold=0.5",
            "actor_rollout_ref.rollout.n=8",
            "data.train_batch_size=32",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        ]
    )
    records = steps_of(read_metrics, run_dir)
    assert [r["step"] for r in records] == list(range(1, 21))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last > first + 0.04, f"score did not rise: {scores}"
    # generation ran ahead of training: stale samples were trained, within the bound
    assert records[0]["training/staleness_max"] == 0.0
    assert any(r["training/stale_samples"] > 0 for r in records)
    assert all(r["training/staleness_max"] <= 2 for r in records)
    assert all("timing_s/wait_batch" in r and "rollouter/idle_ratio" in r for r in records)


@pytest.mark.parametrize("partial", [True, False])
def test_samples_in_flight_at_a_sync_continue_or_finish_first(
    partial, tiny_model_dir, synthetic_data, tmp_path, base_overrides, read_metrics
):
    run_dir = tmp_path / "run"
    run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 5), *FULLY_ASYNC,
         *SMALL, *LONG, f"async_training.partial_rollout={str(partial).lower()}"])  # fmt: skip
    records = steps_of(read_metrics, run_dir)
    spans = [r["training/max_partial_span"] for r in records]
    if partial:  # some sample had tokens of two weights versions
        assert max(spans) >= 1, spans
    else:  # every sample one version's, at most ⌈1⌉ sync old
        assert spans == [0.0] * 5
        assert all(r["training/staleness_max"] <= 1 for r in records)


def test_fully_async_resumes_without_losing_or_repeating_prompts(
    tiny_model_dir, synthetic_data, tmp_path, base_overrides
):
    run_dir, dumps = tmp_path / "run", tmp_path / "generations"
    args = [*FULLY_ASYNC, *SMALL, "async_training.staleness_threshold=1", "trainer.save_freq=2",
            "data.max_response_length=16", f"trainer.rollout_data_dir={dumps}"]  # fmt: skip
    run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 4), *args])
    step2 = json.loads((run_dir / "global_step_2" / "trainer_state.json").read_text())
    assert step2["extra"]["fully_async_pending"], "no prompt was drawn ahead at the checkpoint"
    assert step2["extra"]["weights_version"] == 2  # two updates; a resume counts on from it
    # as if killed after step 4 with no checkpoint since step 2: resume from there
    resumed = run([*common(tiny_model_dir, synthetic_data, base_overrides, run_dir, 6), *args,
                   "trainer.resume_mode=resume_path",
                   f"trainer.resume_from_path={run_dir / 'global_step_2'}"])  # fmt: skip
    assert "resumed from" in resumed.stdout and "at step 2" in resumed.stdout
    trained = []
    for step in range(1, 7):  # steps 3-6 rewritten by the resumed run
        rows = [json.loads(line) for line in (dumps / f"{step}.jsonl").read_text().splitlines()]
        trained += sorted({r["index"] for r in rows})
    end = json.loads((run_dir / "global_step_6" / "trainer_state.json").read_text())
    pending = end["extra"]["fully_async_pending"]
    assert len(trained) == len(set(trained)) == 6 * 8  # no prompt trained twice
    assert not set(trained) & set(pending)
    # every prompt the loader gave out is trained or pending: none lost
    assert len(trained) + len(pending) == end["loader"]["batches_done"] * 8
    assert end["extra"]["weights_version"] == 6
