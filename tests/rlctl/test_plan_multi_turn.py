"""The planner with multi-turn rollouts on: the response budget spans every turn and tool
result (its rule and warning on hand-computed cases), the rollout's TP (free on vLLM, 1
on SGLang), the refusals, and the budget in the reasoning."""

from __future__ import annotations

import pytest

from engine.config import load_config
from rlctl.job.spec import nest
from rlctl.planner.multi_turn import MultiTurn
from rlctl.planner.plan import InfeasiblePlanError, PlanRequest, make_plan

ARR = "actor_rollout_ref"
MT = f"{ARR}.rollout.multi_turn"


def request(model: str, accelerator: str | None, devices: int | None, **keys) -> PlanRequest:
    """A PlanRequest as a recipe with these engine keys makes it (typed config, pinned)."""
    config = load_config(base=nest(keys), check=False)
    return PlanRequest(model, accelerator, devices, config=config, pinned=frozenset(keys))


def multi_turn(**keys) -> dict:
    return {f"{MT}.enable": True, **{f"{MT}.{k}": v for k, v in keys.items()}}


def lines_with(plan, text: str) -> list[str]:
    return [line for line in plan.reasoning if text in line]


# ---------------------------------------------------------------------------
# the rule, by hand


def test_the_rule_by_hand():
    # 4 turns, results of up to 1000 characters: ⌈1000 / 4⌉ + 24 = 274 tokens each;
    # 4 × 256 + 3 × 274 = 1846 tokens
    mt = MultiTurn(turns=4, parallel_calls=2, tool_chars=1000, tool_timeout_s=20)
    assert (mt.rounds, mt.result_tokens, mt.needed()) == (3, 274, 1846)
    assert mt.needed(1) == 256 and mt.needed(2) == 2 * 256 + 274
    assert mt.turns_that_fit(1846) == 4 and mt.turns_that_fit(1845) == 3
    assert mt.turns_that_fit(255) == 0 and mt.turns_that_fit(256) == 1
    # the engine's defaults: 2000 characters -> 524 tokens; 1536 tokens hold 2 turns
    # (2 × 256 + 524 = 1036 ≤ 1536 < 3 × 256 + 2 × 524 = 1816)
    default = MultiTurn(turns=4, parallel_calls=8, tool_chars=2000, tool_timeout_s=30)
    assert default.result_tokens == 524 and default.turns_that_fit(1536) == 2
    # all 4 turns in 1536 tokens: results of ⌊(1536 − 1024) / 3⌋ − 24 = 146 tokens, 584
    # characters: ⌈584 / 4⌉ + 24 = 170, 1024 + 3 × 170 = 1534 ≤ 1536; 585 would need 1537
    assert default.result_chars_for(1536) == 584
    assert MultiTurn(4, 8, 584, 30).needed() == 1534
    assert MultiTurn(4, 8, 585, 30).needed() == 1537
    assert default.result_chars_for(1024) == 0  # four bare turns take it all
    assert MultiTurn(1, 8, 2000, 30).result_chars_for(4096) == 0  # no round: nothing to cut


# ---------------------------------------------------------------------------
# the plan


def test_the_budget_is_shown_and_held():
    """The bundled tool recipe's settings: 1024 + 2048 tokens, 4 turns, 2 calls a turn of
    up to 1000 characters, 20 s each."""
    plan = make_plan(
        request(
            "Qwen/Qwen2.5-3B-Instruct",
            "H100",
            8,
            **{"data.max_prompt_length": 1024, "data.max_response_length": 2048},
            **multi_turn(
                max_assistant_turns=4,
                max_parallel_calls=2,
                max_tool_response_length=1000,
                tool_timeout_s=20,
            ),
        )
    )
    (budget,) = lines_with(plan, "multi-turn budget:")
    assert "data.max_response_length 2048 tokens is the whole trajectory's" in budget
    assert "up to 4 model turns (max_assistant_turns) and the 3 tool rounds" in budget
    assert "≈ 274 tokens (⌈1000 / 4⌉ + 24 for its message)" in budget
    assert "548 for a turn's 2 calls" in budget  # 2 × 274 at their longest
    # (2048 − 3 × 274) / 4 = 306.5 tokens a turn on average
    assert "4 × 256 + 3 × 274 = 1846 ≤ 2048, leaving ~306 tokens a turn" in budget
    (sizing,) = lines_with(plan, "multi-turn sizing:")
    assert "1024 + 2048 = 3072 tokens a trajectory" in sizing
    assert "up to 3 × 20 s (tool_timeout_s) = 60 s a step" in sizing
    assert not [line for line in plan.reasoning if line.startswith("warning")]
    # the sizing is on prompt + response as without multi-turn: the same memory
    plain = make_plan(
        request(
            "Qwen/Qwen2.5-3B-Instruct",
            "H100",
            8,
            **{"data.max_prompt_length": 1024, "data.max_response_length": 2048},
        )
    )
    assert plan.memory == plain.memory and plan.rollout_tp == plain.rollout_tp == 1
    assert not lines_with(plain, "multi-turn")


def test_a_short_budget_is_warned_about_with_the_fixes():
    """1536 tokens with the engine's defaults (4 turns, 2000 characters): 2 turns fit by
    the rule (see test_the_rule_by_hand); the plan is made, with a warning."""
    plan = make_plan(
        request(
            "Qwen/Qwen2.5-3B-Instruct",
            "H100",
            8,
            **{"data.max_response_length": 1536},
            **multi_turn(),
        )
    )
    (warning,) = [line for line in plan.reasoning if line.startswith("warning: multi-turn")]
    assert "data.max_response_length 1536 holds 2 of the 4 turns" in warning
    assert "(2596 tokens for all)" in warning  # 4 × 256 + 3 × 524
    assert "raise data.max_response_length to 2596" in warning
    assert f"cut {MT}.max_tool_response_length to 584 characters" in warning
    assert f"lower {MT}.max_assistant_turns to 2" in warning
    assert "4 × 256 + 3 × 524 = 2596 > 1536" in lines_with(plan, "multi-turn budget:")[0]


