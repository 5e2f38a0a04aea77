"""Save and load one FSDP2-trained role (actor or critic) as a sharded checkpoint.

Layout of a role's directory (written collectively by every rank of the group):

    model/    torch distributed checkpoint of the model state dict (HF parameter names)
    optim/    torch distributed checkpoint of the optimizer state dict
    rank_<r>.pt  the LR scheduler's state and the update counters of rank r
    hf/       config.json, generation_config.json and the tokenizer (rank 0), so that
              ``python -m engine.export`` can rebuild a Hugging Face folder

Each rank writes only its own shards; loading reshards to the current world size.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict


def save_role(
    path: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    extra: dict[str, Any],
    tokenizer: Any = None,
) -> None:
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model_sd, optim_sd = get_state_dict(module, optimizer)
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
    dist.barrier()


def load_role(
    path: str | Path,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
) -> dict[str, Any]:
    """Load in place; returns this rank's extras (those passed to ``save_role``)."""
    path = Path(path)
    model_sd, optim_sd = get_state_dict(module, optimizer)
    dcp.load(model_sd, checkpoint_id=str(path / "model"))
    dcp.load(optim_sd, checkpoint_id=str(path / "optim"))
    set_state_dict(module, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)
    state = _rank_state(path)
    scheduler.load_state_dict(state.pop("scheduler"))
    return state


def _rank_state(path: Path) -> dict[str, Any]:
    """This rank's extras; after a change of world size, rank 0's (the counters are
    replicated across ranks, so any rank's copy is right)."""
    own = path / f"rank_{dist.get_rank()}.pt"
    return torch.load(own if own.exists() else path / "rank_0.pt", weights_only=False)
