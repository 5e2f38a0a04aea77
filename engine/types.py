"""Typed batches at the boundaries between stages.

Shapes in names: B samples (prompts × rollout.n), S = P + R tokens per row,
P the prompt length (left-padded), R the response length (right-padded).

    controller                         workers (one per device)
    ----------                         ------------------------
    prompts ──► GenerationRequest ──►  rollout.generate  ──► GenerationOutput (ragged)
    TokenBatch (padded once, here)
             ──► TokenBatch        ──►  actor/ref.log_probs, critic.values  ──► per-token tensors
                                        actor.old_policy (Σπ², R2's routing) ──► PolicyProbs
             ──► ActorBatch        ──►  actor.update     ──► metrics
             ──► CriticBatch       ──►  critic.update    ──► metrics

A batch sent to a worker group is split along its first dimension by
data-parallel rank (``engine.controller.dispatch``); every field of these
dataclasses is either a tensor with B rows, a list with B items, or None.

MoE routing replay (``engine.config.routing_replay``) adds L (the model's decoder
layers) and K (experts per token): ``routed_experts_BSLK`` holds each token's experts in
every layer, int16, -1 where none was recorded (padding; the last token of an R3 row,
which the rollout never ran forward).

A vision-language model's prompts carry their images (``ImageInputs``, one per row,
ragged: each row's own number of patches) in a list beside the tokens, and the batch
its multimodal rotary positions (``VisionInputs``), so that they split with the rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch


@dataclass(frozen=True)
class ImageInputs:
    """One prompt's images as its model's image processor made them (Qwen2-VL's
    layout), and the prompt's multimodal rotary positions (``engine.models.mrope``)."""

    pixel_values_PD: torch.Tensor  # every image's patches in order (patches, C·T·p·p)
    image_grid_thw_N3: torch.Tensor  # each image's (t, h, w) in patches, (images, 3)
    positions_3P: torch.Tensor  # (temporal, height, width) of each prompt token
    # the images themselves (RGB PIL images, in order): what vLLM's own processor takes
    # (engine.rollout.vllm_images); empty where they were not kept
    sources: tuple[Any, ...] = ()


@dataclass
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    do_sample: bool = True
    max_new_tokens: int = 512
    ignore_eos: bool = False


@dataclass
class GenerationRequest:
    """Prompts already expanded to one row per sample (the n copies are adjacent)."""

    prompt_ids: list[list[int]]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    # Multi-turn: each row's agent loop (engine.agents.loops); None: single turn
    agent_names: list[str] | None = None
    # Multi-turn: each row's extra_info (its tools_kwargs, interaction_kwargs, what its
    # agent loop reads)
    extra_info: list[dict[str, Any]] | None = None
    # A vision-language model's: each row's images (None: a row without); None: no row has
    images: list[ImageInputs | None] | None = None


@dataclass
class GenerationOutput:
    """Ragged, so that each worker returns only the tokens it produced."""

    response_ids: list[list[int]]  # up to and including EOS when one was sampled
    finished: list[bool]  # True when the response ended with EOS (not truncated)
    logprobs: list[list[float]] | None = None  # sampling log-probs, when the engine gives them
    # Multi-turn rows: 1 on the model's tokens, 0 on the tools' (None: all the model's)
    response_mask: list[list[int]] | None = None
    # Multi-turn rows: turns, tool calls, errors, timeouts, latency (engine.agents)
    agent_stats: list[dict[str, float]] | None = None
    # Multi-turn rows: the interaction's score of each answer (empty without one)
    turn_scores: list[list[float]] | None = None
    # rollout.enable_rollout_routing_replay: each row's (n, L, K) experts of its prompt
    # and response tokens from the first, n <= their count (the last may have none)
    routed_experts: list[torch.Tensor] | None = None


# Multimodal rotary positions of text (an image's come from engine.models.mrope, which
# builds on these types).
def text_positions(length: int) -> torch.Tensor:
    """(3, length): a text-only prompt's positions, the same in all three."""
    return torch.arange(length).expand(3, length)