def test_a_budget_for_one_bare_turn_offers_only_a_longer_budget():
    plan = make_plan(
        request(
            "Qwen/Qwen2.5-3B-Instruct",
            "H100",
            8,
            **{"data.max_response_length": 1024},
            **multi_turn(),
        )
    )
    (warning,) = [line for line in plan.reasoning if line.startswith("warning: multi-turn")]
    # (1024 + 524) // (256 + 524) = 1 turn; 4 × 256 = 1024 leaves no room for a result
    assert "holds 1 of the 4 turns" in warning
    assert "raise data.max_response_length to 2596 (a task" in warning
    assert "max_tool_response_length to" not in warning and "max_assistant_turns to" not in warning


SGLANG = {f"{ARR}.rollout.name": "sglang"}


def test_the_rollout_tp_is_chosen_as_without_tools_on_vllm_and_is_1_on_sglang():
    """Qwen2.5-14B on 8 × H100: its 27.5 GiB of bf16 weights take more than half the
    48 GiB pool, so the planner takes rollout TP 2. On vLLM multi-turn keeps it (the
    group's first member runs the loops, the others step with it); on SGLang it runs at
    TP 1 (the engine's rule there), where the weights and the KV of 16 sequences still
    fit."""
    keys = {"data.max_prompt_length": 1024, "data.max_response_length": 2048}
    plain = make_plan(request("Qwen/Qwen2.5-14B", "H100", 8, **keys))
    assert plain.rollout_tp == 2
    tools = make_plan(request("Qwen/Qwen2.5-14B", "H100", 8, **keys, **multi_turn()))
    assert tools.rollout_tp == 2
    plan = make_plan(request("Qwen/Qwen2.5-14B", "H100", 8, **keys, **SGLANG, **multi_turn()))
    assert plan.rollout_tp == 1
    assert plan.engine_overrides()[f"{ARR}.rollout.tensor_model_parallel_size"] == 1
    assert lines_with(plan, "rollout TP 1: multi-turn rollouts on SGLang run at TP 1")
    # one replica per device: twice the KV per token on each (96 -> 192 KiB)
    assert lines_with(plan, "at 192 KiB/token") and lines_with(plain, "at 96 KiB/token")


def test_a_model_that_needs_rollout_tp_is_refused_on_sglang_with_the_reason():
    """Qwen2.5-72B: 72.7B × 2 B = 135.4 GiB of bf16 weights, more than any H100 pool;
    on vLLM the planner spreads it over TP as it would without tools."""
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(request("Qwen/Qwen2.5-72B", "H100", 8, **SGLANG, **multi_turn()))
    assert "multi-turn rollouts on SGLang run at TP 1, where bf16 weights (135.4 GiB)" in str(
        info.value
    )
    assert "the bf16 weights (135.4 GiB) and their KV must fit one device" in info.value.hint
    assert make_plan(request("Qwen/Qwen2.5-72B", "H100", 8, **multi_turn())).rollout_tp > 1


def test_a_pinned_rollout_tp_above_1_is_refused_on_sglang_only():
    pinned = {f"{ARR}.rollout.tensor_model_parallel_size": 2}
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(request("Qwen/Qwen2.5-7B", "H100", 8, **pinned, **SGLANG, **multi_turn()))
    assert f"tensor_model_parallel_size 2 with {MT}.enable on SGLang" in str(info.value)
    assert "rollout.name=vllm" in info.value.hint
    plan = make_plan(request("Qwen/Qwen2.5-7B", "H100", 8, **pinned, **multi_turn()))
    assert plan.rollout_tp == 2


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        ("max_assistant_turns", 0, "max_assistant_turns must be a positive integer, got 0"),
        ("max_parallel_calls", -1, "max_parallel_calls must be a positive integer, got -1"),
        ("max_tool_response_length", 10**9, "max_tool_response_length 1000000000 is more"),
        ("tool_timeout_s", 0.0, "tool_timeout_s must be a positive number of seconds, got 0.0"),
    ],
)
def test_impossible_limits_are_refused_naming_the_key(key, value, says):
    with pytest.raises(InfeasiblePlanError, match=f"{MT}.{says}"):
        make_plan(request("Qwen/Qwen2.5-3B", "H100", 8, **multi_turn(**{key: value})))


def test_limits_without_enable_change_nothing():
    keys = {f"{MT}.max_assistant_turns": 0, "data.max_response_length": 64}
    plan = make_plan(request("Qwen/Qwen2.5-3B", "H100", 8, **keys))
    assert not lines_with(plan, "multi-turn")


def test_the_cpu_plan_shows_the_budget():
    plan = make_plan(
        request(
            "rlctl:tiny",
            None,
            2,
            **{
                "data.train_batch_size": 8,
                "data.max_prompt_length": 64,
                "data.max_response_length": 96,
            },
            **multi_turn(max_assistant_turns=2, max_tool_response_length=40),
        )
    )
    # 2 turns, results of ⌈40 / 4⌉ + 24 = 34 tokens: 2 × 256 + 34 = 546 > 96, 0 turns fit
    assert "2 × 256 + 1 × 34 = 546 > 96" in lines_with(plan, "multi-turn budget:")[0]
    assert lines_with(plan, "warning: multi-turn budget: data.max_response_length 96 holds 0")
