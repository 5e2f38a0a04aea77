"""The rollout role: generates responses with the configured backend."""

from __future__ import annotations

from typing import Any

from engine.config import EngineConfig
from engine.device import DeviceSpec
from engine.errors import EngineError
from engine.types import GenerationOutput, GenerationRequest


class RolloutWorker:
    def __init__(
        self, cfg: EngineConfig, device: DeviceSpec, tokenizer: Any, colocated: dict[str, Any]
    ) -> None:
        rollout_cfg = cfg.actor_rollout_ref.rollout
        if rollout_cfg.name != "hf":
            raise EngineError(
                f"actor_rollout_ref.rollout.name={rollout_cfg.name} is not available in this"
                " build yet; use rollout.name=hf"
            )
        if rollout_cfg.placement != "colocate" or "actor" not in colocated:
            raise EngineError(
                "the hf rollout generates with the actor's own weights: it needs"
                " actor_rollout_ref.rollout.placement=colocate"
            )
        from engine.rollout.hf import HFRollout

        self.engine = HFRollout(
            colocated["actor"].module,
            tokenizer,
            device.torch_device(),
            micro_batch_size=rollout_cfg.micro_batch_size,
        )

    def generate(self, request: GenerationRequest) -> GenerationOutput:
        self.engine.wake()
        try:
            return self.engine.generate(request)
        finally:
            self.engine.sleep()
