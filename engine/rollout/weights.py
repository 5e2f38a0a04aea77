"""Weights from the FSDP2-sharded actor to a colocated inference engine, bucket by bucket.

After each actor update the rollout engine needs the new weights. Gathering the whole
model on every rank at once would cost a full copy of it on each device; instead the
state dict is walked parameter by parameter (``DTensor.full_tensor()`` is one
all-gather, and every rank takes part in the same order), cast to the rollout dtype,
and handed over in buckets of at most ``bucket_bytes``: the peak extra memory is one
bucket (plus one tensor when a single tensor is larger than the limit).

Names. Both engines load Hugging Face *checkpoint* names (what ``save_pretrained`` writes)
through the model's own ``load_weights``, which does its own fusing:

=========  ===========================================  ===================================
engine     what it is handed                            what it does with it
=========  ===========================================  ===================================
vLLM       HF names (``model.layers.0.self_attn.q_proj  ``load_weights`` stacks q/k/v into
           .weight``), unfused; MoE experts one tensor  ``qkv_proj`` and gate/up into
           per expert (below)                           ``gate_up_proj`` (its
                                                        ``stacked_params_mapping``), the
                                                        experts into its fused MoE, and
                                                        shards for tensor parallelism
SGLang     the same HF names, unfused                   the same, in
                                                        ``update_weights_from_tensor``
hf         the same HF names, unfused                   ``HFRollout.sync_weights`` copies
                                                        them in, expert slices into the
                                                        fused experts parameters
fused      ``...self_attn.qkv_proj.weight`` and         for a consumer that writes
(option)   ``...mlp.gate_up_proj.weight`` (concatenated parameters directly (vLLM's
           along dim 0: q, k, v; gate, up), per expert  internal parameter names)
           ``...experts.{j}.gate_up_proj.weight``
=========  ===========================================  ===================================

Experts. transformers 5 keeps the experts of a mixture-of-experts model fused in memory
(Qwen2-MoE, Qwen3-MoE, Mixtral, DeepSeek-V3, ...): ``mlp.experts.gate_up_proj`` [E, 2I, H]
and ``mlp.experts.down_proj`` [E, H, I]. Its checkpoints, and the engines, name one tensor
per expert: ``mlp.experts.{j}.gate_proj.weight`` [I, H] is ``gate_up_proj[j, :I]``,
``up_proj`` is ``gate_up_proj[j, I:]``, ``down_proj`` is ``down_proj[j]`` (Mixtral:
``block_sparse_moe.experts.{j}.w1``/``w3``/``w2`` and ``block_sparse_moe.gate``). Which
names a tensor gets is transformers' own answer (``revert_weight_conversion``, the step
``save_pretrained`` takes), asked one tensor at a time; a fused experts tensor is gathered
once and its 2E (or E) per-expert slices handed on as views of it, with no copy. Any other
conversion transformers applies on save (a rename, a transpose) is taken from it as is.
A model with nothing to convert (dense models; transformers 4, which keeps experts as one
module each) is handed on exactly as its state dict names it.

What is dropped: the wrapper prefixes that activation checkpointing, FSDP1 or
``torch.compile`` insert (``_checkpoint_wrapped_module.``, ``_fsdp_wrapped_module.``,
``_orig_mod.``), ``lm_head.weight`` when the embeddings are tied (the engine ties it to
``embed_tokens`` itself; sending it would be a second gather of the largest tensor),
and rotary ``inv_freq`` buffers, which the engines compute.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024

NamedTensor = tuple[str, torch.Tensor]
# transformers' save-time conversion of some in-memory tensors to checkpoint tensors.
Reverter = Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]


@dataclass(frozen=True)
class NameMap:
    """How one engine wants the training model's names."""

    skip_tied_lm_head: bool = True
    fuse_qkv: bool = False
    fuse_gate_up: bool = False


# The engines' load_weights take unfused HF names (see the module docstring).
ENGINE_NAME_MAPS = {
    "hf": NameMap(),  # the HF rollout's own copy (a Megatron actor's): plain HF names
    "vllm": NameMap(),
    "sglang": NameMap(),
    "fused": NameMap(fuse_qkv=True, fuse_gate_up=True),
}

_FUSED = {
    "qkv": (("q_proj", "k_proj", "v_proj"), "qkv_proj"),
    "gate_up": (("gate_proj", "up_proj"), "gate_up_proj"),
}


