"""Pipeline parallelism for the Megatron engine: the stage a rank holds, the 1F1B order
of forwards and backwards, and the point-to-point link between neighbouring stages.

Megatron-core's own schedules (``megatron.core.pipeline_parallel``) allocate CUDA tensors
even at one stage and take the loss as a callback returning Megatron's reduction tuple;
the engine's update loop (one piece of code for FSDP and Megatron) computes its losses
itself. So the engine runs this small schedule instead, with the same 1F1B order:

- each rank of stage ``s`` (of ``p``) runs ``min(p - s - 1, m)`` forwards first (warm-up),
  then alternates one forward and one backward, then drains the remaining backwards; at
  most ``p - s`` micro-batches' activations are alive on a stage at once (GPipe keeps all
  ``m``), and the bubble is ``(p - 1) / (m + p - 1)`` of the step, as in Megatron's 1F1B;
- activations go forward and gradients backward between the ranks of neighbouring
  stages with the same tensor- and data-parallel ranks. In the schedule each send goes
  out together with the stage's next receive, in one ``batch_isend_irecv``
  (``StageLink``): sent one by one, two neighbours sending to each other would deadlock
  on NCCL. Outside a schedule (forward-only passes: π_old, the reference, the critic's
  values) data flows one way and each send is waited at once;
- every stage knows each micro-batch's activation shape without asking: the ranks of a
  pipeline hold the same rows and trim them the same way, so the shape is
  ``(trimmed sequence length, rows, hidden size)`` on both sides.

Stages hold equal shares of the layers, or ⌈L/p⌉ each and the rest on the last
(``megatron_parallel.pipeline_stage_layers``). The stage's layers are
``decoder.layers.0 .. n-1`` in the module; checkpoints, weight
sync and export name them by their place in the whole model (``layer_offset`` added), so
that stages' tensors can be merged without knowing the layout.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> list[tuple[str, int]]:
    """The order of ("F", i) forwards and ("B", i) backwards on ``stage``: warm-up
    forwards, one-forward-one-backward, then the remaining backwards; backwards in the
    order of their forwards."""
    if not 0 <= stage < stages:
        raise ValueError(f"stage {stage} is not one of {stages} stages")
    warmup = min(stages - stage - 1, micro_batches)
    order = [("F", i) for i in range(warmup)]
    forward, backward = warmup, 0
    while forward < micro_batches:
        order += [("F", forward), ("B", backward)]
        forward += 1
        backward += 1
    order += [("B", i) for i in range(backward, micro_batches)]
    return order


def shift_layer(name: str, by: int) -> str:
    """``decoder.layers.<i>.…`` renamed to ``decoder.layers.<i + by>.…``; other names as is."""
    match = _LAYER.match(name)
    if match is None:
        return name
    return f"decoder.layers.{int(match.group(1)) + by}.{name[match.end() :]}"


def layer_index(name: str) -> int | None:
    match = _LAYER.match(name)
    return None if match is None else int(match.group(1))


@dataclass(frozen=True)
class Stage:
    """The pipeline stage this rank holds, among stages holding ``stage_layers`` layers
    each (``megatron_parallel.pipeline_stage_layers``)."""

    index: int
    stage_layers: tuple[int, ...]
    prev_rank: int | None = None  # global rank of the same TP/DP position one stage up
    next_rank: int | None = None

    @property
    def count(self) -> int:
        return len(self.stage_layers)

    @property
    def layers(self) -> int:
        return self.stage_layers[self.index]

    @property
    def layer_offset(self) -> int:
        """The global index of this stage's first layer."""
        return sum(self.stage_layers[: self.index])

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.count - 1

    def holds(self, megatron_name: str) -> bool:
        """Whether a global Megatron name lives on this stage (the tied output copy on the
        last stage is not named here: it is the embedding's)."""
        index = layer_index(megatron_name)
        if index is not None:
            return self.layer_offset <= index < self.layer_offset + self.layers
        if megatron_name.startswith("embedding."):
            return self.first
        return self.last  # final norm, output layer / value head

    @classmethod
    def of(cls, index: int, stage_layers: list[int], ranks: list[int]) -> Stage:
        """Stage ``index``; ``ranks``: the pipeline group's global ranks, in stage order."""
        last = len(stage_layers) - 1
        return cls(
            index=index,
            stage_layers=tuple(stage_layers),
            prev_rank=ranks[index - 1] if index > 0 else None,
            next_rank=ranks[index + 1] if index < last else None,
        )


class StageLink:
    """Point-to-point transfers with the neighbouring stages.

    Inside ``batched()`` (the 1F1B schedule) a send is not issued at once: it waits for
    this stage's next receive and goes out with it in one ``batch_isend_irecv`` (the
    rest at the end). NCCL runs the point-to-point operations of a pair of ranks on one
    stream, in order: a send that waits for its receiver would hold back the receive
    queued after it, while the neighbour's send waits for that receive, so two stages
    sending to each other (an activation forward, a gradient back) would deadlock.
    Batched, each stage's send and receive progress together, as Megatron's
    ``send_forward_recv_backward`` does. Outside (forward-only passes, where data flows
    one way) each send is issued and waited at once."""

    def __init__(self) -> None:
        self._queued: list[dist.P2POp] | None = None

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        op = dist.P2POp(dist.isend, tensor.detach().contiguous(), dst)
        if self._queued is None:
            _run([op])
        else:
            self._queued.append(op)

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, src: int):
        tensor = torch.empty(shape, dtype=dtype, device=device)
        queued, self._queued = self._queued, [] if self._queued is not None else None
        _run([*(queued or []), dist.P2POp(dist.irecv, tensor, src)])
        return tensor

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        self._queued = []
        try:
            yield
        except BaseException:
            self._queued = None  # a peer may be gone: sending could hang
            raise
        queued, self._queued = self._queued, None
        if queued:
            _run(queued)


def _run(ops: list[dist.P2POp]) -> None:
    for work in dist.batch_isend_irecv(ops):
        work.wait()
