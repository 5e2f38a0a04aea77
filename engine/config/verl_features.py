"""The rules on verl's keys that this engine accepts without having what they turn on:
each such key may keep its "off" value (a verl command line carries them), and any
other value is refused naming the feature, so that a run never silently lacks what its
config asked for; and the checks of verl's keys that must agree with this engine's own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.config.fields import choice
from engine.config.rollout import LOGPROBS_MODES, SCHEDULING_POLICIES
from engine.config.train import OPTIMIZERS
from engine.config.verl_sections import model_engine_problems

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

ACTOR, REF, ROLLOUT = (
    "actor_rollout_ref.actor",
    "actor_rollout_ref.ref",
    "actor_rollout_ref.rollout",
)
_ROLES = (ACTOR, REF, "critic")

# (key, the values that keep it off, the feature in words)
SWITCHES: tuple[tuple[str, tuple[Any, ...], str], ...] = (
    ("transfer_queue.enable", (False,), "verl's TransferQueue data plane"),
    *(
        (f"skip.{what}.enable", (False,), "verl's rollout dump and replay")
        for what in ("rollout", "rollout_tq", "async_rollout")
    ),
    ("trainer.v1.trainer_mode", ("sync",), "verl's v1 trainer modes (here: async_training.mode)"),
    (f"{ACTOR}.qat.enable", (False,), "quantization-aware training"),
    (f"{ROLLOUT}.qat.enable", (False,), "quantization-aware training"),
    *((f"{r}.fsdp_config.qat.enable", (False,), "quantization-aware training") for r in _ROLES),
    *((f"{r}.megatron.qat.enable", (False,), "quantization-aware training") for r in _ROLES),
    *(
        (f"{m}.mtp.enable_train", (False,), "training multi-token-prediction layers")
        for m in ("actor_rollout_ref.model", "critic.model")
    ),
    *(
        (f"{m}.lora.rank", (0, None), "Megatron LoRA (LoRA here: lora_rank under fsdp2)")
        for m in ("actor_rollout_ref.model", "critic.model")
    ),
    *(
        (f"{m}.{k}", (None, ""), what)
        for m in ("actor_rollout_ref.model", "critic.model")
        for k, what in (
            ("hf_config_path", "a model config apart from the model"),
            ("custom_chat_template", "a chat template given in the config"),
            ("external_lib", "importing a module to register a model"),
        )
    ),
    ("reward_model.model.external_lib", (None, ""), "importing a module to register a model"),
    *(
        (f"reward_model.{k}", (None,), "verl's reward loop classes of your own")
        for k in ("reward_loop_source", "reward_loop_module_path", "reward_loop_class_name")
    ),
    ("reward.reward_manager.source", ("register",), "a reward manager class of your own"),
    ("reward.reward_manager.module.path", (None, ""), "a reward manager class of your own"),
    ("reward.sandbox_fusion.url", (None, ""), "verl's remote code sandbox (SandboxFusion)"),
    ("data.continuous_token.enable", (False,), "verl's continuous-token prompts"),
    (f"{ROLLOUT}.over_sample_rate", (0, 0.0), "over-sampling and dropping the slowest samples"),
    (f"{ROLLOUT}.quantization", (None, ""), "quantized generation"),
    (f"{ROLLOUT}.quantization_config_file", (None, ""), "quantized generation"),
    (f"{ROLLOUT}.disaggregation.enabled", (False,), "prefill/decode disaggregation"),
    (
        f"{ROLLOUT}.checkpoint_engine.custom_backend_module",
        (None, ""),
        "a weight transport of your own",
    ),
    (f"{ROLLOUT}.agent.custom_async_server.path", (None, ""), "a rollout server class of your own"),
    (f"{ROLLOUT}.moe_tensor_parallel_size", (1, None), "TensorRT-LLM's expert parallelism"),
    (f"{ROLLOUT}.engine_kwargs.trtllm", ({}, None), "the TensorRT-LLM rollout"),
    (f"{ROLLOUT}.multi_turn.function_tool_path", (None, ""), "Python functions as tools"),
    (
        f"{ROLLOUT}.multi_turn.tool_response_truncate_side",
        ("right",),
        "cutting a tool result elsewhere than at its end",
    ),
    ("algorithm.use_pf_ppo", (False,), "policy-filtration PPO"),
    ("trainer.default_hdfs_dir", (None, ""), "copying checkpoints to HDFS"),
    ("actor_rollout_ref.hybrid_engine", (True,), "verl's non-hybrid actor and rollout"),
)
# verl's deprecated global micro-batches: (key, the per-device key to give instead)
GLOBAL_MICRO_BATCHES = (
    (f"{ACTOR}.ppo_micro_batch_size", f"{ACTOR}.ppo_micro_batch_size_per_gpu"),
    (f"{REF}.log_prob_micro_batch_size", f"{REF}.log_prob_micro_batch_size_per_gpu"),
    (f"{ROLLOUT}.log_prob_micro_batch_size", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
    ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ("critic.forward_micro_batch_size", f"{ROLLOUT}.log_prob_micro_batch_size_per_gpu"),
)
_FAMILIES = {"dp": ("fsdp", "fsdp2"), "megatron": ("megatron",), "veomni": ("fsdp2",)}


def value_at(cfg: Any, key: str) -> Any:
    """The value at a dotted key, through sections and mappings alike."""
    node = cfg
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part, None)
        if node is None:
            return None
    return node


def _written(value: Any) -> str:
    """A value as the command line writes it."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    return repr(value) if isinstance(value, str) else str(value)


