"""A micro-batch as the model sees it: padded rows, or every row's tokens packed end to
end in one row with no padding at all (``actor_rollout_ref.model.use_remove_padding``,
verl's key; docs/training.md).

Packed, the model gets ``input_ids`` and ``position_ids`` of shape (1, T), T the tokens
of all rows together, each row's positions starting again at 0, and no attention mask:
transformers then builds the attention from the positions, each token attending to its
own row's earlier tokens only (a block-diagonal causal mask for sdpa and eager; on GPUs
flash-attention's variable-length kernels, from the same positions). Only the positions
that predict a response token go through the head (``logits_to_keep`` as an index), and
the per-token results are put back in the batch's (B, R) layout. The call passes
``use_cache=False``: with a cache transformers does not read packed rows from the
positions, and every row would attend to the rows before it.

A vision-language batch (``TokenBatch.vision``) packs the same way: the images go in the
order their pad tokens sit in the bins, and the positions are (4, K, L), the text
positions above (which transformers' Qwen2-VL models build the packed mask from, and
flash-attention its row boundaries) over each row's own 3-D rotary positions.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engine.train.vision_tower import NO_IMAGES, keep_tower_running
from engine.types import TokenBatch, pixel_inputs


@dataclass
class ModelCall:
    """What the model is called with, the response tokens its last ``R' + 1`` head
    positions predict (the first ``R'``; ``targets`` is (B', R')), how per-token
    results (B', R') go back to the batch's (B, R), and where each token of the call
    sits in the batch: ``token_index`` (B', T'), row × S + column of the batch's
    (B, S), -1 for padding of the call's own (what MoE routing replay lays out by)."""

    inputs: dict[str, torch.Tensor]
    kwargs: dict
    targets: torch.Tensor
    select: torch.Tensor | None  # head positions to take by hand (no logits_to_keep)
    unpack: Callable[[torch.Tensor], torch.Tensor]
    token_index: torch.Tensor
    # the inverse of ``unpack``: per-response-token values (B, R, ...) laid out as the
    # targets (B', R', ...) (distillation's teacher top-k ids); None where not built
    pack: Callable[[torch.Tensor], torch.Tensor] | None = None

    def head_positions(self, out_BLX: torch.Tensor) -> torch.Tensor:
        """The model output at the positions that predict the targets, (B', R', X)."""
        if self.select is not None:
            out_BLX = out_BLX[:, self.select]
        r = self.targets.shape[1]
        return out_BLX[:, -r - 1 : -1]


@functools.cache
def takes_logits_to_keep(model_type: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_type.forward).parameters


def trimmed_columns(tokens: TokenBatch) -> slice:
    """The columns that are not padding in every row."""
    attention = tokens.attention_mask_BS
    r_len = tokens.response_length
    response_width = max(1, int(attention[:, -r_len:].sum(dim=1).max()))
    prompt_width = int(attention[:, :-r_len].sum(dim=1).max())
    return slice(
        attention.shape[1] - r_len - prompt_width, attention.shape[1] - r_len + response_width
    )


def trim_padding(tokens: TokenBatch) -> TokenBatch:
    """The same rows without the columns that are padding in every one of them."""
    kept = trimmed_columns(tokens)
    response_width = kept.stop - tokens.input_ids_BS.shape[1] + tokens.response_length
    routed = tokens.routed_experts_BSLK
    vision = tokens.vision
    if vision is not None:
        vision = dataclasses.replace(vision, position_ids_B3S=vision.position_ids_B3S[:, :, kept])
    return TokenBatch(
        input_ids_BS=tokens.input_ids_BS[:, kept],
        attention_mask_BS=tokens.attention_mask_BS[:, kept],
        position_ids_BS=tokens.position_ids_BS[:, kept],
        response_mask_BR=tokens.response_mask_BR[:, :response_width],
        routed_experts_BSLK=None if routed is None else routed[:, kept],
        vision=vision,
    )


def batch_index(tokens: TokenBatch) -> torch.Tensor:
    """(B, S): each token's row × S + column, the flat index ``ModelCall.token_index``
    takes its entries from."""
    rows, width = tokens.input_ids_BS.shape
    return torch.arange(rows * width).view(rows, width)


def model_call(
    model: nn.Module, tokens: TokenBatch, device: torch.device, packed: bool, ulysses=None
) -> ModelCall:
    """The call of a micro-batch; with ``ulysses`` (an ``engine.train.ulysses.UlyssesGroup``,
    packed only) this rank's slice of it, bins padded to a multiple of the group's size."""
    if ulysses is not None:
        call = ulysses.split(_packed(model, tokens, device, multiple=ulysses.size))
    else:
        call = _packed(model, tokens, device) if packed else _padded(model, tokens, device)
    if tokens.vision is not None and "pixel_values" not in call.inputs:
        # no image here: the vision tower runs anyway (FSDP's collectives pair up)
        keep_tower_running(model)
        call.kwargs[NO_IMAGES] = True
    return call


def _padded(model: nn.Module, tokens: TokenBatch, device: torch.device) -> ModelCall:
    """Rows padded to the micro-batch's widest prompt and response (``trim_padding``)."""
    r_len = tokens.response_length
    trimmed = trim_padding(tokens)
    kept = trimmed.response_length
    columns = trimmed_columns(tokens)
    kwargs: dict = {"use_cache": False}
    if takes_logits_to_keep(type(model)):
        kwargs["logits_to_keep"] = kept + 1
    inputs = {
        "input_ids": trimmed.input_ids_BS.to(device),
        "attention_mask": trimmed.attention_mask_BS.to(device),
        "position_ids": trimmed.position_ids_BS.to(device),
    }
    if trimmed.vision is not None:  # the images, and the positions as (3, B, S)
        inputs["position_ids"] = trimmed.vision.position_ids_B3S.transpose(0, 1).to(device)
        inputs |= {k: v.to(device) for k, v in trimmed.vision.pixel_inputs().items()}
    return ModelCall(
        inputs=inputs,
        kwargs=kwargs,
        targets=trimmed.responses_BR.to(device),
        select=None,
        unpack=lambda values: nn.functional.pad(values, (0, r_len - values.shape[1])),
        token_index=batch_index(tokens)[:, columns].to(device),
        pack=lambda values: values[:, :kept].to(device),
    )


def _packed(
    model: nn.Module, tokens: TokenBatch, device: torch.device, multiple: int = 1
) -> ModelCall:
    """Every row's real tokens end to end (prompt then response, positions from 0), in
    bins; the head at the positions before response tokens. A flash-attention model
    takes one bin of all the tokens (its variable-length kernels cost each row's own
    length squared); others (sdpa, eager: a dense mask over the bin) bins as long as the
    longest row, filled first-fit by decreasing length, so that attention costs no more
    than padded rows would. The ends of the bins are filled with a row of pad tokens
    of its own, which no real token attends to; ``multiple``: the bins' length is rounded
    up to a multiple of it (Ulysses splits them into that many equal slices)."""
    attention = tokens.attention_mask_BS.bool()
    r_len = tokens.response_length
    lengths = attention.sum(dim=1).tolist()
    prompt_lens = attention[:, :-r_len].sum(dim=1).tolist()
    real = [tokens.input_ids_BS[i][attention[i]] for i in range(len(lengths))]
    config = getattr(model, "config", None)
    flash = "flash" in str(getattr(config, "_attn_implementation", ""))
    width = sum(lengths) if flash else max(lengths)
    width = -(-width // multiple) * multiple
    bins = first_fit(lengths, width)
    flat = [index[mask] for index, mask in zip(batch_index(tokens), attention, strict=True)]
    ids, pos, source, where = _fill(bins, real, flat, width)
    # response token j of row i sits at its start + prompt + j; the head one before
    places = [
        (i, j, where[i][0], where[i][1] + prompt_lens[i] + j - 1)
        for i in range(len(lengths))
        for j in range(lengths[i] - prompt_lens[i])
    ]
    columns = sorted({col for *_, col in places})
    index = {col: n for n, col in enumerate(columns)}
    keep = torch.tensor([*columns, width - 1])  # one more, as padded: the last R' + 1
    targets = torch.zeros((len(bins), len(columns)), dtype=torch.long)
    row_of, tok_of, bin_of, col_of = (
        (torch.tensor(v, dtype=torch.long) for v in zip(*places, strict=True))
        if places
        else (torch.zeros(0, dtype=torch.long),) * 4
    )
    col_of = torch.tensor([index[int(c)] for c in col_of], dtype=torch.long)
    targets[bin_of, col_of] = tokens.responses_BR[row_of, tok_of]
    kwargs: dict = {"use_cache": False}
    select = None
    if takes_logits_to_keep(type(model)):
        kwargs["logits_to_keep"] = keep.to(device)
    else:
        select = keep.to(device)

    def unpack(values_KU: torch.Tensor) -> torch.Tensor:
        out = values_KU.new_zeros((len(lengths), r_len))
        d = out.device
        out[row_of.to(d), tok_of.to(d)] = values_KU[bin_of.to(d), col_of.to(d)]
        return out

    def pack(values_BRX: torch.Tensor) -> torch.Tensor:
        out = values_BRX.new_zeros((len(bins), len(columns), *values_BRX.shape[2:]))
        out[bin_of, col_of] = values_BRX[row_of, tok_of]
        return out.to(device)

    inputs = {"input_ids": ids, "position_ids": pos}
    if tokens.vision is not None:
        inputs |= _packed_vision(tokens, bins, pos)
    return ModelCall(
        inputs={k: v.to(device) for k, v in inputs.items()},
        kwargs=kwargs,
        targets=targets.to(device),
        select=select,
        unpack=unpack,
        token_index=source.to(device),
        pack=pack,
    )


def _fill(
    bins: list[list[int]], real: list[torch.Tensor], flat: list[torch.Tensor], width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """The bins' token ids, positions (each row from 0; the tail a row of its own) and
    each token's place in the batch (ModelCall.token_index, -1 for the tail), and each
    row's (bin, start). ``real``/``flat``: each row's real tokens and their places."""
    ids = torch.zeros((len(bins), width), dtype=torch.long)
    pos = torch.zeros((len(bins), width), dtype=torch.long)
    source = torch.full((len(bins), width), -1, dtype=torch.long)
    where: list[tuple[int, int]] = [(0, 0)] * len(real)
    for k, rows in enumerate(bins):
        at = 0
        for row in rows:
            n = len(real[row])
            ids[k, at : at + n] = real[row]
            pos[k, at : at + n] = torch.arange(n)
            source[k, at : at + n] = flat[row]
            where[row] = (k, at)
            at += n
        pos[k, at:] = torch.arange(width - at)
    return ids, pos, source, where


def first_fit(lengths: list[int], width: int) -> list[list[int]]:
    """The rows (by index) in bins of ``width`` tokens: first fit by decreasing length."""
    bins: list[list[int]] = []
    room: list[int] = []
    for row in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        k = next((k for k, free in enumerate(room) if free >= lengths[row]), len(bins))
        if k == len(bins):
            bins.append([])
            room.append(width)
        bins[k].append(row)
        room[k] -= lengths[row]
    return bins


def _packed_vision(
    tokens: TokenBatch, bins: list[list[int]], text_KL: torch.Tensor
) -> dict[str, torch.Tensor]:
    """The packed bins' images and positions: the pixels in the order of their pad
    tokens (bin by bin, each bin's rows as placed), and (4, K, L) positions, the text
    ones ``text_KL`` (rows restarting at 0: the mask's boundaries) over each row's 3-D
    ones (the tail of a bin: the text positions in all three)."""
    vision = tokens.vision
    assert vision is not None
    attention = tokens.attention_mask_BS.bool()
    pos = text_KL.unsqueeze(0).repeat(4, 1, 1)
    for k, rows in enumerate(bins):
        at = 0
        for row in rows:
            n = int(attention[row].sum())
            pos[1:, k, at : at + n] = vision.position_ids_B3S[row][:, attention[row]]
            at += n
    order = [row for rows in bins for row in rows]
    return {"position_ids": pos, **pixel_inputs([vision.images[row] for row in order])}
