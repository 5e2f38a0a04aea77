"""The routers of a Hugging Face mixture-of-experts model, tapped at their top-k: record
the experts each token takes, or make it take given ones (MoE routing replay,
``engine.config.routing_replay``).

transformers' routers (``Qwen3MoeTopKRouter``, ``Qwen2MoeTopKRouter``,
``DeepseekV3TopkRouter``, Mixtral's, ...) are modules of their own that compute the router
logits, a score from them, the top k over the experts, and from the chosen experts'
scores the weights the experts are mixed with: a softmax renormalised over the k, a
sigmoid gathered and scaled, each family its own way. The narrowest point common to all
is that top-k call, over a (tokens, experts) score with k = the router's ``top_k``. While
a router runs, a ``TorchFunctionMode`` (thread-local, active in that forward only)
watches for it: recording keeps its indices; replaying returns the given indices, with
the values at them of the score it was called on. The family's own code then computes
the weights from the current logits over the replayed experts, exactly as it would had
it chosen them (and the router's gradient flows through them as it does natively). A
token whose target row holds a -1 (nothing recorded: padding, the last token of an R3
row) keeps its own top k.

The tap wraps each router's ``forward`` on the instance: under gradient checkpointing
the recomputed layer calls the router again, and replays the same targets.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from engine.errors import EngineError

NATIVE, RECORD, REPLAY = "native", "record", "replay"
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def find_routers(model: nn.Module) -> dict[int, nn.Module]:
    """The model's routers by decoder layer: modules with ``top_k``, ``num_experts`` and
    their own (experts, hidden) ``weight``."""
    found = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        experts = getattr(module, "num_experts", None)
        if (
            isinstance(getattr(module, "top_k", None), int)
            and isinstance(experts, int)
            and isinstance(weight, torch.Tensor)
            and weight.dim() == 2
            and weight.shape[0] == experts
            and (layer := _LAYER.search(name)) is not None
        ):
            found[int(layer.group(1))] = module
    return found


class _TopK(TorchFunctionMode):
    """Active while one router runs: its top-k over the experts, recorded or replaced."""

    def __init__(self, tap: RouterTap, layer: int, router: nn.Module) -> None:
        super().__init__()
        self.tap, self.layer, self.router = tap, layer, router

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func not in (torch.topk, torch.Tensor.topk) or not self._routes(args, kwargs):
            return out
        if self.tap.action == RECORD:
            self.tap.recorded.setdefault(self.layer, []).append(out.indices.detach())
            return out
        return self._replayed(args[0], out)

    def _routes(self, args: tuple, kwargs: dict) -> bool:
        """The call picks each token's experts: (tokens, experts) scores, k = top_k."""
        scores = args[0]
        k = args[1] if len(args) > 1 else kwargs.get("k")
        dim = args[2] if len(args) > 2 else kwargs.get("dim", -1)
        return (
            scores.dim() == 2
            and scores.shape[-1] == self.router.num_experts
            and k == self.router.top_k
            and dim in (-1, 1)
        )

    def _replayed(self, scores: torch.Tensor, out):
        target = self.tap.targets.get(self.layer)
        if target is None or target.shape != out.indices.shape:
            shape = None if target is None else tuple(target.shape)
            raise EngineError(
                f"routing replay: layer {self.layer}'s router chose {tuple(out.indices.shape)}"
                f" experts (tokens × k) but was given {shape} to replay; the recorded routing"
                " does not match this model or this batch"
            )
        target = target.to(out.indices.device)
        recorded = (target >= 0).all(dim=-1, keepdim=True)
        indices = torch.where(recorded, target, out.indices)
        return torch.return_types.topk((scores.gather(-1, indices), indices))


class RouterTap:
    """One model's routers, each in the same state: ``action`` native (untouched),
    record (``recorded``: per layer, the (tokens, k) indices of each call) or replay
    (``targets``: per layer, the (tokens, k) indices to take)."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = find_routers(model)
        config = getattr(model, "config", None)
        text = config.get_text_config() if config is not None else None
        self.num_layers = int(getattr(text, "num_hidden_layers", 0) or 0)
        self.action = NATIVE
        self.recorded: dict[int, list[torch.Tensor]] = {}
        self.targets: dict[int, torch.Tensor] = {}
        self._originals: dict[int, object] = {}

    @property
    def layers(self) -> list[int]:
        return sorted(self.routers)

    @property
    def top_k(self) -> int:
        return next(iter(self.routers.values())).top_k if self.routers else 0

    def install(self) -> RouterTap:
        if not self.routers:
            raise EngineError(
                "routing replay needs a mixture-of-experts model whose routers this engine"
                " knows (a module per layer with top_k, num_experts and its own weight, as"
                " transformers' Qwen2/3-MoE, Mixtral and DeepSeek-V3 routers); found none:"
                " set actor_rollout_ref.actor.router_replay.mode=disabled"
            )
        for layer, router in self.routers.items():
            self._originals[layer] = router.forward
            router.forward = self._wrapped(layer, router, router.forward)
        return self

    def uninstall(self) -> None:
        for layer, forward in self._originals.items():
            self.routers[layer].forward = forward  # type: ignore[method-assign]
        self._originals = {}

    def _wrapped(self, layer: int, router: nn.Module, forward):
        def routed(*args, **kwargs):
            if self.action == NATIVE:
                return forward(*args, **kwargs)
            with _TopK(self, layer, router):
                return forward(*args, **kwargs)

        return routed

    def record(self) -> None:
        self.action, self.recorded = RECORD, {}

    def replay(self, targets: dict[int, torch.Tensor]) -> None:
        self.action, self.targets = REPLAY, targets

    def native(self) -> None:
        self.action, self.recorded, self.targets = NATIVE, {}, {}

    def taken(self) -> dict[int, torch.Tensor]:
        """The indices of the one forward recorded since ``record()``."""
        return {layer: calls[0] for layer, calls in self.recorded.items()}

    def after_forward(self) -> None:
        """Nothing: the targets stay for the backward's recomputation."""


@contextlib.contextmanager
def recording(model: nn.Module) -> Iterator[RouterTap]:
    """Record ``model``'s routing for the duration (a rollout's generation): the tap's
    ``recorded`` holds each layer's indices of every forward call, in order."""
    tap = RouterTap(model).install()
    tap.record()
    try:
        yield tap
    finally:
        tap.uninstall()
