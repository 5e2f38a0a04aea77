"""The modules the engine puts in Megatron's GPT model in place of Transformer Engine's:
SDPA core attention, the value head, torch RMSNorm, a linear held whole on every TP rank."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.train import megatron_context

# ---------------------------------------------------------------------------
# modules plugged into Megatron's layer spec


class SDPAttention(nn.Module):
    """Megatron core attention through ``scaled_dot_product_attention``.

    Takes Megatron's ``[s, b, heads, d]`` query and ``[s, b, groups, d]`` key/value and a
    boolean mask ``[b, 1, s, s]`` (True: masked); returns ``[s, b, heads * d]``."""

    def __init__(
        self,
        config: Any,
        layer_number: int,
        attn_mask_type: Any,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        **_: Any,  # cp_comm_type, process groups: context parallelism is done here
    ) -> None:
        super().__init__()
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        self.softmax_scale = softmax_scale
        self.cp_group = None
        if getattr(config, "context_parallel_size", 1) > 1:
            from megatron.core import parallel_state as ps

            self.cp_group = ps.get_context_parallel_group()

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor,
        attn_mask_type: Any = None,
        attention_bias: Any = None,
        packed_seq_params: Any = None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention takes neither packed sequences nor a bias")
        s, b, heads = query.shape[:3]
        per_group = heads // key.shape[2]
        if self.cp_group is not None:  # this rank's queries against the whole sequence
            key = megatron_context.gather(key, 0, self.cp_group, sum_grads=True)
            value = megatron_context.gather(value, 0, self.cp_group, sum_grads=True)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, h, s, d]
        if per_group > 1:
            k = k.repeat_interleave(per_group, dim=1)
            v = v.repeat_interleave(per_group, dim=1)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=~attention_mask,  # SDPA's boolean mask is True where attention is allowed
            dropout_p=self.dropout if self.training else 0.0,
            scale=self.softmax_scale,
        )
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)  # MLA: the value head dim


class ValueHead(nn.Linear):
    """The critic's head: one output per position, replicated on every TP rank. Under
    sequence parallelism its input, the final hidden states, is split over the TP ranks
    by sequence and is gathered first; every rank then computes the same values, so the
    gradient going back is each rank's own slice (not a sum over ranks)."""

    def __init__(
        self, hidden_size: int, dtype: torch.dtype, device: torch.device, sequence_parallel: bool
    ) -> None:
        super().__init__(hidden_size, 1, bias=True, dtype=dtype, device=device)
        self.sequence_parallel = sequence_parallel

    def forward(  # GPTModel calls its output layer with these keywords
        self, input_: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None
    ) -> tuple[torch.Tensor, None]:
        if self.sequence_parallel:
            from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

            input_ = gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=False)
        return super().forward(input_), None


class TorchRMSNorm(nn.RMSNorm):
    """torch's RMSNorm in Megatron's norm slots (the local spec's own wrapper refuses
    sequence parallelism). Under sequence parallelism a rank normalises its slice of the
    sequence, so the weight's gradient is partial: the ``sequence_parallel`` mark makes
    ``finalize_model_grads`` sum it over the TP group."""

    def __init__(self, config: Any, hidden_size: int, eps: float = 1e-5, **_: Any) -> None:
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        if config.sequence_parallel:
            self.weight.sequence_parallel = True


class DuplicatedLinear(nn.Linear):
    """A linear layer every TP rank holds whole, for multi-latent attention's low-rank
    down projections (Transformer Engine's ``parallel_mode="duplicated"``).

    Megatron-core's local spec splits them column-wise instead, and then the rotary part
    of the keys, which each rank uses for its own heads only, gets back the gradient of
    those heads alone (the gather's backward keeps this rank's columns): with TP > 1
    the down projection's gradient misses the other ranks' heads (seen on
    megatron-core 0.14: gradient norms 2e-5 off at TP 2). Whole, on the rank's slice of
    the sequence, the rotary keys are gathered over the sequence instead, whose backward
    sums every rank's heads; the weight's gradient, partial over the sequence, is summed
    over TP by ``finalize_model_grads`` (the ``sequence_parallel`` mark). Needs sequence
    parallelism when TP > 1 (``MegatronParallel.model_problems``)."""

    def __init__(
        self,
        input_size: int,
        output_size: int,
        *,
        config: Any,
        bias: bool = False,
        skip_bias_add: bool = False,
        **_: Any,  # init_method, gather_output, ...: the weights are loaded
    ) -> None:
        super().__init__(input_size, output_size, bias=bias, dtype=config.params_dtype)
        for param in self.parameters():
            param.sequence_parallel = config.sequence_parallel

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return super().forward(x), None


def duplicated_linear() -> type:
    """The whole-on-every-rank linear Megatron's MLA accepts for its down projections:
    Megatron's own (with Transformer Engine installed) or ``DuplicatedLinear``, bound to
    the name the MLA module checks against (None without Transformer Engine)."""
    from megatron.core.extensions import transformer_engine
    from megatron.core.transformer import multi_latent_attention

    # Without Transformer Engine, megatron-core's TE extension still imports (its ``te`` is
    # a MagicMock, so ``TELinear`` is a mock, not a class) and the MLA module believes TE
    # is there. 0.16's MLASelfAttention then calls ``isinstance(linear_proj, TELinear)``
    # first (0.14 tested ``config.fp8`` first), a TypeError: say what is installed.
    if not transformer_engine.HAVE_TE:
        multi_latent_attention.HAVE_TE = False
    if multi_latent_attention.Linear is None:
        multi_latent_attention.Linear = DuplicatedLinear
    return multi_latent_attention.Linear
