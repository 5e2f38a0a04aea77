"""The engine's whole configuration, as typed dataclasses.

Defaults live here and nowhere else. Keys follow verl's layout (``data``,
``actor_rollout_ref.{model,actor,ref,rollout}``, ``critic``, ``reward_model``,
``custom_reward_function``, ``algorithm``, ``trainer``) so that a verl command
line carries over. ``load_config`` composes a YAML file and Hydra-style
``key=value`` overrides onto the schema; ``validate`` checks every cross-field
rule up front and reports all problems at once, each with the fix.

This module imports neither torch nor ray: ``rlctl`` validates recipes with it
on a laptop.
"""

from __future__ import annotations

import copy
import difflib
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any

from engine.algo import names
from engine.algo.registry import unknown_name_message
from engine.errors import ConfigError

# ---------------------------------------------------------------------------
# data


@dataclass
class DataConfig:
    train_files: Any = field(default_factory=list)  # a path or a list of paths (parquet/jsonl)
    val_files: Any = field(default_factory=list)
    prompt_key: str = "prompt"  # column holding the chat messages
    reward_fn_key: str = "data_source"  # column that picks the reward function
    max_prompt_length: int = 512  # tokens, after the chat template
    max_response_length: int = 512  # tokens generated per sample
    train_batch_size: int = 1024  # prompts per training step
    val_batch_size: int | None = None  # prompts per validation batch; None: the whole set
    truncation: str = "error"  # over-long prompts: error | left | right | middle
    filter_overlong_prompts: bool = False  # drop over-long prompts instead (before truncation)
    shuffle: bool = True
    seed: int = 1
    dataloader_num_workers: int = 0

    @property
    def train_file_list(self) -> list[str]:
        return _as_list(self.train_files)

    @property
    def val_file_list(self) -> list[str]:
        return _as_list(self.val_files)


TRUNCATION_MODES = ("error", "left", "right", "middle")


# ---------------------------------------------------------------------------
# actor, rollout, reference


@dataclass
class ModelConfig:
    path: str = ""  # Hugging Face id or local folder
    tokenizer_path: str | None = None  # default: path
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = True
    use_remove_padding: bool = True  # packed sequences (no compute on padding)
    dtype: str = "bfloat16"  # training compute dtype where the device supports it


@dataclass
class OptimConfig:
    lr: float = 1e-6
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    weight_decay: float = 0.01
    lr_warmup_steps: int = -1  # -1: use lr_warmup_steps_ratio
    lr_warmup_steps_ratio: float = 0.0  # of the total training steps
    lr_scheduler_type: str = "constant"  # constant | cosine
    min_lr_ratio: float = 0.0  # cosine floor, as a fraction of lr
    num_cycles: float = 0.5  # cosine half-periods over the decay
    total_training_steps: int = -1  # filled in by the trainer from data and epochs


LR_SCHEDULERS = ("constant", "cosine")


@dataclass
class MixedPrecisionConfig:
    param_dtype: str = "bfloat16"
    reduce_dtype: str = "float32"


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    fsdp_size: int = -1  # -1: shard over the whole data-parallel group
    mixed_precision: MixedPrecisionConfig = field(default_factory=MixedPrecisionConfig)


DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class MegatronConfig:
    """``strategy=megatron``: Megatron-core's parallel sizes (verl's ``<role>.megatron.*``).
    Data parallel is the rest of the world. The rules are in
    ``engine.train.megatron_parallel`` (what the engine supports and why)."""

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = True  # GPUs; the CPU test path uses torch's AdamW


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"  # see engine.algo.names.POLICY_LOSSES
    clip_cov_ratio: float = 0.0002  # Clip-Cov: fraction of tokens whose gradient is detached
    clip_cov_lb: float = 1.0  # Clip-Cov: covariance window picked from
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002  # KL-Cov: fraction of tokens given the KL penalty
    ppo_kl_coef: float = 1.0  # KL-Cov: coefficient of that penalty


@dataclass
class ActorConfig:
    strategy: str = "fsdp2"  # fsdp | fsdp2 | megatron
    ppo_mini_batch_size: int = 256  # prompts per optimizer step (×rollout.n samples)
    ppo_micro_batch_size_per_gpu: int = 4  # samples per forward/backward on one device
    use_dynamic_bsz: bool = False  # pack micro-batches by token count instead
    ppo_max_token_len_per_gpu: int = 16384  # use_dynamic_bsz: padded tokens per micro-batch
    ppo_epochs: int = 1
    # π_old comes from a separate forward pass after generation, unless the update is
    # on-policy (one epoch, one mini-batch, no KL in the reward): then the update's own
    # first forward sees the same weights, and its log-probs, detached, are π_old.
    # True: always run the separate pass.
    recompute_old_log_prob: bool = False
    shuffle: bool = False
    grad_clip: float = 1.0
    clip_ratio: float = 0.2  # ε of PPO's clip, both sides unless overridden below
    clip_ratio_low: float | None = None  # default: clip_ratio
    clip_ratio_high: float | None = None  # default: clip_ratio (DAPO's clip-higher: 0.28)
    clip_ratio_c: float = 3.0  # dual-clip bound for negative advantages (> 1)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: float | None = (
        None  # seq-mean-token-sum-norm divisor; default: max_response_length
    )
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False  # KL to the reference as a loss term (GRPO)
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


TRAIN_STRATEGIES = ("fsdp", "fsdp2", "megatron")