def clean_name(name: str) -> str:
    """The HF name of a parameter, without the wrappers training put around modules."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def ties_embeddings(model: nn.Module) -> bool:
    config = getattr(model, "config", None)
    text_config = getattr(config, "get_text_config", None)
    if callable(text_config):
        config = text_config()
    return bool(getattr(config, "tie_word_embeddings", False))


def tensor_bytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


def whole_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor from a DTensor shard (a collective: every rank must call it)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def full_tensors(
    model: nn.Module,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    name_map: NameMap | None = None,
) -> Iterator[NamedTensor]:
    """``(engine name, full tensor)`` for each weight the engine needs, one gather at a
    time, in the state dict's order (identical on every rank, as the gathers require),
    under checkpoint names (a fused experts tensor as its per-expert slices)."""
    name_map = name_map or NameMap()
    skip_lm_head = name_map.skip_tied_lm_head and ties_embeddings(model)
    pairs: Iterable[NamedTensor] = (
        (name, tensor)
        for name, tensor in model.state_dict().items()
        if not skipped_weight(name, skip_lm_head)
    )
    gathered = _gathered(pairs, dtype, device)
    yield from as_engine_names(as_checkpoint(gathered, checkpoint_reverter(model)), name_map)


def as_engine_names(pairs: Iterable[NamedTensor], name_map: NameMap) -> Iterator[NamedTensor]:
    """Full HF-named tensors (already gathered: FSDP's above, or the Megatron engine's
    ``hf_named_tensors``) fused as ``name_map`` asks."""
    if name_map.fuse_qkv:
        pairs = fuse(pairs, "qkv")
    if name_map.fuse_gate_up:
        pairs = fuse(pairs, "gate_up")
    yield from pairs


def skipped_weight(raw_name: str, skip_lm_head: bool) -> bool:
    name = clean_name(raw_name)
    if name.endswith("rotary_emb.inv_freq") or name.endswith("rotary_emb.original_inv_freq"):
        return True
    return skip_lm_head and name == "lm_head.weight"


def _gathered(
    pairs: Iterable[NamedTensor], dtype: torch.dtype | None, device: torch.device | str | None
) -> Iterator[NamedTensor]:
    for raw_name, tensor in pairs:
        shard = tensor.detach()
        # Cast and move the local shard before the gather: half the traffic for bf16, and
        # CPU-offloaded shards reach the device whose collective backend gathers them.
        if dtype is not None and shard.is_floating_point():
            shard = shard.to(dtype)
        if device is not None:
            shard = shard.to(device)
        full = whole_tensor(shard)
        yield clean_name(raw_name), full


def checkpoint_reverter(model: nn.Module) -> Reverter | None:
    """transformers' conversion of ``model``'s in-memory tensors to checkpoint tensors
    (``revert_weight_conversion``, as ``save_pretrained`` applies it), or None where the
    names are the same: transformers 4, a model it converts nothing for, or a module that
    is not a ``PreTrainedModel``."""
    try:
        from transformers import PreTrainedModel
        from transformers.core_model_loading import revert_weight_conversion
    except ImportError:  # transformers 4: in-memory names are the checkpoint's
        return None
    if not isinstance(model, PreTrainedModel):
        return None
    probe: dict[str, torch.Tensor] = {}
    # With no conversion to apply it hands back the dict it was given, untouched.
    if revert_weight_conversion(model, probe) is probe:
        return None
    return functools.partial(revert_weight_conversion, model)


def as_checkpoint(pairs: Iterable[NamedTensor], revert: Reverter | None) -> Iterator[NamedTensor]:
    """Full in-memory tensors under their checkpoint names (``checkpoint_tensors``)."""
    if revert is None:
        yield from pairs
        return
    sent: set[str] = set()
    for name, tensor in pairs:
        for ckpt_name, ckpt_tensor in checkpoint_tensors(name, tensor, revert):
            if ckpt_name in sent:
                raise ValueError(
                    f"checkpoint tensor {ckpt_name!r} is built from several in-memory tensors"
                    f" (the second is {name!r}); weights are streamed one tensor at a time"
                    " and cannot be merged into it"
                )
            sent.add(ckpt_name)
            yield ckpt_name, ckpt_tensor


def checkpoint_tensors(
    name: str, tensor: torch.Tensor, revert: Reverter | None
) -> list[NamedTensor]:
    """One full in-memory tensor as ``save_pretrained`` writes it: ``[(name, tensor)]``
    for most; a fused experts tensor as its per-expert views (no copy); anything else
    transformers converts, as it converts it. ``revert``: ``checkpoint_reverter(model)``."""
    if revert is None:
        return [(name, tensor)]
    if tensor.dim() == 3:  # names and shapes only, from a meta tensor: nothing is copied
        views = expert_views(tensor, revert({name: tensor.detach().to("meta")}))
        if views is not None:
            return views
    return list(revert({name: tensor}).items())


def checkpoint_slots(module: nn.Module) -> dict[str, tuple[str, torch.Tensor]]:
    """Where each checkpoint-named tensor goes: ``{checkpoint name: (parameter name,
    the parameter or the slice of it that the tensor fills)}``. Buffers a checkpoint
    holds (DeepSeek-V3's ``e_score_correction_bias``) count as parameters; rotary
    ``inv_freq`` and other non-persistent buffers do not."""
    revert = checkpoint_reverter(module)
    slots: dict[str, tuple[str, torch.Tensor]] = {}
    saved = set(module.state_dict().keys())
    buffers = ((n, b) for n, b in module.named_buffers() if n in saved)
    for name, param in (*module.named_parameters(), *buffers):
        for ckpt_name, view in checkpoint_tensors(name, param.detach(), revert):
            if view.untyped_storage().data_ptr() != param.untyped_storage().data_ptr():
                raise ValueError(
                    f"cannot sync {name!r}: transformers saves it as {ckpt_name!r} through"
                    " a conversion that is not a slice of it, so it cannot be written in place"
                )
            slots[ckpt_name] = (name, view)
    return slots


_PER_EXPERT = re.compile(r"^(?P<experts>.+)\.(?P<j>\d+)\.(?P<proj>[^.]+)\.weight$")
# The half of a fused gate_up tensor (dim 1) each checkpoint projection is: transformers
# concatenates gate then up (Concatenate(dim=1) over [gate, up]; Mixtral's w1 then w3).
_EXPERT_HALF = {"gate_proj": 0, "up_proj": 1, "w1": 0, "w3": 1}


def expert_views(fused: torch.Tensor, layout: dict[str, torch.Tensor]) -> list[NamedTensor] | None:
    """Slices of ``fused`` [E, A, B] under the per-expert names ``layout`` gives them
    (transformers' checkpoint names and shapes for it), expert by expert: E tensors
    [A, B] (``down_proj``: ``fused[j]``) or 2E [A/2, B] (``gate_up_proj``: the gate
    ``fused[j, :A/2]``, the up projection ``fused[j, A/2:]``). None when ``layout`` is
    not one of these two, e.g. the tensor is saved fused."""
    n_experts, rows, cols = fused.shape
    parts, rest = divmod(len(layout), n_experts)
    if rest or parts not in (1, 2) or rows % parts:
        return None
    size = rows // parts
    placed: dict[tuple[int, int], str] = {}  # (expert, half) -> checkpoint name
    prefixes: set[str] = set()
    for ckpt_name, tensor in layout.items():
        match = _PER_EXPERT.match(ckpt_name)
        if match is None or tuple(tensor.shape) != (size, cols):
            return None
        half = 0 if parts == 1 else _EXPERT_HALF.get(match["proj"])
        if half is None:
            return None
        prefixes.add(match["experts"])
        placed[(int(match["j"]), half)] = ckpt_name
    every_slice = {(j, h) for j in range(n_experts) for h in range(parts)}
    if len(prefixes) != 1 or set(placed) != every_slice:
        return None
    return [(placed[(j, h)], fused[j, h * size : (h + 1) * size]) for j, h in sorted(placed)]


def fuse(pairs: Iterable[NamedTensor], kind: str) -> Iterator[NamedTensor]:
    """Concatenate the parts of a fused projection (``qkv`` or ``gate_up``) along dim 0,
    in the engine's order, as soon as the last part of a module arrives."""
    parts_names, fused_name = _FUSED[kind]
    pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    for name, tensor in pairs:
        module, _, leaf = name.rpartition(".")  # leaf: weight | bias
        parent, _, proj = module.rpartition(".")
        if proj not in parts_names:
            yield name, tensor
            continue
        group = pending.setdefault((parent, leaf), {})
        group[proj] = tensor
        if len(group) == len(parts_names):
            del pending[(parent, leaf)]
            yield (
                f"{parent}.{fused_name}.{leaf}",
                torch.cat([group[p] for p in parts_names], dim=0),
            )
    if pending:
        missing = {
            f"{parent}.{leaf}": sorted(set(parts_names) - set(g))
            for (parent, leaf), g in pending.items()
        }
        raise ValueError(f"cannot fuse {kind}: parts missing {missing}")


def unfuse(name: str, tensor: torch.Tensor, sizes: dict[str, list[int]]) -> list[NamedTensor]:
    """Split a fused ``qkv_proj``/``gate_up_proj`` tensor back into HF names; ``sizes``
    gives the dim-0 sizes by fused name (``{"qkv_proj": [q, k, v]}``)."""
    module, _, leaf = name.rpartition(".")
    parent, _, proj = module.rpartition(".")
    for parts_names, fused_name in _FUSED.values():
        if proj == fused_name:
            chunks = torch.split(tensor, sizes[fused_name], dim=0)
            return [(f"{parent}.{p}.{leaf}", c) for p, c in zip(parts_names, chunks, strict=True)]
    return [(name, tensor)]


def bucketize(pairs: Iterable[NamedTensor], bucket_bytes: int) -> Iterator[list[NamedTensor]]:
    """Group tensors, in order, into lists of at most ``bucket_bytes``. A tensor larger
    than the limit travels alone in its own bucket (it cannot be split by name)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket: list[NamedTensor] = []
    size = 0
    for name, tensor in pairs:
        nbytes = tensor_bytes(tensor)
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def weight_buckets(
    model: nn.Module,
    *,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
    engine: str = "vllm",
) -> Iterator[list[NamedTensor]]:
    """The model's weights as the ``engine`` names them, gathered and bucketed lazily: a
    bucket is only gathered when the previous one has been consumed."""
    name_map = ENGINE_NAME_MAPS[engine]
    yield from bucketize(
        full_tensors(model, dtype=dtype, device=device, name_map=name_map), bucket_bytes
    )