def response_positions(prompt_3P: torch.Tensor, length: int) -> torch.Tensor:
    """(3, length): the positions of ``length`` response tokens after the prompt's."""
    start = int(prompt_3P.max()) + 1 if prompt_3P.numel() else 0
    return torch.arange(start, start + length).expand(3, length)


@dataclass
class VisionInputs:
    """A vision-language batch's images and its tokens' multimodal rotary positions."""

    images: list[ImageInputs | None]  # each row's (None: a row without images)
    position_ids_B3S: torch.Tensor  # (temporal, height, width) of every token; padding 0

    @classmethod
    def of_rows(
        cls,
        images: list[ImageInputs | None],
        attention_mask_BS: torch.Tensor,
        prompt_length: int,
    ) -> VisionInputs:
        """The positions of rows laid out as ``TokenBatch.from_ragged`` lays them: each
        prompt's own (text-only rows: 0, 1, 2... in all three), its response after them."""
        batch, width = attention_mask_BS.shape
        positions = torch.zeros((batch, 3, width), dtype=torch.long)
        for i, row in enumerate(images):
            p_len = int(attention_mask_BS[i, :prompt_length].sum())
            r_len = int(attention_mask_BS[i, prompt_length:].sum())
            prompt = text_positions(p_len) if row is None else row.positions_3P
            if prompt.shape[1] != p_len:
                raise ValueError(f"row {i}: {prompt.shape[1]} prompt positions, {p_len} tokens")
            positions[i, :, prompt_length - p_len : prompt_length] = prompt
            response = response_positions(prompt, r_len)
            positions[i, :, prompt_length : prompt_length + r_len] = response
        return cls(images=list(images), position_ids_B3S=positions)

    def pixel_inputs(self) -> dict[str, torch.Tensor]:
        return pixel_inputs(self.images)


def pixel_inputs(images: list[ImageInputs | None]) -> dict[str, torch.Tensor]:
    """The model's image arguments for these rows: every image's patches and grids, in
    row order (the order of their pad tokens in the batch); empty when no row has one."""
    rows = [row for row in images if row is not None]
    if not rows:
        return {}
    return {
        "pixel_values": torch.cat([row.pixel_values_PD for row in rows]),
        "image_grid_thw": torch.cat([row.image_grid_thw_N3 for row in rows]),
    }