@dataclass
class SamplingConfig:
    """Validation-time sampling (verl's ``rollout.val_kwargs``): greedy by default."""

    n: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = -1
    do_sample: bool = False


@dataclass
class RolloutConfig:
    name: str = "hf"  # hf | vllm | sglang
    placement: str = "colocate"  # colocate (share the actor's devices) | separate
    separate_nnodes: int = 0  # placement=separate: the rollout pool's own size
    separate_n_gpus_per_node: int = 0
    n: int = 1  # samples per prompt
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: off
    do_sample: bool = True
    ignore_eos: bool = False
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5  # vllm/sglang: fraction of device memory
    tensor_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    enforce_eager: bool = False
    free_cache_engine: bool = True  # release KV cache while training (colocated)
    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool | None = None  # None: the actor's use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor's ppo_max_token_len_per_gpu
    micro_batch_size: int | None = None  # hf: sequences per generate call; None: all at once
    calculate_log_probs: bool = False  # return sampling log-probs from the engine
    update_weights_bucket_megabytes: int = 512  # vllm/sglang: weight sync bucket size
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)


ROLLOUT_BACKENDS = ("hf", "vllm", "sglang")
PLACEMENTS = ("colocate", "separate")


@dataclass
class RefConfig:
    strategy: str | None = None  # fsdp | fsdp2 | megatron; None: the actor's
    log_prob_micro_batch_size_per_gpu: int = 8
    log_prob_use_dynamic_bsz: bool | None = None  # None: the actor's use_dynamic_bsz
    log_prob_max_token_len_per_gpu: int | None = None  # None: actor's ppo_max_token_len_per_gpu
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)


@dataclass
class ActorRolloutRefConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)


# ---------------------------------------------------------------------------
# critic


@dataclass
class CriticConfig:
    enable: bool | None = None  # None: on exactly when the advantage estimator needs values
    strategy: str = "fsdp2"
    model: ModelConfig = field(default_factory=ModelConfig)  # path "" : the actor's model
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    ppo_mini_batch_size: int | None = None  # default: the actor's
    ppo_micro_batch_size_per_gpu: int = 4
    use_dynamic_bsz: bool | None = None  # None: the actor's
    ppo_max_token_len_per_gpu: int | None = None  # None: the actor's
    ppo_epochs: int | None = None  # default: the actor's
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    grad_clip: float = 1.0
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)


# ---------------------------------------------------------------------------
# reward


@dataclass
class OverlongBufferConfig:
    """DAPO's soft overlong punishment over the last ``len`` tokens of the budget."""

    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0


@dataclass
class RewardModelConfig:
    enable: bool = False  # a learned reward model (otherwise rule rewards only)
    model: ModelConfig = field(default_factory=ModelConfig)
    reward_manager: str = "naive"  # naive | dapo (naive + overlong penalty)
    num_workers: int = 4  # processes scoring samples in parallel
    timeout_s: float = 10.0  # per sample; a sample over it scores 0
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)


REWARD_MANAGERS = ("naive", "dapo")


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = None  # a .py file
    name: str = "compute_score"  # function in it: (data_source, solution_str, ground_truth, extra_info) -> float | dict


# ---------------------------------------------------------------------------
# algorithm


@dataclass
class KLControlConfig:
    type: str = "fixed"  # fixed | adaptive
    kl_coef: float = 0.001  # β, the starting value for adaptive
    horizon: int = 10000  # adaptive: steps (in samples) over which β moves
    target_kl: float = 0.1  # adaptive: the KL the controller steers to


@dataclass
class FilterGroupsConfig:
    """DAPO's dynamic sampling: keep only groups whose rewards differ."""

    enable: bool = False
    metric: str = "acc"  # acc | score | seq_reward | seq_final_reward
    max_num_gen_batches: int = 10  # cap on generation batches per step; 0: no cap


FILTER_METRICS = ("acc", "score", "seq_reward", "seq_final_reward")


@dataclass
class RolloutCorrectionConfig:
    """Truncated importance sampling against the rollout engine's own probabilities
    (engine.algo.rollout_correction); needs ``rollout.calculate_log_probs``."""

    rollout_is: str | None = None  # token | sequence | null (off)
    rollout_is_threshold: float = 2.0  # C: the cap on π_old / π_rollout


ROLLOUT_IS_LEVELS = ("token", "sequence")


@dataclass
class AlgorithmConfig:
    adv_estimator: str = "gae"
    gamma: float = 1.0
    lam: float = 1.0
    norm_adv_by_std_in_grpo: bool = True  # False: Dr.GRPO (no std division)
    use_kl_in_reward: bool = False  # KL penalty subtracted from token rewards (PPO)
    kl_penalty: str = "kl"  # estimator used for the in-reward penalty
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


# ---------------------------------------------------------------------------
# trainer


