"""The Megatron engine's pipeline schedule and stage bookkeeping (no megatron-core
needed). The schedule running on real stages is tested in test_megatron_backend.py
(PP 2 and 4 against Hugging Face) and tests/e2e/test_megatron_cpu.py."""

import pytest

from engine.config.megatron_parallel import pipeline_stage_layers
from engine.train.megatron_pipeline import Stage, layer_index, one_f_one_b, shift_layer


def test_one_f_one_b_by_hand():
    # 4 stages, 6 micro-batches: stage 0 warms up with 3 forwards, the last with none.
    assert one_f_one_b(0, 4, 6) == [
        ("F", 0), ("F", 1), ("F", 2),
        ("F", 3), ("B", 0), ("F", 4), ("B", 1), ("F", 5), ("B", 2),
        ("B", 3), ("B", 4), ("B", 5),
    ]  # fmt: skip
    assert one_f_one_b(3, 4, 3) == [("F", 0), ("B", 0), ("F", 1), ("B", 1), ("F", 2), ("B", 2)]
    # Fewer micro-batches than stages: all forwards, then all backwards.
    assert one_f_one_b(0, 4, 2) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]
    assert one_f_one_b(0, 1, 2) == [("F", 0), ("B", 0), ("F", 1), ("B", 1)]
    with pytest.raises(ValueError, match="stage 4"):
        one_f_one_b(4, 4, 1)


def _link_groups(stage: int, stages: int, micro_batches: int) -> list[list[tuple]]:
    """The transfers ``StageLink`` issues on ``stage`` during the schedule, as the groups
    it batches: a forward receives its activation (not on the first stage) and sends its
    output on (not on the last); a backward receives its gradient (not on the last) and
    sends its input's gradient back (not on the first). A send waits for the stage's next
    receive and goes out with it; what is left goes out at the end. An op is
    (direction, peer, what, micro-batch)."""
    groups, queued = [], []

    def recv(peer, what, i):
        nonlocal queued
        groups.append([*queued, ("recv", peer, what, i)])
        queued = []

    for op, i in one_f_one_b(stage, stages, micro_batches):
        if op == "F":
            if stage > 0:
                recv(stage - 1, "act", i)
            if stage < stages - 1:
                queued.append(("send", stage + 1, "act", i))
        else:
            if stage < stages - 1:
                recv(stage + 1, "grad", i)
            if stage > 0:
                queued.append(("send", stage - 1, "grad", i))
    if queued:
        groups.append(queued)
    return groups


def _simulate(groups: list[list[list[tuple]]]) -> None:
    """Runs every stage's groups under NCCL's rule: a stage is held at its current group
    until each of its transfers has met its match in the peer's current group (sends do
    not complete on their own; the next group waits for this one). Fails on a deadlock."""
    stages = len(groups)
    at = [0] * stages
    done = [set() for _ in range(stages)]  # transfers of the current group that completed

    def current(s):
        return groups[s][at[s]] if at[s] < len(groups[s]) else []

    while any(at[s] < len(groups[s]) for s in range(stages)):
        moved = False
        for s in range(stages):
            for direction, peer, what, i in current(s):
                match = ("recv" if direction == "send" else "send", s, what, i)
                if match in current(peer) and (direction, peer, what, i) not in done[s]:
                    done[s].add((direction, peer, what, i))
                    done[peer].add(match)
                    moved = True
        for s in range(stages):
            if current(s) and all(op in done[s] for op in current(s)):
                at[s] += 1
                done[s] = set()
                moved = True
        assert moved, f"deadlock: stages at groups {at} of {[len(g) for g in groups]}"


def _peak_in_flight(order: list[tuple[str, int]]) -> int:
    alive = peak = 0
    for op, _ in order:
        alive += 1 if op == "F" else -1
        peak = max(peak, alive)
    return peak


