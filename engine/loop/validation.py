"""Validation metrics: what the trainer logs after scoring the validation set.

``validation_metrics(samples)`` takes one ``ValidationSample`` per generated response
(the ``n = val_kwargs.n`` samples of a prompt share ``prompt_index``) and returns verl's
metric names. For each data source ``ds``, with ``n`` its largest group size, and each
variable ``var``: ``reward`` (the score) and ``acc`` (correctness in [0, 1]):

- ``val-core/{ds}/{var}/mean@{n}``: the mean over all the source's samples.
- for ``k`` in ``k_values(n)`` (2, 4, 8, ... below ``n``, then ``n``; none when n = 1),
  over the prompts with at least ``k`` samples (smaller groups skip that ``k``):

  - ``{sec}/{ds}/{var}/best@{k}/mean``, ``val-aux/{ds}/{var}/worst@{k}/mean``: the
    expected max (min) of ``var`` over a uniformly random k-subset of a prompt's samples,
    exact (order statistics), averaged over prompts;
  - ``{sec}/{ds}/{var}/maj@{k}/mean``, only when some sample of ``ds`` has a ``pred``:
    the value of the majority-voted answer of a random k-subset, averaged over prompts
    (see ``majority_value``); all subsets are enumerated when there are at most
    ``MAJ_RESAMPLES`` of them (always for k = n), else ``MAJ_RESAMPLES`` random subsets
    are drawn, seeded by ``seed`` and the data source;
  - ``val-aux/{ds}/pass@{k}``: the unbiased pass@k estimator of Chen et al. (2021),
    ``1 - C(n - c, k) / C(n, k)`` with ``c`` the samples whose ``acc > 0.5``.

  ``{sec}`` is ``val-core`` for ``k = n`` and ``val-aux`` otherwise (verl's split: mean,
  best and maj at the largest k are core; worst and pass@k are always aux).

And over all the samples of all sources: ``val/score/mean`` and ``val/acc/mean``.
"""

from __future__ import annotations

import functools
import itertools
import math
import zlib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAJ_RESAMPLES = 1000  # random k-subsets per prompt for maj@k when C(n, k) is larger
CORRECT_ACC = 0.5  # a sample counts as correct for pass@k when acc > CORRECT_ACC
VARIABLES = ("reward", "acc")


@dataclass
class ValidationSample:
    data_source: str
    prompt_index: int  # samples of the same prompt share it (n samples per prompt)
    score: float  # the reward
    acc: float  # correctness in [0, 1]
    pred: str | None = None  # the extracted final answer, for majority voting (None: unknown)


def validation_metrics(samples: list[ValidationSample], seed: int = 0) -> dict[str, float]:
    """verl's validation metrics (see the module docstring); ``{}`` for no samples.

    Deterministic given ``samples`` and ``seed`` (a non-negative integer); a data
    source's metrics do not depend on the other sources in the list.
    """
    if not samples:
        return {}
    out = {
        "val/score/mean": float(np.mean([s.score for s in samples])),
        "val/acc/mean": float(np.mean([s.acc for s in samples])),
    }
    groups: dict[str, dict[int, list[ValidationSample]]] = defaultdict(lambda: defaultdict(list))
    for sample in samples:
        groups[sample.data_source][sample.prompt_index].append(sample)
    for source in sorted(groups):
        rng = np.random.default_rng([seed, zlib.crc32(source.encode())])
        by_prompt = groups[source]
        out |= _source_metrics(source, [by_prompt[i] for i in sorted(by_prompt)], rng)
    return out


def _source_metrics(
    source: str, prompts: list[list[ValidationSample]], rng: np.random.Generator
) -> dict[str, float]:
    n = max(len(group) for group in prompts)
    values = [
        {"reward": np.array([s.score for s in g]), "acc": np.array([s.acc for s in g])}
        for g in prompts
    ]
    out = {
        f"val-core/{source}/{var}/mean@{n}": float(
            np.mean(np.concatenate([v[var] for v in values]))
        )
        for var in VARIABLES
    }
    has_preds = any(s.pred is not None for g in prompts for s in g)
    pred_ids = [_pred_ids(g) for g in prompts]
    for k in k_values(n):
        sec = "val-core" if k == n else "val-aux"
        eligible = [i for i, g in enumerate(prompts) if len(g) >= k]
        subsets = {i: k_subsets(len(prompts[i]), k, rng) for i in eligible} if has_preds else {}
        for var in VARIABLES:
            vs = [values[i][var] for i in eligible]
            out[f"{sec}/{source}/{var}/best@{k}/mean"] = _mean(expected_max_at_k(v, k) for v in vs)
            out[f"val-aux/{source}/{var}/worst@{k}/mean"] = _mean(
                expected_min_at_k(v, k) for v in vs
            )
            if has_preds:
                out[f"{sec}/{source}/{var}/maj@{k}/mean"] = _mean(
                    majority_value(values[i][var], pred_ids[i], subsets[i]) for i in eligible
                )
        out[f"val-aux/{source}/pass@{k}"] = _mean(
            pass_at_k(len(values[i]["acc"]), int(np.sum(values[i]["acc"] > CORRECT_ACC)), k)
            for i in eligible
        )
    return out


