"""The weight bridge between the actor's group and a rollout group of its own: a second
gloo world of real processes (the sender and two receivers) built from the sender's TCP
store; every tensor arrives exact (float32, bfloat16, int64; one larger than a bucket),
in order, bucket by bucket, and the transfer ends for every receiver."""

from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from engine.rollout.bridge import BridgeAddress, Pushed, WeightBridge, WeightPart

BUCKET = 1024  # bytes


def tensors() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("model.embed_tokens.weight", torch.randn(16, 8, generator=g)),  # 512 B
        ("model.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),  # 16 B
        ("big.weight", torch.randn(40, 10, generator=g)),  # 1600 B: alone in its bucket
        ("counts", torch.arange(6, dtype=torch.int64).view(2, 3)),
        ("scalar", torch.tensor(3.5)),
    ]


def _on_rank(rank: int, port: int, out: str) -> None:
    bridge = WeightBridge(BridgeAddress("127.0.0.1", port, 3), rank, torch.device("cpu"))
    if rank == 0:
        sent = bridge.send(iter(tensors()), BUCKET)
        record = {"sent": sent.tensors, "bytes": sent.bytes}
    else:
        got = [(name, t.clone()) for name, t in bridge.receive()]
        torch.save(got, f"{out}/{rank}.pt")
        record = {"received": len(got)}
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(record, f)


@pytest.mark.slow
def test_every_tensor_arrives_exact_in_buckets(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_on_rank, args=(port, str(tmp_path)), nprocs=3, join=True)
    nbytes = sum(t.numel() * t.element_size() for _, t in tensors())
    assert json.loads((tmp_path / "0.json").read_text()) == {"sent": 5, "bytes": nbytes}
    for rank in (1, 2):
        got = torch.load(tmp_path / f"{rank}.pt")
        assert [name for name, _ in got] == [name for name, _ in tensors()]
        for (_, a), (_, b) in zip(got, tensors(), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _push_on_rank(rank: int, port: int, out: str) -> None:
    """Two pushes: base and adapter, then the adapter alone, whose first tensor the
    receiver leaves untaken (the bridge drains it and stays in step)."""
    bridge = WeightBridge(BridgeAddress("127.0.0.1", port, 2), rank, torch.device("cpu"))
    base, adapter = tensors()[:3], tensors()[3:]
    pushes = [[(WeightPart.BASE, base), (WeightPart.ADAPTER, adapter)],
              [(WeightPart.ADAPTER, adapter)]]  # fmt: skip
    record: list = []
    for push in pushes:
        if rank == 0:
            pushed = bridge.send_push(push, BUCKET)
            record.append([pushed.tensors, pushed.bytes, list(pushed.parts)])
        else:
            got = []
            for part, named in bridge.receive_push():
                if part is WeightPart.ADAPTER:
                    named = iter(list(named)[:1])  # takes one, leaves the rest
                got.append([part.value, [name for name, _ in named]])
            record.append(got)
    with open(f"{out}/{rank}.json", "w") as f:
        json.dump(record, f)


@pytest.mark.slow
def test_a_push_names_its_parts(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_push_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    names = [name for name, _ in tensors()]
    adapter_bytes = sum(t.numel() * t.element_size() for _, t in tensors()[3:])
    all_bytes = sum(t.numel() * t.element_size() for _, t in tensors())
    assert json.loads((tmp_path / "0.json").read_text()) == [
        [5, all_bytes, ["base", "adapter"]],
        [2, adapter_bytes, ["adapter"]],
    ]
    assert json.loads((tmp_path / "1.json").read_text()) == [
        [["base", names[:3]], ["adapter", names[3:4]]],
        [["adapter", names[3:4]]],
    ]
    assert Pushed(1, 2, ("base",)) + Pushed(3, 4, ("adapter",)) == Pushed(4, 6, ("base", "adapter"))
