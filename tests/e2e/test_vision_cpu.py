"""The learning proof of vision-language RL on CPU: GRPO with the HF rollout on the
synthetic shapes task (engine.data.shapes: which square is larger, red or blue), a tiny
Qwen2.5-VL warmed up on the answer's format only (engine.warmup.shapes: colours
drawn at random, whatever the image). The task's scorer pays +1 for the right colour and
-1 for the wrong one, so a policy blind to the images scores 0 on average whatever it
learns: the score rises only if the images reach generation and training intact, each
with its row, at its tokens' positions.

The control, blank images (the same rows, white images), is the same run with
``RLCTL_VISION_CONTROL=1``; it stays near 0 (docs/vision.md has both runs' numbers)."""

import os

import pytest

pytestmark = pytest.mark.slow

STEPS = 24
CONTROL = os.environ.get("RLCTL_VISION_CONTROL") == "1"


@pytest.fixture(scope="module")
def warm_model(tmp_path_factory):
    """The tiny Qwen2.5-VL after its format warm start, on one thread: its steps are too
    small for two to pay, and two spin against any other work on the cores."""
    import torch

    from engine.models.tiny_vl import build_tiny_vl_model
    from engine.warmup.shapes import warm_start

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return warm_start(build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl_warm"), seed=0))
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize(
    "blank",
    [
        pytest.param(False, id="images"),
        pytest.param(
            True,
            id="blank",
            marks=pytest.mark.skipif(not CONTROL, reason="the control: RLCTL_VISION_CONTROL=1"),
        ),
    ],
)
def test_grpo_learns_to_read_the_images(blank, warm_model, tmp_path, run_engine):
    from engine.data.shapes import write_shapes_dataset

    train, _ = write_shapes_dataset(tmp_path / "data", n_train=512, n_val=2, blank=blank)
    run = run_engine(
        f"actor_rollout_ref.model.path={warm_model}",
        f"data.train_files={train}",
        "data.max_response_length=2",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=128",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
    )
    scores = [r["critic/score/mean"] for r in run.steps]
    assert len(scores) == STEPS
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    print(f"shapes ({'blank' if blank else 'images'}): first 5 {first:+.3f}, last 5 {last:+.3f}")
    print("scores", [round(s, 3) for s in scores])
    if blank:
        assert abs(last) < 0.15, f"blank images scored: {scores}"
    else:
        assert last > first + 0.25, f"score did not rise: {scores}"
