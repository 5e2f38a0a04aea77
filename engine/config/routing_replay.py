"""``actor_rollout_ref.actor.router_replay``: MoE routing replay (verl's R2 and R3), and
the rules on it.

A mixture-of-experts layer routes each token to its top-k experts. Routing is a
discrete choice, so the same token can take other experts in the update's forward than
in the pass its log-probs came from (the weights moved, or the numbers differ by a
rounding), and the policy ratio then compares two different networks. Replay records
the experts chosen and routes the update's forwards through them, the routing weights
computed from the current router logits over those experts:

- ``R2``: recorded in the actor's π_old pass, replayed in the update.
- ``R3``: recorded by the rollout engine while it generated
  (``rollout.enable_rollout_routing_replay``), replayed in the π_old pass and the update.

verl spells the mode per engine (``actor.megatron.router_replay.mode``,
``actor.veomni.router_replay.mode``); both are read as this key. The reference and the
critic route freely, as verl's do. docs/training.md#moe-routing-replay says more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config.fields import choice, inert, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

MODES = ("disabled", "R2", "R3")
KEY = "actor_rollout_ref.actor.router_replay.mode"
ROLLOUT_KEY = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
# What a pass does with the routing.
NATIVE, RECORD, REPLAY = "native", "record", "replay"
# Where verl lets the other roles name a mode: they route freely (here as in verl).
_OTHER_ROLES = tuple(
    f"{role}.{section}router_replay.mode"
    for role in ("actor_rollout_ref.ref", "critic")
    for section in ("", "megatron.", "veomni.")
    if not (role == "critic" and section == "")
)
# The actor's engine sections' spellings, aliases of KEY; set as a whole mapping
# (``...megatron.router_replay={mode: R2}``) they would bypass the alias.
_ACTOR_TREES = (
    "actor_rollout_ref.actor.megatron.router_replay.mode",
    "actor_rollout_ref.actor.veomni.router_replay.mode",
)


@dataclass
class RouterReplayConfig:
    """MoE routing replay of the actor: R2 records the routing in its π_old pass, R3 in the
    rollout; both replay it in the update (docs/training.md#moe-routing-replay)."""

    mode: str = setting(
        "disabled",
        "MoE routing replay: disabled; R2 (the experts each token took in the actor's π_old"
        " pass are replayed in the update); R3 (those the rollout engine took are replayed"
        " in the π_old pass and the update; needs rollout.enable_rollout_routing_replay)."
        " verl's actor.megatron.router_replay.mode and actor.veomni.router_replay.mode set it.",
    )
    record_file: str | None = inert(
        None, "verl's declared file for recorded routing (unused by verl too); changes nothing."
    )
    replay_file: str | None = inert(
        None, "verl's declared file of routing to replay (unused by verl too); changes nothing."
    )


@dataclass(frozen=True)
class ReplayPlan:
    """What each pass of a step does with the routing, decided once from the mode."""

    mode: str = "disabled"

    @property
    def on(self) -> bool:
        return self.mode != "disabled"

    @property
    def old_pass(self) -> str:
        """The actor's π_old pass: records (R2), replays the rollout's (R3), or neither."""
        return {"R2": RECORD, "R3": REPLAY}.get(self.mode, NATIVE)

    @property
    def update(self) -> str:
        return REPLAY if self.on else NATIVE

    @property
    def rollout_records(self) -> bool:
        return self.mode == "R3"


def rules(cfg: EngineConfig) -> list[str]:
    arr = cfg.actor_rollout_ref
    mode, recording = arr.actor.router_replay.mode, arr.rollout.enable_rollout_routing_replay
    p = choice(mode, MODES, KEY, "router replay mode")
    p += _other_roles(cfg)
    if p:
        return p
    if mode == "R3" and not recording:
        p.append(
            f"{KEY}=R3 replays the routing the rollout engine recorded, but {ROLLOUT_KEY}=false"
            f": set {ROLLOUT_KEY}=true (or use mode R2, which records in the actor's π_old pass)"
        )
    if recording and mode != "R3":
        p.append(
            f"{ROLLOUT_KEY}=true records the rollout's routing, which only mode R3 replays"
            f" ({KEY}={mode}): set {KEY}=R3, or {ROLLOUT_KEY}=false"
        )
    if mode == "R2" and cfg.algorithm.rollout_correction.bypass_mode:
        p.append(
            f"{KEY}=R2 records the routing in the actor's π_old pass, which"
            " algorithm.rollout_correction.bypass_mode=true skips (the sampler's log-probs"
            f" are π_old): use mode R3 with {ROLLOUT_KEY}=true, or bypass_mode=false"
        )
    if mode == "R3":
        p += _r3_problems(cfg)
    return p


def _other_roles(cfg: EngineConfig) -> list[str]:
    from engine.config.verl_features import value_at

    p = [
        f"{key}={value}: the reference and the critic route freely (so do verl's); replay"
        f" is the actor's, {KEY}. Leave {key} at disabled"
        for key in _OTHER_ROLES
        if (value := value_at(cfg, key)) not in (None, "disabled")
    ]
    return p + [
        f"{key}={value} came as part of a mapping: give the mode as {key} or {KEY}"
        for key in _ACTOR_TREES
        if (value := value_at(cfg, key)) not in (None, "disabled")
    ]


def _r3_problems(cfg: EngineConfig) -> list[str]:
    """Where the rollout's routing is not recorded here."""
    rollout = cfg.actor_rollout_ref.rollout
    p = []
    if rollout.name == "sglang":
        p.append(
            f"{KEY}=R3 with actor_rollout_ref.rollout.name=sglang: SGLang's routed-experts"
            " output is not read here; use rollout.name=vllm or hf, or mode R2"
        )
    if rollout.name == "vllm" and cfg.trainer.device == "cpu":
        p.append(
            f"{KEY}=R3 with actor_rollout_ref.rollout.name=vllm on trainer.device=cpu: vLLM's"
            " CPU builds return no routed experts (0.32's capture needs its Model Runner V2,"
            " which needs Triton's CPU backend; 0.27's refuses the CPU MoE kernel): use"
            " rollout.name=hf on CPU, or mode R2"
        )
    if rollout.name == "vllm" and not rollout.enable_prefix_caching:
        p.append(
            f"{KEY}=R3 with actor_rollout_ref.rollout.name=vllm needs"
            " actor_rollout_ref.rollout.enable_prefix_caching=true (vLLM keeps the recorded"
            " routing by cached block): set it to true"
        )
    if rollout.multi_turn.enable:
        p.append(
            f"{KEY}=R3 with actor_rollout_ref.rollout.multi_turn.enable=true: the routing"
            " is recorded in single-turn generation only (a tool's tokens have none);"
            " use mode R2"
        )
    if cfg.async_training.mode == "fully_async":
        p.append(
            f"{KEY}=R3 with async_training.mode=fully_async: streamed samples carry no"
            " routing here; use mode R2, or async_training.mode=one_step_off"
        )
    return p


def num_experts(hf_config: Any) -> int:
    """The routed experts of a model's config (or its fields as a mapping); 0: dense."""
    for name in ("num_experts", "n_routed_experts", "num_local_experts"):
        value = (
            hf_config.get(name) if isinstance(hf_config, dict) else getattr(hf_config, name, None)
        )
        if value:
            return int(value)
    return 0


def model_problems(cfg: EngineConfig, hf_config_of: Any) -> list[str]:
    """Replay asked of a model without experts. ``hf_config_of(model_cfg)``: the Hugging
    Face config (or its fields) of a role's model, as ``train.ulysses_model_problems``."""
    mode = cfg.actor_rollout_ref.actor.router_replay.mode
    if mode == "disabled":
        return []
    model = cfg.actor_rollout_ref.model
    fields = hf_config_of(model)
    if not fields or num_experts(fields):
        return []  # a config that does not say: the engine checks the model it loads
    return [
        f"{KEY}={mode} replays mixture-of-experts routing, but {model.path} is a dense model"
        f" (its config names no experts): set {KEY}=disabled"
        + (f" and {ROLLOUT_KEY}=false" if mode == "R3" else "")
    ]
