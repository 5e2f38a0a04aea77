"""Mixture-of-experts weights under checkpoint names: transformers 5 keeps the experts
fused in memory ([E, 2I, H] ``gate_up_proj``, [E, H, I] ``down_proj``) but
``save_pretrained`` (and vLLM/SGLang ``load_weights``) name one tensor per expert. The
tensors handed to engines must be exactly what ``save_pretrained`` writes, and the HF
rollout must take them back into its fused parameters.

Tiny models built from a config (no hub): hidden 32, 2 layers, 4 experts, top-2.
"""

from __future__ import annotations

import os
import re
import socket
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file

from engine.rollout.hf import HFRollout
from engine.rollout.weights import ENGINE_NAME_MAPS, bucketize, checkpoint_reverter, full_tensors

transformers = pytest.importorskip("transformers")
# transformers 4 keeps one module per expert: in-memory names are the checkpoint's.
pytest.importorskip("transformers.core_model_loading")

COMMON = dict(
    vocab_size=96,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def qwen3_moe(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.Qwen3MoeConfig(
        **COMMON,
        head_dim=8,
        intermediate_size=48,
        moe_intermediate_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        **overrides,
    )
    return transformers.Qwen3MoeForCausalLM(cfg).eval()


def qwen2_moe(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2MoeConfig(
        **COMMON,
        intermediate_size=48,
        moe_intermediate_size=16,
        shared_expert_intermediate_size=24,
        num_experts=4,
        num_experts_per_tok=2,
        **overrides,
    )
    return transformers.Qwen2MoeForCausalLM(cfg).eval()


def mixtral(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.MixtralConfig(
        **COMMON, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2, **overrides
    )
    return transformers.MixtralForCausalLM(cfg).eval()


def qwen2_dense(seed: int = 0, **overrides):
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(**COMMON, intermediate_size=48, **overrides)
    return transformers.Qwen2ForCausalLM(cfg).eval()


MOE = {"qwen3_moe": qwen3_moe, "qwen2_moe": qwen2_moe, "mixtral": mixtral}


def saved(model, tmp_path) -> dict[str, torch.Tensor]:
    model.save_pretrained(tmp_path, safe_serialization=True)
    return load_file(tmp_path / "model.safetensors")


def rollout(model) -> HFRollout:
    tokenizer = SimpleNamespace(eos_token_id=1, pad_token_id=0)
    return HFRollout(model, tokenizer, torch.device("cpu"))


# ----------------------------------------------------------------------------- (a)


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("arch", sorted(MOE))
def test_tensors_are_what_save_pretrained_writes(arch, tied, tmp_path):
    model = MOE[arch](tie_word_embeddings=tied)
    expected = saved(model, tmp_path)
    pairs = list(full_tensors(model))
    names = [n for n, _ in pairs]
    assert len(names) == len(set(names))
    assert set(names) == set(expected)
    for name, tensor in pairs:
        assert tensor.shape == expected[name].shape, name
        assert torch.equal(tensor, expected[name]), name
    # One tensor per expert, each a view of the fused parameter (no copy).
    prefix = "block_sparse_moe" if arch == "mixtral" else "mlp"
    gate = "w1" if arch == "mixtral" else "gate_proj"
    fused = model.model.layers[1].mlp.experts.gate_up_proj
    got = dict(pairs)[f"model.layers.1.{prefix}.experts.3.{gate}.weight"]
    assert got.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()


def test_experts_come_expert_by_expert_and_cast():
    model = qwen3_moe()
    names = [n for n, _ in full_tensors(model) if ".layers.0.mlp.experts." in n]
    assert names[:4] == [
        "model.layers.0.mlp.experts.0.gate_proj.weight",
        "model.layers.0.mlp.experts.0.up_proj.weight",
        "model.layers.0.mlp.experts.1.gate_proj.weight",
        "model.layers.0.mlp.experts.1.up_proj.weight",
    ]
    fused = model.model.layers[0].mlp.experts
    got = dict(full_tensors(model, dtype=torch.bfloat16))
    up = got["model.layers.0.mlp.experts.2.up_proj.weight"]
    assert up.dtype == torch.bfloat16 and up.shape == (16, 32)
    assert torch.equal(up, fused.gate_up_proj[2, 16:].to(torch.bfloat16))
    down = got["model.layers.0.mlp.experts.2.down_proj.weight"]
    assert torch.equal(down, fused.down_proj[2].to(torch.bfloat16))


def test_fused_name_map_fuses_each_experts_gate_and_up():
    model = qwen2_moe()
    got = dict(full_tensors(model, name_map=ENGINE_NAME_MAPS["fused"]))
    experts = model.model.layers[1].mlp.experts
    for j in range(4):
        fused = got[f"model.layers.1.mlp.experts.{j}.gate_up_proj.weight"]
        assert torch.equal(fused, experts.gate_up_proj[j])
        assert f"model.layers.1.mlp.experts.{j}.gate_proj.weight" not in got
    shared = model.model.layers[1].mlp.shared_expert
    assert torch.equal(
        got["model.layers.1.mlp.shared_expert.gate_up_proj.weight"],
        torch.cat([shared.gate_proj.weight, shared.up_proj.weight]),
    )
    assert got["model.layers.1.self_attn.qkv_proj.weight"].shape == (32 + 16 + 16, 32)


def test_buckets_hold_expert_slices():
    model = qwen3_moe()
    slice_bytes = 16 * 32 * 4
    buckets = list(bucketize(full_tensors(model), bucket_bytes=3 * slice_bytes))
    for bucket in buckets:
        assert sum(t.numel() * t.element_size() for _, t in bucket) <= 3 * slice_bytes or (
            len(bucket) == 1
        )
    assert not any(n.endswith("experts.gate_up_proj") for b in buckets for n, _ in b)


# ----------------------------------------------------------------------------- (b)


def _logits(model, input_ids):
    with torch.no_grad():
        return model(input_ids=input_ids).logits


@pytest.mark.parametrize("arch", sorted(MOE))
def test_sync_round_trip_gives_the_same_logits(arch):
    source, target = MOE[arch](seed=0), MOE[arch](seed=1)
    input_ids = torch.randint(2, 96, (3, 10), generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(_logits(source, input_ids), _logits(target, input_ids))
    rollout(target).sync_weights(full_tensors(source, name_map=ENGINE_NAME_MAPS["hf"]))
    torch.testing.assert_close(_logits(target, input_ids), _logits(source, input_ids))
    for (name, a), (_, b) in zip(
        source.state_dict().items(), target.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name


def test_sync_takes_slices_one_expert_at_a_time_in_any_order():
    source, target = qwen2_moe(seed=0), qwen2_moe(seed=1)
    pairs = list(full_tensors(source))
    rollout(target).sync_weights(reversed([(n, t.clone()) for n, t in pairs]))
    assert torch.equal(
        target.model.layers[0].mlp.experts.gate_up_proj,
        source.model.layers[0].mlp.experts.gate_up_proj,
    )


# ----------------------------------------------------------------------------- (c)


def test_a_missing_expert_slice_names_the_stale_parameter():
    source, target = qwen3_moe(seed=0), qwen3_moe(seed=1)
    dropped = "model.layers.1.mlp.experts.2.up_proj.weight"
    pairs = [(n, t) for n, t in full_tensors(source) if n != dropped]
    with pytest.raises(KeyError, match=r"model\.layers\.1\.mlp\.experts\.gate_up_proj") as err:
        rollout(target).sync_weights(pairs)
    assert dropped in str(err.value)


def test_unknown_and_in_memory_names_are_refused():
    source, target = qwen3_moe(seed=0), qwen3_moe(seed=1)
    # The protocol is checkpoint names: the fused in-memory name is not one.
    fused = (
        "model.layers.0.mlp.experts.gate_up_proj",
        source.state_dict()["model.layers.0.mlp.experts.gate_up_proj"],
    )
    with pytest.raises(
        KeyError, match=re.escape("no parameter 'model.layers.0.mlp.experts.gate_up_proj'")
    ):
        rollout(target).sync_weights([fused])
    with pytest.raises(KeyError, match=r"experts\.4\.gate_proj"):
        rollout(target).sync_weights(
            [("model.layers.0.mlp.experts.4.gate_proj.weight", torch.zeros(16, 32))]
        )


# ----------------------------------------------------------------------------- (d)


def test_dense_model_is_handed_on_unchanged(tmp_path):
    model = qwen2_dense(tie_word_embeddings=False)
    assert checkpoint_reverter(model) is None
    state = model.state_dict()
    pairs = list(full_tensors(model))
    assert [n for n, _ in pairs] == [n for n in state if "inv_freq" not in n]
    assert all(t is state[n] or t.data_ptr() == state[n].data_ptr() for n, t in pairs)
    expected = saved(model, tmp_path)
    assert set(dict(pairs)) == set(expected)
    assert all(torch.equal(t, expected[n]) for n, t in pairs)


def test_dense_sync_is_unchanged():
    source, target = qwen2_dense(seed=0), qwen2_dense(seed=1)
    pairs = list(full_tensors(source))
    rollout(target).sync_weights(pairs)
    for (name, a), (_, b) in zip(
        source.state_dict().items(), target.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    with pytest.raises(KeyError) as err:
        rollout(target).sync_weights([(n, t) for n, t in pairs if n != "model.norm.weight"])
    assert err.value.args[0] == "weight sync left rollout parameters stale: ['model.norm.weight']"


# ------------------------------------------------------------------ FSDP2, 2 ranks (gloo)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_moe_on_rank(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from engine.config import FSDPConfig
        from engine.device import DEVICES
        from engine.train.fsdp import shard_model

        model = shard_model(qwen3_moe(), FSDPConfig(), DEVICES["cpu"], gradient_checkpointing=True)
        local = model.model.layers[0].mlp.experts.gate_up_proj.to_local().shape
        pairs = [(n, t.clone()) for n, t in full_tensors(model, dtype=torch.bfloat16)]
        torch.save({"pairs": pairs, "local": tuple(local)}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_fsdp_sharded_experts_are_gathered_and_split(tmp_path):
    mp.spawn(_gather_moe_on_rank, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    expected = {n: t.to(torch.bfloat16) for n, t in saved(qwen3_moe(), tmp_path / "hf").items()}
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["local"] == (2, 32, 32)  # 4 experts sharded over 2 ranks
        names = [n for n, _ in got["pairs"]]
        assert len(names) == len(set(names))
        assert set(names) == set(expected)
        for name, tensor in got["pairs"]:
            assert torch.equal(tensor, expected[name]), name
