"""A vision-language batch over data-parallel ranks (engine.controller.dispatch): each
row's images are ragged (their own number of patches, or none), so they travel as a
per-row list beside the tokens and their positions, and split, gather, reorder and trim
with their rows."""

import dataclasses

import torch

from engine.controller.dispatch import concat, split, take
from engine.loop.balance import reorder
from engine.loop.batch import Rollout
from engine.train.packing import trim_padding
from engine.types import GenerationRequest, ImageInputs, SampleMeta, SamplingParams, TokenBatch

PAD = 9  # an image pad token


def images(row: int, grids: list[tuple[int, int]], prompt: list[int]) -> ImageInputs:
    """Images whose patches are filled with ``row`` (to tell them apart after a split)."""
    from engine.models.mrope import prompt_positions

    grid = torch.tensor([[1, h, w] for h, w in grids])
    patches = int(grid.prod(-1).sum())
    return ImageInputs(
        pixel_values_PD=torch.full((patches, 6), float(row)),
        image_grid_thw_N3=grid,
        positions_3P=prompt_positions(prompt, grid, PAD, 2),
    )


def make_rows():
    prompts = [
        [1, PAD, 2],  # one image of 2 x 2 patches: one pad
        [1, PAD, PAD, PAD, PAD, 3, PAD, 2],  # 4 x 4 and 2 x 2 patches
        [1, 2, 3],  # no image
        [PAD, PAD, 2, 2],  # 2 x 4 patches: two pads
    ]
    grids = [[(2, 2)], [(4, 4), (2, 2)], None, [(2, 4)]]
    rows = [
        None if g is None else images(i, g, p)
        for i, (p, g) in enumerate(zip(prompts, grids, strict=True))
    ]
    responses = [[5, 6], [7], [], [8, 8, 8]]
    return prompts, responses, rows


def test_split_and_concat_keep_each_rows_images_and_positions():
    prompts, responses, rows = make_rows()
    tokens = TokenBatch.from_ragged(prompts, responses, 0, images=rows)
    shards = split(tokens, 2)
    assert [len(s) for s in shards] == [2, 2]
    for rank, shard in enumerate(shards):
        for j, row in enumerate(shard.vision.images):
            i = 2 * rank + j
            assert row is rows[i]  # the row's own images, whole
            assert torch.equal(shard.vision.position_ids_B3S[j], tokens.vision.position_ids_B3S[i])
        patches = shard.vision.pixel_inputs().get("pixel_values")
        if patches is not None:  # the shard's images only, in row order
            assert set(patches[:, 0].tolist()) == {
                float(i) for i in (2 * rank, 2 * rank + 1) if rows[i]
            }
    gathered = concat(shards)
    assert gathered.vision.images == rows
    assert torch.equal(gathered.vision.position_ids_B3S, tokens.vision.position_ids_B3S)
    assert torch.equal(gathered.input_ids_BS, tokens.input_ids_BS)


def test_a_request_and_a_rollout_carry_images_per_row():
    prompts, responses, rows = make_rows()
    request = GenerationRequest(prompts, SamplingParams(), images=rows)
    halves = split(request, 2)
    assert [h.images for h in halves] == [rows[:2], rows[2:]]
    assert halves[0].sampling is request.sampling
    assert split(GenerationRequest(prompts), 2)[0].images is None  # a text batch: none
    meta = SampleMeta([0, 0, 1, 1], ["s"] * 4, ["red"] * 4, [{}] * 4)
    rollout = Rollout(prompts, responses, meta, torch.zeros(4), torch.zeros(4), [None] * 4,
                      [None] * 4, 0, images=rows)  # fmt: skip
    order = [3, 1, 0, 2]  # what trainer.balance_batch does
    moved = reorder(rollout, order)
    assert moved.images == [rows[i] for i in order]
    assert torch.equal(
        moved.tokens.vision.position_ids_B3S,
        TokenBatch.from_ragged([prompts[i] for i in order], [responses[i] for i in order], 0,
                               images=[rows[i] for i in order]).vision.position_ids_B3S,
    )  # fmt: skip
    assert take(rollout, slice(1, 3)).tokens.vision.images == rows[1:3]


def test_trimming_a_micro_batch_trims_its_positions_alike():
    prompts, responses, rows = make_rows()
    tokens = take(TokenBatch.from_ragged(prompts, responses, 0, images=rows), slice(2, 4))
    trimmed = trim_padding(tokens)
    kept = trimmed.input_ids_BS.shape[1]
    assert kept < tokens.input_ids_BS.shape[1]  # the longest prompt is in another shard
    assert trimmed.vision.position_ids_B3S.shape == (2, 3, kept)
    start = tokens.input_ids_BS.shape[1] - tokens.response_length - (kept - trimmed.response_length)
    assert torch.equal(
        trimmed.vision.position_ids_B3S,
        tokens.vision.position_ids_B3S[:, :, start : start + kept],
    )
    assert dataclasses.replace(trimmed, vision=None).vision is None
