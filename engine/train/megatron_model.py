"""Megatron's GPT model built from a Hugging Face config, its weights loaded from HF
checkpoints and renamed back to HF names (``megatron_weights`` gathers them from a
running engine, ``megatron_checkpoint`` from a saved checkpoint)."""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engine.config.megatron_parallel import MegatronParallel, pipeline_stage_layers
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.models.families import family
from engine.models.megatron_config import (
    AttentionShape,
    gpt_model_kwargs,
    has_shared_expert_gate,
    is_mla,
    moe_layers,
    num_experts,
    transformer_config_kwargs,
)
from engine.train.megatron_convert import (
    expert_index,
    hf_to_megatron,
    is_expert,
    megatron_to_hf_pairs,
    shift_expert,
    split_for_tp,
    tp_split_dim,
)
from engine.train.megatron_modules import SDPAttention, TorchRMSNorm, ValueHead, duplicated_linear
from engine.train.megatron_pipeline import Stage, shift_layer

VALUE_HEAD = {"output_layer.weight": "score.weight", "output_layer.bias": "score.bias"}


# The local layer spec names its norms separately (not fused into the next linear).
FUSED_NORMS = False


# ---------------------------------------------------------------------------
# building blocks


def load_hf_state_dict(model_path: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face folder's safetensors (or ``pytorch_model*.bin``)."""
    folder = Path(model_path)
    files = sorted(folder.glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    if files:
        from safetensors.torch import load_file

        for file in files:
            state.update(load_file(file))
        return state
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if not bins:
        raise EngineError(f"{folder} has no *.safetensors or pytorch_model*.bin weights")
    for file in bins:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def build_gpt(
    hf_config: Any,
    parallel: MegatronParallel,
    stage: Stage,
    device: DeviceSpec,
    dtype: torch.dtype,
    role: str,
    recompute: bool,
    routing_replay: bool = False,
) -> nn.Module:
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    config = _transformer_config(
        hf_config, parallel, stage, device, dtype, recompute, routing_replay
    )
    moe = moe_layers(hf_config)[stage.layer_offset : stage.layer_offset + stage.layers]
    specs = [_layer_spec(hf_config, config.qk_layernorm, is_moe) for is_moe in moe]
    gpt_kw = gpt_model_kwargs(hf_config)
    if role == "critic":
        gpt_kw["share_embeddings_and_output_weights"] = False
    # With tied embeddings over several stages GPTModel moves the last stage's copy to
    # CUDA to all-reduce it with the first's (``weight.data.cuda()``); on CPU it stays.
    keep_on_cpu = device.type == "cpu" and stage.count > 1
    # The stage's layers and the final norm, given as a block so that the final norm is
    # ours too (the block's default is the wrapper that refuses sequence parallelism).
    block = TransformerBlockSubmodules(layer_specs=specs, layer_norm=TorchRMSNorm)
    with _tensor_cuda_is_identity() if keep_on_cpu else contextlib.nullcontext():
        model = GPTModel(
            config=config,
            transformer_layer_spec=block,
            pre_process=stage.first,
            post_process=stage.last,
            **gpt_kw,
        )
    first_layer = model.decoder.layers[0].layer_number - 1  # Megatron numbers from 1
    if first_layer != stage.layer_offset:
        raise EngineError(
            f"Megatron places pipeline stage {stage.index}'s layers from {first_layer}; the"
            f" engine expects {stage.layer_offset} (megatron_parallel.pipeline_stage_layers)"
        )
    if parallel.experts_apart:
        _reduce_experts_over_their_grid(model)
    if role == "critic" and stage.last:
        model.output_layer = ValueHead(
            hf_config.hidden_size, dtype, torch.device("cpu"), config.sequence_parallel
        )
    # Modules Megatron does not place itself (torch norms, the value head) come along.
    return model.to(device.torch_device())


def _transformer_config(
    hf_config: Any,
    parallel: MegatronParallel,
    stage: Stage,
    device: DeviceSpec,
    dtype: torch.dtype,
    recompute: bool,
    routing_replay: bool,
) -> Any:
    """Megatron-core's TransformerConfig (MLA's for DeepSeek-style attention) for the
    model, its parallel layout and this stage."""
    from megatron.core.transformer import TransformerConfig

    kw = transformer_config_kwargs(hf_config)
    kw.pop("activation")  # "silu"
    if recompute:
        kw.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if routing_replay:  # each TopKRouter holds a RouterReplay (engine.train.megatron_routing)
        kw["moe_enable_routing_replay"] = True
    if len(set(stage.stage_layers)) > 1:  # uneven: the last stage holds fewer
        kw["num_layers_in_last_pipeline_stage"] = stage.stage_layers[-1]
    config_class = TransformerConfig
    if kw.get("multi_latent_attention"):
        from megatron.core.transformer.transformer_config import MLATransformerConfig

        config_class = MLATransformerConfig
    if _shared_expert_gate_in_config():
        kw["moe_shared_expert_gate"] = has_shared_expert_gate(hf_config)
    config = config_class(
        **kw,
        activation_func=F.silu,
        tensor_model_parallel_size=parallel.tensor_model_parallel_size,
        pipeline_model_parallel_size=parallel.pipeline_model_parallel_size,
        context_parallel_size=parallel.context_parallel_size,
        expert_model_parallel_size=parallel.expert_model_parallel_size,
        # The all-to-all exchange needs CUDA streams; the all-gather one runs anywhere.
        moe_token_dispatcher_type="alltoall"
        if device.type != "cpu" and parallel.expert_model_parallel_size > 1
        else "allgather",
        sequence_parallel=parallel.sequence_parallel_in_effect,
        params_dtype=dtype,
        pipeline_dtype=dtype,  # what travels between stages
        bf16=dtype == torch.bfloat16,
        use_cpu_initialization=device.type == "cpu",
        # Every weight is loaded next, but only the initialisers mark TP-split weights
        # (``tensor_model_parallel``), which the gradient norm needs to count them right.
        perform_initialization=True,
        gradient_accumulation_fusion=False,
    )
    return config


def _reduce_experts_over_their_grid(model: nn.Module) -> None:
    """Mark the routed experts' weights as Megatron-core's DDP and optimizer know expert
    weights (``allreduce`` False: gradients reduced over the expert-data-parallel group,
    norms over ETP × EP × PP, the first weights broadcast over it). Megatron marks them so
    only under expert parallelism; with ETP ≠ TP at EP 1 too, the ranks holding one slice
    are that group and not the dense data-parallel one (TP 2, ETP 1: a gradient would miss
    the other TP rank's half of the sequence; TP 1, ETP 2: DDP's first broadcast would
    copy one slice over the other; both seen in ``test_moe_actor_engine_matches_hf``)."""
    for name, param in model.named_parameters():
        if is_expert(name):
            param.allreduce = False


def _layer_spec(hf_config: Any, qk_layernorm: bool, moe: bool) -> Any:
    """Megatron-core's local layer spec (a dense MLP, or experts run one after another:
    ``SequentialMLP``, no grouped GEMM) with our attention core and norms."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    mla = is_mla(hf_config)
    spec = get_gpt_layer_local_spec(
        num_experts=num_experts(hf_config) if moe else None,
        moe_grouped_gemm=False,
        qk_layernorm=qk_layernorm,
        multi_latent_attention=mla,
        normalization="RMSNorm",
    )
    layer = spec.submodules
    attention = layer.self_attention.submodules
    attention.core_attention = SDPAttention
    layer.input_layernorm = layer.pre_mlp_layernorm = TorchRMSNorm
    if mla:  # the low-rank query's and key/value's norms; whole down projections
        attention.q_layernorm = attention.kv_layernorm = TorchRMSNorm
        attention.linear_q_down_proj = attention.linear_kv_down_proj = duplicated_linear()
    elif qk_layernorm:  # Qwen3; per head, after the (gathered) qkv projection
        attention.q_layernorm = attention.k_layernorm = TorchRMSNorm
    if moe:
        layer.mlp.module = _moe_layer_class()
        if not _shared_expert_gate_in_config():  # megatron-core 0.14: the spec's param
            shared = layer.mlp.submodules.shared_experts
            shared.params = {**shared.params, "gate": has_shared_expert_gate(hf_config)}
    return spec


def _shared_expert_gate_in_config() -> bool:
    """Whether Qwen2-MoE's shared-expert gate is set in the TransformerConfig. Megatron-core
    0.14 takes it as the shared-expert spec's ``gate`` param; 0.16 has a config field,
    ``moe_shared_expert_gate``, that ``MoELayer`` passes as ``gate`` itself (a ``gate``
    param in the spec too is then a TypeError: "got multiple values")."""
    from megatron.core.transformer import TransformerConfig

    return any(f.name == "moe_shared_expert_gate" for f in fields(TransformerConfig))


@functools.cache
def _moe_layer_class() -> type:
    """Megatron-core's ``MoELayer``, keeping its own copy of the gathered tokens.

    The all-gather token exchange gathers into Megatron's global "mpu" buffer, and the
    shared expert, which runs between the exchange and the routed experts, gathers its
    sequence-parallel input into the same buffer: with expert parallelism the routed
    experts then read the shared expert's tokens in place of the first ranks' (seen on
    Megatron-core 0.14 with the local spec; Transformer Engine's linears do their own
    gathers). A copy of the exchanged tokens costs one activation of the MoE input."""
    from megatron.core.transformer.moe.moe_layer import MoELayer

    class MoELayerOwnTokens(MoELayer):
        def dispatch(self, hidden_states: torch.Tensor, probs: torch.Tensor):
            hidden_states, probs = super().dispatch(hidden_states, probs)
            if self.use_shared_expert and self.config.moe_token_dispatcher_type == "allgather":
                hidden_states = hidden_states.clone()
            return hidden_states, probs

    return MoELayerOwnTokens


@contextlib.contextmanager
def _tensor_cuda_is_identity() -> Iterator[None]:
    cuda = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *a, **k: self  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.Tensor.cuda = cuda  # type: ignore[method-assign]


def local_stage(hf_config: Any) -> Stage:
    """The pipeline stage this rank holds (parallel state initialised)."""
    from megatron.core import parallel_state as ps

    group = ps.get_pipeline_model_parallel_group()
    stages = ps.get_pipeline_model_parallel_world_size()
    layers = pipeline_stage_layers(hf_config.num_hidden_layers, stages)
    if layers is None:  # MegatronParallel.model_problems refuses this before the build
        raise EngineError(f"{hf_config.num_hidden_layers} layers cannot form {stages} stages")
    return Stage.of(
        ps.get_pipeline_model_parallel_rank(), layers, dist.get_process_group_ranks(group)
    )


def local_experts(hf_config: Any) -> range:
    """The routed experts this rank holds, by their numbers in the whole model: E/EP of
    them from ``ep_rank`` · E/EP (empty for a dense model; parallel state initialised)."""
    from megatron.core import parallel_state as ps

    per_rank = num_experts(hf_config) // ps.get_expert_model_parallel_world_size()
    first = ps.get_expert_model_parallel_rank() * per_rank
    return range(first, first + per_rank)


def load_hf_weights(
    model: nn.Module,
    hf_state: dict[str, torch.Tensor],
    hf_config: Any,
    stage: Stage,
    role: str,
    seed: int,
) -> None:
    """This rank's share of the HF weights into ``model``: its pipeline stage's
    tensors, its TP slices."""
    from megatron.core import parallel_state as ps

    tp = ps.get_tensor_model_parallel_world_size()
    tp_rank = ps.get_tensor_model_parallel_rank()
    etp = ps.get_expert_tensor_parallel_world_size()
    etp_rank = ps.get_expert_tensor_parallel_rank()
    experts = local_experts(hf_config)

    def share(name: str, tensor: torch.Tensor) -> torch.Tensor:  # this rank's slice
        slices = split_size(name, role, tp, etp)
        if slices == 1:
            return tensor
        return split_for_tp(name, tensor, slices)[etp_rank if is_expert(name) else tp_rank]

    def held(name: str) -> bool:  # this stage's, and this expert-parallel rank's experts
        return stage.holds(name) and (not is_expert(name) or expert_index(name) in experts)

    head = {k: v for k, v in hf_state.items() if k.startswith("score.")}
    body = {
        k: v
        for k, v in hf_state.items()
        if not k.startswith("score.")
        and not (role == "critic" and k == "lm_head.weight")
        and not _beyond_the_model(k, hf_config)
    }
    tied = bool(hf_config.tie_word_embeddings) or role == "critic"
    full = hf_to_megatron(
        body,
        AttentionShape.of(hf_config),
        tie_word_embeddings=tied,
        fused_norms=FUSED_NORMS,
        names=family(hf_config.model_type).weights,
    )
    if role == "critic":
        full.update(_value_head_state(head, hf_config, seed))
    elif tied and stage.count > 1:  # the last stage's copy of the embeddings
        full["output_layer.weight"] = full["embedding.word_embeddings.weight"]
    mine = {
        shift_expert(shift_layer(name, -stage.layer_offset), -experts.start): share(name, t)
        for name, t in full.items()
        if held(name)
    }
    params = dict(checkpoint_weights(model))
    missing = sorted(set(params) - set(mine))
    unexpected = sorted(set(mine) - set(params))
    if missing or unexpected:
        raise EngineError(
            f"Hugging Face weights do not fit the Megatron model: missing {missing[:5]},"
            f" unexpected {unexpected[:5]}"
        )
    with torch.no_grad():
        for name, tensor in mine.items():
            if params[name].shape != tensor.shape:
                raise EngineError(
                    f"{name}: Hugging Face gives {tuple(tensor.shape)}, the Megatron model"
                    f" expects {tuple(params[name].shape)}"
                )
            params[name].copy_(tensor)


def _value_head_state(head: dict[str, torch.Tensor], hf_config: Any, seed: int) -> dict:
    """The critic's head from a token-classification checkpoint, or a new one drawn as HF
    draws it (normal(0, initializer_range), bias 0) from ``seed`` (same on every rank)."""
    if "score.weight" in head:
        weight = head["score.weight"]
        if weight.shape[0] != 1:
            raise EngineError(f"score.weight has {weight.shape[0]} outputs; a critic has 1")
        bias = head.get("score.bias", torch.zeros(1))
        return {"output_layer.weight": weight, "output_layer.bias": bias}
    generator = torch.Generator().manual_seed(seed)
    std = float(getattr(hf_config, "initializer_range", 0.02))
    weight = torch.randn(1, hf_config.hidden_size, generator=generator) * std
    return {"output_layer.weight": weight, "output_layer.bias": torch.zeros(1)}


def wrap_ddp(model: nn.Module, parallel: MegatronParallel, device: DeviceSpec) -> nn.Module:
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,  # reduce once, at optimizer_step
        # The CPU fallback optimizer needs every gradient on every rank.
        use_distributed_optimizer=parallel.use_distributed_optimizer and device.type != "cpu",
    )
    ddp = DistributedDataParallel(model.config, ddp_config, model)
    ddp.broadcast_params()  # the same start on every DP rank, whatever happened before
    return ddp


def full_shape(name: str, shape: torch.Size, slices: int) -> tuple[int, ...]:
    """The shape of the full tensor of one of ``slices`` slices of ``shape``."""
    full = list(shape)
    if slices > 1:
        full[tp_split_dim(name)] *= slices
    return tuple(full)


def split_size(name: str, role: str, tp: int, etp: int) -> int:
    """How many ranks hold slices of ``name``: ETP for a routed expert's weights (Megatron's
    expert tensor parallelism; the shared experts split like the dense MLP), TP for the
    other split weights, 1 for a replicated one."""
    if not is_tp_split(name, role):
        return 1
    return etp if is_expert(name) else tp


def is_tp_split(name: str, role: str) -> bool:
    """Whether this rank holds a TP slice of ``name`` (the critic's head is replicated)."""
    if role == "critic" and name in VALUE_HEAD:
        return False
    return tp_split_dim(name) is not None


def checkpoint_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters, and the one buffer that is a checkpoint's weight too: DeepSeek's
    per-expert routing bias (``router.expert_bias``, fixed here, as in HF's forward)."""
    yield from model.named_parameters()
    for name, buffer in model.named_buffers():
        if name.endswith("router.expert_bias"):
            yield name, buffer


def _beyond_the_model(name: str, hf_config: Any) -> bool:
    """DeepSeek-V3 checkpoints hold their multi-token-prediction modules as layers after
    the last (``num_nextn_predict_layers``); the causal LM, HF's too, leaves them out."""
    match = re.match(r"model\.layers\.(\d+)\.", name)
    return match is not None and int(match.group(1)) >= hf_config.num_hidden_layers


def to_hf_pairs(
    pairs: Iterator[tuple[str, torch.Tensor]], hf_config: Any, role: str
) -> Iterator[tuple[str, torch.Tensor]]:
    """Full Megatron pairs as HF pairs; the critic's head as ``score.*``."""

    def body() -> Iterator[tuple[str, torch.Tensor]]:
        for name, tensor in pairs:
            if role == "critic" and name in VALUE_HEAD:
                head.append((VALUE_HEAD[name], tensor))
            else:
                yield name, tensor

    head: list[tuple[str, torch.Tensor]] = []
    yield from megatron_to_hf_pairs(
        body(),
        AttentionShape.of(hf_config),
        fused_norms=FUSED_NORMS,
        names=family(hf_config.model_type).weights,
    )
    yield from head
