"""Ulysses sequence parallelism for the FSDP2 engine (``<role>.ulysses_sequence_parallel_size``,
verl's key; DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv:2309.14509).

Groups. ``size`` consecutive ranks form a sequence-parallel (SP) group; they receive the
same rows (the controller's ``ModelParallelLayout(cp=size)``) and split each packed
micro-batch (``engine.train.packing``, padded to a multiple of ``size`` tokens) by
sequence: rank r of the group runs the model on tokens [r·L/size, (r+1)·L/size) of each
bin. Everything outside attention is per token and runs on the local slice as is, RoPE
included (the slice carries its own positions).

Attention. Each layer's queries, keys and values (after RoPE) go through an all-to-all
that turns (local sequence, all heads) into (whole sequence, heads/size): each rank then
attends over the whole sequence with its share of the heads, and a second all-to-all
turns the output back into (local sequence, all heads) for ``o_proj``. Query head h uses
KV head h // (H/KV), so handing rank r query heads [r·H/size, ...) and KV heads
[r·KV/size, ...) keeps each query group whole: ``size`` must divide both. The packed
rows' block-diagonal causal mask is built here from the positions of the *whole* bin
(each row restarts at 0), which ride along in the model call's keyword arguments (so
that a layer recomputed under gradient checkpointing sees them again). The model's own
attention function (sdpa, eager, flash-attention) then runs on the exchanged tensors:
the model is switched to a registered attention name ``rlctl_ulysses|<inner>`` that
passes straight through when a call carries no SP state (the colocated HF rollout
generates with the same module).

Images. A vision-language model's call (``engine.train.packing``: pixels and (4, K, L)
positions) goes to the model whole on every rank of the group: the model embeds the bins'
tokens and scatters every image's features into them (an image's pad tokens may straddle
two slices, and transformers takes all of an image's features or none), then a hook on
its language model keeps this rank's slice of the embeddings and positions. Every rank
of the group runs the vision tower on all of the micro-batch's images; each rank's loss
reaches the tower only through its slice, so the group's summed gradients are the
whole's, as for the token embeddings.

Results. Each rank computes the per-token quantities (log-probs, entropy, values) at the
head positions in its slice; they are gathered into the bin's order, so every rank of
the group returns the same (B, R) tensors an SP-1 forward would. Every rank then computes
the same loss from them, and the gather's backward keeps each rank's own positions'
gradient: summed over the group (FSDP's reduce-scatter), the gradients are the loss's.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.errors import ConfigError, EngineError
from engine.train.packing import ModelCall

PREFIX = "rlctl_ulysses|"
STATE_KWARG = "rlctl_ulysses"  # the model call's keyword that carries the SP state
# A vision-language call's: the state the language model's hook turns into STATE_KWARG
# (under this name the vision tower's attention, which gets the call's keywords too,
# passes it by and attends over its whole images)
VISION_STATE_KWARG = "rlctl_ulysses_vision"
INNER = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


class SequenceParallelError(EngineError):
    """The model or the call cannot be split as asked."""


@dataclass(frozen=True)
class UlyssesGroup:
    """This rank's SP group: ``size`` consecutive ranks, this one ``rank`` within it."""

    size: int
    rank: int
    group: Any

    @classmethod
    def create(cls, size: int) -> UlyssesGroup:
        """This rank's group of ``size``, made once per world and size in a process: the
        actor, the reference and the critic at one size share it. Every rank calls this
        for the same sizes in the same order (the host builds its roles in ``ROLE_ORDER``
        from one config), so all ranks make a size's groups on the same call
        (``new_group`` is collective over the world) and reuse them together after."""
        world = dist.group.WORLD
        if _SHARED.world is not world:  # a new default group: the old groups went with it
            _SHARED.world, _SHARED.groups = world, {}
        if size not in _SHARED.groups:
            _SHARED.groups[size] = cls._new(size)
        return _SHARED.groups[size]

    @classmethod
    def _new(cls, size: int) -> UlyssesGroup:
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % size:
            raise SequenceParallelError(
                f"ulysses_sequence_parallel_size {size} must divide the world size {world}"
            )
        mine = None
        for start in range(0, world, size):
            group = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                mine = group
        return cls(size=size, rank=rank % size, group=mine)

    def split(self, call: ModelCall) -> ModelCall:
        """This rank's part of a packed call (its length a multiple of ``size``): its slice
        of every bin, the head positions in it, and an ``unpack`` that gathers the group's
        per-token results back into the whole call's (B, R)."""
        ids, pos = call.inputs["input_ids"], call.inputs["position_ids"]
        bins, length = ids.shape
        vision = pos.ndim == 3  # (4, K, L): a vision-language call (engine.train.packing)
        if length % self.size:
            raise SequenceParallelError(f"a packed length {length} not a multiple of {self.size}")
        local = length // self.size
        lo = self.rank * local
        keep = call.kwargs.get("logits_to_keep")
        keep = call.select if keep is None else keep
        columns = keep[:-1]  # the head positions (the last entry is the padding one)
        first = int(torch.searchsorted(columns, lo))
        last = int(torch.searchsorted(columns, lo + local))
        mine = columns[first:last] - lo
        local_keep = torch.cat([mine, mine.new_tensor([local - 1])])
        kwargs = dict(call.kwargs)
        if vision:  # whole bins in: the language model's hook slices them (module doc)
            kwargs[VISION_STATE_KWARG] = UlyssesState(self, pos[0])
            inputs = dict(call.inputs)
        else:
            kwargs[STATE_KWARG] = UlyssesState(self, pos)
            inputs = {"input_ids": ids[:, lo : lo + local], "position_ids": pos[:, lo : lo + local]}
        select = None
        if "logits_to_keep" in kwargs:
            kwargs["logits_to_keep"] = local_keep
        else:
            select = local_keep
        group = self

        def unpack(values_KN: torch.Tensor) -> torch.Tensor:
            slice_KS = values_KN.new_zeros((bins, local)).index_copy(1, mine, values_KN)
            whole_KL = _GatherSlices.apply(slice_KS, group)
            return call.unpack(whole_KL[:, columns])

        return ModelCall(
            inputs=inputs,
            kwargs=kwargs,
            targets=call.targets[:, first:last],
            select=select,
            unpack=unpack,
            token_index=call.token_index[:, lo : lo + local],
        )


