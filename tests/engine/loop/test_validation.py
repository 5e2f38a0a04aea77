import itertools
import math
from collections import Counter

import numpy as np
import pytest

from engine.loop.validation import (
    MAJ_RESAMPLES,
    ValidationSample,
    expected_max_at_k,
    expected_min_at_k,
    k_subsets,
    k_values,
    majority_value,
    pass_at_k,
    validation_metrics,
)


def group(source, index, scores, accs=None, preds=None):
    accs = scores if accs is None else accs
    preds = [None] * len(scores) if preds is None else preds
    return [
        ValidationSample(source, index, float(s), float(a), p)
        for s, a, p in zip(scores, accs, preds, strict=True)
    ]


# -- brute force references (independent of the implementation) ----------------


def brute_best_worst(values, k):
    subsets = list(itertools.combinations(values, k))
    return (
        sum(max(s) for s in subsets) / len(subsets),
        sum(min(s) for s in subsets) / len(subsets),
    )


def brute_pass(n, c, k):
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(outcomes, k))
    return sum(any(s) for s in subsets) / len(subsets)


def vote(values, preds, subset):
    """The documented rule, one subset at a time."""
    counts = Counter(preds[i] for i in subset if preds[i] is not None)
    if not counts:
        return sum(values[i] for i in subset) / len(subset)
    most = max(counts.values())
    tied = [p for p, c in counts.items() if c == most]
    answer_values = [np.mean([values[i] for i in subset if preds[i] == answer]) for answer in tied]
    return float(np.mean(answer_values))


def brute_maj(values, preds, k):
    subsets = list(itertools.combinations(range(len(values)), k))
    return sum(vote(values, preds, s) for s in subsets) / len(subsets)


def pred_ids(preds):
    classes = {p: i for i, p in enumerate(sorted({p for p in preds if p is not None}))}
    return np.array([-1 if p is None else classes[p] for p in preds])


# -- order statistics ------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_best_and_worst_at_k_equal_brute_force_over_all_subsets(n):
    rng = np.random.default_rng(n)
    values = list(rng.normal(size=n).round(3))
    values[0] = values[-1]  # ties are fine
    for k in range(1, n + 1):
        best, worst = brute_best_worst(values, k)
        assert expected_max_at_k(values, k) == pytest.approx(best)
        assert expected_min_at_k(values, k) == pytest.approx(worst)


def test_best_at_k_by_hand():
    # values 0, 1, 2, 3; k = 2: max of the 6 pairs = 1, 2, 3, 2, 3, 3 -> 14/6
    assert expected_max_at_k([3, 0, 2, 1], 2) == pytest.approx(14 / 6)
    assert expected_min_at_k([3, 0, 2, 1], 2) == pytest.approx(4 / 6)
    assert expected_max_at_k([3, 0, 2, 1], 1) == pytest.approx(1.5)  # the mean
    assert expected_max_at_k([3, 0, 2, 1], 4) == 3.0


def test_best_at_k_is_finite_for_large_groups():
    values = np.linspace(0, 1, 2048)
    assert expected_max_at_k(values, 1024) == pytest.approx(1.0, abs=1e-2)
    assert expected_min_at_k(values, 1024) == pytest.approx(0.0, abs=1e-2)


# -- pass@k --------------------------------------------------------------------------


def test_pass_at_k_known_value():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)


@pytest.mark.parametrize("n", [1, 2, 4, 7])
def test_pass_at_k_equals_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k(n, c, k) == pytest.approx(brute_pass(n, c, k))


def test_pass_at_k_is_stable_for_large_n():
    n, c, k = 2000, 3, 1000
    exact = 1 - math.comb(n - c, k) / math.comb(n, k)  # big-integer reference
    assert pass_at_k(n, c, k) == pytest.approx(exact, rel=1e-12)
    assert pass_at_k(n, 0, k) == 0.0
    assert pass_at_k(n, n - k + 1, k) == 1.0


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 2)
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


# -- maj@k -----------------------------------------------------------------------------