@dataclass
class TrainerConfig:
    project_name: str = "rlctl"
    experiment_name: str = "run"
    nnodes: int = 1
    n_gpus_per_node: int = 8  # devices per node (CPU workers when device=cpu)
    device: str = "auto"  # auto | cuda | npu | cpu (ROCm is cuda in torch)
    cpus_per_worker: int = 1  # CPU cores reserved for each device's worker process
    total_epochs: int = 1
    total_training_steps: int | None = None  # overrides epochs when set
    critic_warmup: int = 0  # steps that train the critic only
    save_freq: int = -1  # save every N steps and at the last step; -1: never
    test_freq: int = -1
    val_before_train: bool = True
    resume_mode: str = "auto"  # auto | disable | resume_path
    resume_from_path: str | None = None
    logger: list[str] = field(default_factory=lambda: ["console"])
    default_local_dir: str = "checkpoints/${trainer.project_name}/${trainer.experiment_name}"
    max_actor_ckpt_to_keep: int | None = None  # keep the last K complete checkpoints
    # On SIGTERM (preemption), save before exiting if at least this many steps ran since
    # the last checkpoint; 0: exit without saving. Exit code 75 asks to be requeued.
    preemption_save_steps: int = 1
    max_consecutive_skipped_updates: int = 5  # NaN/inf updates in a row before stopping
    export_hf_dir: str | None = None  # export the final checkpoint as a Hugging Face folder
    seed: int = 1


DEVICES = ("auto", "cuda", "npu", "cpu")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


# ---------------------------------------------------------------------------
# the whole config


@dataclass
class EngineConfig:
    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(
        default_factory=CustomRewardFunctionConfig
    )
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)

    # Derived facts the trainer and workers ask for; computed, never stored.

    @property
    def world_size(self) -> int:
        """Devices the actor trains on (colocated with rollout and reference)."""
        return self.trainer.nnodes * self.trainer.n_gpus_per_node

    @property
    def use_critic(self) -> bool:
        if self.critic.enable is None:
            return self.algorithm.adv_estimator in names.CRITIC_ADVANTAGE_ESTIMATORS
        return self.critic.enable

    @property
    def use_reference(self) -> bool:
        """A frozen reference policy is loaded only when some KL term needs it."""
        return self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss

    @property
    def ref_strategy(self) -> str:
        """The reference's training backend: its own, or the actor's."""
        arr = self.actor_rollout_ref
        return arr.ref.strategy or arr.actor.strategy

    def megatron_roles(self) -> dict[str, tuple[str, MegatronConfig]]:
        """The roles this run builds with ``strategy=megatron``: role -> (config key of
        its megatron section, the section)."""
        arr = self.actor_rollout_ref
        roles: dict[str, tuple[str, MegatronConfig]] = {}
        if arr.actor.strategy == "megatron":
            roles["actor"] = ("actor_rollout_ref.actor.megatron", arr.actor.megatron)
        if self.use_reference and self.ref_strategy == "megatron":
            roles["reference"] = ("actor_rollout_ref.ref.megatron", arr.ref.megatron)
        if self.use_critic and self.critic.strategy == "megatron":
            roles["critic"] = ("critic.megatron", self.critic.megatron)
        return roles

    @property
    def update_is_on_policy(self) -> bool:
        """The actor update's first forward sees the weights that generated the batch:
        one PPO epoch of one mini-batch. Then π_old needs no pass of its own, unless the
        KL in the reward needs it before the update, the rollout's own log-probs are to
        be compared with it (``calculate_log_probs``: mismatch metrics, TIS), or the user
        asks for it."""
        actor = self.actor_rollout_ref.actor
        return (
            actor.ppo_epochs == 1
            and actor.ppo_mini_batch_size == self.data.train_batch_size
            and not self.algorithm.use_kl_in_reward
            and not actor.recompute_old_log_prob
            and not self.actor_rollout_ref.rollout.calculate_log_probs
        )

    def token_budget(self, role: str) -> int | None:
        """Padded tokens per micro-batch for ``role`` (a key of ``TOKEN_BUDGET_KEYS``)
        when it packs micro-batches by tokens, else None. A role's unset (null) keys
        take the actor's."""
        if role not in TOKEN_BUDGET_KEYS:
            raise ValueError(f"unknown role {role!r}; valid: {', '.join(TOKEN_BUDGET_KEYS)}")
        own = [_selected(self, key) for key in TOKEN_BUDGET_KEYS[role]]
        actor = [_selected(self, key) for key in TOKEN_BUDGET_KEYS["actor"]]
        dynamic, budget = (a if o is None else o for o, a in zip(own, actor, strict=True))
        return budget if dynamic else None


# Each role's (use_dynamic_bsz, max_token_len) keys; the actor's are the defaults.
TOKEN_BUDGET_KEYS = {
    "actor": (
        "actor_rollout_ref.actor.use_dynamic_bsz",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    ),
    "actor_log_prob": (
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    ),
    "ref_log_prob": (
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    ),
    "critic": ("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu"),
}


def _selected(cfg: Any, key: str) -> Any:
    """The value at a dotted key."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part)
    return value


# ---------------------------------------------------------------------------
# composition


def load_config(
    overrides: Sequence[str] = (),
    config_file: str | Path | None = None,
    base: Mapping[str, Any] | None = None,
    check: bool = True,
) -> EngineConfig:
    """Build an ``EngineConfig``: defaults, then ``base`` (a nested mapping), then a YAML
    ``config_file``, then Hydra-style ``overrides`` (``a.b=c``, ``a=[1,2]``, ``a=null``).

    Unknown keys and values of the wrong type raise ``ConfigError`` naming the key; with
    ``check`` every cross-field rule of ``validate`` is applied too.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    cfg = copy.deepcopy(_schema())
    layers: list[tuple[str, Any]] = []
    if base is not None:
        layers.append(("base config", dict(base)))
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError([f"config file {str(path)!r} does not exist"])
        layers.append((str(path), OmegaConf.load(path)))
    for source, layer in layers:
        try:
            cfg = OmegaConf.merge(cfg, layer)
        except OmegaConfBaseException as exc:
            raise ConfigError([_omegaconf_problem(exc, source)]) from None

    problems = []
    for key, value in _parse_overrides(overrides):
        try:
            OmegaConf.update(cfg, key, value, merge=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, f"override {key}={value!r}"))
    if problems:
        raise ConfigError(problems)

    try:
        OmegaConf.resolve(cfg)
        result: EngineConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as exc:
        raise ConfigError([_omegaconf_problem(exc, "config")]) from None
    untyped = [p for k in _PATH_KEYS if (p := _paths_problem(k, _selected(result, k)))]
    if untyped:
        raise ConfigError(untyped)
    if check:
        validate(result)
    return result


