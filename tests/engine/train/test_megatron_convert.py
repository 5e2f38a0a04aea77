"""HF ↔ Megatron-core weight layouts: hand-checked shapes and orders, round trips, and
tensor-parallel slices. A forward through a real Megatron-core GPTModel runs only when
megatron-core is importable (``scripts/setup.sh`` installs it beside the venv)."""

from __future__ import annotations

import pytest
import torch

from engine.models.families import family
from engine.models.megatron_config import (
    AttentionShape,
    gpt_model_kwargs,
    transformer_config_kwargs,
)
from engine.train.megatron_convert import (
    fuse_gate_up,
    fuse_qkv,
    hf_to_megatron,
    megatron_to_hf,
    merge_from_tp,
    split_for_tp,
    split_gate_up,
    split_qkv,
)

SHAPE = AttentionShape(num_heads=4, num_kv_heads=2, head_dim=3)  # 2 query heads per group
HIDDEN = 12


def _rows(n_heads: int, tag: float) -> torch.Tensor:
    """Rows whose value says which head and row they are: tag + head + row/10."""
    return torch.tensor(
        [[tag + h + r / 10] * HIDDEN for h in range(n_heads) for r in range(SHAPE.head_dim)]
    )


def test_qkv_is_grouped_by_query_group_by_hand():
    q, k, v = _rows(4, 100.0), _rows(2, 200.0), _rows(2, 300.0)
    qkv = fuse_qkv(q, k, v, SHAPE)
    assert qkv.shape == ((4 + 2 * 2) * 3, HIDDEN)
    first_col = qkv[:, 0].tolist()
    expected = [
        # group 0: query heads 0 and 1, key head 0, value head 0
        *[100.0, 100.1, 100.2, 101.0, 101.1, 101.2, 200.0, 200.1, 200.2, 300.0, 300.1, 300.2],
        # group 1: query heads 2 and 3, key head 1, value head 1
        *[102.0, 102.1, 102.2, 103.0, 103.1, 103.2, 201.0, 201.1, 201.2, 301.0, 301.1, 301.2],
    ]
    assert first_col == pytest.approx(expected)
    back = split_qkv(qkv, SHAPE)
    for original, got in zip((q, k, v), back, strict=True):
        assert torch.equal(original, got)


def test_qkv_bias_round_trip_and_mha():
    q, k, v = torch.randn(12), torch.randn(6), torch.randn(6)
    assert [
        torch.equal(a, b)
        for a, b in zip((q, k, v), split_qkv(fuse_qkv(q, k, v, SHAPE), SHAPE), strict=True)
    ] == [True] * 3
    mha = AttentionShape(4, 4, 3)  # no GQA: q, k, v of one head per group
    q, k, v = torch.randn(12, 5), torch.randn(12, 5), torch.randn(12, 5)
    fused = fuse_qkv(q, k, v, mha)
    assert torch.equal(fused[:9], torch.cat([q[:3], k[:3], v[:3]]))
    with pytest.raises(ValueError):
        AttentionShape(5, 2, 3)
    with pytest.raises(ValueError, match="rows"):
        split_qkv(torch.zeros(7, 2), SHAPE)


def test_gate_up():
    gate, up = torch.randn(8, 4), torch.randn(8, 4)
    fc1 = fuse_gate_up(gate, up)
    assert fc1.shape == (16, 4)
    assert torch.equal(fc1[:8], gate) and torch.equal(fc1[8:], up)
    g, u = split_gate_up(fc1)
    assert torch.equal(g, gate) and torch.equal(u, up)


def _qwen_config(model_type="qwen2", tie=True, layers=2, hidden=HIDDEN, head_dim=3):
    from transformers import Qwen2Config, Qwen3Config

    cls = Qwen2Config if model_type == "qwen2" else Qwen3Config
    return cls(
        vocab_size=64,
        hidden_size=hidden,
        intermediate_size=20,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        tie_word_embeddings=tie,
        max_position_embeddings=128,
    )


