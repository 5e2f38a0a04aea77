"""The planner counts the reward model's memory on every training device: a sequence
classifier's weights, a judge's weights with its KV cache (and vLLM's overhead); held
through the run, or, for a vLLM judge that sleeps, in a phase of its own."""

import pytest

from rlctl.api import plan_recipe
from rlctl.models import model_shape
from rlctl.planner.model import GIB, InfeasiblePlanError
from rlctl.recipe.load import load_recipe, parse_recipe

BASE = {
    "name": "grpo-05b",
    "algorithm": "grpo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "data": {"prepare": "gsm8k"},
    "hardware": {"accelerators": "H100:1"},
    "rollout": "vllm",
    "engine": {
        "data.train_batch_size": 64,
        "data.max_prompt_length": 512,
        "data.max_response_length": 512,
        "actor_rollout_ref.rollout.n": 8,
        "actor_rollout_ref.actor.ppo_mini_batch_size": 16,
    },
}
JUDGE = {
    "reward_model.enable": True,
    "reward_model.style": "generative",
    "reward_model.model.path": "Qwen/Qwen2.5-1.5B-Instruct",
    "reward_model.judge.max_prompt_length": 1024,
    "reward_model.judge.max_new_tokens": 256,
}


def _plan(engine=None, **fields):
    return plan_recipe(parse_recipe({**BASE, **fields, "engine": {**BASE["engine"], **engine}}))


def test_a_sequence_classifier_is_held_beside_the_training_state():
    without = _plan({})
    rm = _plan(
        {
            "reward_model.enable": True,
            "reward_model.model.path": "Skywork/Skywork-Reward-V2-Qwen3-0.6B",
        }
    )
    shape = model_shape("Qwen/Qwen3-0.6B")  # the body it was trained from
    weights = 2 * (shape.num_params - shape.lm_head_params + shape.hidden_size) / GIB
    mem, base = rm.memory, without.memory
    assert mem.reward_model_gib == pytest.approx(weights, abs=2e-3)
    assert mem.reward_model_held
    assert mem.train_peak_gib == pytest.approx(base.train_peak_gib + weights, abs=5e-3)
    assert mem.rollout_resident_gib == pytest.approx(base.rollout_resident_gib + weights, abs=5e-3)
    assert any("reward model (sequence classifier" in line for line in rm.reasoning)


def test_a_vllm_judge_counts_its_weights_kv_cache_and_engine_as_a_phase_of_its_own():
    plan = _plan(JUDGE)
    m = model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    rows = 256  # one device: every sample's judge prompt, up to vLLM's 256 at once
    blocks = -(-(1024 + 256) // 128)
    kv = rows * blocks * 128 * m.kv_cache_bytes_per_token(2)
    expected = (2 * m.num_params + kv) / GIB + 2.0  # + vLLM's engine overhead
    mem = plan.memory
    assert mem.reward_model_gib == pytest.approx(expected, abs=2e-3)
    assert not mem.reward_model_held  # sleeps while the actor trains and the policy generates
    assert mem.judge_peak_gib == pytest.approx(mem.rollout_resident_gib + expected, abs=5e-3)
    assert mem.peak_gib <= mem.budget_gib
    assert any("judge on vllm" in line and "256 prompts" in line for line in plan.reasoning)


def test_an_hf_judge_is_held_through_the_run():
    plan = _plan(JUDGE, rollout="hf")
    m = model_shape("Qwen/Qwen2.5-1.5B-Instruct")
    kv = 8 * (1024 + 256) * m.kv_cache_bytes_per_token(2)  # one generate call of 8 prompts
    assert plan.memory.reward_model_held
    assert plan.memory.reward_model_gib == pytest.approx((2 * m.num_params + kv) / GIB, abs=2e-3)


def test_sizing_grows_for_a_big_judge_and_refuses_it_on_pinned_devices():
    big = {**JUDGE, "reward_model.model.path": "Qwen/Qwen2.5-32B-Instruct"}
    # a 32B judge's weights (61 GiB) fit one H100 only beside a small share of the KV
    # cache: the planner spreads the samples over more devices until it fits
    small, grown = _plan(JUDGE), _plan(big)
    assert small.nodes * small.devices_per_node == 1
    assert grown.nodes * grown.devices_per_node > 1
    assert grown.memory.judge_peak_gib <= grown.memory.budget_gib
    with pytest.raises(InfeasiblePlanError) as info:
        _plan({**big, "trainer.nnodes": 1, "trainer.n_gpus_per_node": 1})
    assert "the judge needs" in str(info.value)


def test_the_bundled_judge_recipe_plans_with_its_judge():
    from rlctl.api import BUNDLED_RECIPES

    recipe = load_recipe(BUNDLED_RECIPES / "grpo_qwen05b_llm_judge.yaml")
    plan = plan_recipe(recipe)
    assert plan.memory.reward_model_gib > 5
    assert any("Qwen/Qwen2.5-1.5B-Instruct" in line for line in plan.reasoning)
