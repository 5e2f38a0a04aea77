"""What one role's Megatron engine holds on its rank, shared by its parts
(``megatron_forward``, ``megatron_update``, ``megatron_weights``, ``megatron_checkpoint``;
``engine.train.megatron.MegatronEngine`` joins them): the model and its DDP wrapper, the
configs, this rank's place in Megatron's parallel groups and its pipeline stage."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.config import OptimConfig
from engine.config.megatron_parallel import MegatronParallel
from engine.device import DeviceSpec
from engine.train.megatron_model import local_experts
from engine.train.megatron_pipeline import Stage, StageLink
from engine.train.routing_replay import NO_REPLAY


@dataclass(frozen=True)
class RankLayout:
    """This rank's place in the parallel groups (a checkpoint records every rank's)."""

    world_size: int
    rank: int
    tp: int
    tp_rank: int
    dp: int
    dp_rank: int
    pp: int = 1
    pp_rank: int = 0
    cp: int = 1
    cp_rank: int = 0
    ep: int = 1
    ep_rank: int = 0
    edp_rank: int = 0  # expert data parallel: ranks holding the same experts
    # expert tensor parallel: the ranks that split each routed expert (Megatron: the TP
    # size unless set); a checkpoint written before it had etp = tp
    etp: int = 1
    etp_rank: int = 0

    @classmethod
    def current(cls) -> RankLayout:
        """From Megatron's parallel state (initialised)."""
        from megatron.core import parallel_state as ps

        return cls(
            world_size=dist.get_world_size(),
            rank=dist.get_rank(),
            tp=ps.get_tensor_model_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            dp=ps.get_data_parallel_world_size(),
            dp_rank=ps.get_data_parallel_rank(),
            pp=ps.get_pipeline_model_parallel_world_size(),
            pp_rank=ps.get_pipeline_model_parallel_rank(),
            cp=ps.get_context_parallel_world_size(),
            cp_rank=ps.get_context_parallel_rank(),
            ep=ps.get_expert_model_parallel_world_size(),
            ep_rank=ps.get_expert_model_parallel_rank(),
            edp_rank=ps.get_expert_data_parallel_rank(),
            etp=ps.get_expert_tensor_parallel_world_size(),
            etp_rank=ps.get_expert_tensor_parallel_rank(),
        )


class EngineState:
    """The state of one role's Megatron engine on this rank; each part of
    ``MegatronEngine`` derives from it."""

    def __init__(
        self,
        model: nn.Module,
        ddp: nn.Module | None,
        hf_config: Any,
        parallel: MegatronParallel,
        optim_cfg: OptimConfig | None,
        device: DeviceSpec,
        role: str,
        total_steps: int,
        stage: Stage,
    ) -> None:
        from megatron.core import parallel_state as ps

        self.model = model  # the GPTModel (names as megatron_convert expects)
        self.ddp = ddp  # its DDP wrapper (None: forward only)
        self.hf_config = hf_config
        self.parallel = parallel
        self.optim_cfg = optim_cfg
        self.device = device
        self.role = role
        self.total_steps = max(1, total_steps)
        self.tp_group = ps.get_tensor_model_parallel_group()
        self.dp_group = ps.get_data_parallel_group()
        self.model_parallel_group = ps.get_model_parallel_group()
        self.pp_group = ps.get_pipeline_model_parallel_group()
        self.layout = RankLayout.current()
        self.cp_group = ps.get_context_parallel_group()
        self.ep_group = ps.get_expert_model_parallel_group()
        self.etp_group = ps.get_expert_tensor_parallel_group()  # slices of one routed expert
        # The ranks whose tokens meet in the experts (Megatron's ETP × EP group).
        self.tp_ep_group = ps.get_expert_tensor_and_model_parallel_group()
        # Each routed expert's ETP slice once: what the gradient norm sums over for them.
        self.expert_norm_group = ps.get_expert_tensor_model_pipeline_parallel_group()
        self.experts = local_experts(hf_config)  # global numbers of this rank's experts
        self.stage = stage
        self.link = StageLink()
        # (stage input, stage output) of each micro-batch whose backward is still to come:
        # the input's gradient goes to the previous stage, the output's comes from the next.
        self._in_flight: deque[tuple[torch.Tensor | None, torch.Tensor]] = deque()
        self._scheduling = False  # inside forward_backward with pipeline stages
        self.lr_step = 0  # schedule steps taken
        self.optimizer: Any = None
        # Megatron's optimizer on accelerators; on CPU torch's AdamW (megatron_update).
        self.uses_megatron_optimizer = device.type != "cpu"
        # MoE routing replay (engine.train.megatron_routing): the actor's when it replays.
        self.routing: Any = NO_REPLAY

    @property
    def dp_size(self) -> int:
        return self.layout.dp

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def module(self) -> nn.Module:
        """What runs forward: the DDP wrapper, or the bare model when forward-only."""
        return self.ddp if self.ddp is not None else self.model

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()