@pytest.mark.parametrize("stages", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("micro_batches", [1, 2, 5, 16])
def test_one_f_one_b_never_deadlocks_and_bounds_activations(stages, micro_batches):
    _simulate([_link_groups(s, stages, micro_batches) for s in range(stages)])
    for s in range(stages):
        order = one_f_one_b(s, stages, micro_batches)
        assert sorted(order) == sorted(
            [("F", i) for i in range(micro_batches)] + [("B", i) for i in range(micro_batches)]
        )
        # Each backward follows its forward, in forward order.
        assert [i for op, i in order if op == "B"] == list(range(micro_batches))
        # 1F1B's memory bound: stage s holds at most p - s micro-batches' activations.
        assert _peak_in_flight(order) <= min(stages - s, micro_batches)


def test_sending_one_by_one_would_deadlock_on_nccl():
    """Why ``StageLink`` batches: issued alone, stage 0's activation send waits for
    stage 1 to receive it, while stage 1 first sends a gradient that stage 0 receives only
    after that send (1F1B with 2 stages, 3 micro-batches)."""
    batched = [_link_groups(s, 2, 3) for s in range(2)]
    _simulate(batched)
    one_by_one = [[[op] for group in stage for op in group] for stage in batched]
    with pytest.raises(AssertionError, match="deadlock"):
        _simulate(one_by_one)


def test_layer_names_shift_between_stage_and_model():
    assert shift_layer("decoder.layers.1.mlp.linear_fc1.weight", 6) == (
        "decoder.layers.7.mlp.linear_fc1.weight"
    )
    assert shift_layer("decoder.layers.7.self_attention.linear_qkv.weight", -6) == (
        "decoder.layers.1.self_attention.linear_qkv.weight"
    )
    assert shift_layer("decoder.final_layernorm.weight", 6) == "decoder.final_layernorm.weight"
    assert shift_layer("embedding.word_embeddings.weight", 3) == "embedding.word_embeddings.weight"
    assert layer_index("decoder.layers.12.input_layernorm.weight") == 12
    assert layer_index("output_layer.weight") is None


def test_stage_layers_equal_or_the_rest_on_the_last():
    assert pipeline_stage_layers(8, 4) == [2, 2, 2, 2]
    # Llama 3.1 405B: 126 layers over 16 stages.
    assert pipeline_stage_layers(126, 16) == [8] * 15 + [6]
    assert pipeline_stage_layers(4, 4) == [1, 1, 1, 1]
    assert pipeline_stage_layers(28, 8) is None  # 7 × 4 leaves nothing for the last
    assert pipeline_stage_layers(3, 4) is None and pipeline_stage_layers(3, 0) is None


def test_stages_split_layers_and_hold_their_tensors():
    # 7 layers over 4 stages (2, 2, 2, 1); this rank's pipeline group is global ranks
    # 1, 3, 5, 7.
    ranks = [1, 3, 5, 7]
    layers = pipeline_stage_layers(7, 4)
    first = Stage.of(0, layers, ranks)
    middle = Stage.of(2, layers, ranks)
    last = Stage.of(3, layers, ranks)
    assert (first.layer_offset, first.layers, first.prev_rank, first.next_rank) == (0, 2, None, 3)
    assert (middle.layer_offset, middle.prev_rank, middle.next_rank) == (4, 3, 7)
    assert (last.layer_offset, last.layers, last.prev_rank, last.next_rank) == (6, 1, 5, None)
    assert first.first and not first.last and last.last and not middle.first
    emb = "embedding.word_embeddings.weight"
    head, norm = "output_layer.weight", "decoder.final_layernorm.weight"
    layer = "decoder.layers.{}.mlp.linear_fc2.weight".format
    assert [s.holds(emb) for s in (first, middle, last)] == [True, False, False]
    assert [s.holds(head) for s in (first, middle, last)] == [False, False, True]
    assert [s.holds(norm) for s in (first, middle, last)] == [False, False, True]
    assert [i for i in range(7) if middle.holds(layer(i))] == [4, 5]
    assert [i for i in range(7) if last.holds(layer(i))] == [6]
    one = Stage.of(0, [7], [0])
    assert one.first and one.last and all(one.holds(n) for n in (emb, head, norm, layer(6)))
