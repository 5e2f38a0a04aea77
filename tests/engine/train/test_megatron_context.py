"""Context parallelism's sequence split and gather (no megatron-core needed). The engine
with context parallelism against Hugging Face is in test_megatron_backend.py."""

import socket

import pytest
import torch

from engine.train.megatron_context import gather, zigzag_index


def test_zigzag_pairs_an_early_chunk_with_a_late_one():
    # 12 positions, CP 3: 6 chunks of 2; rank r holds chunks r and 5 - r.
    assert zigzag_index(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert zigzag_index(12, 3, 1).tolist() == [2, 3, 8, 9]
    assert zigzag_index(12, 3, 2).tolist() == [4, 5, 6, 7]
    every = torch.cat([zigzag_index(12, 3, r) for r in range(3)])
    assert sorted(every.tolist()) == list(range(12))
    with pytest.raises(ValueError, match="2 × 3 equal chunks"):
        zigzag_index(10, 3, 0)


def _gather_run(rank, port, out):
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        # The whole sequence is 0..7 (batch of one); each rank holds its zigzag positions.
        mine = zigzag_index(8, 2, rank)
        local = mine.float().unsqueeze(0).requires_grad_()
        whole = gather(local, 1, None, sum_grads=False)
        # Every rank computes the same loss from the whole sequence: weights 1..8.
        (whole * torch.arange(1.0, 9.0)).sum().backward()
        kept = local.grad.clone()
        local.grad = None
        keys = gather(local, 1, None, sum_grads=True)
        (keys * torch.arange(1.0, 9.0) * (rank + 1)).sum().backward()
        torch.save({"whole": whole.tolist(), "kept": kept, "summed": local.grad}, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_gather_orders_the_sequence_and_routes_gradients(tmp_path):
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "r")
    mp.spawn(_gather_run, args=(port, out), nprocs=2, join=True)
    for rank in range(2):
        r = torch.load(f"{out}.{rank}")
        assert r["whole"] == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]]
        weights = zigzag_index(8, 2, rank).float() + 1  # d loss / d position
        # The same loss on every rank: each keeps its own positions' gradient.
        assert r["kept"].tolist() == [weights.tolist()]
        # Different uses on each rank (weights × 1 on rank 0, × 2 on rank 1): summed.
        assert r["summed"].tolist() == [(weights * 3).tolist()]
