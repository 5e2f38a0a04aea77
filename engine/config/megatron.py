"""``strategy=megatron``: each role's Megatron-core section (verl's ``<role>.megatron.*``,
the reference's sizes following the actor's), and the rules on the parallel layout,
which span the roles that use it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import inert, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

_MCORE_CONVERTS = "the engine converts the Hugging Face weights at model.path itself"
_NO_MCORE_OFFLOAD = (
    "changes nothing here: the Megatron engine keeps its parameters, gradients and"
    " optimizer state on the device"
)


@dataclass
class MegatronConfig:
    """``strategy=megatron``: Megatron-core's parallel sizes (verl's ``<role>.megatron.*``).
    Data parallel is the rest of the world. The rules are in
    ``engine.config.megatron_parallel`` (what the engine supports and why)."""

    tensor_model_parallel_size: int = setting(
        1, "Ranks that split every layer (tensor parallel); they share their rows."
    )
    pipeline_model_parallel_size: int = setting(
        1, "Pipeline stages the layers are split over (1F1B schedule)."
    )
    context_parallel_size: int = setting(
        1, "Ranks that split every sequence (for long sequences); they share their rows."
    )
    expert_model_parallel_size: int = setting(
        1, "Ranks the experts of a mixture-of-experts model are spread over."
    )
    sequence_parallel: bool = setting(
        True,
        "With tensor parallel > 1, split the activations outside attention and the MLP by"
        " sequence over its ranks (verl's default too; Megatron needs it for expert"
        " parallelism with TP > 1); ignored at 1.",
    )
    use_distributed_optimizer: bool = setting(
        True,
        "Megatron's DistributedOptimizer (sharded state) on GPUs; the CPU path uses torch's AdamW.",
    )
    expert_tensor_parallel_size: int | None = setting(
        None,
        "Ranks that split each routed expert of a mixture-of-experts model (expert tensor"
        " parallel); null: tensor_model_parallel_size. The experts get a grid of their own,"
        " ETP × EP × expert data parallel in each pipeline stage (ETP 1 with TP 2 keeps"
        " experts whole); ETP × EP × PP must divide the world.",
    )
    # verl's other Megatron keys (docs/verl-compat.md).
    virtual_pipeline_model_parallel_size: int | None = inert(
        None,
        "verl's interleaved pipeline stages (a schedule: speed only); changes nothing here"
        " (one stage a rank, 1F1B).",
    )
    param_offload: bool = inert(False, f"verl's Megatron parameter offload; {_NO_MCORE_OFFLOAD}.")
    grad_offload: bool = inert(False, f"verl's Megatron gradient offload; {_NO_MCORE_OFFLOAD}.")
    optimizer_offload: bool = inert(
        False, f"verl's Megatron optimizer offload; {_NO_MCORE_OFFLOAD}."
    )
    use_dist_checkpointing: bool = inert(
        False,
        "verl loads the initial weights from a Megatron distributed checkpoint; changes"
        f" nothing here: {_MCORE_CONVERTS}.",
    )
    dist_checkpointing_path: str | None = inert(
        None, f"That checkpoint's folder; changes nothing here: {_MCORE_CONVERTS}."
    )
    dist_checkpointing_prefix: str = inert("", "Its key prefix; changes nothing here.")
    dist_ckpt_optim_fully_reshardable: bool = inert(
        False, "verl's Megatron checkpoint format option; changes nothing here."
    )
    distrib_optim_fully_reshardable_mem_efficient: bool = inert(
        False, "verl's Megatron checkpoint format option; changes nothing here."
    )
    use_mbridge: bool = inert(True, f"verl's weight converter choice; {_MCORE_CONVERTS}.")
    vanilla_mbridge: bool = inert(False, f"verl's weight converter choice; {_MCORE_CONVERTS}.")
    use_megatron_fsdp: bool = inert(
        False, "verl's Megatron-FSDP sharding (memory layout); changes nothing here."
    )
    dynamic_context_parallel: bool = inert(
        False, "verl sizes context parallelism per batch; changes nothing here (fixed size)."
    )
    max_seqlen_per_dp_cp_rank: int | None = inert(
        None, "verl's bound for dynamic context parallelism; changes nothing here."
    )
    seed: int = inert(42, "verl's Megatron seed; changes nothing here (trainer.seed seeds all).")
    override_transformer_config: dict[str, Any] = inert(
        help="verl's extra TransformerConfig arguments (recompute, fusions, MoE kernels);"
        " changes nothing here: the engine builds the TransformerConfig from the model's"
        " config (recompute from model.enable_gradient_checkpointing).",
        factory=lambda: {
            "recompute_granularity": None,
            "recompute_modules": ["core_attn"],
            "recompute_method": None,
            "recompute_num_layers": None,
            "attention_backend": "flash",
        },
        kind="mapping",
    )
    override_ddp_config: dict[str, Any] = inert(
        help="verl's extra Megatron DDP arguments; changes nothing here.",
        factory=dict,
        kind="mapping",
    )
    override_mcore_model_config: dict[str, Any] = inert(
        help="verl's extra Megatron model arguments; changes nothing here.",
        factory=dict,
        kind="mapping",
    )
    pad_bshd_to_minibatch_max: bool = inert(
        True, "verl's padding of unpacked rows (static shapes); changes nothing here."
    )
    pad_to_length: bool = inert(
        False, "verl pads packed rows to a bucket length (static shapes); changes nothing here."
    )
    pad_to_length_bucket: int = inert(512, "That bucket's size; changes nothing here.")
    forward_only: bool = inert(
        False, "Set by verl for roles that never train; changes nothing here (the role decides)."
    )
    router_replay: dict[str, Any] = tree(
        verl_trees.ROUTER_REPLAY,
        "verl's MoE routing replay for this engine: the actor's mode is read as"
        " actor_rollout_ref.actor.router_replay.mode; the reference and the critic route"
        " freely (a mode other than disabled is refused for them).",
    )
    qat: dict[str, Any] = tree(
        verl_trees.QAT,
        "verl's quantization-aware training; not in this engine (enable=true is refused).",
    )


@dataclass
class RefMegatronConfig(MegatronConfig):
    """``strategy=megatron`` for the reference: its parallel sizes follow the actor's
    unless set (verl's default), since the roles share their worker processes."""

    tensor_model_parallel_size: int | None = setting(  # type: ignore[assignment]
        None, "Tensor-parallel size; null: the actor's."
    )
    pipeline_model_parallel_size: int | None = setting(  # type: ignore[assignment]
        None, "Pipeline stages; null: the actor's."
    )
    context_parallel_size: int | None = setting(  # type: ignore[assignment]
        None, "Context-parallel size; null: the actor's."
    )
    expert_model_parallel_size: int | None = setting(  # type: ignore[assignment]
        None, "Expert-parallel size; null: the actor's."
    )
    expert_tensor_parallel_size: int | None = setting(
        None, "Expert-tensor-parallel size; null: the actor's (whose null is its TP size)."
    )
    sequence_parallel: bool | None = setting(  # type: ignore[assignment]
        None, "Sequence parallelism with TP > 1; null: the actor's."
    )

    def resolved(self, actor: MegatronConfig) -> MegatronConfig:
        """These settings with each null size taken from the actor's."""
        sizes = {name: getattr(actor, name) for name in _FOLLOWED if getattr(self, name) is None}
        own = {f.name: getattr(self, f.name) for f in dataclasses.fields(MegatronConfig)}
        return MegatronConfig(**{**own, **sizes})


_FOLLOWED = (
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "expert_tensor_parallel_size",
    "sequence_parallel",
)


def megatron_rules(cfg: EngineConfig) -> list[str]:
    """The Megatron engine's parallel sizes, for each role that uses it."""
    roles = cfg.megatron_roles()
    if not roles:
        return []
    # Pure python (no torch): importable wherever this module is.
    from engine.config.megatron_parallel import CONFIG_KEYS, MegatronParallel

    p = []
    if cfg.trainer.device == "npu":
        p.append(
            "trainer.device=npu: the Megatron engine runs on NVIDIA/AMD GPUs (cuda) only; on"
            f" Ascend set {' and '.join(_strategy_key(role) for role in roles)} to fsdp2"
        )
    found = {
        role: MegatronParallel.of(section).problems(cfg.world_size, key)
        for role, (key, section) in roles.items()
    }
    for role, (key, _) in roles.items():
        if role == "reference":  # what it follows from the actor is said at the actor's key
            actor = set(found.get("actor", ()))
            own = CONFIG_KEYS["actor"]
            found[role] = [q for q in found[role] if q.replace(key, own) not in actor]
        p += found[role]
    # Every role runs in the same worker processes, which hold one Megatron parallel state
    # (an expert-tensor-parallel size of null is the TP size there).
    names = (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "expert_tensor_parallel_size",
    )
    sizes = {role: MegatronParallel.of(section).grid for role, (_key, section) in roles.items()}
    if len(set(sizes.values())) > 1:
        listed = "; ".join(
            f"{roles[role][0]}: "
            + ", ".join(f"{name}={size}" for name, size in zip(names, role_sizes, strict=True))
            for role, role_sizes in sizes.items()
        )
        p.append(
            f"the Megatron roles share their worker processes and so one parallel layout, but"
            f" their sizes differ ({listed}); give them the same sizes"
        )
    return p


def _strategy_key(role: str) -> str:
    return {
        "actor": "actor_rollout_ref.actor.strategy",
        "reference": "actor_rollout_ref.ref.strategy",
        "critic": "critic.strategy",
    }[role]
