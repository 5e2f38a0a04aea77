"""Weights from the colocated actor into vLLM, through vLLM's own weight-update session.

vLLM (0.16 and newer) updates a running engine's weights in a session:
``LLM.start_weight_update()``, any number of ``LLM.update_weights(...)`` chunks, then
``LLM.finish_weight_update(weight_version)``. The worker side is a pluggable
``WeightTransferEngine`` chosen by ``weight_transfer_config={"backend": name}``: vLLM's
own backends move tensors between processes (NCCL, CUDA IPC). Here the engine runs in
the actor's own process (``distributed_executor_backend="external_launcher"``), so the
tensors are already where vLLM needs them: ``InProcessTransfer`` is a backend that takes
them as they are, on every platform vLLM runs on (CUDA, ROCm, Ascend, CPU).

The session loads checkpoint-format tensors through vLLM's layerwise reload
(``initialize_layerwise_reload`` / ``finalize_layerwise_reload``): each layer is rebuilt
from the new tensors and post-processed again (fused, sharded for TP, repacked for the
CPU's oneDNN kernels), so it works where a plain ``model.load_weights`` after start
does not (on CPU the repacked linear weights are empty parameters).

Two things the session would get silently wrong, checked here:

- A tied output head (``lm_head`` sharing the embedding) is its own module in vLLM with
  its own processed copy: a layer that receives nothing keeps its old weights (vLLM only
  logs it). The embedding's tensor is loaded under every alias of it, so the head follows.
- Any parameter the session did not receive is an error at ``finish`` (the engine would
  otherwise hold a mix of old and new weights). The caller marks the engine unusable.

vLLM is imported only when this module is, by engine.rollout.vllm.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

BACKEND = "rlctl_inprocess"

NamedTensor = tuple[str, torch.Tensor]


class IncompleteWeightUpdate(RuntimeError):
    """The session ended without a tensor for every parameter of the model."""


@dataclass
class InProcessInitInfo(WeightTransferInitInfo):
    """Nothing to set up: no rendezvous, the tensors are in this process."""


@dataclass
class InProcessUpdateInfo(WeightTransferUpdateInfo):
    weights: list[NamedTensor] = field(default_factory=list)  # HF checkpoint names


def tied_aliases(model: torch.nn.Module) -> dict[str, list[str]]:
    """``{first name: [other names]}`` of parameters that are one tensor under several
    names (a tied ``lm_head.weight`` and ``model.embed_tokens.weight``)."""
    by_tensor: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        by_tensor.setdefault(id(param), []).append(name)
    return {names[0]: names[1:] for names in by_tensor.values() if len(names) > 1}


def missing_parameters(expected: Iterable[str], loaded: set[str]) -> list[str]:
    return sorted(set(expected) - loaded)


class InProcessTransfer(WeightTransferEngine[InProcessInitInfo, InProcessUpdateInfo]):
    init_info_cls = InProcessInitInfo
    update_info_cls = InProcessUpdateInfo

    def __init__(self, config: Any, vllm_config: Any, device: Any, model: Any) -> None:
        super().__init__(config, vllm_config, device, model)
        self.aliases = tied_aliases(model)  # read once: the reload untie them meanwhile
        self.loaded: set[str] = set()
        self.expected: list[str] = []

    def init_transfer_engine(self, init_info: InProcessInitInfo) -> None:
        pass

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.loaded = set()
        # With enable_lora vLLM wraps its linear layers (qkv_proj.base_layer); its loader
        # fills them under their own names (qkv_proj.weight), and reports those.
        self.expected = [
            name.replace(".base_layer.", ".")
            for name, _ in self.model.named_parameters(remove_duplicate=False)
        ]
        initialize_layerwise_reload(self.model)

    def receive_weights(self, update_info: InProcessUpdateInfo) -> None:
        weights = list(update_info.weights)
        for name, tensor in update_info.weights:
            weights.extend((alias, tensor) for alias in self.aliases.get(name, ()))
        loaded = self.model.load_weights(weights)
        # Models return the vLLM names they loaded; one that returns nothing cannot be
        # checked name by name, so every expected name counts as loaded for it.
        loaded = set(self.expected) if loaded is None else set(loaded)
        # Some versions skip a tied head's name (it is the embedding's parameter) and do
        # not report it: it is loaded with the embedding. Whether its output follows is
        # what the engine's conformance test checks, on every version CI runs.
        for name in list(loaded):
            loaded.update(self.aliases.get(name, ()))
        self.loaded |= loaded

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        missing = missing_parameters(self.expected, self.loaded)
        # finalize puts the old weights back into every layer that received nothing:
        # run it either way (the model stays consistent in itself), then refuse.
        finalize_layerwise_reload(self.model, self.model_config)
        if missing and self.model_config.quantization is None:
            shown = ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else "")
            raise IncompleteWeightUpdate(
                f"the weight update left {len(missing)} of {len(self.expected)} vLLM"
                f" parameters with their old values: {shown}"
            )

    def shutdown(self) -> None:
        pass

    @staticmethod
    def trainer_send_weights(iterator: Any, trainer_args: Any) -> None:
        """The trainer side of vLLM 0.27's interface; here the trainer calls
        ``LLM.update_weights`` itself (engine.rollout.vllm)."""
        raise NotImplementedError("InProcessTransfer is driven through LLM.update_weights")


def _not_a_missing_weight(record: logging.LogRecord) -> bool:
    """vLLM warns "<Layer>: Failed to load weights" for every layer a reload gave
    nothing, rotary embeddings included, whose buffers are no checkpoint weight: a
    warning per layer per sync that cries wolf. The check at ``finish`` covers every
    real parameter and fails instead of warning."""
    return "Failed to load weights" not in record.getMessage()


def register() -> dict[str, str]:
    """Make the backend known to vLLM (this process only; the engine is built in it) and
    return the ``weight_transfer_config`` that selects it."""
    with contextlib.suppress(ValueError):  # registered by an earlier engine in this process
        WeightTransferEngineFactory.register_engine(BACKEND, InProcessTransfer)
    layerwise = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if _not_a_missing_weight not in layerwise.filters:
        layerwise.addFilter(_not_a_missing_weight)
    return {"backend": BACKEND}


def update_chunk(bucket: list[NamedTensor]) -> dict[str, Any]:
    """One ``LLM.update_weights`` request: the tensors themselves (no serialisation: the
    worker is this process)."""
    return {"update_info": {"weights": bucket}}
