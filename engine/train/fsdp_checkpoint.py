"""Save and load one FSDP2-trained role (actor or critic) as a sharded checkpoint.

Layout of a role's directory (written collectively by every rank of the group):

    model/    torch distributed checkpoint of the model state dict (HF parameter names)
    optim/    torch distributed checkpoint of the optimizer state dict
    rank_<r>.pt  the LR scheduler's state and the update counters of rank r
    hf/       config.json, generation_config.json and the tokenizer (rank 0), so that
              ``python -m engine.export`` can rebuild a Hugging Face folder; a
              vision-language model's processor files too (preprocessor_config.json)

With LoRA (engine.train.lora) ``model/`` holds the adapter's tensors only (the frozen base
weights are the model path's, unchanged), ``optim/`` their AdamW state, and ``hf/`` also
peft's ``adapter_config.json`` naming the base model.

Each rank writes only its own shards; loading reshards to the current world size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_state_dict,
)

from engine.models.processor import copy_processor_files
from engine.rollout.weights import clean_name


def _options(adapter_only: bool) -> StateDictOptions:
    # The frozen base weights stay out of the checkpoint (and are not expected on load).
    return StateDictOptions(ignore_frozen_params=adapter_only, strict=not adapter_only)


def _model_state(module: nn.Module, optimizer: torch.optim.Optimizer, adapter_only: bool):
    model_sd, optim_sd = get_state_dict(module, optimizer, options=_options(adapter_only))
    if adapter_only:
        # ignore_frozen_params misses a tied weight's second name (lm_head.weight, the
        # embedding's): keep exactly the parameters that train.
        trainable = {clean_name(n) for n, p in module.named_parameters() if p.requires_grad}
        model_sd = {k: v for k, v in model_sd.items() if k in trainable}
    return model_sd, optim_sd


def save_role(
    path: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    extra: dict[str, Any],
    tokenizer: Any = None,
    peft_model: Any = None,
) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = _model_state(module, optimizer, adapter_only=peft_model is not None)
    dcp.save(model_sd, checkpoint_id=str(path / "model"))
    dcp.save(optim_sd, checkpoint_id=str(path / "optim"))
    rank = dist.get_rank()
    torch.save({"scheduler": scheduler.state_dict(), **extra}, path / f"rank_{rank}.pt")
    if rank == 0:
        hf = path / "hf"
        module.config.save_pretrained(hf)
        generation = getattr(module, "generation_config", None)
        if generation is not None:
            generation.save_pretrained(hf)
        if tokenizer is not None:
            tokenizer.save_pretrained(hf)
            # a vision-language model's processor files, for the export (docs/vision.md)
            copy_processor_files(module.config, hf)
        if peft_model is not None:
            peft_model.peft_config["default"].save_pretrained(hf)
    dist.barrier()


def load_role(
    path: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    adapter_only: bool = False,
) -> dict[str, Any]:
    """Load in place; returns this rank's extras (those passed to ``save_role``)."""
    path = Path(path)
    model_sd, optim_sd = _model_state(module, optimizer, adapter_only)
    dcp.load(model_sd, checkpoint_id=str(path / "model"))
    dcp.load(optim_sd, checkpoint_id=str(path / "optim"))
    set_state_dict(
        module,
        optimizer,
        model_state_dict=model_sd,
        optim_state_dict=optim_sd,
        options=_options(adapter_only),
    )
    state = _rank_state(path)
    scheduler.load_state_dict(state.pop("scheduler"))
    return state


def _rank_state(path: Path) -> dict[str, Any]:
    """This rank's extras; after a change of world size, rank 0's (the counters are
    replicated across ranks, so any rank's copy is right)."""
    own = path / f"rank_{dist.get_rank()}.pt"
    return torch.load(own if own.exists() else path / "rank_0.pt", weights_only=False)
