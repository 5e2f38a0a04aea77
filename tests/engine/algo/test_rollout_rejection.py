"""Rejection sampling's options and thresholds (verl's written forms), by hand."""

import math

import pytest
import torch

from engine.algo.rollout_rejection import rejection_mask
from engine.algo.rollout_spec import (
    RS_OPTIONS,
    Bounds,
    RejectionRule,
    parse_is_threshold,
    parse_rejection,
)

# ρ = π_old / π_rollout of two responses: row 0: 2, 0.5, 1; row 1: 4, 1, then padding
# (whose ratio, 0.5, must count nowhere).
RATIOS = torch.tensor([[2.0, 0.5, 1.0], [4.0, 1.0, 0.5]])
LOG_RATIO = RATIOS.log()
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
LN2 = math.log(2.0)
# k2 = ½ (log ρ)²: 0.240, 0.240, 0 | 0.961, 0;  k3 = ρ − 1 − log ρ: 0.307, 0.193, 0 | 1.614, 0
K2 = [[LN2**2 / 2, LN2**2 / 2, 0.0], [2 * LN2**2, 0.0]]
K3 = [[1 - LN2, LN2 - 0.5, 0.0], [3 - 2 * LN2, 0.0]]
KEEP_ROW_0 = [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]


def _mask(options, thresholds):
    return rejection_mask(LOG_RATIO, MASK, parse_rejection(options, thresholds))


