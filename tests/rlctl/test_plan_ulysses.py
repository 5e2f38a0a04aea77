"""The planner and Ulysses: under FSDP a sample too long for one device is split over the
smallest Ulysses group that fits it (as Megatron plans take the smallest CP), the plan
says so and sets the engine's keys, and what it sets passes the engine's rules."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from engine.config import load_config
from engine.config.train import ulysses_model_problems
from rlctl.job.spec import nest
from rlctl.model_table import table_config
from rlctl.planner.plan import GIB, InfeasiblePlanError, Plan, PlanRequest, make_plan

ARR = "actor_rollout_ref"
SP_KEY = f"{ARR}.actor.ulysses_sequence_parallel_size"

# Qwen2.5-7B on 8 × H100, 65536 tokens a sample: at SP 1 one sample's logits alone
# (65536 × V × 10 B = 92.8 GiB) outgrow a device.
LONG = dict(
    model="Qwen/Qwen2.5-7B",
    accelerator="H100",
    num_devices=8,
    train_batch_size=64,
    rollout_n=8,
    max_prompt_length=2048,
    max_response_length=63488,
)


def _pinned(keys: dict) -> dict:
    return {"config": load_config(base=nest(keys), check=False), "pinned": frozenset(keys)}


def _engine_config(plan: Plan):
    values = {
        f"{ARR}.model.path": "Qwen/Qwen2.5-7B",
        "data.train_files": "train.parquet",
        "algorithm.adv_estimator": "gae" if plan.use_critic else "grpo",
        **plan.engine_overrides(),
    }
    return load_config(
        [f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in values.items()]
    )


def test_a_long_sample_under_fsdp_is_split_over_the_smallest_ulysses_group_that_fits():
    plan = make_plan(PlanRequest(**LONG))
    assert plan.train_backend == "fsdp2" and plan.train_sp == 4
    assert not plan.param_offload and not plan.optimizer_offload
    # Qwen2.5-7B: h 3584, 28 layers, q 3584, k + v 1024, MLP 18944, V 152064. A micro-batch
    # of up to 69632 tokens (dynamic: at most 32768 × SP, in steps of 1024; 70656 would
    # pass the budget) is split over 4 ranks:
    local = 69632 // 4
    assert plan.max_token_len_per_device == local  # per device: the engine multiplies by SP
    kept = local * 3584 * 28 * 2  # checkpointed layer inputs
    # the largest term: this rank's response positions only (63488 of every 65536 tokens),
    # at the 20 B per vocabulary entry the GPU proof measured
    logits = -(-local * 63488 // 65536) * 152064 * 20
    layer = local * 2 * (4 * 3584 + 2 * 3584 + 1024 + 4 * 18944)
    exchange = 2 * local * (2 * 3584 + 1024) * 2  # q, k, v, out as sent and as received
    assert logits > 2 * layer
    mem = plan.memory
    assert mem.train_logits_gib == pytest.approx(logits / GIB, abs=1e-3)
    assert mem.train_activations_gib == pytest.approx((kept + logits + exchange) / GIB, abs=1e-3)
    n = plan.model.num_params  # FSDP's sharded state: 16 B/param over all 8 devices
    assert mem.train_weights_gib + mem.train_grads_gib + mem.train_optimizer_gib == pytest.approx(
        16 * n / 8 / GIB, abs=1e-3
    )
    text = "\n".join(plan.reasoning)
    assert "sequence parallel (Ulysses): SP 4: every micro-batch's packed tokens" in text
    assert "28/4 query heads and 4/4 KV heads" in text
    assert "at SP 2 one sample needs" in text and "> budget 72.6 GiB" in text
    assert "the 2 Ulysses groups (4 devices each, sharing their rows)" in text
    assert "/ SP 4 — the largest term" in text
    # the keys: SP on the actor (the reference's null follows it), padding removal on
    keys = plan.engine_overrides()
    assert keys[SP_KEY] == 4 and keys[f"{ARR}.model.use_remove_padding"] is True
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan
    # what the plan sets passes the engine's rules, and the model's heads take SP 4
    cfg = _engine_config(plan)
    assert cfg.ulysses_size("actor") == 4 and cfg.ulysses_size("reference") == 4
    assert cfg.token_budget("actor") == 69632
    fields = SimpleNamespace(**table_config("Qwen/Qwen2.5-7B"))
    assert ulysses_model_problems(cfg, lambda _model: fields) == []


def test_the_critic_gets_the_same_size():
    plan = make_plan(PlanRequest(**LONG, algorithm_needs_critic=True))
    assert plan.train_sp > 1
    keys = plan.engine_overrides()
    assert keys["critic.ulysses_sequence_parallel_size"] == plan.train_sp
    cfg = _engine_config(plan)
    assert cfg.ulysses_size("critic") == plan.train_sp


def test_short_samples_keep_sp_1_and_say_nothing():
    plan = make_plan(PlanRequest(**dict(LONG, max_prompt_length=1024, max_response_length=2048)))
    assert plan.train_sp == 1
    assert SP_KEY not in plan.engine_overrides()
    assert f"{ARR}.model.use_remove_padding" not in plan.engine_overrides()
    assert not any("Ulysses" in line for line in plan.reasoning)


def test_pins_are_kept():
    plan = make_plan(PlanRequest(**LONG, **_pinned({SP_KEY: 8})))
    assert plan.train_sp == 8  # the planner alone picks 4
    assert any("SP 8 (pinned by the recipe)" in line for line in plan.reasoning)
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest(**LONG, **_pinned({SP_KEY: 3})))
    assert "ulysses_sequence_parallel_size 3 does not divide 8 devices" in str(info.value)
    assert "unpin ulysses_sequence_parallel_size" in info.value.hint
    # padding removal pinned off: no Ulysses (the engine would refuse it), so 8 devices
    # no longer hold a sample
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest(**LONG, **_pinned({f"{ARR}.model.use_remove_padding": False})))
    assert "training one 65536-token sample needs" in str(info.value)


def test_rlctl_plan_shows_it_and_renders_the_keys(tmp_path):
    """The CLI on a recipe: the reasoning line, and the engine config the job runs."""
    import subprocess
    import sys

    recipe = tmp_path / "long.yaml"
    recipe.write_text(
        "name: long-grpo\nalgorithm: grpo\nmodel: Qwen/Qwen2.5-7B\n"
        "data: {train: data/train.parquet}\nhardware: {accelerators: H100:8}\n"
        "rollout: vllm\ntrainer: fsdp2\n"
        "engine:\n  data.train_batch_size: 64\n  data.max_prompt_length: 2048\n"
        "  data.max_response_length: 63488\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "rlctl.cli", "plan", str(recipe)],
        capture_output=True,
        text=True,
        env={**__import__("os").environ, "RLCTL_HOME": str(tmp_path)},
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "sequence parallel (Ulysses): SP 4" in result.stdout
    assert '"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4' in result.stdout
    assert "ulysses_sequence_parallel_size: 4" in result.stdout  # the engine.yaml shown
    assert "use_remove_padding: true" in result.stdout
