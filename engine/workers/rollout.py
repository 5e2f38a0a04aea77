"""The rollout role: generates responses with the configured backend.

``hf`` generates with the actor's own (FSDP) weights. ``vllm`` and ``sglang`` hold
their own copy, in the same worker processes as the actor (colocated): before each
generation the worker checks the actor's ``weights_version`` and, when the actor has
changed since the last push (an update, a checkpoint load, or the start: the engine is
built with dummy weights), pushes the new weights bucket by bucket. All ranks update
in lockstep, so they all push in the same call, as the FSDP gathers require.
"""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.rollout.hf import eos_ids
from engine.rollout.weights import ENGINE_NAME_MAPS, full_tensors
from engine.train.fsdp import DTYPES
from engine.types import GenerationOutput, GenerationRequest


class RolloutWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        rollout_cfg = cfg.actor_rollout_ref.rollout
        if rollout_cfg.placement != "colocate" or "actor" not in colocated:
            raise EngineError(
                f"actor_rollout_ref.rollout.placement={rollout_cfg.placement}: only colocate"
                " (the rollout in the actor's worker processes) is wired in this build; set"
                " actor_rollout_ref.rollout.placement=colocate"
            )
        self.cfg = rollout_cfg
        self.device = device
        self.actor = colocated["actor"]
        self.synced_version: int | None = None  # the actor's weights the engine holds
        if rollout_cfg.name == "hf":
            from engine.rollout.hf import HFRollout

            self.engine: Any = HFRollout(
                self.actor.module,
                tokenizer,
                device.torch_device(),
                micro_batch_size=rollout_cfg.micro_batch_size,
            )
            self.owns_weights = False
            return
        model = cfg.actor_rollout_ref.model
        common = {
            "eos_token_ids": eos_ids(tokenizer, self.actor.module),
            "max_model_len": cfg.data.max_prompt_length + cfg.data.max_response_length,
            "seed": cfg.trainer.seed,
            "trust_remote_code": model.trust_remote_code,
            # The first generation pushes the actor's weights: no second read from disk.
            "load_format": "dummy",
            "local_world_size": cfg.trainer.n_gpus_per_node,
            "bucket_bytes": rollout_cfg.update_weights_bucket_megabytes * 2**20,
        }
        if rollout_cfg.name == "vllm":
            from engine.rollout.vllm import VLLMRollout

            self.engine = VLLMRollout(rollout_cfg, model.path, **common)
        elif rollout_cfg.name == "sglang":
            from engine.rollout.sglang import SGLangRollout

            local_rank = device.torch_device().index or 0
            self.engine = SGLangRollout(rollout_cfg, model.path, local_rank=local_rank, **common)
        else:
            raise EngineError(f"unknown actor_rollout_ref.rollout.name {rollout_cfg.name!r}")
        self.owns_weights = True

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        if self.owns_weights and self.synced_version != self.actor.weights_version:
            self.sync_weights()
        self.engine.wake()
        try:
            return self.engine.generate(request)
        finally:
            self.engine.sleep()

    def sync_weights(self) -> None:
        """Push the actor's current weights into the engine, in the rollout dtype, as
        the engine names them (Hugging Face names, unfused)."""
        self.engine.sync_weights(
            full_tensors(
                self.actor.module,
                dtype=DTYPES[self.cfg.dtype] if self.device.supports_bf16 else None,
                device=self.device.torch_device(),
                name_map=ENGINE_NAME_MAPS[self.cfg.name],
            )
        )
        self.synced_version = self.actor.weights_version
