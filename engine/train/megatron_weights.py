"""Full weights out of ``MegatronEngine`` (``engine.train.megatron``), every rank taking
part: its TP slices gathered (a routed expert's over its ETP group), its routed experts
gathered over expert parallelism, each pipeline stage's tensors broadcast to the others;
renamed to Hugging Face's names one tensor at a time, for the rollout's weight sync and
for exports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from engine.train.megatron_convert import is_expert, merge_from_tp, shift_expert
from engine.train.megatron_model import checkpoint_weights, full_shape, split_size, to_hf_pairs
from engine.train.megatron_pipeline import shift_layer
from engine.train.megatron_state import EngineState


class MegatronWeights(EngineState):
    """``hf_named_tensors``: full Hugging Face (name, tensor) pairs."""

    def _stage_parameters(self, with_shared: bool = False) -> Iterator[tuple[str, nn.Parameter]]:
        """This stage's parameters by their global Megatron names (layers and routed
        experts numbered in the whole model); the last stage's copy of tied embeddings
        (``shared``) only when asked."""
        for name, param in checkpoint_weights(self.model):
            if with_shared or not getattr(param, "shared", False):
                global_name = shift_layer(name, self.stage.layer_offset)
                yield shift_expert(global_name, self.experts.start), param

    def _split_size(self, name: str) -> int:
        return split_size(name, self.role, self.layout.tp, self.layout.etp)

    def _gathered(self, name: str, param: torch.Tensor) -> torch.Tensor:
        """The full tensor of this rank's slice (the TP group takes part; for a routed
        expert, its ETP group)."""
        tensor = param.detach()
        if (count := self._split_size(name)) > 1:
            group = self.etp_group if is_expert(name) else self.tp_group
            slices = [torch.empty_like(tensor) for _ in range(count)]
            dist.all_gather(slices, tensor.contiguous(), group=group)
            tensor = merge_from_tp(name, slices)
        return tensor

    def _expert_peers(self, name: str) -> list[str]:
        """The names of what one parameter and its counterparts on the other
        expert-parallel ranks hold: a routed expert's on each EP rank, else itself."""
        if self.layout.ep == 1 or not is_expert(name):
            return [name]
        n, mine = len(self.experts), self.layout.ep_rank
        return [shift_expert(name, (r - mine) * n) for r in range(self.layout.ep)]

    def _full_tensors_of(self, name: str, param: torch.Tensor) -> Iterator[torch.Tensor]:
        """The full tensors of ``_expert_peers(name)``: TP slices gathered, and a routed
        expert's gathered over the EP group (its ranks hold the same local experts)."""
        tensor = self._gathered(name, param)
        if len(peers := self._expert_peers(name)) == 1:
            yield tensor
            return
        parts = [torch.empty_like(tensor) for _ in peers]
        dist.all_gather(parts, tensor.contiguous(), group=self.ep_group)
        yield from parts

    def _full_megatron_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(global Megatron name, full tensor): TP slices and expert-parallel shares
        gathered, and with pipeline stages each stage's tensors broadcast to the others,
        stage by stage, one tensor at a time. Every rank takes part in the same order
        and gets every tensor."""
        if self.stage.count == 1:
            for name, param in self._stage_parameters():
                peers = self._expert_peers(name)
                yield from zip(peers, self._full_tensors_of(name, param), strict=True)
            return
        device = self.device.torch_device()
        for stage in range(self.stage.count):
            src = dist.get_global_rank(self.pp_group, stage)
            mine = list(self._stage_parameters()) if stage == self.stage.index else []
            shapes = ((n, full_shape(n, p.shape, self._split_size(n)), p.dtype) for n, p in mine)
            specs = [[(peer, s, d) for n, s, d in shapes for peer in self._expert_peers(n)]]
            dist.broadcast_object_list(specs, src=src, group=self.pp_group)
            tensors = (t for n, p in mine for t in self._full_tensors_of(n, p))
            for name, shape, dtype in specs[0]:
                if mine:
                    tensor = next(tensors).contiguous()
                else:
                    tensor = torch.empty(shape, dtype=dtype, device=device)
                dist.broadcast(tensor, src=src, group=self.pp_group)
                yield name, tensor

    def hf_named_tensors(self, dtype: torch.dtype | None = None) -> Iterator[tuple[str, Any]]:
        """Full Hugging Face (name, tensor) pairs, one parameter at a time (collective: call
        on every rank). The critic's value head comes out as ``score.{weight,bias}``.
        Tensors not split over TP are views of the live parameters: copy what you keep."""
        pairs = self._full_megatron_tensors()
        for name, tensor in to_hf_pairs(pairs, self.hf_config, self.role):
            yield name, tensor if dtype is None else tensor.to(dtype)
