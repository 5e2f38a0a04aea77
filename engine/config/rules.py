"""``validate``: every cross-field rule, checked once, up front, all problems reported
together, each with the fix.

Each section's rules sit beside its fields, in a ``rules(cfg)`` function of its module
(``data``, ``actor``, ``rollout``, ``routing_replay``, ``multi_turn``, ``critic``,
``reward``, ``algorithm``, ``trainer``); a rule that spans sections lives with the field
it is about (``rollout.n >= 2`` for group
estimators in ``algorithm``, the rollout's tensor-parallel size against the device count
in ``rollout``). Two kinds span too much for one section and have modules of their own:
the batch sizes (``batches``: data, actor, critic, rollout and devices) and the Megatron
parallel layout, shared by every role that uses it (``megatron.megatron_rules``). verl's
keys that turn on what this engine lacks, or repeat one of its keys, are checked in
``verl_features``.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.config import (
    actor,
    algorithm,
    async_training,
    batches,
    critic,
    data,
    distillation,
    multi_turn,
    reward,
    rollout,
    routing_replay,
    trainer,
    verl_features,
)
from engine.config.engine import EngineConfig
from engine.config.megatron import megatron_rules
from engine.errors import ConfigError

# In the order their problems are listed.
RULES: tuple[Callable[[EngineConfig], list[str]], ...] = (
    data.rules,
    actor.rules,
    rollout.rules,
    routing_replay.rules,
    multi_turn.rules,
    critic.rules,
    reward.rules,
    algorithm.rules,
    trainer.rules,
    async_training.rules,
    distillation.rules,
    batches.rules,
    megatron_rules,
    verl_features.rules,
)


def validate(cfg: EngineConfig) -> None:
    """Check every rule that spans fields; raise one ConfigError listing all problems."""
    problems = [problem for rule in RULES for problem in rule(cfg)]
    if problems:
        raise ConfigError(problems)
