"""Loss aggregation: hand-computed values per mode, and micro-batch invariance."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo import names
from engine.algo.aggregate import LOSS_AGGREGATIONS, LossScale, aggregate_loss
from engine.algo.registry import UnknownNameError

NAN = math.nan

# Three sequences of 4, 2 and 1 valid tokens. Padding holds garbage (NaN, inf, 100) that
# must never reach a sum or a normaliser.
LOSS = torch.tensor(
    [
        [1.0, 2.0, 3.0, 4.0],
        [5.0, 6.0, NAN, 100.0],
        [7.0, math.inf, 100.0, NAN],
    ]
)
MASK = torch.tensor(
    [
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 1.0, 0.0, 0.0],
        [1.0, 0.0, 0.0, 0.0],
    ]
)

# Σ valid = 1+2+3+4 + 5+6 + 7 = 28; N = 7 tokens; |S| = 3 sequences; L = 4.
EXPECTED = {
    "token-mean": 28 / 7,  # = 4
    "seq-mean-token-sum": (10 + 11 + 7) / 3,  # row sums / |S|
    "seq-mean-token-mean": (10 / 4 + 11 / 2 + 7 / 1) / 3,  # (2.5 + 5.5 + 7) / 3 = 5
    "seq-mean-token-sum-norm": 28 / (3 * 4),  # Σ / (|S| · C), C = L = 4 by default
    "token-sum": 28.0,
}


def test_every_mode_is_tested_and_registered():
    assert set(EXPECTED) == set(names.LOSS_AGG_MODES) == set(LOSS_AGGREGATIONS.names())


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_hand_computed_values(mode):
    got = aggregate_loss(LOSS, MASK, mode)
    assert got.item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_bool_mask_gives_the_same_value(mode):
    assert aggregate_loss(LOSS, MASK.bool(), mode).item() == pytest.approx(EXPECTED[mode])


def test_loss_scale_factor_is_the_norm_constant():
    # Σ / (|S| · C) with C = 8: 28 / 24
    got = aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=8.0)
    assert got.item() == pytest.approx(28 / 24)


def test_token_mean_gradient_is_mask_over_num_tokens():
    loss = torch.where(MASK.bool(), LOSS, torch.zeros_like(LOSS)).requires_grad_()
    aggregate_loss(loss, MASK, "token-mean").backward()
    torch.testing.assert_close(loss.grad, MASK / 7)


def test_loss_scale_of_counts_tokens_and_nonempty_sequences():
    mask = torch.cat([MASK, torch.zeros(1, 4)])  # an all-masked row is not a sequence
    assert LossScale.of(mask) == LossScale(num_tokens=7.0, num_seqs=3.0)
    assert LossScale.of_micro_batches([mask[:2], mask[2:]]) == LossScale.of(mask)


# ---------------------------------------------------------------------------
# micro-batches


def _micro_batches(loss, mask, splits):
    return list(zip(loss.split(splits), mask.split(splits), strict=True))


@pytest.mark.parametrize("mode", sorted(EXPECTED))
@pytest.mark.parametrize("splits", [[2, 1], [1, 2], [1, 1, 1]])
def test_micro_batches_sum_to_the_full_batch_loss(mode, splits):
    full = aggregate_loss(LOSS, MASK, mode)
    scale = LossScale.of(MASK)
    parts = [
        aggregate_loss(lo, ma, mode, scale=scale) for lo, ma in _micro_batches(LOSS, MASK, splits)
    ]
    assert sum(p.item() for p in parts) == pytest.approx(full.item())


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_micro_batch_gradients_accumulate_to_the_full_batch_gradient(mode):
    clean = torch.where(MASK.bool(), LOSS, torch.zeros_like(LOSS))
    full_leaf = clean.clone().requires_grad_()
    aggregate_loss(full_leaf, MASK, mode).backward()

    micro_leaf = clean.clone().requires_grad_()
    scale = LossScale.of(MASK)
    for lo, ma in _micro_batches(micro_leaf, MASK, [2, 1]):
        aggregate_loss(lo, ma, mode, scale=scale).backward()
    torch.testing.assert_close(micro_leaf.grad, full_leaf.grad)


def test_local_divisor_would_differ_for_token_mean_with_uneven_lengths():
    # Micro-batch 1 (rows 0, 1): 21 over 6 tokens = 3.5; micro-batch 2 (row 2): 7 over 1.
    # The mean of local means is (3.5 + 7) / 2 = 5.25, the sum of local means 10.5; the
    # full-batch token-mean is 4. Only the global divisor gives 4.
    micro = _micro_batches(LOSS, MASK, [2, 1])
    local = [aggregate_loss(lo, ma, "token-mean").item() for lo, ma in micro]
    assert local == pytest.approx([3.5, 7.0])
    assert sum(local) / 2 == pytest.approx(5.25)
    scale = LossScale.of(MASK)
    global_ = [aggregate_loss(lo, ma, "token-mean", scale=scale).item() for lo, ma in micro]
    assert global_ == pytest.approx([21 / 7, 7 / 7])
    assert sum(global_) == pytest.approx(4.0)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_micro_batches_padded_to_their_own_length_with_a_fixed_scale_factor(mode):
    # A backend that repads each micro-batch (row 2 alone is 1 token wide) stays exact as
    # long as seq-mean-token-sum-norm gets a fixed C rather than the padded length.
    c = 8.0
    full = aggregate_loss(LOSS, MASK, mode, loss_scale_factor=c)
    scale = LossScale.of(MASK)
    first = aggregate_loss(LOSS[:2], MASK[:2], mode, scale=scale, loss_scale_factor=c)
    second = aggregate_loss(LOSS[2:, :1], MASK[2:, :1], mode, scale=scale, loss_scale_factor=c)
    assert (first + second).item() == pytest.approx(full.item())


# ---------------------------------------------------------------------------
# empty rows and batches


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_all_masked_row_changes_nothing(mode):
    loss = torch.cat([LOSS, torch.full((1, 4), 9.0)])
    mask = torch.cat([MASK, torch.zeros(1, 4)])
    assert aggregate_loss(loss, mask, mode).item() == pytest.approx(EXPECTED[mode])


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_all_masked_batch_is_zero_with_finite_gradient(mode):
    loss = torch.full((2, 3), NAN).requires_grad_()
    out = aggregate_loss(loss, torch.zeros(2, 3), mode)
    assert out.item() == 0.0
    out.backward()
    assert torch.equal(loss.grad, torch.zeros(2, 3))


@pytest.mark.parametrize("mode", sorted(EXPECTED))
def test_all_masked_micro_batch_contributes_zero(mode):
    scale = LossScale.of(MASK)
    out = aggregate_loss(torch.ones(2, 4), torch.zeros(2, 4), mode, scale=scale)
    assert out.item() == 0.0


def test_unknown_mode_lists_the_valid_ones():
    with pytest.raises(UnknownNameError) as info:
        aggregate_loss(LOSS, MASK, "token_mean")
    message = str(info.value)
    for mode in names.LOSS_AGG_MODES:
        assert mode in message
    assert "did you mean 'token-mean'" in message
