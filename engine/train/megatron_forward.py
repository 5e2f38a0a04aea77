"""The forward pass of ``MegatronEngine`` (``engine.train.megatron``): the stage's
output for a batch (padded for sequence and context parallelism and the experts' token
exchange, received from and sent to the neighbouring pipeline stages), and from it the
logits, the response tokens' log-probs and entropy, or the critic's values."""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F

from engine.algo.entropy import (
    entropy_from_logits,
    logprobs_from_logits,
    sum_squared_probs_from_logits,
)
from engine.errors import EngineError
from engine.train import megatron_context
from engine.train.forward import trim_padding
from engine.train.megatron_ops import (
    attention_mask_B1SS,
    check_consecutive_positions,
    pad_responses,
    vocab_parallel_logprobs_at,
    vocab_parallel_logprobs_entropy,
    vocab_parallel_sum_squared_probs,
)
from engine.train.megatron_routing import router_index
from engine.train.megatron_state import EngineState
from engine.train.packing import batch_index, trimmed_columns
from engine.types import TokenBatch


class MegatronForward(EngineState):
    """Forward passes: ``logits``, ``response_logprobs``,
    ``response_logprobs_sum_pi_squared``, ``response_values``."""

    def _forward(
        self, input_ids_BS, attention_mask_BS, position_ids_BS, routes=None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The stage's output and, under context parallelism, the positions it covers.

        On the last stage the output is the model's, batch first ((B, S, V/tp) logits, or
        (B, S, 1) values); on earlier stages the (S, B, H) hidden states, also sent to the
        next stage. Stages after the first take their input from the previous one.
        Inside ``forward_backward`` the (input, output) pair is kept for the micro-batch's
        backward. Under sequence parallelism the sequence is padded on the right to a
        multiple of the TP size (masked keys; the output is cut back) and what travels
        between stages is each rank's slice of it. Under context parallelism (padded to a
        multiple of 2·CP) each rank runs its zigzag share of the positions
        (``megatron_context``), returned with the output for ``_whole_sequence``.
        ``routes``: (the batch, the (B, S) index of these inputs' tokens in it) for MoE
        routing replay (``engine.train.megatron_routing``), padded along with them."""
        device = self.device.torch_device()
        ids = input_ids_BS.to(device)
        mask = attention_mask_BS.to(device)
        index = None if routes is None else routes[1].to(device)
        check_consecutive_positions(position_ids_BS.to(device), mask)
        b, s = ids.shape
        rows, columns = self._expert_group_shape(b, s)
        if (rows, columns) != (b, s):  # padding rows: masked, attending only to themselves
            ids = F.pad(ids, (0, columns - s, 0, rows - b))
            mask = F.pad(mask, (0, columns - s, 0, rows - b))
            index = None if index is None else F.pad(index, (0, columns - s, 0, rows - b), value=-1)
        sp = self.model.config.sequence_parallel
        cp = self.layout.cp
        multiple = (self.layout.tp if sp else 1) * (2 * cp if cp > 1 else 1)
        if columns % multiple:
            ids = F.pad(ids, (0, -columns % multiple))
            mask = F.pad(mask, (0, -columns % multiple))
            index = None if index is None else F.pad(index, (0, -columns % multiple), value=-1)
        b, padded = ids.shape
        held = None
        if cp > 1:  # this rank's queries (rows of the mask) against every key
            held = megatron_context.zigzag_index(padded, cp, self.layout.cp_rank, device)
            ids = ids[:, held]
        mask_B1SS = attention_mask_B1SS(mask, held)
        length = ids.shape[1]
        positions = torch.arange(padded, device=device)[:length].expand(b, length)
        stage_input = None
        if not self.stage.first:
            shape = (length // self.layout.tp if sp else length, b, self.hf_config.hidden_size)
            dtype = self.model.config.params_dtype
            stage_input = self.link.recv(shape, dtype, device, self.stage.prev_rank)
            stage_input.requires_grad_(torch.is_grad_enabled())
            self.model.set_input_tensor(stage_input)
        replay = contextlib.nullcontext()
        if routes is not None:
            tp, tp_rank = self.layout.tp, self.layout.tp_rank
            replay = self.routing.around(routes[0], router_index(index, held, tp, tp_rank, sp))
        with replay:
            out = self.module(input_ids=ids, position_ids=positions, attention_mask=mask_B1SS)
        if not self.stage.last:
            self.link.send(out, self.stage.next_rank)
        if self._scheduling and torch.is_grad_enabled():
            self._in_flight.append((stage_input, out))
        if self.stage.last:
            out = out[: input_ids_BS.shape[0]]
            if held is None and padded != s:
                out = out[:, :s]
        return out, held

    def _expert_group_shape(self, b: int, s: int) -> tuple[int, int]:
        """The (rows, columns) every rank whose tokens meet in the experts runs: Megatron's
        all-gather token exchange needs the same number of tokens from each of its ETP × EP
        ranks, and unless they are all of one TP group they hold different data-parallel
        rows (their micro-batch counts already agree: ``forward.token_budget_micro_batches``)."""
        meeting = self.layout.etp * self.layout.ep
        # Both grids number ranks TP- (ETP-) first: ETP × EP dividing TP puts them in one.
        within_tp = self.layout.tp % meeting == 0
        if within_tp or self.model.config.moe_token_dispatcher_type != "allgather":
            return b, s
        shape = torch.tensor([b, s], device=self.device.torch_device())
        dist.all_reduce(shape, op=dist.ReduceOp.MAX, group=self.tp_ep_group)
        rows, columns = shape.tolist()
        return rows, columns

    def _whole_sequence(self, values_BL: torch.Tensor, held: torch.Tensor | None, s: int):
        """Per-position results (B, L) of this rank's positions as (B, s) in sequence
        order: gathered over the context-parallel group when there is one."""
        if held is None:
            return values_BL
        return megatron_context.gather(values_BL, 1, self.cp_group, sum_grads=False)[:, :s]

    def _stage_placeholder(self, tokens: TokenBatch) -> torch.Tensor:
        """What a stage before the last returns for per-token results it does not compute
        (they come from the last stage; the controller gathers them there)."""
        return torch.zeros(tokens.responses_BR.shape, device=self.device.torch_device())

    def _forward_trimmed(self, tokens: TokenBatch):
        """``_forward`` of the batch without its all-padding columns: (the trimmed batch,
        the stage's output, the positions held)."""
        trimmed = trim_padding(tokens)
        ids, mask = trimmed.input_ids_BS, trimmed.attention_mask_BS
        routes = (tokens, batch_index(tokens)[:, trimmed_columns(tokens)])
        return (trimmed, *self._forward(ids, mask, trimmed.position_ids_BS, routes))

    def logits(self, input_ids_BS, attention_mask_BS, position_ids_BS) -> torch.Tensor:
        """(B, S, V) logits over the whole vocabulary (gathered over TP ranks)."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        if self.role == "critic":
            raise EngineError("the critic has a value head, not logits: use response_values")
        out, held = self._forward(input_ids_BS, attention_mask_BS, position_ids_BS)
        if not self.stage.last:
            return None  # with pipeline stages, only the last one has logits
        out = gather_from_tensor_model_parallel_region(out) if self.layout.tp > 1 else out
        return self._whole_sequence(out, held, input_ids_BS.shape[1])

    def response_logprobs(
        self,
        tokens: TokenBatch,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As ``engine.train.forward.response_logprobs``: log π of each response token
        (logits divided by the sampling temperature) and optionally the entropy, whose
        graph is kept only with ``entropy_grad``. With TP > 1 the vocabulary stays split."""
        head = self._response_logits(tokens, temperature)
        if head is None:
            zeros = self._stage_placeholder(tokens)
            return zeros, zeros if with_entropy else None
        logits, targets, finish = head
        entropy = None
        if self.layout.tp == 1:
            logp = logprobs_from_logits(logits, targets)
            if with_entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    entropy = entropy_from_logits(logits)
        else:
            logp, entropy = vocab_parallel_logprobs_entropy(
                logits, targets, with_entropy, entropy_grad
            )
        return finish(logp), None if entropy is None else finish(entropy)

    def response_logprobs_at(
        self,
        tokens: TokenBatch,
        ids_BRK: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = False,
        entropy_grad: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """``response_logprobs`` and log π of the K tokens ``ids_BRK`` names at each
        response position, (B, R, K) (distillation's teacher top-k); with TP > 1 the
        vocabulary stays split. Not under context parallelism."""
        if self.layout.cp > 1:
            raise EngineError(
                "distillation's forward_kl_topk is not built for context parallelism: set"
                " actor_rollout_ref.actor.megatron.context_parallel_size=1"
            )
        head = self._response_logits(tokens, temperature)
        if head is None:
            zeros = self._stage_placeholder(tokens)
            at = zeros.unsqueeze(-1).expand(*zeros.shape, ids_BRK.shape[-1]).contiguous()
            return zeros, zeros if with_entropy else None, at
        logits, targets, finish = head
        ids = ids_BRK[:, : logits.shape[1]].long().to(logits.device)
        entropy = None
        if self.layout.tp == 1:
            logp = logprobs_from_logits(logits, targets)
            at = logits.gather(-1, ids) - torch.logsumexp(logits, dim=-1, keepdim=True)
            if with_entropy:
                with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
                    entropy = entropy_from_logits(logits)
        else:
            logp, entropy = vocab_parallel_logprobs_entropy(
                logits, targets, with_entropy, entropy_grad
            )
            at = vocab_parallel_logprobs_at(logits, ids)
        at_BRK = torch.stack([finish(at[..., k]) for k in range(at.shape[-1])], dim=-1)
        return finish(logp), None if entropy is None else finish(entropy), at_BRK

    def response_logprobs_sum_pi_squared(
        self, tokens: TokenBatch, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``engine.train.forward.response_logprobs_sum_pi_squared``: log π of each
        response token and Σ_v π(v)² at its position; with TP > 1 both sums over the
        vocabulary are all-reduced over the TP group, the vocabulary stays split."""
        head = self._response_logits(tokens, temperature)
        if head is None:
            zeros = self._stage_placeholder(tokens)
            return zeros, zeros
        logits, targets, finish = head
        if self.layout.tp == 1:
            logp = logprobs_from_logits(logits, targets)
            sum_sq = sum_squared_probs_from_logits(logits)
        else:
            logp, _ = vocab_parallel_logprobs_entropy(logits, targets, with_entropy=False)
            sum_sq = vocab_parallel_sum_squared_probs(logits)
        return finish(logp), finish(sum_sq)

    def _response_logits(self, tokens: TokenBatch, temperature: float):
        """On the last stage: the float32 logits this rank holds (its vocabulary slice;
        divided by the temperature), the token each position predicts, and ``finish``,
        which turns a per-position result into (B, R) response values (gathered over
        context-parallel ranks, padded to the batch's response length). None on an
        earlier stage."""
        r_len = tokens.response_length
        trimmed, out, held = self._forward_trimmed(tokens)
        if not self.stage.last:
            return None
        kept, ids = trimmed.response_length, trimmed.input_ids_BS
        s = ids.shape[1]
        if held is None:  # the logits before each response token
            logits = out[:, -kept - 1 : -1, :]
            targets = trimmed.responses_BR
        else:  # every position this rank holds predicts the token after it
            logits = out
            padded = len(held) * self.layout.cp
            targets = F.pad(ids[:, 1:], (0, padded - s + 1))[:, held.cpu()]
        logits = logits.float()
        if temperature != 1.0:
            logits = logits / temperature

        def finish(values: torch.Tensor) -> torch.Tensor:
            if held is not None:
                values = self._whole_sequence(values, held, s)[:, s - kept - 1 : s - 1]
            return pad_responses(values, r_len)

        return logits, targets.to(logits.device), finish

    def response_values(self, tokens: TokenBatch) -> torch.Tensor:
        """V(prefix) before each response token (the critic)."""
        if self.role != "critic":
            raise EngineError(f"response_values needs the critic's value head, not the {self.role}")
        r_len = tokens.response_length
        trimmed, out, held = self._forward_trimmed(tokens)
        kept = trimmed.response_length
        if not self.stage.last:
            return self._stage_placeholder(tokens)
        s = trimmed.input_ids_BS.shape[1]
        values = self._whole_sequence(out[..., 0].float(), held, s)
        return pad_responses(values[:, s - kept - 1 : s - 1], r_len)