@pytest.mark.parametrize(
    "options,thresholds,kept",
    [
        # ρ within [0.6, 3]: 0.5 and 4 out
        ("token_k1", "0.6_3.0", [[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]),
        # the bounds are on ρ itself: [0.3, 1.5] drops 2 and 4 and keeps 0.5 (verl's code,
        # which bounds 1/ρ, would drop 0.5 and keep 2)
        ("token_k1", "0.3_1.5", [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
        # one number U: [1/U, U] = [0.5, 2]; the bounds are inclusive (kept at 0.5 and 2)
        ("token_k1", 2.0, [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),
        # products 1 and 4 against [0.5, 2]: row 1 goes whole
        ("seq_sum_k1", 2.0, KEEP_ROW_0),
        # geometric means (2 · 0.5 · 1)^(1/3) = 1 and (4 · 1)^(1/2) = 2 against [0.5, 1.5]
        ("seq_mean_k1", "0.5_1.5", KEEP_ROW_0),
        ("token_k2", 0.5, [[1.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),  # 0.961 > 0.5
        ("token_k3", 0.3, [[0.0, 1.0, 1.0], [0.0, 1.0, 0.0]]),  # 0.307, 1.614 > 0.3
        ("seq_sum_k2", 0.5, KEEP_ROW_0),  # sums 0.480 and 0.961
        ("seq_mean_k3", 0.5, KEEP_ROW_0),  # means 0.167 and 0.807
        ("seq_max_k2", 0.3, KEEP_ROW_0),  # maxima 0.240 and 0.961
        ("seq_max_k3", 0.3, [[0.0] * 3, [0.0] * 3]),  # maxima 0.307 and 1.614
        ("seq_sum_k3", 10.0, MASK.tolist()),  # nothing out
        # every option must pass: token_k1's mask AND seq_mean_k3's
        ("token_k1, seq_mean_k3", "0.6_3.0, 0.5", [[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]),
    ],
)
def test_each_option_by_hand(options, thresholds, kept):
    mask, metrics = _mask(options, thresholds)
    assert torch.equal(mask, torch.tensor(kept))
    out = float((MASK - mask).sum())
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(out / 5)


def test_the_statistics_and_the_fractions_rejected():
    _, m = _mask("token_k1,seq_mean_k3", "0.6_3.0,0.5")
    # token_k1 rejects 2 of the 5 tokens, in both rows; seq_mean_k3 row 1's 2 tokens
    assert m["rollout_corr/rollout_rs_token_k1_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_seq_mean_k3_masked_fraction"] == pytest.approx(2 / 5)
    assert m["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(3 / 5)
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(1.0)
    # k1 = −log ρ: −(ln 2 − ln 2 + 0 + ln 4 + 0) / 5; max −ln 0.5, min −ln 4
    assert m["rollout_corr/rollout_rs_token_k1_mean"] == pytest.approx(-2 * LN2 / 5)
    assert m["rollout_corr/rollout_rs_token_k1_max"] == pytest.approx(LN2)
    assert m["rollout_corr/rollout_rs_token_k1_min"] == pytest.approx(-2 * LN2)
    # a sequence statistic stands for each of its tokens in the mean
    mean0, mean1 = sum(K3[0]) / 3, sum(K3[1]) / 2
    assert m["rollout_corr/rollout_rs_seq_mean_k3_mean"] == pytest.approx(
        (3 * mean0 + 2 * mean1) / 5
    )
    assert m["rollout_corr/rollout_rs_seq_mean_k3_max"] == pytest.approx(mean1)
    _, m = _mask("seq_sum_k2", 1.0)
    assert m["rollout_corr/rollout_rs_seq_sum_k2_max"] == pytest.approx(sum(K2[1]))
    assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0


def test_padding_and_empty_rows_stay_out():
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    # the padded ρ = 1 / 0.001 (row 0) and ρ = 4 (row 1) would fail every bound
    log_ratio = torch.tensor([[0.0, 0.0, math.log(1000.0)], [math.log(4.0)] * 3])
    for option in RS_OPTIONS:
        rules = parse_rejection(option, "0.9_1.1" if option.endswith("k1") else 0.01)
        kept, m = rejection_mask(log_ratio, mask, rules)
        assert torch.equal(kept, mask), option
        assert m["rollout_corr/rollout_rs_masked_fraction"] == 0.0, option
        assert m["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0, option
    kept, m = rejection_mask(log_ratio, torch.zeros(2, 3), parse_rejection("token_k1", 2.0))
    assert not kept.any() and m == {}


def test_extreme_ratios_are_finite_and_rejected():
    log_ratio = torch.tensor([[300.0, -300.0, 0.0]])  # clamped to ±20 first
    kept, m = rejection_mask(log_ratio, torch.ones(1, 3), parse_rejection("token_k3", 1.0))
    assert torch.equal(kept, torch.tensor([[0.0, 0.0, 1.0]]))
    assert all(math.isfinite(v) for v in m.values())


# ---------------------------------------------------------------------------
# the written forms


def test_is_threshold_forms():
    assert parse_is_threshold(2.0) == Bounds(None, 2.0)
    assert parse_is_threshold(3) == Bounds(None, 3.0)
    assert parse_is_threshold("2.5") == Bounds(None, 2.5)
    assert parse_is_threshold("0.5_5.0") == Bounds(0.5, 5.0)
    for bad, message in [
        ("5.0_0.5", "0 < lower <= upper"),
        ("0_2", "0 < lower <= upper"),
        (0, "must be > 0"),
        ("two", "not a number"),
        ("1_2_3", "not a number"),  # float() would read "2_3" as 23
        ("nan", "not finite"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_is_threshold(bad)


def test_rejection_forms():
    # one threshold for all (for k1 U means [1/U, U]); a repeated option counts once
    rules = parse_rejection(" token_k1 ,seq_max_k3,token_k1", 2.0)
    assert rules == (RejectionRule("token_k1", 0.5, 2.0), RejectionRule("seq_max_k3", None, 2.0))
    # "0.5_2.0" is not an upper bound: a divergence option refuses it
    with pytest.raises(ValueError, match="upper bound only"):
        parse_rejection("token_k1,seq_max_k3", "0.5_2.0")
    rules = parse_rejection("token_k1,seq_mean_k3", "4.0, 0.01")
    assert rules == (RejectionRule("token_k1", 0.25, 4.0), RejectionRule("seq_mean_k3", None, 0.01))
    assert (rules[0].level, rules[0].estimator) == ("token", "k1")
    assert (rules[1].level, rules[1].estimator) == ("seq_mean", "k3")
    for options, thresholds, message in [
        ("", 2.0, "no option"),
        ("seq_max_k1", 2.0, "unknown option 'seq_max_k1'"),
        ("token_k1", None, "rollout_rs_threshold is null"),
        ("token_k1,token_k2", "2.0,1.0,1.0", "3 thresholds for 2 options"),
        ("token_k1", 0.5, "so U >= 1"),
        ("token_k2", -1.0, "must be > 0"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_rejection(options, thresholds)
