"""A recipe's ``lora: {rank, alpha, target_modules}``: checked here, set as the engine's
``actor_rollout_ref.model.lora_rank``, ``lora_alpha`` and ``target_modules`` (verl's names)."""

from __future__ import annotations

from typing import Any

# The recipe's lora: keys and the engine keys they set.
LORA_KEYS = {"rank": "lora_rank", "alpha": "lora_alpha", "target_modules": "target_modules"}
DOC = (
    "`rank:` (> 0), `alpha:` (default 16; the update is scaled by alpha / rank) and"
    " `target_modules:` (all-linear, the default, or a list of module names such as"
    " [q_proj, v_proj]): train a LoRA adapter of the actor instead of every weight (fsdp"
    " and fsdp2 trainers); the reference is the actor with the adapter off, so it costs"
    " no second copy. Sets actor_rollout_ref.model.lora_rank, lora_alpha and target_modules"
)


def lora_problems(lora: dict[str, Any], trainer: str | None) -> list[str]:
    """What is wrong with a non-empty ``lora:`` mapping (its unknown keys are the
    parser's), each naming the field, the value and the fix."""
    p = []
    rank, alpha = lora.get("rank"), lora.get("alpha")
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        p.append(f"lora.rank: expected a positive integer (8, 16, 32, 64), got {rank!r}")
    if alpha is not None and (
        not isinstance(alpha, int | float) or isinstance(alpha, bool) or alpha <= 0
    ):
        p.append(f"lora.alpha: expected a positive number (often 2 × rank), got {alpha!r}")
    targets = lora.get("target_modules", "all-linear")
    if targets != "all-linear" and not (
        isinstance(targets, list) and targets and all(isinstance(t, str) and t for t in targets)
    ):
        p.append(
            "lora.target_modules: expected all-linear or a list of module names such as"
            f" [q_proj, k_proj, v_proj, o_proj], got {targets!r}"
        )
    if trainer == "megatron":
        p.append(
            "lora: LoRA runs under the FSDP trainers only; set trainer: fsdp2, or drop lora"
            " to train every weight with megatron"
        )
    return p


def lora_engine_keys(
    lora: dict[str, Any], model: str = "actor_rollout_ref.model"
) -> dict[str, Any]:
    """The engine keys of ``lora:``, under ``model`` (an SFT recipe's is ``model``)."""
    return {f"{model}.{LORA_KEYS[name]}": value for name, value in lora.items()}
