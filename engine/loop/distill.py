"""The controller's side of on-policy distillation: each sample to its teacher's ranks,
the scores back in the batch's row order (the teacher role: engine.workers.teacher).

One teacher scores every sample. Several route each sample by ``distillation.teacher_key``
(``data_source``, or a field of the sample's ``extra_info``) to the teacher whose ``key``
equals it; a teacher's samples are split evenly over its ranks, and every rank of the pool
is called (with no rows if it has none: the members of a vLLM tensor-parallel group
gather each other's rows)."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.config.distillation import DEFAULT_KEY
from engine.controller.workers import Workers
from engine.errors import EngineError
from engine.types import SampleMeta, TeacherScores, TokenBatch
from engine.workers.teacher import empty_scores, teacher_ranks

ROLE = "teacher"


def route(cfg: EngineConfig, meta: SampleMeta, world: int) -> list[list[int]]:
    """For each rank of the teachers' pool, the rows (sample indices) it scores."""
    layout = teacher_ranks(cfg, world)
    keys = _routing_keys(cfg, meta)
    known = {t.key for t, _ in layout}
    unknown = sorted({k for k in keys if k not in known}) if len(layout) > 1 else []
    if unknown:
        raise EngineError(
            f"samples with {cfg.distillation.teacher_key}={unknown[0]!r} have no teacher: the"
            f" teachers' keys are {sorted(known)}; give distillation.teacher_models.<name>.key"
            " one of these values, or filter the data"
        )
    per_rank: list[list[int]] = [[] for _ in range(world)]
    for teacher, ranks in layout:
        rows = [i for i, k in enumerate(keys) if len(layout) == 1 or k == teacher.key]
        n = len(ranks)
        for j, rank in enumerate(ranks):  # contiguous, as even as the count allows
            per_rank[rank] = rows[j * len(rows) // n : (j + 1) * len(rows) // n]
    return per_rank


def _routing_keys(cfg: EngineConfig, meta: SampleMeta) -> list[str]:
    field = cfg.distillation.teacher_key
    if field == "data_source":
        return [str(v) for v in meta.data_source]
    return [str((extra or {}).get(field, DEFAULT_KEY)) for extra in meta.extra_info]


def select_rows(tokens: TokenBatch, rows: list[int]) -> TokenBatch:
    index = torch.tensor(rows, dtype=torch.long)
    return TokenBatch(
        input_ids_BS=tokens.input_ids_BS[index],
        attention_mask_BS=tokens.attention_mask_BS[index],
        position_ids_BS=tokens.position_ids_BS[index],
        response_mask_BR=tokens.response_mask_BR[index],
    )


def score(
    workers: Workers, cfg: EngineConfig, tokens: TokenBatch, meta: SampleMeta
) -> TeacherScores:
    """The teachers' scores of the batch, rows in the batch's order."""
    group = workers.group_of(ROLE)
    per_rank = route(cfg, meta, group.world_size)
    parts = group.submit_each(
        ROLE, "score", [select_rows(tokens, rows) for rows in per_rank]
    ).result()
    rows, r_len = tokens.responses_BR.shape
    out = empty_scores(rows, r_len, cfg.distillation.topk)
    for where, part in zip(per_rank, parts, strict=True):
        if not where:
            continue
        index = torch.tensor(where, dtype=torch.long)
        out.logprobs_BR[index] = part.logprobs_BR
        if part.topk_ids_BRK is not None:
            out.topk_ids_BRK[index] = part.topk_ids_BRK
            out.topk_logprobs_BRK[index] = part.topk_logprobs_BRK
    return out
