"""Weights from the FSDP2-sharded actor to a colocated inference engine, bucket by bucket.

After each actor update the rollout engine needs the new weights. Gathering the whole
model on every rank at once would cost a full copy of it on each device; instead the
state dict is walked parameter by parameter (``DTensor.full_tensor()`` is one
all-gather, and every rank takes part in the same order), cast to the rollout dtype,
and handed over in buckets of at most ``bucket_bytes``: the peak extra memory is one
bucket (plus one tensor when a single tensor is larger than the limit).

Names. Both engines load Hugging Face checkpoint names through the model's own
``load_weights``, which does its own fusing:

=========  ===========================================  ===================================
engine     what it is handed                            what it does with it
=========  ===========================================  ===================================
vLLM       HF names (``model.layers.0.self_attn.q_proj  ``load_weights`` stacks q/k/v into
           .weight``), unfused                          ``qkv_proj`` and gate/up into
                                                        ``gate_up_proj`` (its
                                                        ``stacked_params_mapping``) and
                                                        shards for tensor parallelism
SGLang     the same HF names, unfused                   the same, in
                                                        ``update_weights_from_tensor``
fused      ``...self_attn.qkv_proj.weight`` and         for a consumer that writes
(option)   ``...mlp.gate_up_proj.weight`` (concatenated parameters directly (vLLM's
           along dim 0: q, k, v; gate, up)              internal parameter names)
=========  ===========================================  ===================================

What is dropped: the wrapper prefixes that activation checkpointing, FSDP1 or
``torch.compile`` insert (``_checkpoint_wrapped_module.``, ``_fsdp_wrapped_module.``,
``_orig_mod.``), ``lm_head.weight`` when the embeddings are tied (the engine ties it to
``embed_tokens`` itself; sending it would be a second gather of the largest tensor),
and rotary ``inv_freq`` buffers, which the engines compute.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

WRAPPER_PREFIXES = ("_checkpoint_wrapped_module.", "_fsdp_wrapped_module.", "_orig_mod.")
DEFAULT_BUCKET_BYTES = 512 * 1024 * 1024

NamedTensor = tuple[str, torch.Tensor]


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


def _full(tensor: torch.Tensor) -> torch.Tensor:
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
    time, in the state dict's order (identical on every rank, as the gathers require)."""
    name_map = name_map or NameMap()
    skip_lm_head = name_map.skip_tied_lm_head and ties_embeddings(model)
    pairs: Iterable[NamedTensor] = (
        (name, tensor)
        for name, tensor in model.state_dict().items()
        if not _skipped(name, skip_lm_head)
    )
    yield from as_engine_names(_gathered(pairs, dtype, device), name_map)


def as_engine_names(pairs: Iterable[NamedTensor], name_map: NameMap) -> Iterator[NamedTensor]:
    """Full HF-named tensors (already gathered: FSDP's above, or the Megatron engine's
    ``hf_named_tensors``) fused as ``name_map`` asks."""
    if name_map.fuse_qkv:
        pairs = fuse(pairs, "qkv")
    if name_map.fuse_gate_up:
        pairs = fuse(pairs, "gate_up")
    yield from pairs


def _skipped(raw_name: str, skip_lm_head: bool) -> bool:
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
        full = _full(shard)
        yield clean_name(raw_name), full


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