@dataclass
class _SharedGroups:
    """This process's SP groups by size, and the default process group they were made
    in (each ``new_group`` costs a rendezvous, and a communicator per group on a GPU)."""

    world: Any = None
    groups: dict[int, UlyssesGroup] = field(default_factory=dict)


_SHARED = _SharedGroups()


@dataclass(eq=False)
class UlyssesState:
    """What attention needs beyond its inputs: the group, and the positions of the whole
    bins (the mask is built from them once per forward and kept for the recomputation)."""

    group: UlyssesGroup
    position_ids: torch.Tensor  # (K, L), the whole bins
    _masks: dict = field(default_factory=dict)

    def local(self, whole: torch.Tensor, dim: int) -> torch.Tensor:
        """This rank's slice of a whole bins' tensor along its token dimension ``dim``."""
        local = whole.shape[dim] // self.group.size
        return whole.narrow(dim, self.group.rank * local, local)

    def mask(self, kind: str, dtype: torch.dtype, window: int | None) -> torch.Tensor:
        """The (K, 1, L, L) mask of the packed rows: each token attends to the earlier
        tokens of its own row (and within ``window`` of it when the layer slides), as a
        boolean (sdpa) or an additive float (eager)."""
        key = (kind, dtype, window)
        if key not in self._masks:
            pos = self.position_ids
            # A row starts where the position does not follow the one before it.
            starts = torch.ones_like(pos, dtype=torch.bool)
            starts[:, 1:] = pos[:, 1:] != pos[:, :-1] + 1
            row = starts.cumsum(-1)
            index = torch.arange(pos.shape[1], device=pos.device)
            allowed = (row[:, :, None] == row[:, None, :]) & (index[:, None] >= index[None, :])
            if window is not None:
                allowed &= (index[:, None] - index[None, :]) < window
            allowed = allowed[:, None]
            if kind == "eager":
                zero = torch.zeros((), dtype=dtype, device=pos.device)
                low = torch.tensor(torch.finfo(dtype).min, dtype=dtype, device=pos.device)
                allowed = torch.where(allowed, zero, low)
            self._masks[key] = allowed
        return self._masks[key]