def k_values(n: int) -> list[int]:
    """The subset sizes reported for groups of ``n``: 2, 4, 8, ... below ``n``, then ``n``."""
    if n < 2:
        return []
    ks = [2**p for p in range(1, n.bit_length()) if 2**p < n]
    return [*ks, n]


# -- best@k / worst@k: order statistics ----------------------------------------


@functools.lru_cache(maxsize=1024)
def _max_weights(n: int, k: int) -> np.ndarray:
    """``w[i] = C(i, k-1) / C(n, k)``: the chance that the (i+1)-th smallest of ``n`` values
    is the max of a uniformly random k-subset (exact big-integer ratios, then rounded)."""
    total = math.comb(n, k)
    weights = np.array([math.comb(i, k - 1) / total for i in range(n)])
    weights.flags.writeable = False
    return weights


def expected_max_at_k(values: Sequence[float] | np.ndarray, k: int) -> float:
    """E[max of a uniformly random k-subset of ``values``] = Σ_i v_(i) C(i-1, k-1) / C(n, k),
    v_(1) ≤ ... ≤ v_(n) sorted ascending."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    _check_k(len(ordered), k)
    return float(ordered @ _max_weights(len(ordered), k))


def expected_min_at_k(values: Sequence[float] | np.ndarray, k: int) -> float:
    """E[min of a uniformly random k-subset of ``values``] = Σ_i v_(i) C(n-i, k-1) / C(n, k)."""
    ordered = np.sort(np.asarray(values, dtype=np.float64))
    _check_k(len(ordered), k)
    return float(ordered @ _max_weights(len(ordered), k)[::-1])


# -- pass@k ------------------------------------------------------------------------


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chen et al.'s unbiased estimator ``1 - C(n-c, k) / C(n, k)`` from ``c`` correct of
    ``n`` samples, as the product ``1 - Π_{i=n-c+1}^{n} (1 - k/i)`` (no huge binomials)."""
    _check_k(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"correct count {c} must be in [0, {n}]")
    if n - c < k:
        return 1.0
    return float(1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


# -- maj@k -------------------------------------------------------------------------


def _pred_ids(group: list[ValidationSample]) -> np.ndarray:
    """Each sample's answer as an integer class (``-1``: no answer, does not vote)."""
    classes = {pred: i for i, pred in enumerate(sorted({s.pred for s in group} - {None}))}
    return np.array([-1 if s.pred is None else classes[s.pred] for s in group], dtype=np.int64)


def k_subsets(n: int, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-subsets of ``range(n)`` as rows: all ``C(n, k)`` of them when there are at most
    ``MAJ_RESAMPLES``, else ``MAJ_RESAMPLES`` uniformly random ones (from ``rng``)."""
    _check_k(n, k)
    if math.comb(n, k) <= MAJ_RESAMPLES:
        return _all_subsets(n, k)
    permutations = rng.permuted(np.tile(np.arange(n), (MAJ_RESAMPLES, 1)), axis=1)
    return permutations[:, :k]


@functools.lru_cache(maxsize=256)
def _all_subsets(n: int, k: int) -> np.ndarray:
    subsets = np.array(list(itertools.combinations(range(n), k)), dtype=np.int64)
    subsets.flags.writeable = False
    return subsets


def majority_value(values: np.ndarray, pred_ids: np.ndarray, subsets_SK: np.ndarray) -> float:
    """The mean, over the given subsets of one prompt's samples, of the majority vote's value.

    In a subset, samples with an answer (``pred_ids >= 0``) vote for it; the value of an
    answer is the mean of ``values`` over its samples in the subset. Answers tied for the
    most votes count equally (the expectation of picking one of them at random: no
    ground truth breaks the tie). A subset in which no sample voted is worth the mean of
    its values (the expectation of picking one sample at random).
    """
    values_SK = np.asarray(values, dtype=np.float64)[subsets_SK]
    classes_SK = pred_ids[subsets_SK]
    num_classes = int(pred_ids.max()) + 1
    if num_classes == 0:
        return float(values_SK.mean())
    S = len(subsets_SK)
    voted = classes_SK >= 0
    cell = (np.arange(S)[:, None] * num_classes + classes_SK)[voted]
    counts_SA = np.bincount(cell, minlength=S * num_classes).reshape(S, num_classes)
    sums_SA = np.bincount(cell, weights=values_SK[voted], minlength=S * num_classes).reshape(
        S, num_classes
    )
    most_S = counts_SA.max(axis=1)
    tied_SA = (counts_SA == most_S[:, None]) & (counts_SA > 0)
    answer_value_SA = sums_SA / np.maximum(counts_SA, 1)
    voted_value_S = (answer_value_SA * tied_SA).sum(axis=1) / np.maximum(tied_SA.sum(axis=1), 1)
    value_S = np.where(most_S > 0, voted_value_S, values_SK.mean(axis=1))
    return float(value_S.mean())


# -- helpers -----------------------------------------------------------------------


def _check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must be in [1, n={n}]")


def _mean(values) -> float:
    return float(np.mean(list(values)))
