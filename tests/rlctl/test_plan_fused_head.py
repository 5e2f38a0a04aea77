"""The planner with ``use_fused_kernels``: the logits term is one chunk's, plus the fp32
buffer the head's weight gradient is summed in."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import load_config
from rlctl.api import find_recipe, plan_request
from rlctl.plan import GIB, PlanRequest, make_plan
from rlctl.recipe import load_recipe
from rlctl.spec import nest

ARR = "actor_rollout_ref"


def _pinned(keys: dict) -> dict:
    return {"config": load_config(base=nest(keys), check=False), "pinned": frozenset(keys)}


def _llama_1b(**pins):
    return make_plan(
        PlanRequest(
            "meta-llama/Llama-3.2-1B",
            "H100",
            1,
            train_batch_size=64,
            rollout_n=4,
            max_prompt_length=512,
            max_response_length=512,
            micro_batch_size_per_device=2,
            **(_pinned(pins) if pins else {}),
        )
    )


def test_logits_term_by_hand_llama_1b():
    """Llama-3.2-1B (h 2048, 16 layers, V 128256, tied head), 2 × 1024 tokens per
    micro-batch: the full logits are 2048 × V × 10 B = 2.446 GiB; chunks of 256 tokens
    hold 256 × V × 10 B = 0.306 GiB, and the head's gradient is summed in 4 B × V × h =
    0.979 GiB (a tied head too: the gradient is the head's, whatever else shares it)."""
    full, fused = _llama_1b(), _llama_1b(**{
        f"{ARR}.model.use_fused_kernels": True,
        f"{ARR}.model.fused_kernel_options.chunk_size": 256,
    })  # fmt: skip
    tokens, v, h = 2048, 128256, 2048
    assert full.memory.train_logits_gib == pytest.approx(tokens * v * 10 / GIB, abs=1e-3)
    chunked = 256 * v * 10 + 4 * v * h
    assert fused.memory.train_logits_gib == pytest.approx(chunked / GIB, abs=1e-3)
    # the rest of the activations (checkpointed layer inputs) is unchanged
    kept = tokens * h * 16 * 2
    assert fused.memory.train_activations_gib == pytest.approx((kept + chunked) / GIB, abs=1e-3)
    saved = full.memory.train_peak_gib - fused.memory.train_peak_gib
    assert saved == pytest.approx((tokens * v * 10 - chunked) / GIB, abs=5e-3)
    line = next(r for r in fused.reasoning if "of which logits" in r)
    assert "(use_fused_kernels: 256 of the 2048 tokens at a time) 256 × 128256 × 10 B" in line
    assert "+ head gradient 4 B × 0.26B" in line


def test_the_dapo_32b_recipe_plans_its_logits_in_chunks():
    """The bundled DAPO-32B recipe turns use_fused_kernels on: its logits term falls from
    28672 × 152064 × 10 B = 40.6 GiB (the largest, with the key off) to a chunk's 0.73 GiB
    and the 2.9 GiB fp32 head gradient, and the planner packs more tokens per device."""
    recipe = load_recipe(find_recipe("dapo_qwen32b"))
    assert recipe.engine[f"{ARR}.model.use_fused_kernels"] is True
    fused = make_plan(plan_request(recipe))
    off = dict(recipe.engine, **{f"{ARR}.model.use_fused_kernels": False})
    full = make_plan(plan_request(dataclasses.replace(recipe, engine=off)))
    assert full.memory.train_logits_gib == pytest.approx(28672 * 152064 * 10 / GIB, abs=1e-2)
    chunk = 512 * 152064 * 10 + 4 * 152064 * 5120
    assert fused.memory.train_logits_gib == pytest.approx(chunk / GIB, abs=1e-3)
    assert fused.max_token_len_per_device > full.max_token_len_per_device
    assert fused.memory.train_peak_gib < full.memory.train_peak_gib