@functools.cache
def _schema() -> Any:
    """The schema as OmegaConf's structured config, made once (the slowest step of a
    load); ``load_config`` works on a copy."""
    from omegaconf import OmegaConf

    return OmegaConf.structured(EngineConfig)


def key_problems(dotted: Mapping[str, Any]) -> list[str]:
    """Each dotted key checked alone against the schema (it exists, and its value has the
    key's type; no cross-field rules), one problem a line as ``load_config`` words them
    for a base mapping: every bad key, not only the first one a merge meets."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def nested(key: str, value: Any) -> dict[str, Any]:
        for part in reversed(key.split(".")):
            value = {part: value}
        return value

    problems = []
    for key, value in dotted.items():
        try:
            merged = OmegaConf.merge(_schema(), nested(key, value))
            if isinstance(value, str) and "${" in value:  # an interpolation: resolved here
                OmegaConf.select(merged, key, throw_on_resolution_failure=True)
        except OmegaConfBaseException as exc:
            problems.append(_omegaconf_problem(exc, "base config"))
            continue
        if key in _PATH_KEYS and (problem := _paths_problem(key, value)):
            problems.append(f"base config: {problem}")
    return problems


# Keys the schema types as Any (a path or a list of paths): checked here instead.
_PATH_KEYS = ("data.train_files", "data.val_files")


def _paths_problem(key: str, value: Any) -> str | None:
    if value is None or isinstance(value, str):  # None: none (as an empty list)
        return None
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return None
    return f"{key}: expected a path or a list of paths, got {_short(value)}"


# Line breaks besides \n that YAML readers fold inside a quoted scalar: a value holding
# one is written double-quoted, where they are escapes (\N, \L, \P) and survive.
_YAML_SPECIAL_BREAKS = ("\x85", "\u2028", "\u2029")


@functools.cache
def _yaml_dumper() -> type:
    """OmegaConf's YAML dumper, except that a string holding one of the special breaks is
    written double-quoted (made once: a representer is registered on the class)."""
    import yaml
    from omegaconf._utils import get_omega_conf_dumper

    base = get_omega_conf_dumper()

    class Dumper(base):  # type: ignore[misc, valid-type]
        pass

    def represent_str(dumper: yaml.Dumper, data: str) -> yaml.ScalarNode:
        if any(ch in data for ch in _YAML_SPECIAL_BREAKS):
            return dumper.represent_scalar("tag:yaml.org,2002:str", data, style='"')
        return base.str_representer(dumper, data)

    Dumper.add_representer(str, represent_str)
    return Dumper


def to_yaml(cfg: EngineConfig) -> str:
    """The config as YAML (OmegaConf's layout), every string read back as written."""
    import yaml
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    return yaml.dump(
        container,
        default_flow_style=False,
        allow_unicode=True,
        sort_keys=False,
        Dumper=_yaml_dumper(),
    )


def config_keys(cls: type = EngineConfig, prefix: str = "") -> list[str]:
    """Every dotted leaf key of the schema (for suggestions and docs)."""
    keys = []
    for f in fields(cls):
        default = _field_default(f)
        name = f"{prefix}{f.name}"
        if is_dataclass(default):
            keys.extend(config_keys(type(default), f"{name}."))
        else:
            keys.append(name)
    return keys


def _field_default(f: Any) -> Any:
    from dataclasses import MISSING

    if f.default_factory is not MISSING:
        return f.default_factory()
    return f.default


def _parse_overrides(overrides: Sequence[str]) -> list[tuple[str, Any]]:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    parser = OverridesParser.create()
    parsed = []
    problems = []
    for line in overrides:
        try:
            (override,) = parser.parse_overrides([line])
        except OverrideParseException as exc:
            problems.append(f"cannot parse override {line!r}: {exc.message.splitlines()[0]}")
            continue
        if override.is_sweep_override():
            problems.append(
                f"override {line!r} is a sweep; the engine runs one config: give a single value"
            )
            continue
        if override.is_delete():
            problems.append(f"override {line!r} deletes a key; schema keys cannot be removed")
            continue
        parsed.append((override.key_or_group, override.value()))
    if problems:
        raise ConfigError(problems)
    return parsed


def _omegaconf_problem(exc: Exception, source: str) -> str:
    """One line from an OmegaConf error: the key, what was wrong, and for a typo the fix."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    key = getattr(exc, "full_key", None) or ""
    msg = str(getattr(exc, "msg", None) or exc).splitlines()[0]
    if isinstance(exc, ConfigKeyError | ConfigAttributeError):
        close = difflib.get_close_matches(key, config_keys(), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{source}: unknown key {key!r}{hint}"
    leaf = schema_leaf(key) if key else None
    wrong_type = ("could not be converted", "is not a valid", "Incompatible value", "is not a List")
    if leaf is not None and hasattr(exc, "value") and any(w in msg for w in wrong_type):
        kind, default = leaf
        example = "" if default is None else f" (the default is {_short(default)})"
        return (
            f"{source}: {key}: expected {_expected(kind)}, got {_short(exc.value)};"
            f" give {_expected(kind)}{example}"
        )
    return f"{source}: {key + ': ' if key else ''}{msg}"


@functools.cache
def schema_leaf(key: str) -> tuple[Any, Any] | None:
    """(type, default) of the schema's value at a dotted key; None where the key names
    no value (unknown, or a section of keys)."""
    import typing

    node: Any = EngineConfig
    parts = key.split(".")
    for i, part in enumerate(parts):
        if not (isinstance(node, type) and is_dataclass(node)):
            return None
        found = next((f for f in fields(node) if f.name == part), None)
        if found is None:
            return None
        default = _field_default(found)
        if i == len(parts) - 1:
            if is_dataclass(default):
                return None
            return typing.get_type_hints(node)[part], default
        node = type(default)
    return None


def _expected(kind: Any) -> str:
    """A schema type in words: ``int | None`` -> "a whole number or null"."""
    import types
    import typing

    words = {int: "a whole number", float: "a number", bool: "true or false", str: "text"}
    args = typing.get_args(kind)
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return " or ".join(_expected(a) for a in inner) + (
            " or null" if len(inner) < len(args) else ""
        )
    if typing.get_origin(kind) is list:
        return f"a list of {_expected(args[0]) if args else 'values'}"
    return words.get(kind, getattr(kind, "__name__", str(kind)))


def _short(value: Any, limit: int = 60) -> str:
    """A value as a person wrote it, cut short: messages repeat what the user gave."""
    from omegaconf import OmegaConf

    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    return [str(v) for v in value]


# ---------------------------------------------------------------------------
# validation


def validate(cfg: EngineConfig) -> None:
    """Check every rule that spans fields; raise one ConfigError listing all problems."""
    problems: list[str] = []
    for check in _CHECKS:
        problems.extend(check(cfg))
    if problems:
        raise ConfigError(problems)


def _choice(value: str, valid: Iterable[str], key: str, kind: str) -> list[str]:
    valid = tuple(valid)
    if value in valid:
        return []
    return [f"{key}: {unknown_name_message(kind, value, valid)}"]


def _check_names(cfg: EngineConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    p = []
    p += _choice(
        cfg.algorithm.adv_estimator,
        names.ADVANTAGE_ESTIMATORS,
        "algorithm.adv_estimator",
        "advantage estimator",
    )
    p += _choice(
        actor.policy_loss.loss_mode,
        names.POLICY_LOSSES,
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "policy loss",
    )
    p += _choice(
        actor.loss_agg_mode,
        names.LOSS_AGG_MODES,
        "actor_rollout_ref.actor.loss_agg_mode",
        "loss aggregation mode",
    )
    p += _choice(
        cfg.critic.loss_agg_mode,
        names.LOSS_AGG_MODES,
        "critic.loss_agg_mode",
        "loss aggregation mode",
    )
    for key, value in (
        ("actor_rollout_ref.actor.kl_loss_type", actor.kl_loss_type),
        ("algorithm.kl_penalty", cfg.algorithm.kl_penalty),
    ):
        if not names.is_valid_kl_estimator(value):
            valid = names.KL_ESTIMATORS
            p.append(
                f"{key}: {unknown_name_message('KL estimator', value, valid)}; "
                "append '+' for the straight-through variant (e.g. 'low_var_kl+')"
            )
    p += _choice(
        cfg.algorithm.kl_ctrl.type, names.KL_CONTROLLERS, "algorithm.kl_ctrl.type", "KL controller"
    )
    p += _choice(
        cfg.algorithm.filter_groups.metric,
        FILTER_METRICS,
        "algorithm.filter_groups.metric",
        "filter metric",
    )
    p += _choice(
        rollout.name, ROLLOUT_BACKENDS, "actor_rollout_ref.rollout.name", "rollout backend"
    )
    p += _choice(rollout.placement, PLACEMENTS, "actor_rollout_ref.rollout.placement", "placement")
    p += _choice(actor.strategy, TRAIN_STRATEGIES, "actor_rollout_ref.actor.strategy", "strategy")
    p += _choice(cfg.critic.strategy, TRAIN_STRATEGIES, "critic.strategy", "strategy")
    if cfg.actor_rollout_ref.ref.strategy is not None:
        p += _choice(
            cfg.actor_rollout_ref.ref.strategy,
            TRAIN_STRATEGIES,
            "actor_rollout_ref.ref.strategy",
            "strategy",
        )
    p += _choice(cfg.data.truncation, TRUNCATION_MODES, "data.truncation", "truncation mode")
    p += _choice(
        cfg.reward_model.reward_manager,
        REWARD_MANAGERS,
        "reward_model.reward_manager",
        "reward manager",
    )
    p += _choice(cfg.trainer.device, DEVICES, "trainer.device", "device")
    p += _choice(cfg.trainer.resume_mode, RESUME_MODES, "trainer.resume_mode", "resume mode")
    for logger in cfg.trainer.logger:
        p += _choice(logger, LOGGERS, "trainer.logger", "logger")
    for key, optim in (
        ("actor_rollout_ref.actor.optim", actor.optim),
        ("critic.optim", cfg.critic.optim),
    ):
        p += _choice(
            optim.lr_scheduler_type, LR_SCHEDULERS, f"{key}.lr_scheduler_type", "LR scheduler"
        )
    for key, dtype in (
        ("actor_rollout_ref.model.dtype", cfg.actor_rollout_ref.model.dtype),
        ("actor_rollout_ref.rollout.dtype", rollout.dtype),
        (
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype",
            actor.fsdp_config.mixed_precision.param_dtype,
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype",
            actor.fsdp_config.mixed_precision.reduce_dtype,
        ),
    ):
        p += _choice(dtype, DTYPES, key, "dtype")
    return p


def _positive(cfg: EngineConfig) -> list[str]:
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    checks = [
        ("data.train_batch_size", cfg.data.train_batch_size),
        ("data.max_prompt_length", cfg.data.max_prompt_length),
        ("data.max_response_length", cfg.data.max_response_length),
        ("actor_rollout_ref.actor.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        (
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
            actor.ppo_micro_batch_size_per_gpu,
        ),
        ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
        ("actor_rollout_ref.actor.ppo_epochs", actor.ppo_epochs),
        ("actor_rollout_ref.rollout.n", rollout.n),
        (
            "actor_rollout_ref.rollout.tensor_model_parallel_size",
            rollout.tensor_model_parallel_size,
        ),
        (
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
            rollout.log_prob_micro_batch_size_per_gpu,
        ),
        ("actor_rollout_ref.rollout.val_kwargs.n", rollout.val_kwargs.n),
        (
            "actor_rollout_ref.rollout.update_weights_bucket_megabytes",
            rollout.update_weights_bucket_megabytes,
        ),
        ("critic.ppo_micro_batch_size_per_gpu", cfg.critic.ppo_micro_batch_size_per_gpu),
        ("trainer.nnodes", cfg.trainer.nnodes),
        ("trainer.n_gpus_per_node", cfg.trainer.n_gpus_per_node),
        ("trainer.total_epochs", cfg.trainer.total_epochs),
        ("trainer.cpus_per_worker", cfg.trainer.cpus_per_worker),
        ("reward_model.num_workers", cfg.reward_model.num_workers),
    ]
    p = [f"{key} must be a positive integer, got {value}" for key, value in checks if value < 1]
    if cfg.data.val_batch_size is not None and cfg.data.val_batch_size < 1:
        p.append(f"data.val_batch_size must be positive or null, got {cfg.data.val_batch_size}")
    if cfg.trainer.total_training_steps is not None and cfg.trainer.total_training_steps < 1:
        p.append(
            "trainer.total_training_steps must be positive or null (use epochs), "
            f"got {cfg.trainer.total_training_steps}"
        )
    if cfg.reward_model.timeout_s <= 0:
        p.append(f"reward_model.timeout_s must be > 0 seconds, got {cfg.reward_model.timeout_s}")
    return p


def _divisors_near(n: int, around: int, count: int = 3) -> list[int]:
    """The ``count`` divisors of ``n`` nearest ``around``. Divisors come in pairs d, n/d
    with d <= √n: the search stops there (a batch of 10**12 must not hang validation)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    divisors = set(small) | {n // d for d in small}
    return sorted(sorted(divisors, key=lambda d: (abs(d - around), d))[:count])


def _batch_sizes(cfg: EngineConfig) -> list[str]:
    """verl's batch-size rules, in prompts and samples, with the numbers that would work."""
    actor = cfg.actor_rollout_ref.actor
    n = cfg.actor_rollout_ref.rollout.n
    world = cfg.world_size
    train_bsz = cfg.data.train_batch_size
    p = []
    if min(train_bsz, n, world, actor.ppo_mini_batch_size, actor.ppo_micro_batch_size_per_gpu) < 1:
        return p  # _positive reports these
    # (role, mini-batch, micro-batch, whether the mini-batch is the role's own setting,
    #  whether micro-batches are packed by tokens)
    roles = [
        (
            "actor_rollout_ref.actor",
            actor.ppo_mini_batch_size,
            actor.ppo_micro_batch_size_per_gpu,
            True,
            actor.use_dynamic_bsz,
        )
    ]
    if cfg.use_critic:
        own = cfg.critic.ppo_mini_batch_size is not None
        critic_mini = cfg.critic.ppo_mini_batch_size if own else actor.ppo_mini_batch_size
        roles.append(
            (
                "critic",
                critic_mini,
                cfg.critic.ppo_micro_batch_size_per_gpu,
                own,
                cfg.token_budget("critic") is not None,
            )
        )
    for role, mini, micro, own, dynamic in roles:
        if mini < 1 or micro < 1:
            continue
        if not own:
            # Inherited from the actor: its mini-batch problems are reported once, there.
            if train_bsz % mini or (mini * n) % world:
                continue
        elif mini > train_bsz or train_bsz % mini:
            fits = ", ".join(map(str, _divisors_near(train_bsz, mini)))
            p.append(
                f"{role}.ppo_mini_batch_size {mini} must divide data.train_batch_size {train_bsz}"
                f" (both count prompts); use a divisor such as {fits}"
            )
            continue
        samples = mini * n
        if own and samples % world:
            p.append(
                f"{role}.ppo_mini_batch_size × rollout.n = {mini} × {n} = {samples} samples must be"
                f" divisible by the {world} devices (trainer.nnodes × trainer.n_gpus_per_node);"
                " change the mini-batch size, rollout.n or the device count"
            )
            continue
        per_device = samples // world
        if not dynamic and per_device % micro:
            fits = ", ".join(map(str, _divisors_near(per_device, micro)))
            p.append(
                f"{role}.ppo_micro_batch_size_per_gpu {micro} must divide the {per_device} samples"
                f" each device gets per mini-batch ({mini} prompts × {n} samples / {world}"
                f" devices); use {fits}, or set {role}.use_dynamic_bsz=true"
            )
    return p + _token_budgets(cfg)


def _token_budgets(cfg: EngineConfig) -> list[str]:
    """With use_dynamic_bsz, one whole sequence must fit a micro-batch's budget."""
    longest = cfg.data.max_prompt_length + cfg.data.max_response_length
    skipped = {"critic": not cfg.use_critic, "ref_log_prob": not cfg.use_reference}
    p = []
    for role, (_, key) in TOKEN_BUDGET_KEYS.items():
        if skipped.get(role):
            continue
        budget = cfg.token_budget(role)
        if budget is not None and budget < longest:
            inherited = role != "actor" and _selected(cfg, key) is None
            if inherited and cfg.actor_rollout_ref.actor.use_dynamic_bsz:
                continue  # the actor's own budget is reported, once
            source = " (the actor's)" if inherited else ""
            p.append(
                f"{key} is {budget}{source}: less than one sequence of"
                f" data.max_prompt_length + data.max_response_length = {longest} tokens;"
                f" raise it to at least {longest}"
            )
    return p


def _algorithm_rules(cfg: EngineConfig) -> list[str]:
    algo = cfg.algorithm
    actor = cfg.actor_rollout_ref.actor
    rollout = cfg.actor_rollout_ref.rollout
    p = []
    if algo.adv_estimator in names.GROUP_ADVANTAGE_ESTIMATORS and rollout.n < 2:
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} compares samples of the same prompt:"
            f" set actor_rollout_ref.rollout.n >= 2 (got {rollout.n}); 8 or 16 are usual"
        )
    if algo.adv_estimator in names.CRITIC_ADVANTAGE_ESTIMATORS and cfg.critic.enable is False:
        p.append(
            f"algorithm.adv_estimator={algo.adv_estimator} needs a value function: set"
            " critic.enable=true (or null), or pick a critic-free estimator such as grpo"
        )
    if not 0.0 <= algo.gamma <= 1.0:
        p.append(f"algorithm.gamma must be in [0, 1], got {algo.gamma}")
    if not 0.0 <= algo.lam <= 1.0:
        p.append(f"algorithm.lam must be in [0, 1], got {algo.lam}")
    if not 0.0 < actor.clip_low < 1.0:
        p.append(
            f"actor_rollout_ref.actor.clip_ratio_low {actor.clip_low} must be in (0, 1):"
            " the ratio is clipped to [1 - clip_ratio_low, 1 + clip_ratio_high]"
        )
    if actor.clip_high <= 0.0:
        p.append(f"actor_rollout_ref.actor.clip_ratio_high must be > 0, got {actor.clip_high}")
    if actor.clip_ratio_c <= 1.0:
        p.append(
            f"actor_rollout_ref.actor.clip_ratio_c {actor.clip_ratio_c} must be > 1: dual-clip"
            " bounds the loss of negative advantages at clip_ratio_c × |A| (3.0 is usual)"
        )
    if actor.loss_scale_factor is not None and actor.loss_scale_factor <= 0:
        p.append(
            f"actor_rollout_ref.actor.loss_scale_factor must be > 0, got {actor.loss_scale_factor}"
        )
    if cfg.critic.cliprange_value <= 0:
        p.append(f"critic.cliprange_value must be > 0, got {cfg.critic.cliprange_value}")
    if algo.kl_ctrl.kl_coef < 0 or actor.kl_loss_coef < 0:
        p.append("KL coefficients (algorithm.kl_ctrl.kl_coef, actor.kl_loss_coef) must be >= 0")
    if algo.kl_ctrl.type == "adaptive" and (
        algo.kl_ctrl.target_kl <= 0 or algo.kl_ctrl.horizon < 1
    ):
        p.append(
            "algorithm.kl_ctrl.type=adaptive needs target_kl > 0 and horizon >= 1"
            f" (got {algo.kl_ctrl.target_kl}, {algo.kl_ctrl.horizon})"
        )
    if algo.filter_groups.enable and rollout.n < 2:
        p.append(
            "algorithm.filter_groups.enable=true keeps groups whose rewards differ: it needs"
            f" actor_rollout_ref.rollout.n >= 2 (got {rollout.n})"
        )
    if algo.filter_groups.max_num_gen_batches < 0:
        p.append("algorithm.filter_groups.max_num_gen_batches must be >= 0 (0: no cap)")
    rc = algo.rollout_correction
    if rc.rollout_is is not None and rc.rollout_is not in ROLLOUT_IS_LEVELS:
        p.append(
            f"algorithm.rollout_correction.rollout_is {rc.rollout_is!r} is not a level;"
            f" valid: {', '.join(ROLLOUT_IS_LEVELS)}, or null (off)"
        )
    if rc.rollout_is is not None and not rollout.calculate_log_probs:
        p.append(
            f"algorithm.rollout_correction.rollout_is={rc.rollout_is} weighs tokens by the"
            " rollout engine's own probabilities: set"
            " actor_rollout_ref.rollout.calculate_log_probs=true"
        )
    if not rc.rollout_is_threshold > 0:
        p.append(
            "algorithm.rollout_correction.rollout_is_threshold must be > 0 (the cap on"
            f" π_old / π_rollout; 2.0 is usual), got {rc.rollout_is_threshold}"
        )
    ob = cfg.reward_model.overlong_buffer
    if ob.enable and not 0 < ob.len < cfg.data.max_response_length:
        p.append(
            f"reward_model.overlong_buffer.len {ob.len} must be in (0, data.max_response_length"
            f" = {cfg.data.max_response_length}): the penalty ramps over the last len tokens"
        )
    return p


