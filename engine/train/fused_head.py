"""Log-probs and entropy straight from the hidden states, without the whole logits tensor
(``actor_rollout_ref.model.use_fused_kernels``, verl's name).

The LM head's logits are ``tokens × V`` floats: for a 20k-token micro-batch of a model with
a 152k vocabulary that is tens of GiB, the largest activation of the update. Here the head
runs on ``chunk_size`` tokens at a time: each chunk's logits give its log-probs (and
entropy, Σπ²) and are freed; the backward recomputes each chunk's logits and turns them
into the gradients of the hidden states and of the head's weight. At most one chunk's
logits exist at any time, in the forward and in the backward.

The model still runs its own forward (FSDP's hooks, gradient checkpointing, its layers):
only its output head's ``forward`` is swapped, for the length of one call, for one that
returns these per-token quantities in place of the logits (``quantities_from_model``).

``impl_backend=liger`` computes the log-probs with Liger's fused linear cross-entropy
Triton kernel (liger-kernel, GPUs only, imported when first used); entropy and Σπ², which
that kernel does not give, come from the chunked torch path beside it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from engine.config.train import FUSED_BACKENDS, ModelConfig


@dataclass(frozen=True)
class HeadOptions:
    """How the head's quantities are computed: ``chunk_size`` tokens at a time, by the
    ``torch`` path or Liger's kernel."""

    chunk_size: int = 512
    impl_backend: str = "torch"

    def __post_init__(self) -> None:
        if self.chunk_size < 1:
            raise ValueError(
                f"fused_kernel_options.chunk_size must be a positive number of tokens,"
                f" got {self.chunk_size}; verl uses 512"
            )
        if self.impl_backend not in FUSED_BACKENDS:
            raise ValueError(
                f"fused_kernel_options.impl_backend {self.impl_backend!r} is not one of"
                f" {', '.join(FUSED_BACKENDS)}"
            )

    @classmethod
    def of(cls, model_cfg: ModelConfig) -> HeadOptions | None:
        """The model's ``use_fused_kernels`` options, or None when it is off."""
        if not model_cfg.use_fused_kernels:
            return None
        opts = model_cfg.fused_kernel_options
        return cls(chunk_size=opts.chunk_size, impl_backend=opts.impl_backend)


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias, temperature: float):
    """One chunk's float32 logits, divided by the temperature. The matmul runs in the
    weights' dtype and is upcast after, as the unfused path does (``lm_head(h).float()``)."""
    z = F.linear(h, weight, bias).float()
    return z.div_(temperature) if temperature != 1.0 else z


