"""Interactions: environments that answer the model's turns (feedback, retries, a game),
decide when the episode ends, and score each turn (verl's ``interaction_config_path``).

When a model's turn calls no tool, the sample's interaction reads it and gives
``Feedback(done, message, score)``: when not done, ``message`` goes back to the model as
the user's next turn (masked out of the losses, like tool results) and the model goes on,
up to ``multi_turn.max_assistant_turns``. Each turn's ``score`` is kept, in order, and the
reward function receives them as ``extra_info["turn_scores"]``.

The interactions file (verl's form)::

    interaction:
      - name: retry                      # what rows name in interaction_kwargs.name
        class_name: retry                # a built-in, or "my_env.py:Game" (beside the file)
        config: {data_source: openai/gsm8k}

A row picks its interaction with ``extra_info.interaction_kwargs``::

    interaction_kwargs: {name: retry, ground_truth: "72"}   # the rest goes to start()

An interaction is a class built once as ``cls(config)``, with ``start(**kwargs)``, which
returns the episode's state (anything), and ``respond(state, reply)``, given the model's
turn as text, which returns a ``Feedback`` (or verl's ``(done, message, score)``). It runs
in the rollout worker, between turns; an exception in it stops the run with its name (an
environment's bug is not the model's fault, and hiding it would train on wrong rewards).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from engine.agents.declared import Declared, load_declared, parse_declared
from engine.agents.tools.schemas import short
from engine.algo.registry import Registry, unknown_name_message
from engine.errors import ConfigError, EngineError

KEY = "extra_info.interaction_kwargs"

INTERACTIONS: Registry[Any] = Registry("built-in interaction")
FILE = Declared("interaction", "interaction", ("class_name",), INTERACTIONS)


@dataclass(frozen=True)
class Feedback:
    """What an interaction says after a model's turn."""

    done: bool  # the episode ends here
    message: str = ""  # the user's next turn when not done
    score: float = 0.0  # this turn's score (the reward function gets every turn's)


class Interaction(Protocol):
    def start(self, **kwargs: Any) -> Any: ...

    def respond(self, state: Any, reply: str) -> Feedback | tuple[bool, str, float]: ...


class InteractionError(EngineError):
    """An interaction failed while the rollout ran (its name and what it raised)."""


def as_feedback(value: Any, name: str) -> Feedback:
    """An interaction's answer as a ``Feedback`` (verl's tuple accepted; its 4th item, the
    metadata, dropped)."""
    if isinstance(value, Feedback):
        return value
    if isinstance(value, tuple) and len(value) in (3, 4):
        done, message, score = value[:3]
        return Feedback(bool(done), str(message), float(score))
    raise InteractionError(
        f"interaction {name!r}: respond() returned {short(value)}; return a Feedback(done,"
        " message, score) or a (done, message, score) tuple"
    )


# ---------------------------------------------------------------------------
# the built-in


@INTERACTIONS.register("retry")
class RetryInteraction:
    """Scores each answer with a built-in scorer (``data_source``: the config's, or the
    row's ``interaction_kwargs.data_source``) against the row's ``ground_truth``; a right
    answer (score ``>= pass_score``) ends the episode, a wrong one is sent back with
    ``message`` for another try."""

    CONFIG_KEYS: ClassVar[tuple[str, ...]] = ("data_source", "message", "pass_score")
    MESSAGE = "That is not right. Check your work and give your final answer again."

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.data_source = config.get("data_source")
        self.message = str(config.get("message", self.MESSAGE))
        self.pass_score = float(config.get("pass_score", 1.0))
        if self.data_source is not None:
            _scorer(self.data_source)  # an unknown source is refused when built

    def start(self, *, ground_truth: Any, data_source: str | None = None, **_: Any) -> Any:
        source = data_source or self.data_source
        if source is None:
            raise InteractionError(
                "interaction retry: no data_source: give it in the interaction's config or"
                " in the row's interaction_kwargs"
            )
        return (_scorer(source), ground_truth)

    def respond(self, state: Any, reply: str) -> Feedback:
        scorer, ground_truth = state
        result = scorer(reply, ground_truth, None)
        score = float(result["score"] if isinstance(result, Mapping) else result)
        if score >= self.pass_score:
            return Feedback(done=True, score=score)
        return Feedback(done=False, message=self.message, score=score)


def _scorer(data_source: str) -> Any:
    from engine.reward.registry import get_scorer
    from engine.reward.types import RewardError

    try:
        return get_scorer(str(data_source))
    except RewardError as exc:
        raise ConfigError([f"interaction retry: data_source: {exc}"]) from None


# ---------------------------------------------------------------------------
# the file


def load_interactions(path: str | Path) -> dict[str, Any]:
    """The interactions a file declares, built, by name; one ``ConfigError`` with every
    problem (the file, the entry's key, the value, the fix)."""
    return load_declared(path, FILE)


def parse_interactions(
    data: Any, *, source: str = "interactions", base_dir: str | Path = "."
) -> dict[str, Any]:
    return parse_declared(data, FILE, source=source, base_dir=base_dir)


# ---------------------------------------------------------------------------
# the rows


def row_interaction(
    kwargs: Mapping[str, Any] | None, names: Sequence[str]
) -> tuple[str, dict[str, Any]] | None:
    """(name, start kwargs) of a row's ``interaction_kwargs``; None when it has none. The
    name may be left out when one interaction is declared ("" when it cannot be)."""
    if not isinstance(kwargs, Mapping) or not kwargs:
        return None
    rest = {k: v for k, v in kwargs.items() if k != "name"}
    name = kwargs.get("name", names[0] if len(names) == 1 else "")
    return str(name), rest


def interaction_kwargs_problems(
    extra_info: Mapping[str, Any] | None, interactions: Mapping[str, Any], where: str
) -> list[str]:
    given = (extra_info or {}).get("interaction_kwargs")
    if given is not None and not isinstance(given, Mapping):
        return [f"{where}: {KEY} must be a mapping with a name, got {short(given)}"]
    if not given:
        return []
    if not interactions:
        return [
            f"{where}: {KEY} is given but no interactions file is: set"
            " actor_rollout_ref.rollout.multi_turn.interaction_config_path (docs/agents.md)"
        ]
    names = sorted(interactions)
    name, _ = row_interaction(given, names)
    if "name" not in given and not name:
        return [f"{where}: {KEY}.name is missing; name one of {', '.join(names)}"]
    if name not in interactions:
        return [
            f"{where}: {KEY}.name: "
            + unknown_name_message("interaction", name, names)
            + " (the interactions file declares them)"
        ]
    return []