def _sampling_rules(cfg: EngineConfig) -> list[str]:
    rollout = cfg.actor_rollout_ref.rollout
    p = []
    for key, s in (
        ("actor_rollout_ref.rollout", rollout),
        ("actor_rollout_ref.rollout.val_kwargs", rollout.val_kwargs),
    ):
        if s.do_sample and s.temperature <= 0:
            p.append(
                f"{key}.temperature must be > 0 when do_sample is true (got {s.temperature});"
                " for greedy decoding set do_sample=false"
            )
        if not 0.0 < s.top_p <= 1.0:
            p.append(f"{key}.top_p must be in (0, 1], got {s.top_p}")
        if s.top_k == 0 or s.top_k < -1:
            p.append(f"{key}.top_k must be -1 (off) or a positive integer, got {s.top_k}")
    if not 0.0 < rollout.gpu_memory_utilization <= 1.0:
        p.append(
            "actor_rollout_ref.rollout.gpu_memory_utilization must be in (0, 1],"
            f" got {rollout.gpu_memory_utilization}"
        )
    tp = rollout.tensor_model_parallel_size
    if tp >= 1 and rollout.placement == "colocate" and cfg.world_size % tp:
        p.append(
            f"actor_rollout_ref.rollout.tensor_model_parallel_size {tp} must divide the"
            f" {cfg.world_size} devices the rollout shares with the actor"
        )
    if rollout.placement == "separate" and (
        rollout.separate_nnodes < 1 or rollout.separate_n_gpus_per_node < 1
    ):
        p.append(
            "actor_rollout_ref.rollout.placement=separate needs the rollout pool's size:"
            " set rollout.separate_nnodes and rollout.separate_n_gpus_per_node"
        )
    return p


