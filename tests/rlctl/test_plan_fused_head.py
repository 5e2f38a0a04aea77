"""The planner with ``use_fused_kernels``: the logits term is one chunk's, plus the fp32
buffer the head's weight gradient is summed in."""

from __future__ import annotations

import dataclasses

import pytest

from engine.config import load_config
from rlctl.api import find_recipe, plan_request
from rlctl.job.spec import nest
from rlctl.planner.plan import GIB, PlanRequest, make_plan
from rlctl.recipe.load import load_recipe

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
    """Llama-3.2-1B (h 2048, 16 layers, V 128256, tied head), 2 × (512 + 512) tokens per
    micro-batch, of which the head sees the 2 × 512 response positions: the full logits
    are 1024 × V × 20 B (the bytes per entry the GPU proof measured) = 2.446 GiB; chunks
    of 256 positions hold 256 × V × 20 B = 0.612 GiB, and the head's gradient is summed in
    4 B × V × h = 0.979 GiB (a tied head too: the gradient is the head's, whatever else
    shares it)."""
    full, fused = _llama_1b(), _llama_1b(**{
        f"{ARR}.model.use_fused_kernels": True,
        f"{ARR}.model.fused_kernel_options.chunk_size": 256,
    })  # fmt: skip
    tokens, positions, v, h = 2048, 1024, 128256, 2048
    assert full.memory.train_logits_gib == pytest.approx(positions * v * 20 / GIB, abs=1e-3)
    chunked = 256 * v * 20 + 4 * v * h
    assert fused.memory.train_logits_gib == pytest.approx(chunked / GIB, abs=1e-3)
    # the rest of the activations (checkpointed layer inputs) is unchanged
    kept = tokens * h * 16 * 2
    assert fused.memory.train_activations_gib == pytest.approx((kept + chunked) / GIB, abs=1e-3)
    # at one device the optimizer step's temporaries (8 B per parameter, measured) are the
    # peak either way; the forward's saving shows below it
    n = 1_235_814_400
    assert full.memory.train_step_extra_gib == pytest.approx(8 * n / GIB, abs=1e-3)
    held = full.memory.train_weights_gib + full.memory.train_grads_gib
    held += full.memory.train_optimizer_gib + full.memory.train_gathered_gib
    saved = (held + full.memory.train_activations_gib) - (held + fused.memory.train_activations_gib)
    assert saved == pytest.approx((positions * v * 20 - chunked) / GIB, abs=5e-3)
    line = next(r for r in fused.reasoning if "of which logits" in r)
    assert (
        "(use_fused_kernels: 256 of the 1024 response positions of the 2048 tokens at a time)"
        " 256 × 128256 × 20 B" in line
    )
    assert "+ head gradient 4 B × 0.26B, measured on an H100" in line


def test_the_dapo_32b_recipe_plans_its_logits_in_chunks():
    """The bundled DAPO-32B recipe turns use_fused_kernels on: its logits term falls from
    16290 response positions × 152064 × 20 B = 46.1 GiB (the largest, with the key off:
    17920 tokens per micro-batch, 20480/22528 of them responses) to a chunk's 1.45 GiB and
    the 2.9 GiB fp32 head gradient, and the planner packs more tokens per device."""
    recipe = load_recipe(find_recipe("dapo_qwen32b"))
    assert recipe.engine[f"{ARR}.model.use_fused_kernels"] is True
    fused = make_plan(plan_request(recipe))
    off = dict(recipe.engine, **{f"{ARR}.model.use_fused_kernels": False})
    full = make_plan(plan_request(dataclasses.replace(recipe, engine=off)))
    assert full.max_token_len_per_device == 17920
    positions = -(-17920 * 20480 // 22528)
    assert full.memory.train_logits_gib == pytest.approx(positions * 152064 * 20 / GIB, abs=1e-2)
    chunk = 512 * 152064 * 20 + 4 * 152064 * 5120
    assert fused.memory.train_logits_gib == pytest.approx(chunk / GIB, abs=1e-3)
    assert fused.max_token_len_per_device > full.max_token_len_per_device
    assert fused.memory.train_peak_gib < full.memory.train_peak_gib
