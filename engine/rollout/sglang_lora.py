"""SGLang serving a LoRA actor's adapter itself (``rollout.lora_as_adapter``).

The engine starts with LoRA enabled and no adapter (so it is told the largest rank and
the target modules up front); the frozen base weights are pushed once (the first sync),
and after each actor update only the adapter, written in peft's layout
(engine.rollout.lora_adapter) and loaded under a new name per weight version: load the
new one, serve it (every generation names it, ``lora_path=<name>``), then unload the
old one. A load that fails leaves the old adapter served, which the caller refuses to
go on with. SGLang has no streaming path here (the fully asynchronous mode is vLLM's),
so no request is in flight across a swap.

Written against SGLang's Engine API as read from its source (its
main branch at commit 001067f, late 2026; the pinned 0.5.23 was not checked call by
call): ``Engine(enable_lora=True, max_lora_rank=..., lora_target_modules=[...],
max_loras_per_batch=...)``, ``Engine.load_lora_adapter(lora_name, lora_path,
pinned=False)`` and ``unload_lora_adapter(lora_name)``, answering a ``LoRAUpdateOutput``
(``success``, ``error_message``) rather than raising, and ``Engine.generate(...,
lora_path=[name per row])``. Not run in this repository's CI (SGLang has no CPU
kernels); unit-tested against a stand-in of that surface (tests/engine/rollout/
test_sglang_lora.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from engine.rollout.lora_adapter import AdapterFolder


def lora_engine_args(rank: int, target_modules: str | list[str]) -> dict[str, Any]:
    """SGLang's engine arguments for one adapter of ``rank``. Started without adapters,
    SGLang cannot infer the rank or the modules, so both are given; peft's
    ``all-linear`` is SGLang's ``all``."""
    targets = ["all"] if target_modules == "all-linear" else list(target_modules)
    return {
        "enable_lora": True,
        "max_lora_rank": rank,
        "lora_target_modules": targets,
        # SGLang counts a base-only request among a batch's adapters: one slot for
        # the actor's adapter and one for that.
        "max_loras_per_batch": 2,
    }


def check_lora_result(what: str, result: Any) -> None:
    """SGLang's adapter calls answer ``LoRAUpdateOutput(success, error_message, ...)``."""
    if getattr(result, "success", True) is False:
        raise RuntimeError(f"{what} refused: {getattr(result, 'error_message', None)}")


class AdapterSwap:
    """The adapters an SGLang engine serves, one weight version at a time (on the TP
    group's owner, the process that holds the engine)."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.folder = AdapterFolder()
        self.name: str | None = None  # the adapter every generation names

    def load(
        self, version: int, peft_config: Any, tensors: Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        """Serve this weight version's adapter: load it under its own name, switch to it,
        unload the last one (nothing generates meanwhile: syncs are between batches)."""
        path = self.folder.write(version, peft_config, tensors)
        name = f"actor-v{version}"
        check_lora_result(
            f"load_lora_adapter({name})",
            self.engine.load_lora_adapter(lora_name=name, lora_path=str(path)),
        )
        old, self.name = self.name, name
        if old is not None:
            check_lora_result(
                f"unload_lora_adapter({old})", self.engine.unload_lora_adapter(lora_name=old)
            )
        # Cached prefixes were computed with the old adapter: none may be reused.
        self.engine.flush_cache()

    def generate_kwargs(self, rows: int) -> dict[str, Any]:
        """What ``Engine.generate`` takes to serve the current adapter to ``rows`` rows."""
        return {} if self.name is None else {"lora_path": [self.name] * rows}

    def close(self) -> None:
        self.folder.close()