def test_maj_at_n_with_a_tie_counts_the_tied_answers_equally():
    values = [1.0, 1.0, 0.0, 0.0]
    preds = ["7", "7", "8", "8"]
    subsets = k_subsets(4, 4, np.random.default_rng(0))
    assert majority_value(np.array(values), pred_ids(preds), subsets) == 0.5
    # a third answer with one vote does not change the 2-2 tie
    values, preds = [1.0, 1.0, 0.0, 0.0, 0.0], ["7", "7", "8", "8", "9"]
    all5 = k_subsets(5, 5, np.random.default_rng(0))
    assert majority_value(np.array(values), pred_ids(preds), all5) == 0.5


def test_maj_at_n_takes_the_mean_value_of_the_winning_answer():
    values = np.array([1.0, 0.5, 0.0, 0.2])  # "7" won twice with different rewards
    preds = ["7", "7", "8", None]
    assert majority_value(values, pred_ids(preds), np.array([[0, 1, 2, 3]])) == 0.75


def test_samples_without_pred_do_not_vote():
    values = np.array([0.0, 0.0, 0.0, 1.0])
    preds = [None, None, None, "5"]  # one vote beats three non-votes
    assert majority_value(values, pred_ids(preds), np.array([[0, 1, 2, 3]])) == 1.0
    # a subset with no vote at all is worth its mean
    assert majority_value(values, pred_ids(preds), np.array([[0, 1]])) == 0.0
    assert majority_value(values, pred_ids([None] * 4), np.array([[0, 3]])) == 0.5


def test_small_groups_enumerate_every_subset_exactly():
    values = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0]
    preds = ["a", "b", "b", "a", None, "c"]
    subsets = k_subsets(6, 3, np.random.default_rng(0))
    assert len(subsets) == math.comb(6, 3)
    assert majority_value(np.array(values), pred_ids(preds), subsets) == pytest.approx(
        brute_maj(values, preds, 3)
    )


def test_maj_at_k_resampling_is_close_to_the_expectation_over_all_subsets():
    n, k = 14, 7  # C(14, 7) = 3432 subsets > MAJ_RESAMPLES: resampled
    assert math.comb(n, k) > MAJ_RESAMPLES
    rng = np.random.default_rng(3)
    preds = [str(x) for x in rng.integers(0, 3, size=n)]
    preds[0] = None
    values = [1.0 if p == "0" else 0.0 for p in preds]
    subsets = k_subsets(n, k, np.random.default_rng(0))
    assert subsets.shape == (MAJ_RESAMPLES, k)
    assert all(len(set(row)) == k for row in subsets.tolist())
    estimate = majority_value(np.array(values), pred_ids(preds), subsets)
    assert estimate == pytest.approx(brute_maj(values, preds, k), abs=0.05)


# -- validation_metrics ------------------------------------------------------------------


def test_k_values():
    assert k_values(1) == []
    assert k_values(2) == [2]
    assert k_values(5) == [2, 4, 5]
    assert k_values(8) == [2, 4, 8]
    assert k_values(16) == [2, 4, 8, 16]


def test_n_equal_one_gives_only_the_means():
    samples = group("gsm8k", 0, [1.0], preds=["3"]) + group("gsm8k", 1, [0.0], preds=["4"])
    assert validation_metrics(samples) == {
        "val/score/mean": 0.5,
        "val/acc/mean": 0.5,
        "val-core/gsm8k/reward/mean@1": 0.5,
        "val-core/gsm8k/acc/mean@1": 0.5,
    }


def test_metric_names_for_n_four_with_preds():
    samples = group("math", 0, [1, 0, 0, 1], preds=["1", "2", "2", "1"]) + group(
        "math", 1, [0, 0, 0, 1], preds=["3", "3", "3", "4"]
    )
    metrics = validation_metrics(samples)
    expected = {"val/score/mean", "val/acc/mean"}
    for var in ("reward", "acc"):
        expected |= {
            f"val-core/math/{var}/mean@4",
            f"val-aux/math/{var}/best@2/mean",
            f"val-aux/math/{var}/worst@2/mean",
            f"val-aux/math/{var}/maj@2/mean",
            f"val-core/math/{var}/best@4/mean",
            f"val-aux/math/{var}/worst@4/mean",
            f"val-core/math/{var}/maj@4/mean",
        }
    expected |= {"val-aux/math/pass@2", "val-aux/math/pass@4"}
    assert set(metrics) == expected
    assert metrics["val-core/math/acc/mean@4"] == 3 / 8
    assert metrics["val-core/math/acc/best@4/mean"] == 1.0
    assert metrics["val-aux/math/acc/worst@4/mean"] == 0.0
    # prompt 0: a 2-2 tie (0.5); prompt 1: "3" wins (0.0)
    assert metrics["val-core/math/acc/maj@4/mean"] == 0.25
    assert metrics["val-aux/math/pass@4"] == 1.0
    # pass@2: prompt 0 (c=2 of 4): 1 - 1/6; prompt 1 (c=1): 1 - 3/6
    assert metrics["val-aux/math/pass@2"] == pytest.approx(((1 - 1 / 6) + (1 - 3 / 6)) / 2)
    assert metrics["val-aux/math/acc/maj@2/mean"] == pytest.approx(
        (
            brute_maj([1, 0, 0, 1], ["1", "2", "2", "1"], 2)
            + brute_maj([0, 0, 0, 1], ["3"] * 3 + ["4"], 2)
        )
        / 2
    )


