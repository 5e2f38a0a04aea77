"""``distillation``: on-policy distillation from teacher models (verl's section and keys;
docs/distillation.md).

The student samples as usual; each teacher scores the student's own samples (its log-prob
of every response token, or its top-k log-probs at each position), and the actor's loss
adds a per-token divergence from the teacher's distribution: an estimate of the reverse
KL from the sampled token (``loss_mode`` k1/k2/k3/abs, as ``algorithm.kl_penalty`` names
them) or the forward KL over the teacher's top-k tokens (``forward_kl_topk``).

The teachers run on a pool of their own (``nnodes`` × ``n_gpus_per_node``, as verl's) or,
with ``nnodes`` 0, on the training workers beside the actor (this engine's addition, for
small runs). The pool is split among the teachers: each has ``num_replicas`` copies of
``tensor_model_parallel_size`` devices; one teacher takes the whole pool. Several
teachers route the samples by ``teacher_key`` (a data field, ``data_source``): each
sample goes to the teacher whose ``key`` equals its value.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.algo import names
from engine.config import verl_trees
from engine.config.fields import choice, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

KEY = "distillation"
LOSS = f"{KEY}.distillation_loss"
# per-token estimates of KL(student ‖ teacher) from the sampled token (engine.algo.kl's
# names), and the forward KL over the teacher's top-k tokens
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOPK_MODE = names.DISTILLATION_TOPK_MODE
LOSS_MODES = (*ESTIMATOR_MODES, TOPK_MODE)
TEACHER_ENGINES = ("hf", "vllm")
SINGLE = "teacher_model"  # the entry verl's default config names
DEFAULT_KEY = "default"  # a single teacher's key: it scores every sample


@dataclass
class DistillationLossConfig:
    """How the teacher's scores enter the actor's loss (verl's ``distillation_loss``)."""

    loss_mode: str = setting(
        "k3",
        "the per-token divergence from the teacher: k1 (kl), k2 (mse), k3 (low_var_kl) or"
        " abs, estimates of KL(student‖teacher) from the sampled token; forward_kl_topk,"
        " KL(teacher‖student) over the teacher's top-k tokens (distillation_loss.topk).",
    )
    topk: int | None = setting(32, "forward_kl_topk: the teacher's tokens per position.")
    use_task_rewards: bool = setting(
        True,
        "true: the task's policy loss plus distillation_loss_coef × the distillation loss;"
        " false: the distillation loss alone (the task reward is still scored and logged).",
    )
    distillation_loss_coef: float = setting(
        1.0, "the distillation loss's weight when use_task_rewards is true."
    )
    loss_max_clamp: float | None = setting(
        None, "each token's divergence clamped to [-this, this]; null: not clamped."
    )
    log_prob_min_clamp: float | None = setting(
        None, "forward_kl_topk: log-probs below this are raised to it; null: none."
    )
    use_policy_gradient: bool = setting(
        False,
        "true: minus each token's divergence is its advantage in a clipped policy-gradient"
        " loss (clip_ratio_low/high); false: the divergence is backpropagated directly.",
    )
    policy_loss_mode: str = setting("vanilla", "use_policy_gradient: the policy loss (vanilla).")
    clip_ratio: float = setting(0.2, "use_policy_gradient: verl's symmetric clip range.")
    clip_ratio_low: float = setting(0.2, "use_policy_gradient: the lower clip range.")
    clip_ratio_high: float = setting(0.2, "use_policy_gradient: the upper clip range.")


@dataclass(frozen=True)
class Teacher:
    """One teacher, resolved from its entry under ``distillation.teacher_models``."""

    name: str  # the entry's name
    key: str  # the teacher_key value it scores
    model_path: str
    engine: str  # hf or vllm
    tp: int
    num_replicas: int
    inference: dict[str, Any]  # verl's inference keys, for the vLLM engine

    @property
    def world_size(self) -> int:
        return self.tp * self.num_replicas


@dataclass
class DistillationConfig:
    """On-policy distillation (docs/distillation.md)."""

    enabled: bool = setting(False, "score the student's samples with teacher models.")
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    n_gpus_per_node: int = setting(8, "devices per node of the teachers' own pool.")
    nnodes: int = setting(
        0,
        "nodes of the teachers' own pool; 0: the teachers run on the training workers"
        " beside the actor (this engine's addition; verl needs a pool).",
    )
    teacher_models: dict[str, Any] = tree(
        {SINGLE: verl_trees.TEACHER},
        "the teachers, by a name of yours: each with model_path, key (the teacher_key"
        " value it scores; one teacher scores all), num_replicas and inference.* (name:"
        " hf or vllm, null the rollout's; tensor_model_parallel_size; vLLM's settings).",
        inert_tree=False,
    )
    teacher_key: str = setting(
        "data_source", "the data field that routes each sample to a teacher's key."
    )

    @property
    def topk(self) -> int:
        """Teacher tokens per position the loss needs (0: the sampled token's only)."""
        loss = self.distillation_loss
        return int(loss.topk or 0) if loss.loss_mode == TOPK_MODE else 0

    def pool_size(self, training_world: int) -> int:
        return self.nnodes * self.n_gpus_per_node if self.nnodes > 0 else training_world

    def teachers(self, rollout_name: str, pool_size: int) -> list[Teacher]:
        """The teachers in rank order over the pool (``rules`` has checked them)."""
        entries = dict(self.teacher_models)
        if len(entries) > 1 and not (entries.get(SINGLE) or {}).get("model_path"):
            entries.pop(SINGLE, None)  # verl's placeholder, left unset beside named ones
        out = []
        for name, given in entries.items():
            # an entry added by name (+distillation.teacher_models.x.*) has the default
            # entry's values where it sets none, as verl's dataclass gives it
            entry = _over(verl_trees.TEACHER, given or {})
            inference = entry["inference"]
            tp = int(inference.get("tensor_model_parallel_size") or 1)
            single = len(entries) == 1
            out.append(
                Teacher(
                    name=name,
                    key=DEFAULT_KEY if single else str(entry.get("key")),
                    model_path=str(entry.get("model_path")),
                    engine=str(inference.get("name") or rollout_name),
                    tp=tp,
                    num_replicas=pool_size // tp if single else int(entry.get("num_replicas") or 0),
                    inference=inference,
                )
            )
        return out


def _over(default: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    out = dict(default)
    for key, value in given.items():
        out[key] = _over(out[key], value) if isinstance(out.get(key), dict) else value
    return out


def rules(cfg: EngineConfig) -> list[str]:
    d = cfg.distillation
    if not d.enabled:
        return []
    loss = d.distillation_loss
    p = choice(loss.loss_mode, LOSS_MODES, f"{LOSS}.loss_mode", "distillation loss")
    p += choice(loss.policy_loss_mode, ("vanilla",), f"{LOSS}.policy_loss_mode", "policy loss")
    if loss.loss_mode in ("k1", "kl") and not loss.use_policy_gradient:
        p.append(
            f"{LOSS}.loss_mode={loss.loss_mode} backpropagated directly has a gradient that"
            " does not depend on the teacher (∇ of log π_student alone): set"
            f" {LOSS}.use_policy_gradient=true, or use k3 or forward_kl_topk"
        )
    if loss.loss_mode == TOPK_MODE and (loss.topk or 0) < 1:
        p.append(f"{LOSS}.topk={loss.topk}: forward_kl_topk needs a positive topk")
    if d.nnodes < 0 or (d.nnodes > 0 and d.n_gpus_per_node < 1):
        p.append(
            f"{KEY}.nnodes={d.nnodes} × n_gpus_per_node={d.n_gpus_per_node}: give the teachers'"
            " pool a positive size, or nnodes=0 to run them beside the actor"
        )
        return p
    pool = d.pool_size(cfg.world_size)
    rollout_name = cfg.actor_rollout_ref.rollout.name
    entries = dict(d.teacher_models)
    single = entries.get(SINGLE) or {}
    if len(entries) > 1 and single.get("model_path"):
        p.append(
            f"{KEY}.teacher_models.{SINGLE} is set beside other teachers, where verl would"
            " drop it without a word: give it a name of its own (and a key)"
        )
        return p
    teachers = d.teachers(rollout_name, pool)
    p += _teacher_problems(teachers, pool, loss.loss_mode == TOPK_MODE, d, cfg)
    return p


def _teacher_problems(
    teachers: list[Teacher], pool: int, topk: bool, d: DistillationConfig, cfg: EngineConfig
) -> list[str]:
    p: list[str] = []
    where = (
        f"{KEY}.nnodes × n_gpus_per_node = {pool}"
        if d.nnodes > 0
        else f"the training devices ({pool}; {KEY}.nnodes=0)"
    )
    keys: dict[str, str] = {}
    for t in teachers:
        at = f"{KEY}.teacher_models.{t.name}"
        if t.model_path in ("", "None"):
            p.append(f"{at}.model_path is not set: give the teacher model's path")
        p += choice(t.engine, TEACHER_ENGINES, f"{at}.inference.name", "teacher engine")
        if t.engine == "hf" and t.tp != 1:
            p.append(
                f"{at}.inference.tensor_model_parallel_size={t.tp}: the hf teacher holds a whole"
                " copy on each device; set it to 1 (or inference.name=vllm)"
            )
        if t.tp < 1 or pool % t.tp:
            p.append(f"{at}.inference.tensor_model_parallel_size={t.tp} must divide {where}")
        if t.key in keys:
            p.append(f"{at}.key={t.key!r} is also {keys[t.key]}'s: each teacher needs its own key")
        keys[t.key] = t.name
        if len(teachers) > 1 and t.key in ("None", ""):
            p.append(f"{at}.key is not set: give the {d.teacher_key} value it scores")
        if len(teachers) > 1 and t.num_replicas < 1:
            p.append(f"{at}.num_replicas={t.num_replicas}: give each teacher at least one")
        longest = cfg.data.max_prompt_length + cfg.data.max_response_length
        max_len = t.inference.get("max_model_len")
        if max_len is not None and max_len < longest + 1:
            p.append(
                f"{at}.inference.max_model_len={max_len} cannot hold a sample (data.max_prompt"
                f"_length + max_response_length = {longest}) and one more token: raise it to"
                f" {longest + 1}, or leave it null"
            )
    if p:
        return p
    if len({t.tp for t in teachers if t.engine == "vllm"}) > 1:
        p.append(
            f"{KEY}.teacher_models: the vLLM teachers have different tensor_model_parallel"
            "_size values; give them one size"
        )
    used = sum(t.world_size for t in teachers)
    if len(teachers) > 1 and used != pool:
        sizes = " + ".join(f"{t.num_replicas}×{t.tp} ({t.name})" for t in teachers)
        p.append(
            f"{KEY}.teacher_models: the teachers' num_replicas × tensor_model_parallel_size"
            f" add up to {sizes} = {used} devices, which must equal {where}"
        )
    return p