def _trainer_rules(cfg: EngineConfig) -> list[str]:
    t = cfg.trainer
    p = []
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        p.append(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint dir)"
        )
    if t.save_freq == 0 or t.save_freq < -1:
        p.append(
            f"trainer.save_freq must be -1 (never) or a positive step count, got {t.save_freq}"
        )
    if t.test_freq == 0 or t.test_freq < -1:
        p.append(
            f"trainer.test_freq must be -1 (never) or a positive step count, got {t.test_freq}"
        )
    if t.preemption_save_steps < 0:
        p.append(f"trainer.preemption_save_steps must be >= 0, got {t.preemption_save_steps}")
    if t.max_consecutive_skipped_updates < 1:
        p.append(
            "trainer.max_consecutive_skipped_updates must be >= 1,"
            f" got {t.max_consecutive_skipped_updates}"
        )
    if t.export_hf_dir and t.save_freq < 1:
        p.append(
            "trainer.export_hf_dir exports the final checkpoint: set trainer.save_freq to a"
            " positive step count (the last step is always saved then)"
        )
    if t.max_actor_ckpt_to_keep is not None and t.max_actor_ckpt_to_keep < 1:
        p.append("trainer.max_actor_ckpt_to_keep must be >= 1 or null (keep all)")
    if not cfg.actor_rollout_ref.model.path:
        p.append(
            "actor_rollout_ref.model.path is required: a Hugging Face model id or a local folder"
        )
    if not cfg.data.train_file_list:
        p.append("data.train_files is required: a parquet or jsonl file (or a list of them)")
    return p


def _megatron_rules(cfg: EngineConfig) -> list[str]:
    """The Megatron engine's parallel sizes, for each role that uses it."""
    roles = cfg.megatron_roles()
    if not roles:
        return []
    # Pure python (no torch): importable wherever this module is.
    from engine.train.megatron_parallel import MegatronParallel

    p = []
    if cfg.trainer.device == "npu":
        p.append(
            "trainer.device=npu: the Megatron engine runs on NVIDIA/AMD GPUs (cuda) only; on"
            f" Ascend set {' and '.join(_strategy_key(role) for role in roles)} to fsdp2"
        )
    for key, section in roles.values():
        p += MegatronParallel.of(section).problems(cfg.world_size, key)
    # Every role runs in the same worker processes, which hold one Megatron parallel state.
    names = (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    )
    sizes = {
        role: tuple(getattr(section, name) for name in names)
        for role, (_key, section) in roles.items()
    }
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


_CHECKS = (
    _check_names,
    _positive,
    _batch_sizes,
    _algorithm_rules,
    _sampling_rules,
    _trainer_rules,
    _megatron_rules,
)