def test_no_maj_without_preds_and_reward_and_acc_are_separate():
    samples = group("countdown", 0, [0.1, 1.0, 0.0], accs=[0.0, 1.0, 0.0])
    metrics = validation_metrics(samples)
    assert not any("maj@" in name for name in metrics)
    assert metrics["val-core/countdown/reward/mean@3"] == pytest.approx(1.1 / 3)
    assert metrics["val-core/countdown/acc/mean@3"] == pytest.approx(1 / 3)
    # worst@2 of the rewards {0, 0.1, 1}: pairs (0, .1), (0, 1), (.1, 1) -> mins 0, 0, .1
    assert metrics["val-aux/countdown/reward/worst@2/mean"] == pytest.approx(0.1 / 3)
    assert metrics["val-aux/countdown/acc/worst@2/mean"] == 0.0
    assert metrics["val-aux/countdown/pass@3"] == 1.0  # acc > 0.5 once


def test_data_sources_are_separate():
    a = group("a", 0, [1, 1]) + group("a", 1, [0, 1])
    b = group("b", 7, [0, 0, 0, 0], preds=["x", "y", "y", None])
    both = validation_metrics(a + b, seed=5)
    alone_a = validation_metrics(a, seed=5)
    alone_b = validation_metrics(b, seed=5)
    assert {k: v for k, v in both.items() if "/a/" in k} == {
        k: v for k, v in alone_a.items() if "/a/" in k
    }
    assert {k: v for k, v in both.items() if "/b/" in k} == {
        k: v for k, v in alone_b.items() if "/b/" in k
    }
    assert both["val/score/mean"] == pytest.approx(3 / 8)
    assert both["val-core/a/reward/mean@2"] == 0.75
    assert both["val-core/b/reward/mean@4"] == 0.0
    assert both["val-aux/a/pass@2"] == 1.0


def test_sample_order_does_not_matter_for_exact_metrics():
    samples = group("s", 0, [1, 0, 0, 1], preds=list("abba")) + group(
        "s", 1, [0, 1, 1, 1], preds=list("cddd")
    )
    forward = validation_metrics(samples)
    backward = validation_metrics(samples[::-1])
    assert forward == pytest.approx(backward)


def test_uneven_groups_skip_the_k_they_are_too_small_for():
    samples = group("s", 0, [1, 0, 0, 0]) + group("s", 1, [1, 1])
    metrics = validation_metrics(samples)
    assert metrics["val-core/s/reward/mean@4"] == pytest.approx(3 / 6)
    # best@2: prompt 0: 1 - C(3,2)/C(4,2) = 0.5; prompt 1: 1
    assert metrics["val-aux/s/reward/best@2/mean"] == pytest.approx(0.75)
    assert metrics["val-core/s/reward/best@4/mean"] == 1.0  # prompt 0 only
    assert metrics["val-aux/s/pass@4"] == 1.0
    assert metrics["val-aux/s/reward/worst@4/mean"] == 0.0


def test_resampled_maj_is_deterministic_given_the_seed():
    rng = np.random.default_rng(0)
    samples = group(
        "s", 0, list(rng.integers(0, 2, 16)), preds=[str(p) for p in rng.integers(0, 4, 16)]
    )
    first = validation_metrics(samples, seed=1)
    assert validation_metrics(samples, seed=1) == first
    assert "val-aux/s/acc/maj@8/mean" in first  # C(16, 8) > MAJ_RESAMPLES: resampled


def test_empty_input():
    assert validation_metrics([]) == {}
