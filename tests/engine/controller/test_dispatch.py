"""Split/gather of typed batches over data-parallel ranks."""

import pytest
import torch

from engine.controller.dispatch import ModelParallelLayout, batch_rows, concat, split, take
from engine.types import ActorBatch, GenerationRequest, SamplingParams, TokenBatch


def make_tokens() -> TokenBatch:
    # Four samples: prompts of 1-3 tokens, responses of 0-2 tokens.
    return TokenBatch.from_ragged(
        prompts=[[11], [12, 13], [14, 15, 16], [17]],
        responses=[[21, 22], [23], [], [24, 25]],
        pad_token_id=0,
    )


def test_from_ragged_pads_prompts_left_and_responses_right():
    t = make_tokens()
    assert t.input_ids_BS.tolist() == [
        [0, 0, 11, 21, 22],
        [0, 12, 13, 23, 0],
        [14, 15, 16, 0, 0],
        [0, 0, 17, 24, 25],
    ]
    assert t.attention_mask_BS.tolist() == [
        [0, 0, 1, 1, 1],
        [0, 1, 1, 1, 0],
        [1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1],
    ]
    # Positions count real tokens, so a left-padded prompt still starts at 0.
    assert t.position_ids_BS[0].tolist() == [0, 0, 0, 1, 2]
    assert t.position_ids_BS[1].tolist() == [0, 0, 1, 2, 2]
    assert t.response_mask_BR.tolist() == [[1, 1], [1, 0], [0, 0], [1, 1]]
    assert t.responses_BR.tolist() == [[21, 22], [23, 0], [0, 0], [24, 25]]


def test_split_gives_contiguous_chunks_and_concat_restores_the_batch():
    tokens = make_tokens()
    batch = ActorBatch(
        tokens=tokens,
        old_logprobs_BR=torch.arange(8.0).reshape(4, 2),
        advantages_BR=torch.ones(4, 2),
        ref_logprobs_BR=None,
    )
    shards = split(batch, 2)
    assert [len(s.tokens) for s in shards] == [2, 2]
    assert shards[1].old_logprobs_BR.tolist() == [[4.0, 5.0], [6.0, 7.0]]
    assert shards[1].tokens.input_ids_BS.tolist() == tokens.input_ids_BS[2:].tolist()
    assert shards[0].ref_logprobs_BR is None  # an absent field stays absent
    joined = concat(shards)
    assert torch.equal(joined.old_logprobs_BR, batch.old_logprobs_BR)
    assert torch.equal(joined.tokens.input_ids_BS, tokens.input_ids_BS)


def test_shared_fields_go_whole_to_every_rank():
    sampling = SamplingParams(n=4, temperature=0.7)
    request = GenerationRequest(prompt_ids=[[1], [2], [3], [4]], sampling=sampling)
    shards = split(request, 2)
    assert [s.prompt_ids for s in shards] == [[[1], [2]], [[3], [4]]]
    assert all(s.sampling is sampling for s in shards)


def test_uneven_split_is_refused():
    # Every rank must run the same number of forward passes, or collectives hang.
    with pytest.raises(ValueError, match="5 rows cannot be split evenly over 2"):
        split(torch.zeros(5, 3), 2)


def test_take_and_rows():
    tokens = make_tokens()
    assert batch_rows(tokens) == 4
    assert batch_rows(SamplingParams()) is None
    assert take(tokens, slice(1, 3)).input_ids_BS.tolist() == tokens.input_ids_BS[1:3].tolist()


def _stand_in_group(world_size: int, layouts: dict, sent: dict):
    """A WorkerGroup without Ray: each stand-in worker records the shard it was sent
    and answers with its rank."""
    from types import SimpleNamespace

    from engine.controller.worker_group import WorkerGroup

    def worker(rank: int) -> SimpleNamespace:
        def remote(role, method, shard, *args):
            sent[rank] = shard
            return [f"{role}.{method}@{rank}:{x}" for x in shard]

        return SimpleNamespace(call=SimpleNamespace(remote=remote))

    group = WorkerGroup.__new__(WorkerGroup)
    group.world_size = world_size
    group.layouts = layouts
    group.workers = [worker(r) for r in range(world_size)]
    group.get = lambda refs, phase="": refs
    return group


def _flat(results):
    return [x for r in results for x in r]


def test_call_split_gives_tensor_parallel_ranks_the_same_rows():
    """A Megatron role with TP = 2 on 4 ranks: ranks 0, 1 get the first half of the rows,
    ranks 2, 3 the second; the result is gathered from TP rank 0 of each group only."""
    sent: dict[int, list[int]] = {}
    group = _stand_in_group(4, {"actor": ModelParallelLayout(tp=2)}, sent)
    rows = list(range(8))
    out = group.call_split("actor", "log_probs", rows, gather=_flat)
    assert sent == {0: [0, 1, 2, 3], 1: [0, 1, 2, 3], 2: [4, 5, 6, 7], 3: [4, 5, 6, 7]}
    assert out == [f"actor.log_probs@{0 if x < 4 else 2}:{x}" for x in rows]
    # Other roles (the rollout, an FSDP critic) still split over every rank.
    group.call_split("rollout", "generate", rows, gather=lambda rs: rs)
    assert sent == {r: [2 * r, 2 * r + 1] for r in range(4)}


def test_call_split_with_pipeline_stages_gathers_the_last_stage():
    """TP 2 × DP 2 × PP 2 on 8 ranks, in Megatron's order (TP fastest, PP slowest):
    stage 0 is ranks 0-3, stage 1 ranks 4-7; replica d is ranks {2d, 2d+1, 4+2d, 5+2d}.
    Every rank of a replica gets its rows; the last stage's TP rank 0 answers."""
    sent: dict[int, list[int]] = {}
    layout = ModelParallelLayout(tp=2, pp=2)
    group = _stand_in_group(8, {"actor": layout}, sent)
    rows = list(range(4))
    out = group.call_split("actor", "update", rows, gather=_flat)
    first, second = [0, 1], [2, 3]
    assert sent == {
        0: first, 1: first, 2: second, 3: second,
        4: first, 5: first, 6: second, 7: second,
    }  # fmt: skip
    assert out == ["actor.update@4:0", "actor.update@4:1", "actor.update@6:2", "actor.update@6:3"]
    assert layout.output_ranks(8) == [4, 6]
    # TP 2 × CP 2 × DP 2 on 8 ranks: a replica is 4 consecutive ranks, answered by its
    # first (TP rank 0, CP rank 0).
    with_cp = ModelParallelLayout(tp=2, cp=2)
    assert [with_cp.shard(r, 8) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert with_cp.output_ranks(8) == [0, 4]
    # PP 4 alone: one replica over all ranks, answered by the last.
    assert ModelParallelLayout(pp=4).output_ranks(4) == [3]
    assert [ModelParallelLayout(pp=2).shard(r, 4) for r in range(4)] == [0, 1, 0, 1]