@pytest.mark.parametrize(
    "model_type,tie,fused_norms",
    [("qwen2", True, True), ("qwen2", False, False), ("qwen3", False, True)],
)
def test_whole_model_round_trip(model_type, tie, fused_norms):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = _qwen_config(model_type, tie)
    model = AutoModelForCausalLM.from_config(cfg)
    hf_state = {k: v.clone() for k, v in model.state_dict().items()}
    shape = AttentionShape.of(cfg)
    assert shape == SHAPE
    names = family(model_type).weights
    mc = hf_to_megatron(
        hf_state, shape, tie_word_embeddings=tie, fused_norms=fused_norms, names=names
    )

    qkv = mc["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert qkv.shape == ((4 + 2 * 2) * 3, HIDDEN)
    assert mc["decoder.layers.1.mlp.linear_fc1.weight"].shape == (2 * 20, HIDDEN)
    assert mc["decoder.layers.1.mlp.linear_fc2.weight"].shape == (HIDDEN, 20)
    assert ("decoder.layers.0.self_attention.linear_qkv.bias" in mc) == (model_type == "qwen2")
    assert ("decoder.layers.0.self_attention.q_layernorm.weight" in mc) == (model_type == "qwen3")
    assert ("output_layer.weight" in mc) == (not tie)
    norm = (
        "decoder.layers.0.self_attention.linear_qkv.layer_norm_weight"
        if fused_norms
        else "decoder.layers.0.input_layernorm.weight"
    )
    assert torch.equal(mc[norm], hf_state["model.layers.0.input_layernorm.weight"])

    back = megatron_to_hf(mc, shape, fused_norms=fused_norms, names=names)
    expected = {k: v for k, v in hf_state.items() if not (tie and k == "lm_head.weight")}
    assert set(back) == set(expected)
    for name, tensor in expected.items():
        assert torch.equal(back[name], tensor), name


def test_unknown_names_fail_loudly():
    with pytest.raises(KeyError, match="vision"):
        hf_to_megatron({"model.vision.weight": torch.zeros(1)}, SHAPE, tie_word_embeddings=True)
    with pytest.raises(KeyError, match="q/k/v incomplete"):
        hf_to_megatron(
            {"model.layers.0.self_attn.q_proj.weight": torch.zeros(12, HIDDEN)},
            SHAPE,
            tie_word_embeddings=True,
        )


def test_tensor_parallel_slices():
    tp = 2
    qkv = fuse_qkv(_rows(4, 100.0), _rows(2, 200.0), _rows(2, 300.0), SHAPE)
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    slices = split_for_tp(name, qkv, tp)
    # Each rank holds whole query groups: rank 1 has query heads 2-3 and kv head 1.
    assert slices[1][:, 0].tolist()[:7] == pytest.approx(
        [102.0, 102.1, 102.2, 103.0, 103.1, 103.2, 201.0]
    )
    assert torch.equal(merge_from_tp(name, slices), qkv)

    gate, up = torch.randn(8, 4), torch.randn(8, 4)
    fc1_name = "decoder.layers.0.mlp.linear_fc1.weight"
    fc1_slices = split_for_tp(fc1_name, fuse_gate_up(gate, up), tp)
    assert torch.equal(fc1_slices[0], torch.cat([gate[:4], up[:4]]))  # [gate_r; up_r]
    assert torch.equal(merge_from_tp(fc1_name, fc1_slices), fuse_gate_up(gate, up))

    proj = torch.randn(HIDDEN, 12)
    proj_name = "decoder.layers.0.self_attention.linear_proj.weight"
    assert split_for_tp(proj_name, proj, tp)[0].shape == (HIDDEN, 6)  # row parallel
    norm = torch.randn(HIDDEN)
    norm_name = "decoder.final_layernorm.weight"
    assert all(torch.equal(s, norm) for s in split_for_tp(norm_name, norm, tp))
    with pytest.raises(ValueError, match="divisible"):
        split_for_tp(proj_name, torch.randn(4, 5), 2)


def test_config_translation():
    kw = transformer_config_kwargs(_qwen_config("qwen2"))
    assert kw["num_layers"] == 2
    assert kw["num_attention_heads"] == 4 and kw["num_query_groups"] == 2
    assert kw["kv_channels"] == 3
    assert kw["ffn_hidden_size"] == 20
    assert kw["add_qkv_bias"] is True and kw["qk_layernorm"] is False
    assert kw["gated_linear_unit"] is True and kw["normalization"] == "RMSNorm"
    kw3 = transformer_config_kwargs(_qwen_config("qwen3"))
    assert kw3["add_qkv_bias"] is False and kw3["qk_layernorm"] is True
    gpt = gpt_model_kwargs(_qwen_config("qwen2", tie=True))
    assert gpt["share_embeddings_and_output_weights"] is True
    assert gpt["vocab_size"] == 64 and gpt["position_embedding_type"] == "rope"

    from transformers import LlamaConfig

    llama3 = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    }
    llama = LlamaConfig(max_position_embeddings=16384, rope_scaling=llama3, rope_theta=5e5)
    kw = gpt_model_kwargs(llama)
    assert kw["rope_scaling"] is True and kw["rope_scaling_factor"] == 8.0
    assert kw["rotary_base"] == 500000
    yarn = LlamaConfig(rope_scaling={"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="yarn"):
        gpt_model_kwargs(yarn)
    with pytest.raises(ValueError, match="mlp_bias"):
        transformer_config_kwargs(LlamaConfig(mlp_bias=True))
    # Llama's attention_bias also biases o_proj: refused up front, not at the weight load
    with pytest.raises(
        ValueError, match="attention_bias=True puts a bias on the attention's output"
    ):
        transformer_config_kwargs(LlamaConfig(attention_bias=True))
    assert "add_qkv_bias" in transformer_config_kwargs(_qwen_config("qwen2"))  # q/k/v only: fine
    with pytest.raises(ValueError, match="sliding-window"):
        transformer_config_kwargs(_qwen_config("qwen2").__class__(use_sliding_window=True))

    class Other:
        model_type = "gpt2"

    with pytest.raises(ValueError, match="gpt2"):
        transformer_config_kwargs(Other())


# ---------------------------------------------------------------------------
# a real Megatron-core GPTModel at TP=1 on CPU (gloo), when megatron-core is importable


def _megatron_forward_backward(rank: int, port: int, out_path: str) -> None:
    import contextlib
    import os

    import torch.distributed as dist
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        from megatron.core import parallel_state
        from megatron.core.models.gpt import GPTModel
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker
        from megatron.core.transformer import TransformerConfig

        parallel_state.initialize_model_parallel(1, 1)
        # CPU shims: Megatron-core moves RoPE frequencies to the current CUDA device and
        # forks a CUDA RNG stream around attention dropout; neither exists on CPU.
        torch.cuda.current_device = lambda: "cpu"
        get_cuda_rng_tracker().fork = lambda *a, **k: contextlib.nullcontext()

        cfg = _qwen_config("qwen2", tie=True, hidden=32, head_dim=8)  # RoPE needs an even dim
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(cfg).eval()
        kw = transformer_config_kwargs(cfg)
        kw.pop("activation")
        config = TransformerConfig(
            **kw,
            activation_func=F.silu,
            use_cpu_initialization=True,
            params_dtype=torch.float32,
            bias_activation_fusion=False,
            bias_dropout_fusion=False,
            masked_softmax_fusion=False,
            apply_rope_fusion=False,
            persist_layer_norm=False,
            gradient_accumulation_fusion=False,
        )
        model = GPTModel(
            config=config,
            transformer_layer_spec=get_gpt_layer_local_spec(normalization="RMSNorm"),
            **gpt_model_kwargs(cfg),
        ).eval()
        shape = AttentionShape.of(cfg)
        state = hf_to_megatron(hf.state_dict(), shape, tie_word_embeddings=True, fused_norms=False)
        missing, unexpected = model.load_state_dict(state, strict=False)
        missing = [m for m in missing if not m.endswith("_extra_state")]

        ids = torch.randint(0, cfg.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
        positions = torch.arange(10).expand(2, 10)
        causal = torch.triu(torch.ones(10, 10), diagonal=1).bool()[None, None]  # True: masked
        ref = hf(input_ids=ids).logits
        out = model(input_ids=ids, position_ids=positions, attention_mask=causal)
        ref.float().logsumexp(-1).sum().backward()
        out.float().logsumexp(-1).sum().backward()
        hf_grads = {n: p.grad for n, p in hf.named_parameters() if p.grad is not None}
        mc_grads = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
        expected_grads = hf_to_megatron(
            hf_grads, shape, tie_word_embeddings=True, fused_norms=False
        )
        grad_err = max(
            (mc_grads[n] - g).abs().max().item() for n, g in expected_grads.items() if n in mc_grads
        )
        exported = megatron_to_hf(
            {k: v for k, v in model.state_dict().items() if not k.endswith("_extra_state")},
            shape,
            fused_norms=False,
        )
        export_ok = all(
            torch.equal(exported[k], v) for k, v in hf.state_dict().items() if k != "lm_head.weight"
        )
        torch.save(
            {
                "missing": missing,
                "unexpected": list(unexpected),
                "logit_err": (out - ref).abs().max().item(),
                "grad_err": grad_err,
                "grads_compared": len(set(expected_grads) & set(mc_grads)),
                "export_ok": export_ok,
            },
            out_path,
        )
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_megatron_core_forward_backward_matches_hf(tmp_path):
    pytest.importorskip(
        "megatron.core", reason="megatron-core is not installed (pip install 'rlctl[megatron]')"
    )
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "result.pt"
    mp.spawn(_megatron_forward_backward, args=(port, str(out)), nprocs=1, join=True)
    result = torch.load(out)
    assert result["missing"] == [] and result["unexpected"] == []
    assert result["logit_err"] < 1e-5
    assert result["grads_compared"] > 10
    assert result["grad_err"] < 1e-5
    assert result["export_ok"]


# ---------------------------------------------------------------------------
# mixture of experts


def _moe_config(model_type: str, **kw):
    from transformers import Qwen2MoeConfig, Qwen3MoeConfig

    cls = {"qwen2_moe": Qwen2MoeConfig, "qwen3_moe": Qwen3MoeConfig}[model_type]
    base = dict(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=12,
        moe_intermediate_size=4,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
    )
    if model_type == "qwen2_moe":
        base["shared_expert_intermediate_size"] = 6
    base.update(kw)
    return cls(**base)


@pytest.mark.parametrize("model_type", ["qwen2_moe", "qwen3_moe"])
def test_moe_names_both_ways(model_type):
    """Checkpoint names (one tensor per expert, as save_pretrained writes them) to
    Megatron's MoE layer and back; layer 1 is dense (``mlp_only_layers``)."""
    from transformers import AutoModelForCausalLM

    from engine.rollout.weights import as_checkpoint, checkpoint_reverter

    cfg = _moe_config(model_type, mlp_only_layers=[1])
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    state = dict(as_checkpoint(model.state_dict().items(), checkpoint_reverter(model)))
    state.pop("lm_head.weight", None)
    shape = AttentionShape.of(cfg)
    names = family(model_type).weights
    mc = hf_to_megatron(state, shape, tie_word_embeddings=True, fused_norms=False, names=names)
    layer0 = "decoder.layers.0.mlp."
    fc1 = mc[layer0 + "experts.local_experts.3.linear_fc1.weight"]
    assert fc1.shape == (2 * 4, 8)  # [gate; up] of expert 3
    assert torch.equal(fc1[:4], state["model.layers.0.mlp.experts.3.gate_proj.weight"])
    assert torch.equal(fc1[4:], state["model.layers.0.mlp.experts.3.up_proj.weight"])
    assert torch.equal(
        mc[layer0 + "experts.local_experts.3.linear_fc2.weight"],
        state["model.layers.0.mlp.experts.3.down_proj.weight"],
    )
    assert torch.equal(mc[layer0 + "router.weight"], state["model.layers.0.mlp.gate.weight"])
    assert "decoder.layers.1.mlp.linear_fc1.weight" in mc  # the dense layer
    assert not any(".layers.1.mlp.experts" in n for n in mc)
    if model_type == "qwen2_moe":
        assert torch.equal(
            mc[layer0 + "shared_experts.gate_weight"],
            state["model.layers.0.mlp.shared_expert_gate.weight"],
        )
        assert mc[layer0 + "shared_experts.linear_fc1.weight"].shape == (2 * 6, 8)
    back = megatron_to_hf(mc, shape, fused_norms=False, names=names)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_expert_numbering():
    from engine.train.megatron_convert import expert_index, is_expert, shift_expert

    name = "decoder.layers.5.mlp.experts.local_experts.2.linear_fc1.weight"
    assert is_expert(name) and expert_index(name) == 2
    # expert-parallel rank 1 of 2 with 8 experts holds global experts 4..7 as 0..3
    assert shift_expert(name, 4) == "decoder.layers.5.mlp.experts.local_experts.6.linear_fc1.weight"
    assert shift_expert(shift_expert(name, 4), -4) == name
    shared = "decoder.layers.5.mlp.shared_experts.linear_fc1.weight"
    assert not is_expert(shared) and shift_expert(shared, 4) == shared
    # routed experts are TP-sliced as the dense MLP: [gate_r; up_r] on each rank
    fc1 = torch.arange(8.0)[:, None].expand(8, 3)  # gate rows 0-3, up rows 4-7
    slices = split_for_tp(name, fc1, 2)
    assert [s[:, 0].tolist() for s in slices] == [[0, 1, 4, 5], [2, 3, 6, 7]]
    assert torch.equal(merge_from_tp(name, slices), fc1)


def test_moe_config_translation():
    from engine.models.megatron_config import has_shared_expert_gate, moe_layers

    qwen3 = transformer_config_kwargs(_moe_config("qwen3_moe", norm_topk_prob=True))
    assert qwen3["num_moe_experts"] == 4 and qwen3["moe_router_topk"] == 2
    assert qwen3["moe_ffn_hidden_size"] == 4 and qwen3["ffn_hidden_size"] == 12
    # softmax over the top k's logits = softmax over all, top k, renormalised
    assert qwen3["moe_router_pre_softmax"] is False
    assert qwen3["qk_layernorm"] and not qwen3["add_qkv_bias"]
    assert qwen3["moe_router_load_balancing_type"] == "none"
    assert "moe_shared_expert_intermediate_size" not in qwen3
    qwen2 = transformer_config_kwargs(_moe_config("qwen2_moe"))
    assert qwen2["moe_router_pre_softmax"] is True  # norm_topk_prob False: the full softmax
    assert qwen2["moe_shared_expert_intermediate_size"] == 6 and qwen2["add_qkv_bias"]
    assert has_shared_expert_gate(_moe_config("qwen2_moe"))
    assert not has_shared_expert_gate(_moe_config("qwen3_moe"))
    # every 2nd layer sparse, layer 3 forced dense
    cfg = _moe_config("qwen3_moe", num_hidden_layers=6, decoder_sparse_step=2, mlp_only_layers=[3])
    assert moe_layers(cfg) == [False, True, False, False, False, True]
    assert transformer_config_kwargs(cfg)["moe_layer_freq"] == [0, 1, 0, 0, 0, 1]
    # a dense model has no MoE arguments at all
    dense = transformer_config_kwargs(_moe_config("qwen3_moe", num_experts=0))
    assert "num_moe_experts" not in dense


def _deepseek_config(**kw):
    from transformers import DeepseekV3Config

    base = dict(
        vocab_size=32, hidden_size=16, intermediate_size=24, moe_intermediate_size=8,
        num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=12,
        kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=4,
        n_routed_experts=8, num_experts_per_tok=4, n_group=4, topk_group=2,
        n_shared_experts=2, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="yarn", factor=40.0, original_max_position_embeddings=16,
                          beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    )  # fmt: skip
    base.update(kw)
    return DeepseekV3Config(**base)


def test_deepseek_names_both_ways():
    """DeepSeek-V3's multi-latent attention, routing bias and shared experts: checkpoint
    names to Megatron's and back, every tensor in place."""
    from transformers import AutoModelForCausalLM

    from engine.rollout.weights import as_checkpoint, checkpoint_reverter

    cfg = _deepseek_config()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    state = dict(as_checkpoint(model.state_dict().items(), checkpoint_reverter(model)))
    shape = AttentionShape.of(cfg)
    names = family("deepseek_v3").weights
    mc = hf_to_megatron(state, shape, tie_word_embeddings=False, fused_norms=False, names=names)
    attn, hf_attn = "decoder.layers.1.self_attention.", "model.layers.1.self_attn."
    for hf_name, mc_name in [
        ("q_a_proj.weight", "linear_q_down_proj.weight"),
        ("q_a_layernorm.weight", "q_layernorm.weight"),
        ("q_b_proj.weight", "linear_q_up_proj.weight"),
        ("kv_a_proj_with_mqa.weight", "linear_kv_down_proj.weight"),  # [kv_lora + rope, h]
        ("kv_a_layernorm.weight", "kv_layernorm.weight"),
        ("kv_b_proj.weight", "linear_kv_up_proj.weight"),
    ]:
        assert torch.equal(mc[attn + mc_name], state[hf_attn + hf_name]), hf_name
    mlp = "decoder.layers.1.mlp."
    assert torch.equal(
        mc[mlp + "router.expert_bias"], state["model.layers.1.mlp.gate.e_score_correction_bias"]
    )
    assert mc[mlp + "shared_experts.linear_fc1.weight"].shape == (2 * 2 * 8, 16)  # 2 shared
    assert "decoder.layers.0.mlp.linear_fc1.weight" in mc  # first_k_dense_replace = 1
    back = megatron_to_hf(mc, shape, fused_norms=False, names=names)
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


def test_deepseek_config_translation():
    from engine.config.megatron_parallel import MegatronParallel
    from engine.models.megatron_config import conversion_problems, moe_layers

    kw = transformer_config_kwargs(_deepseek_config())
    assert kw["multi_latent_attention"] and kw["qk_layernorm"]
    assert (kw["q_lora_rank"], kw["kv_lora_rank"]) == (12, 6)
    assert (kw["qk_head_dim"], kw["qk_pos_emb_head_dim"], kw["v_head_dim"]) == (4, 2, 4)
    assert kw["rope_type"] == "yarn" and kw["rotary_scaling_factor"] == 40.0
    assert (kw["mscale"], kw["mscale_all_dim"], kw["original_max_position_embeddings"]) == (
        1.0,
        1.0,
        16,
    )
    # sigmoid scores, a fixed routing bias, 2 of 4 groups, the weights × 2.5
    assert kw["moe_router_score_function"] == "sigmoid"
    assert kw["moe_router_enable_expert_bias"] and kw["moe_router_bias_update_rate"] == 0.0
    assert (kw["moe_router_num_groups"], kw["moe_router_group_topk"]) == (4, 2)
    assert kw["moe_router_topk_scaling_factor"] == 2.5
    assert kw["num_moe_experts"] == 8 and kw["moe_shared_expert_intermediate_size"] == 2 * 8
    assert moe_layers(_deepseek_config()) == [False, True, True]
    assert "rope_scaling" not in gpt_model_kwargs(_deepseek_config())  # MLA rotates itself
    # Settings Megatron routes or rotates otherwise are refused, each named.
    assert conversion_problems(_deepseek_config()) == []
    (p,) = conversion_problems(_deepseek_config(rope_interleave=False))
    assert p.startswith("rope_interleave=False")
    (p,) = conversion_problems(_deepseek_config(norm_topk_prob=False))
    assert p.startswith("norm_topk_prob=False")
    (p,) = conversion_problems(_deepseek_config(num_experts_per_tok=6))
    assert "num_experts_per_tok 6 // topk_group 2 must be 2" in p
    # TP with MLA needs sequence parallelism (the whole down projections).
    (p,) = MegatronParallel(2).model_problems(_deepseek_config())
    assert "multi-latent attention (deepseek_v3) needs" in p and "sequence_parallel=true" in p
    assert MegatronParallel(2, sequence_parallel=True).model_problems(_deepseek_config()) == []
