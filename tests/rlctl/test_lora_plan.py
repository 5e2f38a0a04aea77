"""A recipe's ``lora:`` field, its engine keys, and what the planner makes of LoRA."""

import pytest

from rlctl.api import plan_recipe
from rlctl.errors import RlctlError
from rlctl.models import model_shape
from rlctl.planner.memory import lora_params
from rlctl.recipe.load import RecipeError, parse_recipe

# GRPO with a KL loss (a reference) on Qwen2.5-32B, short samples: memory decides the size.
QWEN32 = {
    "name": "grpo-32b",
    "algorithm": "grpo",
    "model": "Qwen/Qwen2.5-32B-Instruct",
    "data": {"prepare": "gsm8k"},
    "hardware": {"accelerators": "H100:8"},
    "engine": {
        "data.train_batch_size": 256,
        "data.max_prompt_length": 512,
        "data.max_response_length": 1024,
        "actor_rollout_ref.actor.use_kl_loss": True,
    },
}


def test_lora_sets_verls_engine_keys():
    recipe = parse_recipe({**QWEN32, "lora": {"rank": 32, "alpha": 64}})
    keys = recipe.engine_overrides()
    assert keys["actor_rollout_ref.model.lora_rank"] == 32
    assert keys["actor_rollout_ref.model.lora_alpha"] == 64
    assert "actor_rollout_ref.model.target_modules" not in keys  # the engine's all-linear
    targets = parse_recipe({**QWEN32, "lora": {"rank": 8, "target_modules": ["q_proj"]}})
    assert targets.engine_overrides()["actor_rollout_ref.model.target_modules"] == ["q_proj"]
    assert "lora:" in recipe.to_yaml()


@pytest.mark.parametrize(
    ("lora", "extra", "expected"),
    [
        ({"rank": 0}, {}, "lora.rank: expected a positive integer (8, 16, 32, 64), got 0"),
        ({"rank": -8}, {}, "lora.rank: expected a positive integer"),
        ({"alpha": 16}, {}, "lora.rank: expected a positive integer (8, 16, 32, 64), got None"),
        ({"rank": 8, "alpha": 0}, {}, "lora.alpha: expected a positive number"),
        ({"rank": 8, "target_modules": []}, {}, "lora.target_modules: expected all-linear"),
        ({"rank": 8, "target_modules": "q_proj"}, {}, "or a list of module names"),
        ({"rank": 8, "dropout": 0.1}, {}, "lora.dropout: unknown field"),
        ({"rank": 8}, {"trainer": "megatron"}, "lora: LoRA runs under the FSDP trainers only"),
    ],
)
def test_bad_lora_fields_name_the_field_and_the_fix(lora, extra, expected):
    with pytest.raises(RecipeError) as info:
        parse_recipe({**QWEN32, **extra, "lora": lora}, source="r.yaml")
    assert expected in str(info.value)


def test_adapter_size_follows_the_targets():
    m = model_shape("Qwen/Qwen2.5-32B-Instruct")
    every = lora_params(m, 32, "all-linear")
    # r × L × Σ(in + out) over q, k, v, o, gate, up, down of Qwen2.5-32B: 0.27 B
    h, kv, inner = 5120, 1024, 27648
    q, k, v, o = h + h, h + kv, h + kv, h + h
    gate, up, down = h + inner, h + inner, inner + h
    assert every == 32 * 64 * (q + k + v + o + gate + up + down)
    assert lora_params(m, 32, ("q_proj", "v_proj")) == 32 * 64 * (q + v)
    assert lora_params(m, 0, "all-linear") == 0


def test_lora_needs_far_fewer_devices_for_32b():
    full = plan_recipe(parse_recipe(QWEN32))
    lora = plan_recipe(parse_recipe({**QWEN32, "lora": {"rank": 32, "alpha": 64}}))
    assert full.num_devices == 16 and lora.num_devices == 4
    mem = lora.memory
    # Adam and gradients for 0.27 B adapter parameters over 4 devices, no reference copy.
    assert mem.train_optimizer_gib < 1 and mem.train_grads_gib < 0.5
    # weights over all devices: 4·(N + A) with LoRA and the 2 B/param the GPU proof saw
    # a LoRA update hold beside them, 4·2N (actor and reference) without
    assert mem.train_weights_gib * 4 < 0.8 * full.memory.train_weights_gib * 16
    reasoning = "\n".join(lora.reasoning)
    assert "LoRA rank 32 on all-linear" in reasoning
    assert "the reference being the actor with its adapter off" in reasoning


def test_a_saved_adapter_is_planned_as_lora(tmp_path):
    """``lora_adapter_path`` without ``lora_rank``: the engine trains the adapter, so the
    plan is LoRA's, at the adapter's rank where its folder is readable here, else at an
    assumed rank, said in the reasoning; an adapter the engine would refuse is refused."""
    import json

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    (adapter / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj"]})
    )

    def with_adapter(path, **engine):
        keys = {**QWEN32["engine"], "actor_rollout_ref.model.lora_adapter_path": str(path)}
        return plan_recipe(parse_recipe({**QWEN32, "engine": {**keys, **engine}}))

    full = plan_recipe(parse_recipe(QWEN32))
    read = with_adapter(adapter)
    assert read.num_devices < full.num_devices
    assert "LoRA rank 16 on q_proj" in "\n".join(read.reasoning)
    elsewhere = with_adapter("/on/the/cluster/adapter")
    assert elsewhere.num_devices < full.num_devices
    reasoning = "\n".join(elsewhere.reasoning)
    assert "LoRA rank 128 (assumed: the saved adapter is not readable here)" in reasoning
    with pytest.raises(RlctlError, match=r"lora_rank=8 but .* has r=16"):
        with_adapter(adapter, **{"actor_rollout_ref.model.lora_rank": 8})