class _ChunkedHead(torch.autograd.Function):
    """(log π(target), H, Σπ²) per token from hidden states ``h_NH`` and the head
    (``weight_VH``, ``bias_V``), ``chunk`` tokens at a time in both directions.

    Gradients flow from log π and H (Σπ² is a no-grad quantity: the optimal token
    baseline reads π_old's). With z the temperature-scaled logits, p = softmax(z):
    ∂ log p_t / ∂z = onehot(t) − p and ∂H/∂z = −p ⊙ (log p + H); each is divided by the
    temperature on its way to the raw logits.
    """

    @staticmethod
    def forward(ctx, h_NH, weight_VH, bias_V, targets_N, temperature, chunk, entropy, sum_sq):
        ctx.set_materialize_grads(False)
        n = h_NH.shape[0]
        logp = h_NH.new_empty(n, dtype=torch.float32)
        ent = h_NH.new_empty(n if entropy else 0, dtype=torch.float32)
        sq = h_NH.new_empty(n if sum_sq else 0, dtype=torch.float32)
        for start in range(0, n, chunk):
            rows = slice(start, min(start + chunk, n))
            z = _chunk_logits(h_NH[rows], weight_VH, bias_V, temperature)
            lse = torch.logsumexp(z, dim=-1, keepdim=True)
            logp[rows] = z.gather(-1, targets_N[rows, None])[:, 0] - lse[:, 0]
            if entropy or sum_sq:
                logp_all = z.sub_(lse)  # in place: z is not needed again
                p = logp_all.exp()
                if entropy:
                    ent[rows] = -(p * logp_all).sum(-1)
                if sum_sq:
                    sq[rows] = p.square_().sum(-1)
            del z
        ctx.save_for_backward(h_NH, weight_VH, bias_V, targets_N, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(sq)
        return logp, ent, sq

    @staticmethod
    def backward(ctx, g_logp, g_ent, _g_sq):
        h, weight, bias, targets, ent = ctx.saved_tensors
        if g_logp is None and g_ent is None:
            return (None,) * 8
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        g_h = torch.empty_like(h) if need_h else None
        # The weight's gradient sums over chunks: in float32, so that it is rounded once
        # (as the unchunked matmul's is) however many chunks there are.
        g_w = torch.zeros_like(weight, dtype=torch.float32) if need_w else None
        g_b = torch.zeros_like(bias, dtype=torch.float32) if need_b else None
        for start in range(0, h.shape[0], ctx.chunk):
            rows = slice(start, min(start + ctx.chunk, h.shape[0]))
            g_z = _grad_logits(
                _chunk_logits(h[rows], weight, bias, ctx.temperature),
                targets[rows],
                None if g_logp is None else g_logp[rows].float(),
                None if g_ent is None else (g_ent[rows].float(), ent[rows]),
            )
            if ctx.temperature != 1.0:
                g_z.div_(ctx.temperature)
            g_low = g_z.to(weight.dtype)
            del g_z
            if need_h:
                g_h[rows] = g_low @ weight
            if need_w:
                if g_w.dtype == g_low.dtype:
                    g_w.addmm_(g_low.T, h[rows])
                else:
                    g_w.add_(g_low.T @ h[rows])
            if need_b:
                g_b.add_(g_low.float().sum(0))
        return (
            g_h,
            None if g_w is None else g_w.to(weight.dtype),
            None if g_b is None else g_b.to(bias.dtype),
            *([None] * 5),
        )


def _grad_logits(z, targets, g_logp, g_ent):
    """∂loss/∂z for one chunk from the upstream gradients of log p_t and H (either may be
    None), computed in the buffer of ``z``: p ⊙ (−g_lp − g_H ⊙ (log p + H)) + g_lp·onehot."""
    logp_all = z.sub_(torch.logsumexp(z, dim=-1, keepdim=True))
    p = logp_all.exp()
    g = logp_all
    if g_ent is not None:
        g_h, ent = g_ent
        g.add_(ent[:, None]).mul_(-g_h[:, None])
    else:
        g.zero_()
    if g_logp is not None:
        g.sub_(g_logp[:, None])
    g.mul_(p)
    del p
    if g_logp is not None:
        g.scatter_add_(-1, targets[:, None], g_logp[:, None])
    return g


def head_quantities(
    hidden_NH: torch.Tensor,
    head: nn.Linear,
    targets_N: torch.Tensor,
    temperature: float,
    options: HeadOptions,
    *,
    entropy: bool,
    sum_sq: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(log π(target), entropy, Σπ²) for each of N tokens, float32; the last two are
    empty unless asked for. Never more than ``options.chunk_size`` tokens' logits."""
    weight, bias = head.weight, head.bias
    if options.impl_backend == "liger":
        logp = _liger_logprobs(hidden_NH, weight, bias, targets_N, temperature)
        if not (entropy or sum_sq):
            return logp, logp.new_empty(0), logp.new_empty(0)
        _, ent, sq = _ChunkedHead.apply(
            hidden_NH, weight, bias, targets_N, temperature, options.chunk_size, entropy, sum_sq
        )
        return logp, ent, sq
    return _ChunkedHead.apply(
        hidden_NH, weight, bias, targets_N, temperature, options.chunk_size, entropy, sum_sq
    )


def _liger_logprobs(hidden_NH, weight, bias, targets_N, temperature):
    """log π(target) by liger-kernel's ``liger_fused_linear_cross_entropy`` (reduction
    "none": per-token losses, whose backward 0.8.5 recomputes chunk by chunk). The kernel
    has no temperature: logits/τ = (h/τ)·Wᵀ + b/τ."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError as e:
        raise ImportError(
            "actor_rollout_ref.model.fused_kernel_options.impl_backend=liger needs"
            " liger-kernel (pip install 'liger-kernel>=0.8.5'), on a GPU; or set"
            " impl_backend=torch"
        ) from e
    if temperature != 1.0:
        hidden_NH = hidden_NH / temperature
        bias = None if bias is None else bias / temperature
    nll = liger_fused_linear_cross_entropy(
        hidden_NH, weight, targets_N, bias=bias, reduction="none", accum_dtype=torch.float32
    )
    return -nll.float()


@contextlib.contextmanager
def head_replaced(model: nn.Module, compute) -> Iterator[list[torch.Tensor]]:
    """While open, ``model``'s output head returns ``compute(hidden_BLH)`` in place of its
    logits. Yields a list that holds what it returned, so that the caller can check that
    the model's output is exactly that (a model that changes its logits after the head,
    such as Gemma's soft-capping, would otherwise give wrong numbers silently)."""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels needs a linear output head;"
            f" {type(model).__name__}'s is {type(head).__name__}: set use_fused_kernels=false"
        )
    softcap = getattr(getattr(model, "config", None), "final_logit_softcapping", None)
    if softcap:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels: {type(model).__name__} soft-caps its"
            f" logits (final_logit_softcapping={softcap}), which the fused head does not"
            " apply: set use_fused_kernels=false"
        )
    returned: list[torch.Tensor] = []

    def forward(hidden_BLH: torch.Tensor) -> torch.Tensor:
        out = compute(hidden_BLH)
        returned.append(out)
        return out

    head.forward = forward  # an instance attribute: shadows the class's forward
    try:
        yield returned
    finally:
        del head.forward


