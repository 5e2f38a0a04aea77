"""Which rows a reward model scores, for both styles (the sequence classifier,
engine.reward.model; the judge, engine.reward.judge): the covered data sources' rows to
the model, the others to the rule functions, and the rows padded to an even share per
rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from engine.reward.manager import RewardManager
from engine.reward.types import ScoreRequest, ScoreResult

T = TypeVar("T")


def scored_with_rules(
    requests: list[ScoreRequest],
    covers: Callable[[str], bool],
    rules: RewardManager,
    score_rows: Callable[[list[int]], list[ScoreResult]],
) -> list[ScoreResult]:
    """Each request's result: ``score_rows(rows)`` for the rows whose data source the
    reward model covers (either style), the rule functions' for the others; DAPO's
    overlong penalty on the model's results too."""
    on_model = [i for i, r in enumerate(requests) if covers(r.data_source)]
    chosen = set(on_model)
    on_rule = [i for i in range(len(requests)) if i not in chosen]
    results: list[ScoreResult | None] = [None] * len(requests)
    for i, result in zip(on_rule, rules.score([requests[i] for i in on_rule]), strict=True):
        results[i] = result
    if on_model:
        for i, result in zip(on_model, score_rows(on_model), strict=True):
            results[i] = result
        rules.add_overlong_penalty([requests[i] for i in on_model], [results[i] for i in on_model])
    return [r for r in results if r is not None]


def even_for_ranks(rows: list[T], ranks: int) -> list[T]:
    """``rows`` with the first repeated until every rank gets as many (the repeats'
    results are dropped)."""
    return rows + rows[:1] * (-len(rows) % ranks)
