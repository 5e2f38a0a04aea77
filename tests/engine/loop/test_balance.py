"""``trainer.balance_batch`` (engine.loop.balance): each data-parallel rank's contiguous share
gets about the same number of tokens, every row is kept once, and per-row fields move
together."""

import random

import torch

from engine.controller.dispatch import split
from engine.loop.balance import balance, balanced_order, chunk_loads
from engine.loop.batch import Rollout
from engine.types import SampleMeta


def test_the_order_evens_the_ranks_tokens():
    # one rank would take all the long ones: 4 × 1000 then 12 × 10 over 4 ranks
    lengths = [1000] * 4 + [10] * 12
    assert chunk_loads(lengths, 4) == [4000, 40, 40, 40]
    order = balanced_order(lengths, 4)
    assert sorted(order) == list(range(16))  # a permutation
    assert chunk_loads([lengths[i] for i in order], 4) == [1030] * 4


def test_random_lengths_come_close_to_even():
    rng = random.Random(0)
    for parts in (2, 4, 8):
        lengths = [rng.randint(50, 4000) for _ in range(parts * 16)]
        loads = chunk_loads([lengths[i] for i in balanced_order(lengths, parts)], parts)
        mean = sum(lengths) / parts
        assert max(loads) / mean < 1.05, (parts, loads)
        assert max(loads) <= max(chunk_loads(lengths, parts))


def test_uneven_splits_are_refused():
    try:
        balanced_order([1, 2, 3], 2)
    except ValueError as exc:
        assert "cannot be split evenly over 2 ranks" in str(exc)
    else:
        raise AssertionError("3 rows over 2 ranks")


def rollout(lengths: list[int]) -> Rollout:
    rows = len(lengths)
    return Rollout(
        prompt_ids=[[1, 2] for _ in range(rows)],
        response_ids=[[7] * n for n in lengths],
        meta=SampleMeta(
            group_ids=[i // 2 for i in range(rows)],
            data_source=[f"src{i}" for i in range(rows)],
            ground_truth=list(range(rows)),
            extra_info=[{} for _ in range(rows)],
        ),
        scores_B=torch.arange(rows, dtype=torch.float32),
        acc_B=torch.zeros(rows),
        preds=[None] * rows,
        reward_extras=[None] * rows,
        pad_token_id=0,
    )


def test_a_rollouts_rows_move_together_and_the_ranks_get_even_tokens():
    before = rollout([40, 40, 40, 40, 2, 2, 2, 2])
    after, metrics = balance(before, 2)
    for shard in split(after, 2):  # what the two ranks get
        assert sum(len(r) for r in shard.response_ids) == 84
    # each row's fields still belong together (its score is its original index)
    for i, score in enumerate(after.scores_B.tolist()):
        row = int(score)
        assert after.response_ids[i] == before.response_ids[row]
        assert after.meta.group_ids[i] == before.meta.group_ids[row]
        assert after.meta.ground_truth[i] == row
    assert after.meta.messages == []  # a field not kept per row stays as it was
    assert metrics["training/balance_max_over_mean_before"] > 1.8
    assert metrics["training/balance_max_over_mean"] == 1.0