def quantities_from_model(
    model: nn.Module,
    inputs: dict[str, torch.Tensor],
    model_kwargs: dict,
    targets_BR: torch.Tensor,
    temperature: float,
    options: HeadOptions,
    *,
    entropy: bool,
    entropy_grad: bool,
    sum_sq: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Run ``model`` forward with its head fused: (log π, entropy, Σπ²) of shape (B, R)
    for the R response tokens ``targets_BR``, predicted by the R positions that end one
    before the last; entropy and Σπ² are None unless asked for. The entropy carries a
    graph only with ``entropy_grad`` (else its backward is skipped, not run on zeros)."""
    batch, r_len = targets_BR.shape
    names = ("logp",) + ("entropy",) * entropy + ("sum_sq",) * sum_sq

    def compute(hidden_BLH: torch.Tensor) -> torch.Tensor:
        length = hidden_BLH.shape[1]
        hidden = hidden_BLH[:, length - r_len - 1 : length - 1].reshape(batch * r_len, -1)
        head = model.get_output_embeddings()
        logp, ent, sq = head_quantities(
            hidden, head, targets_BR.reshape(-1), temperature, options, entropy=entropy,
            sum_sq=sum_sq,
        )  # fmt: skip
        ent = ent if entropy_grad else ent.detach()
        per_token = [logp, *([ent] * entropy), *([sq] * sum_sq)]
        q_BRK = torch.stack(per_token, dim=-1).view(batch, r_len, len(names))
        # Placed where the logits of those positions would be, so the caller slices as
        # it slices logits.
        return F.pad(q_BRK, (0, 0, length - r_len - 1, 1))

    with head_replaced(model, compute) as returned:
        out = model(**inputs, **model_kwargs).logits
    if len(returned) != 1 or out is not returned[0]:
        raise ValueError(
            f"actor_rollout_ref.model.use_fused_kernels: {type(model).__name__} does not"
            " return its output head's result as its logits (it calls the head"
            f" {len(returned)} time(s) or transforms its output): set use_fused_kernels=false"
        )
    q_BRK = out[:, -r_len - 1 : -1]
    values = dict(zip(names, q_BRK.unbind(-1), strict=True))
    ent = values.get("entropy")
    if ent is not None and not entropy_grad:
        ent = ent.detach()
    return values["logp"], ent, values.get("sum_sq")
