"""Weights from the actor's worker group to a rollout group of its own, bucket by bucket.

With ``rollout.placement=separate`` the rollout runs in processes of its own (its own
devices, possibly its own nodes), outside the actor's torch.distributed world. A bridge
is a process group that spans the actor's first rank (rank 0 here, the sender) and every
rollout rank (1..R): gloo on CPU, NCCL on GPUs, built from a TCP store the sender hosts
(torch's ``ProcessGroupGloo``/``ProcessGroupNCCL`` made directly, as a second world,
which neither side's own world knows of).

The actor's ranks walk their weights together (each tensor is one all-gather of its
shards, ``hf_named_tensors``); the sender packs them in buckets of at most
``bucket_bytes`` and broadcasts each bucket: first its header (names, dtypes, shapes),
then its bytes in one flat tensor. A receiver turns each bucket back into named views of
that buffer and hands them to its engine as they come, so no side ever holds more than
one bucket beyond the model it has (plus one tensor larger than a bucket). An empty
header ends the transfer.

A push (``send_push``/``receive_push``) is a manifest, the list of its parts
(``WeightPart``: full weights; or a LoRA actor's base weights and its adapter), then one
transfer a part, in that order: the receiver knows what each tensor is from the sender's
word, never from its name.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from engine.rollout.weights import NamedTensor, bucketize

SENDER = 0


class WeightPart(enum.Enum):
    """What one transfer of a push holds."""

    FULL = "full"  # every weight under HF names (a LoRA actor's merged), loaded as it comes
    BASE = "base"  # a LoRA actor's frozen base weights, unmerged, loaded as they come
    ADAPTER = "adapter"  # its adapter under peft's names, served by the engine (vLLM's LoRA)


@dataclass(frozen=True)
class Pushed:
    """What the sender sent: tensors and bytes, and the parts, in order."""

    tensors: int = 0
    bytes: int = 0
    parts: tuple[str, ...] = ()

    def __add__(self, other: Pushed) -> Pushed:
        return Pushed(
            self.tensors + other.tensors, self.bytes + other.bytes, self.parts + other.parts
        )


@dataclass(frozen=True)
class BridgeAddress:
    """Where the sender's store listens, and how many take part (the sender and R
    receivers)."""

    host: str
    port: int
    size: int


class WeightBridge:
    def __init__(
        self,
        address: BridgeAddress,
        rank: int,
        device: torch.device,
        timeout: timedelta = timedelta(minutes=30),
    ) -> None:
        self.rank, self.size, self.device = rank, address.size, device
        store = dist.TCPStore(
            address.host,
            address.port,
            world_size=address.size,
            is_master=rank == SENDER,
            timeout=timeout,
            wait_for_workers=False,
        )
        prefixed = dist.PrefixStore("rlctl-weight-bridge", store)
        if device.type == "cuda":  # written to torch's API; not run on this project's CI
            self.group = dist.ProcessGroupNCCL(prefixed, rank, address.size)
        else:
            self.group = dist.ProcessGroupGloo(prefixed, rank, address.size, timeout)
        self._store = store  # the sender's hosts the store: keep it alive

    def send_push(
        self, parts: Sequence[tuple[WeightPart, Iterable[NamedTensor]]], bucket_bytes: int
    ) -> Pushed:
        """The manifest (the parts' kinds), then each part's tensors as one transfer."""
        self._broadcast_header([part.value for part, _ in parts])
        pushed = Pushed()
        for part, named_tensors in parts:
            sent = self.send(named_tensors, bucket_bytes)
            pushed += Pushed(sent.tensors, sent.bytes, (part.value,))
        return pushed

    def receive_push(self) -> Iterator[tuple[WeightPart, Iterator[NamedTensor]]]:
        """Each part of the sender's push with its tensors as they arrive; a part's
        tensors are to be taken before the next part (what is left is drained here)."""
        for value in self._broadcast_header(None):
            tensors = self.receive()
            yield WeightPart(value), tensors
            for _ in tensors:  # keep in step with the sender whatever the caller took
                pass

    def send(self, named_tensors: Iterable[NamedTensor], bucket_bytes: int) -> Pushed:
        """Broadcast every tensor, bucket by bucket; how many and how many bytes."""
        sent = nbytes = 0
        for bucket in bucketize(named_tensors, bucket_bytes):
            header = [
                (name, str(t.dtype).removeprefix("torch."), list(t.shape)) for name, t in bucket
            ]
            self._broadcast_header(header)
            flat = torch.cat(
                [t.detach().contiguous().reshape(-1).view(torch.uint8) for _, t in bucket]
            )
            self._broadcast(flat.to(self.device))
            sent += len(bucket)
            nbytes += flat.numel()
        self._broadcast_header([])
        return Pushed(sent, nbytes)

    def receive(self) -> Iterator[NamedTensor]:
        """The sender's tensors, as they arrive (views of each bucket's buffer)."""
        while header := self._broadcast_header(None):
            sizes = [_nbytes(dtype, shape) for _, dtype, shape in header]
            flat = torch.empty(sum(sizes), dtype=torch.uint8, device=self.device)
            self._broadcast(flat)
            offset = 0
            for (name, dtype, shape), size in zip(header, sizes, strict=True):
                part = flat[offset : offset + size].view(getattr(torch, dtype)).view(shape)
                offset += size
                yield name, part

    def _broadcast(self, tensor: torch.Tensor) -> None:
        options = dist.BroadcastOptions()
        options.rootRank = SENDER
        self.group.broadcast([tensor], options).wait()

    def _broadcast_header(self, header: list | None) -> list:
        """The sender's header: names, dtypes and shapes, as JSON."""
        length = torch.zeros(1, dtype=torch.int64, device=self.device)
        data = b""
        if self.rank == SENDER:
            data = json.dumps(header).encode()
            length[0] = len(data)
        self._broadcast(length)
        buffer = torch.empty(int(length[0]), dtype=torch.uint8, device=self.device)
        if self.rank == SENDER:
            buffer.copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        self._broadcast(buffer)
        return header if self.rank == SENDER else json.loads(buffer.cpu().numpy().tobytes())


def _nbytes(dtype: str, shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= dim
    return count * torch.empty((), dtype=getattr(torch, dtype)).element_size()
