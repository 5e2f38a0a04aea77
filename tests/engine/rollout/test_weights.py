"""Weight sync from FSDP2 shards: buckets respect the byte limit, their union is exactly
the full state dict, and names come out as the inference engines expect.

The sharded case is real: two processes (gloo, torch.multiprocessing spawn) shard the
tiny model with engine.train.fsdp.shard_model and gather it bucket by bucket.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.rollout.weights import (
    bucketize,
    clean_name,
    full_tensors,
    fuse,
    tensor_bytes,
    unfuse,
    weight_buckets,
)

BUCKET_BYTES = 200_000  # the tiny model's embedding (2048 x 128 fp32 = 1 MiB) is larger


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gather_on_rank(rank: int, world: int, port: int, model_dir: str, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from transformers import AutoModelForCausalLM

        from engine.config import FSDPConfig
        from engine.device import DEVICES
        from engine.train.fsdp import shard_model

        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        model = shard_model(model, FSDPConfig(), DEVICES["cpu"], gradient_checkpointing=True)
        local_shapes = {n: tuple(p.to_local().shape) for n, p in model.named_parameters()}
        buckets = [
            [(n, t.clone()) for n, t in bucket]
            for bucket in weight_buckets(
                model, bucket_bytes=BUCKET_BYTES, dtype=torch.bfloat16, engine="vllm"
            )
        ]
        torch.save({"buckets": buckets, "local_shapes": local_shapes}, f"{out_dir}/rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gathered(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gathered")
    mp.spawn(
        _gather_on_rank,
        args=(2, _free_port(), str(tiny_model_dir), str(out)),
        nprocs=2,
        join=True,
    )
    return [torch.load(out / f"rank{r}.pt") for r in range(2)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}


@pytest.mark.slow
def test_parameters_really_were_sharded(gathered, reference):
    shapes = gathered[0]["local_shapes"]
    assert (
        shapes["model.embed_tokens.weight"][0]
        == reference["model.embed_tokens.weight"].shape[0] // 2
    )


@pytest.mark.slow
def test_buckets_respect_the_byte_limit(gathered):
    for rank in gathered:
        buckets = rank["buckets"]
        assert len(buckets) > 2
        for bucket in buckets:
            size = sum(tensor_bytes(t) for _, t in bucket)
            assert size <= BUCKET_BYTES or len(bucket) == 1, [n for n, _ in bucket]


@pytest.mark.slow
def test_union_of_buckets_is_the_full_state_dict(gathered, reference):
    expected = {k: v for k, v in reference.items() if k != "lm_head.weight"}  # tied
    for rank in gathered:
        names = [n for bucket in rank["buckets"] for n, _ in bucket]
        assert len(names) == len(set(names))
        got = dict(t for bucket in rank["buckets"] for t in bucket)
        assert set(got) == set(expected)
        for name, tensor in expected.items():
            assert got[name].dtype == torch.bfloat16
            assert torch.equal(got[name], tensor), name


def test_wrapper_prefixes_are_removed():
    assert (
        clean_name("model.layers.0._checkpoint_wrapped_module.self_attn.q_proj.weight")
        == "model.layers.0.self_attn.q_proj.weight"
    )
    assert clean_name("_orig_mod.model._fsdp_wrapped_module.norm.weight") == "model.norm.weight"
    assert clean_name("lm_head.weight") == "lm_head.weight"


def test_bucketize_keeps_order_and_limits():
    pairs = [
        (f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 1])
    ]
    buckets = list(bucketize(pairs, bucket_bytes=80))
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]
    with pytest.raises(ValueError):
        list(bucketize(pairs, 0))


def test_untied_lm_head_is_kept_and_buffers_dropped():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    model = Qwen2ForCausalLM(cfg)
    names = [n for n, _ in full_tensors(model)]
    assert "lm_head.weight" in names
    assert not any("inv_freq" in n for n in names)
    model.config.tie_word_embeddings = True
    assert "lm_head.weight" not in [n for n, _ in full_tensors(model)]


def test_fused_names_and_round_trip():
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    gate, up = torch.randn(6, 4), torch.randn(6, 4)
    pairs = [
        ("model.layers.0.self_attn.q_proj.weight", q),
        ("model.layers.0.self_attn.k_proj.weight", k),
        ("model.layers.0.self_attn.v_proj.weight", v),
        ("model.layers.0.self_attn.o_proj.weight", torch.randn(4, 8)),
        ("model.layers.0.mlp.gate_proj.weight", gate),
        ("model.layers.0.mlp.up_proj.weight", up),
    ]
    fused = dict(fuse(fuse(pairs, "qkv"), "gate_up"))
    assert set(fused) == {
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
    }
    qkv = fused["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv.shape == (12, 4)
    back = dict(
        unfuse("model.layers.0.self_attn.qkv_proj.weight", qkv, {"qkv_proj": [8, 2, 2]})
        + unfuse(
            "model.layers.0.mlp.gate_up_proj.weight",
            fused["model.layers.0.mlp.gate_up_proj.weight"],
            {"gate_up_proj": [6, 6]},
        )
    )
    assert torch.equal(back["model.layers.0.self_attn.k_proj.weight"], k)
    assert torch.equal(back["model.layers.0.mlp.up_proj.weight"], up)


def test_fuse_reports_missing_parts():
    with pytest.raises(ValueError, match="v_proj"):
        list(
            fuse(
                [("a.q_proj.weight", torch.zeros(1)), ("a.k_proj.weight", torch.zeros(1))],
                "qkv",
            )
        )
