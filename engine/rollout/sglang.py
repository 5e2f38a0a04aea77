"""Rollout with SGLang, colocated with the FSDP actor.

One ``sglang.Engine`` per tensor-parallel group, owned by the group's first worker
(SGLang starts its own scheduler process per TP rank, on the devices from
``base_gpu_id``: with TP > 1 that worker must see the group's devices). Every member
gathers the group's prompts (engine.rollout.tp), the owner generates, and each member
keeps its rows. Weights: every member takes part in the bucketed gather (it is a
collective over the FSDP shards); the owner pushes each bucket with
``Engine.update_weights_from_tensor`` (HF names; SGLang's ``load_weights`` fuses and
shards). Memory: ``enable_memory_saver`` and ``release_memory_occupation`` /
``resume_memory_occupation`` with the ``kv_cache`` and ``weights`` tags.

Written against SGLang's documented Engine API for the versions in
engine.rollout.versions; imported only here. Not run in this repository's CI (no GPU):
see docs/backends.md.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist

from engine.config import RolloutConfig
from engine.errors import EngineError
from engine.rollout.base import finish_row
from engine.rollout.tp import gather_group_rows, new_tp_group, tp_layout
from engine.rollout.translate import (
    EngineSettings,
    explain_kv_cache_errors,
    sampling_params_for,
)
from engine.rollout.versions import check_version
from engine.rollout.weights import bucketize
from engine.types import GenerationOutput, GenerationRequest


def parse_output(
    output: dict[str, Any], eos_token_ids: set[int], ignore_eos: bool, want_logprobs: bool
) -> tuple[list[int], list[float] | None, bool]:
    """One SGLang result dict (``output_ids``; ``meta_info.output_token_logprobs`` as
    ``(logprob, token_id, text)`` triples) in our terms."""
    ids = list(output["output_ids"])
    lps = None
    if want_logprobs:
        triples = output["meta_info"]["output_token_logprobs"]
        lps = [float(t[0]) for t in triples]
    return finish_row(ids, lps, eos_token_ids, ignore_eos)


class SGLangRollout:
    def __init__(
        self, cfg: RolloutConfig, settings: EngineSettings, *, local_rank: int = 0
    ) -> None:
        check_version("sglang")
        self.cfg = cfg
        self.eos_token_ids = set(settings.eos_token_ids)
        self.bucket_bytes = settings.bucket_bytes
        self.layout = tp_layout(cfg.tensor_model_parallel_size, settings.local_world_size)
        self.group = new_tp_group(self.layout)
        self.engine: Any = None
        if self.layout.tp_rank == 0:
            import sglang

            tp = cfg.tensor_model_parallel_size
            visible = torch.cuda.device_count()
            if tp > 1 and visible < local_rank + tp:
                raise EngineError(
                    f"the SGLang rollout with tensor_model_parallel_size={tp} starts its TP"
                    f" processes from the group's first worker, which sees {visible}"
                    " device(s): it must see the whole node (do not pin one device per"
                    " worker), or use actor_rollout_ref.rollout.name=vllm, or"
                    " tensor_model_parallel_size=1"
                )

            args = settings.engine_args(cfg, "sglang")
            # Ray pins one device per worker; a TP group's owner starts at its own.
            args["base_gpu_id"] = local_rank if tp > 1 else 0
            with explain_kv_cache_errors("sglang", cfg, settings.max_model_len):
                self.engine = sglang.Engine(**args)
        self._asleep: set[str] = set()
        self.sleep()

    @property
    def owner(self) -> bool:
        return self.engine is not None

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        rows, mine = gather_group_rows(request.prompt_ids, self.layout, self.group)
        want_logprobs = self.cfg.calculate_log_probs
        results: list[Any] = [None]
        if self.owner:
            params = sampling_params_for(
                request.sampling, "sglang", eos_token_ids=self.eos_token_ids
            )
            outputs = (
                self.engine.generate(
                    input_ids=rows, sampling_params=params, return_logprob=want_logprobs
                )
                if rows
                else []
            )
            results = [
                [
                    parse_output(o, self.eos_token_ids, request.sampling.ignore_eos, want_logprobs)
                    for o in outputs
                ]
            ]
        if self.layout.tp > 1:
            owner_rank = self.layout.group_ranks[0]
            dist.broadcast_object_list(results, src=owner_rank, group=self.group)
        parsed = results[0][mine]
        return GenerationOutput(
            response_ids=[tokens for tokens, _, _ in parsed],
            finished=[done for _, _, done in parsed],
            logprobs=[lps or [] for _, lps, _ in parsed] if want_logprobs else None,
        )

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Every member drains the iterator (the FSDP gathers are collective); the owner
        pushes each bucket, flushing the radix cache after the last one."""
        if self.owner and "weights" in self._asleep:
            self.engine.resume_memory_occupation(tags=["weights"])
            self._asleep.discard("weights")
        pending: list[tuple[str, torch.Tensor]] | None = None
        for bucket in bucketize(named_tensors, self.bucket_bytes):
            if pending is not None and self.owner:
                self.engine.update_weights_from_tensor(named_tensors=pending, flush_cache=False)
            pending = bucket
        if pending is not None and self.owner:
            self.engine.update_weights_from_tensor(named_tensors=pending, flush_cache=True)

    def sleep(self) -> None:
        if not self.cfg.free_cache_engine or self._asleep:
            return
        if self.owner:
            self.engine.release_memory_occupation(tags=["kv_cache", "weights"])
        self._asleep = {"kv_cache", "weights"}

    def wake(self) -> None:
        if not self._asleep:
            return
        if self.owner:
            self.engine.resume_memory_occupation(tags=sorted(self._asleep))
        self._asleep = set()

    def shutdown(self) -> None:
        if self.owner:
            self.engine.shutdown()
