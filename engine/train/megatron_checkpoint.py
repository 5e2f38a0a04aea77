"""Checkpoints of ``MegatronEngine`` (``engine.train.megatron``), and a Hugging Face
state dict from one without Megatron.

One file per rank (``rank_<r>.pt``, written atomically: its TP slices named by their
place in the whole model, the optimizer state, the schedule step, the caller's extras),
``meta.json`` (the layout; written last by rank 0, so it marks a complete checkpoint)
and ``hf/`` (config and tokenizer). Loading needs the same parallel layout;
``hf_state_dict_from_checkpoint`` turns any of them back into a Hugging Face state dict
without Megatron.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from engine.config.megatron_parallel import MegatronParallel
from engine.errors import EngineError
from engine.train.megatron_convert import is_expert, merge_from_tp
from engine.train.megatron_model import is_tp_split, to_hf_pairs
from engine.train.megatron_ops import atomic_save
from engine.train.megatron_state import EngineState

CHECKPOINT_FORMAT = 1

# Layout fields that checkpoints written before pipeline, context and expert parallelism
# leave out.
_LAYOUT_DEFAULTS = {
    "pp": 1,
    "pp_rank": 0,
    "cp": 1,
    "cp_rank": 0,
    "ep": 1,
    "ep_rank": 0,
    "edp_rank": 0,
}


def _full_layout(saved: dict[str, Any]) -> dict[str, Any]:
    """A rank's saved layout with the fields an older checkpoint leaves out; one written
    before expert tensor parallelism split the experts like the rest (ETP = TP)."""
    etp = {"etp": saved["tp"], "etp_rank": saved["tp_rank"]}
    return {**_LAYOUT_DEFAULTS, **etp, **saved}


class MegatronCheckpoint(EngineState):
    """``save`` and ``load`` (with the same layout); the weights come from
    ``MegatronWeights._stage_parameters``, the schedule from ``MegatronUpdate._apply_lr``."""

    def save(self, path: str | Path, extra: dict[str, Any] | None = None, tokenizer: Any = None):
        """Every rank writes ``rank_<r>.pt``; rank 0 writes ``hf/`` and, last, ``meta.json``."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        if self.layout.rank == 0:  # an older checkpoint here is incomplete until the end
            (path / "meta.json").unlink(missing_ok=True)
        layout = asdict(self.layout)
        state = {
            "format": CHECKPOINT_FORMAT,
            "layout": layout,
            "role": self.role,
            "model": {
                n: p.detach().cpu().clone() for n, p in self._stage_parameters(with_shared=True)
            },
            # Copies of another stage's tensors (tied embeddings): left out of exports.
            "shared": [
                n
                for n, p in self._stage_parameters(with_shared=True)
                if getattr(p, "shared", False)
            ],
            "optimizer": self.optimizer.state_dict() if self.optimizer is not None else None,
            "lr_step": self.lr_step,
            "extra": extra or {},
        }
        atomic_save(state, path / f"rank_{self.layout.rank}.pt")
        if self._distributed_optimizer:  # its state is sharded over DP: gathered to DP rank 0
            self.optimizer.save_parameter_state(str(path / self._dist_optim_file()))
        layouts: list[Any] = [None] * self.layout.world_size
        dist.all_gather_object(layouts, layout)
        if self.layout.rank == 0:
            hf = path / "hf"
            self.hf_config.save_pretrained(hf)
            if tokenizer is not None:
                tokenizer.save_pretrained(hf)
            meta = {"format": CHECKPOINT_FORMAT, "role": self.role, "ranks": layouts}
            tmp = path / ".meta.json.tmp"
            tmp.write_text(json.dumps(meta, indent=1))
            os.replace(tmp, path / "meta.json")
        dist.barrier()

    def load(self, path: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer state and schedule in place; returns the extras."""
        path = Path(path)
        if not (path / "meta.json").exists():
            raise EngineError(f"{path} is not a complete Megatron checkpoint (no meta.json)")
        state = torch.load(path / f"rank_{self.layout.rank}.pt", weights_only=False)
        saved, now = _full_layout(state["layout"]), asdict(self.layout)
        if saved != now:
            raise EngineError(
                f"checkpoint {path} was written with layout {saved}; this run is {now}. Resume"
                " with the same parallel sizes and world size, or export it"
                " (hf_state_dict_from_checkpoint) and start from the Hugging Face weights"
            )
        with torch.no_grad():
            params = dict(self._stage_parameters(with_shared=True))
            if set(params) != set(state["model"]):
                raise EngineError(f"checkpoint {path} holds other parameters than this model")
            for name, tensor in state["model"].items():
                params[name].copy_(tensor)
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
            if self._distributed_optimizer:
                self.optimizer.load_parameter_state(str(path / self._dist_optim_file()))
            self.lr_step = state["lr_step"]
            self._apply_lr()
        dist.barrier()
        return state["extra"]

    @property
    def _distributed_optimizer(self) -> bool:
        return (
            self.optimizer is not None
            and self.uses_megatron_optimizer
            and self.parallel.use_distributed_optimizer
        )

    def _dist_optim_file(self) -> str:
        """Megatron's sharded optimizer state, written by each rank that is data-parallel
        rank 0 of the dense or of the expert optimizer (its share of each) and read back
        by the same rank: named by the global rank, so that pipeline stages, EP ranks and
        expert slices never overwrite each other's (the name by TP rank alone did)."""
        return f"dist_optimizer_rank{self.layout.rank}.pt"


def hf_state_dict_from_checkpoint(path: str | Path) -> dict[str, torch.Tensor]:
    """A Hugging Face state dict from a Megatron checkpoint directory, on one process and
    without Megatron: one replica's TP slices merged (data-parallel rank 0's; with the
    routed experts on their own grid, each EP rank's experts from its expert-data-parallel
    rank 0, their ETP slices merged), its pipeline stages joined (their files name layers
    and experts globally), copies of tied embeddings left out, renamed."""
    from transformers import AutoConfig

    path = Path(path)
    meta = json.loads((path / "meta.json").read_text())
    role = meta["role"]
    layouts = [_full_layout(r) for r in meta["ranks"]]
    first = layouts[0]
    apart = MegatronParallel(
        first["tp"], first["pp"], first["cp"], first["ep"], expert_tensor_parallel_size=first["etp"]
    ).experts_apart
    # Groups holding one copy of each tensor, ordered by slice: (routed experts, pipeline
    # stage, EP rank) -> ranks.
    groups: dict[tuple[bool, int, int], list[dict]] = {}
    for r in layouts:
        if r["dp_rank"] == 0 and r["cp_rank"] == 0:
            groups.setdefault((False, r["pp_rank"], 0), []).append(r)
        if apart and r["edp_rank"] == 0:
            groups.setdefault((True, r["pp_rank"], r["ep_rank"]), []).append(r)
    merged: dict[str, torch.Tensor] = {}
    for (experts, _, _), group in sorted(groups.items()):
        group.sort(key=lambda r: r["etp_rank" if experts else "tp_rank"])
        files = [torch.load(path / f"rank_{r['rank']}.pt", weights_only=False) for r in group]
        shared = set(files[0].get("shared", ()))
        for name in files[0]["model"]:
            if name not in shared and (apart and is_expert(name)) == experts:
                slices = [f["model"][name] for f in files]
                merged[name] = merge_from_tp(name, slices) if is_tp_split(name, role) else slices[0]
    hf_config = AutoConfig.from_pretrained(path / "hf")
    return dict(to_hf_pairs(iter(merged.items()), hf_config, role))
