"""What a recipe with ``algorithm: sft`` means: supervised fine-tuning (``python -m
engine.sft``, docs/sft.md), whose engine keys are verl's SFT trainer's (``model.*``,
``data.*``, ``engine.*``, ``optim.*``, ``trainer.*``), not the RL trainer's. The recipe's
fields set them as an RL recipe's set the RL keys: ``trainer:`` the backend
(``engine.strategy``), ``lora:`` ``model.lora_*``; ``rollout:`` and ``reward:`` mean
nothing here and are refused."""

from __future__ import annotations

from typing import Any, Protocol

from rlctl.recipe.lora import lora_engine_keys


class _Hardware(Protocol):
    @property
    def is_cpu(self) -> bool: ...


class SFTFields(Protocol):
    """What of a recipe (``rlctl.recipe.load.Recipe``) its SFT keys come from."""

    name: str
    trainer: str
    hardware: _Hardware
    lora: dict[str, Any]
    engine: dict[str, Any]


# The keys a recipe's own fields set, by what they are: the RL trainer's and engine.sft's.
FIELD_KEYS = {
    False: {
        "model": "actor_rollout_ref.model.path",
        "train": "data.train_files",
        "val": "data.val_files",
        "checkpoints": "trainer.default_local_dir",
        "run_dir": "trainer.run_dir",
    },
    True: {
        "model": "model.path",
        "train": "data.train_files",
        "val": "data.val_files",
        "checkpoints": "trainer.default_local_dir",
        "run_dir": "trainer.run_dir",
    },
}


def sft_engine_overrides(recipe: SFTFields) -> dict[str, Any]:
    """engine.sft's keys of the recipe's fields, then its ``engine:`` block."""
    keys: dict[str, Any] = {
        "engine.strategy": recipe.trainer,
        "trainer.experiment_name": recipe.name,
    }
    if recipe.hardware.is_cpu:
        keys["trainer.device"] = "cpu"
    keys.update(lora_engine_keys(recipe.lora, "model"))
    keys.update(recipe.engine)
    return keys


def sft_field_problems(raw: dict[str, Any]) -> list[str]:
    """The recipe fields an SFT run has no use for."""
    return [
        f"{field}: algorithm: sft generates nothing and scores nothing; remove {field}:"
        for field in ("rollout", "reward")
        if field in raw
    ]