def rules(cfg: EngineConfig) -> list[str]:
    p = []
    for key, off, feature in SWITCHES:
        value = value_at(cfg, key)
        if value not in off:
            p.append(
                f"{key}={_written(value)} turns on {feature}, which this engine does not"
                f" have; leave it at {_written(off[0])} (docs/verl-compat.md)"
            )
    world = cfg.world_size
    for key, per_device in GLOBAL_MICRO_BATCHES:
        value = value_at(cfg, key)
        if value is not None:
            fix = f"{per_device}={max(1, value // world)}" if world else per_device
            p.append(
                f"{key}={value} is verl's deprecated micro-batch over all devices; give the"
                f" per-device one instead: {fix} ({value} / {world} devices)"
            )
    p += _agreement_rules(cfg)
    return p


def _agreement_rules(cfg: EngineConfig) -> list[str]:
    """verl's keys that repeat one of this engine's: they must agree with it."""
    arr, data = cfg.actor_rollout_ref, cfg.data
    rollout = arr.rollout
    p = model_engine_problems(cfg.model_engine)
    p += choice(rollout.logprobs_mode, LOGPROBS_MODES, f"{ROLLOUT}.logprobs_mode", "logprobs mode")
    p += choice(
        rollout.scheduling_policy,
        SCHEDULING_POLICIES,
        f"{ROLLOUT}.scheduling_policy",
        "scheduling policy",
    )
    for role, optim in ((ACTOR, arr.actor.optim), ("critic", cfg.critic.optim)):
        if optim.optimizer.lower() not in {o.lower() for o in OPTIMIZERS}:
            p.append(
                f"{role}.optim.optimizer={optim.optimizer!r}: this engine trains with AdamW"
                " only; set it to AdamW"
            )
    family = arr.actor.model_engine
    if family is not None and arr.actor.strategy not in _FAMILIES.get(family, ()):
        p.append(
            f"{ACTOR}.model_engine={family} but {ACTOR}.strategy={arr.actor.strategy}: give"
            f" the strategy of that family ({' or '.join(_FAMILIES.get(family, ('?',)))}), or"
            " leave model_engine out"
        )
    for name, own in (
        ("prompt_length", data.max_prompt_length),
        ("response_length", data.max_response_length),
    ):
        value = getattr(rollout, name)
        if value is not None and value != own:
            data_key = f"data.max_{name}"
            p.append(
                f"{ROLLOUT}.{name}={value} differs from {data_key}={own}: the rollout's"
                f" lengths are the data's here; set {data_key}={value}, or leave {name} unset"
            )
    longest = data.max_prompt_length + data.max_response_length
    if rollout.max_model_len is not None and rollout.max_model_len < longest:
        p.append(
            f"{ROLLOUT}.max_model_len={rollout.max_model_len} cannot hold a prompt and its"
            f" response (data.max_prompt_length + data.max_response_length = {longest}):"
            f" raise it to {longest}, or leave it null"
        )
    max_resp = cfg.reward_model.reward_kwargs.get("max_resp_len")
    if max_resp is not None and max_resp != data.max_response_length:
        p.append(
            f"reward_model.reward_kwargs.max_resp_len={max_resp} differs from"
            f" data.max_response_length={data.max_response_length}: the overlong penalty"
            " counts from data.max_response_length here; make them equal, or leave"
            " max_resp_len unset"
        )
    return p