def _all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    """Chunk ``i`` of ``scatter_dim`` goes to rank ``i``; what arrives from rank ``j`` is
    chunk ``j`` of ``gather_dim``."""
    size = dist.get_world_size(group)
    send = torch.stack(x.chunk(size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    """The exchange and, for its gradient, the exchange back."""

    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _all_to_all(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _all_to_all(grad.contiguous(), gather_dim, scatter_dim, ctx.group), None, None, None


def all_to_all(x: torch.Tensor, scatter_dim: int, gather_dim: int, group: Any) -> torch.Tensor:
    return _AllToAll.apply(x, scatter_dim, gather_dim, group)


class _GatherSlices(torch.autograd.Function):
    """Each rank's (K, S) slice into the whole (K, S·size), in rank order. Every rank
    computes the same loss from the result, so the backward keeps this rank's slice of
    the gradient (no sum)."""

    @staticmethod
    def forward(ctx, slice_KS, ulysses: UlyssesGroup):
        parts = [torch.empty_like(slice_KS) for _ in range(ulysses.size)]
        dist.all_gather(parts, slice_KS.contiguous(), group=ulysses.group)
        ctx.rank, ctx.width = ulysses.rank, slice_KS.shape[1]
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        return grad.narrow(1, ctx.rank * ctx.width, ctx.width), None


def _inner_function(module: nn.Module, name: str) -> Callable:
    """The attention function the model was loaded with (eager: its own module's)."""
    if name == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers import AttentionInterface

    return AttentionInterface._global_mapping[name]


def ulysses_attention(module, query, key, value, attention_mask, *args, **kwargs):
    """Registered as ``rlctl_ulysses|<inner>``: the exchange around the inner attention
    when the call carries SP state, else the inner attention itself."""
    inner = module.config._attn_implementation.removeprefix(PREFIX)
    function = _inner_function(module, inner)
    state: UlyssesState | None = kwargs.pop(STATE_KWARG, None)
    if state is None:
        return function(module, query, key, value, attention_mask, *args, **kwargs)
    group = state.group.group
    # (B, heads, L/size, D) -> (B, heads/size, L, D)
    query, key, value = (all_to_all(t, 1, 2, group) for t in (query, key, value))
    if inner.startswith("flash"):
        mask = None  # the variable-length kernels find the rows from the positions
    else:
        mask = state.mask(inner, query.dtype, kwargs.get("sliding_window"))
    kwargs["position_ids"] = state.position_ids
    out, _ = function(module, query, key, value, mask, *args, **kwargs)
    # (B, L, heads/size, D) -> (B, L/size, heads, D)
    return all_to_all(out, 1, 2, group), None


def enable(model: nn.Module) -> None:
    """Route ``model``'s attention through ``ulysses_attention`` (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    config = model.config
    current = config._attn_implementation or "eager"
    if current.startswith(PREFIX):
        return
    if current not in INNER:
        raise SequenceParallelError(
            f"ulysses_sequence_parallel_size > 1 runs around sdpa, eager or flash-attention;"
            f" {type(model).__name__} was loaded with attn_implementation={current!r}"
        )
    name = PREFIX + current
    AttentionInterface.register(name, ulysses_attention)
    if getattr(config, "vision_config", None) is not None:
        _language_model(model).register_forward_pre_hook(_slice_for_rank, with_kwargs=True)
    # Without SP state the mask is the inner one's (the colocated rollout's generation).
    mask_function = ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(current)
    if mask_function is not None:
        AttentionMaskInterface.register(name, mask_function)
    config._attn_implementation = name


def _language_model(model: nn.Module) -> nn.Module:
    """A vision-language model's language model (transformers' Qwen2-VL layout)."""
    inner = getattr(getattr(model, "model", None), "language_model", None)
    if inner is None:
        raise SequenceParallelError(
            f"{type(model).__name__}: no model.language_model to split the sequence before"
        )
    return inner


def _slice_for_rank(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
    """A vision-language call's language model gets the whole bins' embeddings (the
    images' scattered in by the model, every rank all of them) and positions; this rank
    keeps its slice of both, and the state its attention exchanges with."""
    state: UlyssesState | None = kwargs.pop(VISION_STATE_KWARG, None)
    if state is None:
        return None
    kwargs["inputs_embeds"] = state.local(kwargs["inputs_embeds"], 1)
    kwargs["position_ids"] = state.local(kwargs["position_ids"], -1)
    kwargs[STATE_KWARG] = state
    return args, kwargs


def check_heads(model: nn.Module, size: int, key: str) -> None:
    """The model's heads against the SP size (also checked before start, by config)."""
    from engine.config.train import ulysses_heads_problems

    problems = ulysses_heads_problems(size, key, model.config)
    if problems:
        raise ConfigError(problems)