@dataclass
class TokenBatch:
    """Prompt and response tokens as the models see them."""

    input_ids_BS: torch.Tensor  # [left-padded prompt | right-padded response]
    attention_mask_BS: torch.Tensor
    position_ids_BS: torch.Tensor
    response_mask_BR: torch.Tensor  # 1.0 for response tokens that count in losses
    # The MoE routing the actor's forwards replay (module docstring), or None
    routed_experts_BSLK: torch.Tensor | None = None
    # A vision-language model's images and positions (they replace position_ids_BS)
    vision: VisionInputs | None = None

    @property
    def response_length(self) -> int:
        return self.response_mask_BR.shape[1]

    @property
    def responses_BR(self) -> torch.Tensor:
        return self.input_ids_BS[:, -self.response_length :]

    def __len__(self) -> int:
        return self.input_ids_BS.shape[0]

    @classmethod
    def from_ragged(
        cls,
        prompts: list[list[int]],
        responses: list[list[int]],
        pad_token_id: int,
        response_masks: list[list[int]] | None = None,
        routed_experts: list[torch.Tensor] | None = None,
        images: list[ImageInputs | None] | None = None,
    ) -> TokenBatch:
        """Pad prompts on the left and responses on the right, to the longest of each.
        ``response_masks`` (multi-turn: 0 on tool tokens) narrow which response tokens
        count in the losses; the model still attends to every one. ``routed_experts``:
        each row's (n, L, K) experts from its first prompt token on (a rollout's, R3).
        ``images`` (a vision-language model's prompts): each row's, carried with their
        positions."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        batch = len(prompts)
        p_len = max(len(p) for p in prompts)
        r_len = max(1, max(len(r) for r in responses))
        input_ids = torch.full((batch, p_len + r_len), pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, p_len + r_len), dtype=torch.long)
        for i, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
            input_ids[i, p_len - len(prompt) : p_len] = torch.tensor(prompt, dtype=torch.long)
            attention[i, p_len - len(prompt) : p_len] = 1
            if response:
                input_ids[i, p_len : p_len + len(response)] = torch.tensor(response)
                attention[i, p_len : p_len + len(response)] = 1
        # Positions count real tokens only, so left padding does not shift them.
        position_ids = (attention.cumsum(dim=1) - 1).clamp(min=0)
        response_mask = attention[:, p_len:].float()
        if response_masks is not None:
            for i, row in enumerate(response_masks):
                if len(row) != len(responses[i]):
                    raise ValueError(f"row {i}: {len(row)} mask values, {len(responses[i])} tokens")
                response_mask[i, : len(row)] = torch.tensor(row, dtype=response_mask.dtype)
        return cls(
            input_ids_BS=input_ids,
            attention_mask_BS=attention,
            position_ids_BS=position_ids,
            response_mask_BR=response_mask,
            routed_experts_BSLK=(
                None
                if routed_experts is None
                else _pad_routing(routed_experts, prompts, responses, p_len + r_len)
            ),
            vision=None if images is None else VisionInputs.of_rows(images, attention, p_len),
        )

    def without_routing(self) -> TokenBatch:
        """The batch for a pass that routes freely (the reference, the critic)."""
        return self if self.routed_experts_BSLK is None else replace(self, routed_experts_BSLK=None)


def _pad_routing(
    rows: list[torch.Tensor], prompts: list[list[int]], responses: list[list[int]], width: int
) -> torch.Tensor:
    """(B, width, L, K): each row's routing where its tokens sit, -1 elsewhere (left
    padding, and beyond the routing a row has; more than its tokens is cut)."""
    shapes = {tuple(r.shape[1:]) for r in rows}
    if len(shapes) != 1:
        raise ValueError(f"rows route over different (layers, experts per token): {shapes}")
    out = torch.full((len(rows), width, *shapes.pop()), -1, dtype=torch.int16)
    p_len = max(len(p) for p in prompts)
    for i, row in enumerate(rows):
        start = p_len - len(prompts[i])
        n = min(len(row), len(prompts[i]) + len(responses[i]))
        out[i, start : start + n] = row[:n].to(torch.int16)
    return out


@dataclass
class TeacherScores:
    """The teachers' scores of the student's samples (on-policy distillation,
    engine.workers.teacher): per response token, 0 on padding."""

    logprobs_BR: torch.Tensor  # log π_teacher(o_t), the sampled token's
    # forward_kl_topk: the teacher's k most likely tokens at each position, and their
    # log-probs (float32, descending)
    topk_logprobs_BRK: torch.Tensor | None = None
    topk_ids_BRK: torch.Tensor | None = None


@dataclass
class ActorBatch:
    tokens: TokenBatch
    old_logprobs_BR: torch.Tensor | None  # None: on-policy, the update's own log-probs
    advantages_BR: torch.Tensor
    ref_logprobs_BR: torch.Tensor | None = None  # present when the KL loss is on
    # Truncated importance weights vs the rollout engine (algorithm.rollout_correction)
    rollout_is_weights_BR: torch.Tensor | None = None
    teacher: TeacherScores | None = None  # present when distillation is on


@dataclass
class PolicyProbs:
    """The actor's π_old pass: per response token, 0 on padding; and what the trainer
    reads of it beyond the log-probs."""

    logprobs_BR: torch.Tensor  # log π_old(o_t)
    # Σ_v π_old(v)² at the token's position (the optimal token baseline), when asked
    sum_pi_squared_BR: torch.Tensor | None = None
    # The routing the pass took (routing replay R2: the update replays it)
    routed_experts_BSLK: torch.Tensor | None = None


@dataclass
class CriticBatch:
    tokens: TokenBatch
    old_values_BR: torch.Tensor
    returns_BR: torch.Tensor


@dataclass
class SampleMeta:
    """What the reward needs about each sample besides its tokens."""

    group_ids: list[int]  # samples of the same prompt share an id
    data_source: list[str]
    ground_truth: list[Any]
    extra_info: list[dict[str, Any]]
    # the prompts' chats, for a reward model that re-templates them (its own tokenizer)
    messages: list[list[dict[str, Any]]] = field(default_factory=list)
