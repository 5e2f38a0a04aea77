"""The Megatron engine's parallel sizes and the rules on them, without torch.

``engine.config`` validates ``<role>.megatron.*`` with these rules before anything heavy
is imported, and ``rlctl`` checks a recipe against the model's config.json with
``model_problems`` before it launches anything (on a laptop without torch). ``engine.train.megatron`` re-exports
``MegatronParallel``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from engine.errors import ConfigError
from engine.models.megatron_config import (
    AttentionShape,
    conversion_problems,
    is_mla,
    moe_layers,
    num_experts,
    shared_expert_size,
)

CONFIG_KEY = "actor_rollout_ref.actor.megatron"
# Where each role's sizes live in the engine config (named in error messages).
CONFIG_KEYS = {
    "actor": CONFIG_KEY,
    "critic": "critic.megatron",
    "reference": "actor_rollout_ref.ref.megatron",
}


def pipeline_stage_layers(num_layers: int, stages: int) -> list[int] | None:
    """How many layers each pipeline stage holds: equal shares when ``stages`` divides
    ``num_layers``, else ⌈L/p⌉ on every stage but the last, which takes the rest
    (Megatron's ``num_layers_in_last_pipeline_stage``; 126 layers over 16 stages: 15 × 8
    and 6). None when that leaves the last stage nothing."""
    if stages < 1 or num_layers < stages:
        return None
    if num_layers % stages == 0:
        return [num_layers // stages] * stages
    per = -(-num_layers // stages)
    last = num_layers - per * (stages - 1)
    return [per] * (stages - 1) + [last] if last >= 1 else None


@dataclass(frozen=True)
class MegatronParallel:
    """Parallel sizes, named as verl's ``<role>.megatron.*`` keys."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True
    expert_tensor_parallel_size: int | None = None  # None: the TP size (Megatron's default)

    @classmethod
    def of(cls, cfg: Any) -> MegatronParallel:
        """From any object with these attribute names (the engine config's section)."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(cls)})

    @property
    def tp(self) -> int:
        return self.tensor_model_parallel_size

    @property
    def etp(self) -> int:
        """The ranks that split each routed expert (Megatron's expert tensor parallelism)."""
        etp = self.expert_tensor_parallel_size
        return self.tensor_model_parallel_size if etp is None else etp

    @property
    def experts_apart(self) -> bool:
        """Whether the routed experts live on a grid of their own (Megatron's "parallel
        folding"): ETP × EP × expert-DP per pipeline stage beside the dense TP × CP × DP.
        Their gradients are then reduced over the expert-data-parallel group, not the
        dense one; with EP 1 and ETP = TP the two are the same ranks."""
        return self.expert_model_parallel_size > 1 or self.etp != self.tp

    @property
    def grid(self) -> tuple[int, int, int, int, int]:
        """(TP, PP, CP, EP, ETP): the groups Megatron's parallel state holds, one per
        process, so the roles a process hosts must agree on them."""
        return (
            self.tensor_model_parallel_size,
            self.pipeline_model_parallel_size,
            self.context_parallel_size,
            self.expert_model_parallel_size,
            self.etp,
        )

    @property
    def sequence_parallel_in_effect(self) -> bool:
        """Sequence parallelism splits what tensor parallelism replicates: with TP 1 there is
        nothing to split, and the setting is ignored (as Megatron-LM and verl do)."""
        return self.sequence_parallel and self.tensor_model_parallel_size > 1

    @property
    def model_parallel_size(self) -> int:
        return (
            self.tensor_model_parallel_size
            * self.pipeline_model_parallel_size
            * self.context_parallel_size
        )

    def data_parallel_size(self, world_size: int) -> int:
        return world_size // self.model_parallel_size

    def problems(self, world_size: int, key: str = CONFIG_KEY) -> list[str]:
        """Rules that need only the sizes and the world size (config validation)."""
        p = []
        for name in (
            "tensor_model_parallel_size",
            "pipeline_model_parallel_size",
            "context_parallel_size",
            "expert_model_parallel_size",
            "expert_tensor_parallel_size",
        ):
            value = getattr(self, name)
            if value is not None and value < 1:
                p.append(f"{key}.{name} must be >= 1, got {value}")
        if p:
            return p
        ep, tp, etp = self.expert_model_parallel_size, self.tp, self.etp
        if self.experts_apart and tp > 1 and not self.sequence_parallel:
            what = (
                f"expert_model_parallel_size {ep}"
                if ep > 1
                else f"expert_tensor_parallel_size {etp}"
            )
            p.append(
                f"{key}.{what} with tensor_model_parallel_size {tp}"
                f" needs {key}.sequence_parallel=true (Megatron-core's rule: the experts'"
                " token exchange spans ETP × EP ranks and takes each rank's slice of the"
                " sequence)"
            )
        expert_world = etp * ep * self.pipeline_model_parallel_size
        if self.experts_apart and world_size % expert_world:
            null = self.expert_tensor_parallel_size is None
            p.append(
                f"the world size {world_size} must be a multiple of {key}.expert_tensor_parallel"
                f"_size × expert_model_parallel_size × pipeline_model_parallel_size ="
                f" {etp} × {ep} × {self.pipeline_model_parallel_size} = {expert_world}"
                + (" (expert_tensor_parallel_size null: the tensor-parallel size)" if null else "")
                + ": the routed experts form a grid of their own, each stage's ranks grouped"
                " ETP × EP at a time to hold every expert once; change these sizes or the"
                " number of devices"
            )
        if world_size % self.model_parallel_size:
            p.append(
                f"the world size {world_size} (trainer.nnodes × trainer.n_gpus_per_node) must"
                f" be a multiple of {key}.tensor_model_parallel_size × pipeline_model_parallel"
                f"_size × context_parallel_size = {self.model_parallel_size}; change those"
                " sizes or the number of devices"
            )
        return p

    def model_problems(self, hf_config: Any, key: str = CONFIG_KEY) -> list[str]:
        """Rules that need the model's shape (checked when the engine is built)."""

        tp = self.tensor_model_parallel_size
        shape = AttentionShape.of(hf_config)
        p = []
        split = [
            ("num_attention_heads", shape.num_heads, "each rank holds whole heads"),
            ("num_key_value_heads", shape.num_kv_heads, "each rank holds whole query groups"),
            ("intermediate_size", hf_config.intermediate_size, "the MLP is split by columns"),
            ("vocab_size", hf_config.vocab_size, "the vocabulary is split; none is padded"),
        ]
        if tp > 1 and is_mla(hf_config) and not self.sequence_parallel:
            p.append(
                f"{key}.tensor_model_parallel_size {tp} with multi-latent attention"
                f" ({hf_config.model_type}) needs {key}.sequence_parallel=true: the low-rank"
                " projections are whole on every rank and their rotary keys are gathered"
                " over the sequence"
            )
        moe = any(moe_layers(hf_config))
        if moe and (shared := shared_expert_size(hf_config)):
            split.append(("shared experts' width", shared, "they are split like the dense MLP"))
        for what, value, why in split:
            if value % tp:
                p.append(
                    f"{key}.tensor_model_parallel_size {tp} must divide the model's {what}"
                    f" {value} ({why}); pick a divisor of {value}"
                )
        width, etp = getattr(hf_config, "moe_intermediate_size", 0), self.etp
        if moe and width % etp:
            null = self.expert_tensor_parallel_size is None
            size = "expert_tensor_parallel_size" + (" (null: the TP size)" if null else "")
            p.append(
                f"{key}.{size} {etp} must divide the model's moe_intermediate_size {width} (each"
                f" routed expert is split by columns over ETP ranks); pick a divisor of {width}"
            )
        # (said once: with experts apart ``problems`` says so, with MLA the rule above)
        said = self.experts_apart or is_mla(hf_config)
        if moe and tp > 1 and not self.sequence_parallel and not said:
            p.append(
                f"{key}.tensor_model_parallel_size {tp} with a mixture-of-experts model"
                f" ({hf_config.model_type}) needs {key}.sequence_parallel=true: Megatron-core's"
                " MoE layer refuses to train under tensor parallelism without it"
            )
        layers, pp = hf_config.num_hidden_layers, self.pipeline_model_parallel_size
        if pipeline_stage_layers(layers, pp) is None:
            fits = [n for n in range(1, layers + 1) if pipeline_stage_layers(layers, n)]
            p.append(
                f"{key}.pipeline_model_parallel_size {pp} cannot split the model's"
                f" {layers} layers (num_hidden_layers): every stage but the last holds"
                f" ⌈{layers}/{pp}⌉ and the last must keep at least one; sizes that work near"
                f" it: {', '.join(map(str, _nearest(fits, pp)))}"
            )
        ep, experts = self.expert_model_parallel_size, num_experts(hf_config)
        if ep > 1 and not any(moe_layers(hf_config)):
            p.append(
                f"{key}.expert_model_parallel_size {ep}: expert parallelism needs a"
                f" mixture-of-experts model; {hf_config.model_type} is dense, set it to 1"
            )
        elif ep > 1 and experts % ep:
            p.append(
                f"{key}.expert_model_parallel_size {ep} must divide the model's num_experts"
                f" {experts} (each rank holds the same number of whole experts); pick a"
                f" divisor of {experts}"
            )
        p.extend(conversion_problems(hf_config))
        return p

    def validate(self, world_size: int, hf_config: Any = None, key: str = CONFIG_KEY) -> None:
        problems = self.problems(world_size, key)
        if hf_config is not None and not problems:
            problems = self.model_problems(hf_config, key)
        if problems:
            raise ConfigError(problems)


def _nearest(values: list[int], target: int, count: int = 4) -> list[int]:
    return sorted(sorted(values, key=lambda v: (abs(v - target), v))[:count])
