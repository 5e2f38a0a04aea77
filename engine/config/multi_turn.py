"""``actor_rollout_ref.rollout.multi_turn``: agentic rollouts, where the model calls tools
between its turns (``engine.agents``; verl's keys of the same names), with the rules on
them: a tools file is named, the call format is known, the limits are positive. The
tools file itself is read where the job runs, at the engine's start (``engine.runtime``,
before any worker): like the data files, its path is the job's, not the launcher's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config.fields import inert, positive, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

AGENT_LOOPS = ("single_turn", "tool_agent")  # the built-in loops (engine.agents.loops)


@dataclass
class MultiTurnConfig:
    """Multi-turn rollouts with tools: each sample's trajectory is driven by its agent
    loop (the dataset's ``agent_name`` column; ``tool_agent`` by default here), the
    tools' tokens masked out of the losses (docs/agents.md)."""

    enable: bool = setting(False, "Run samples through their agent loop, turn by turn, with tools.")
    tool_config_path: str | None = setting(
        None, "The tools file (docs/tools.md): verl's tool_config form or rlctl's short one."
    )
    interaction_config_path: str | None = setting(
        None,
        "The interactions file (docs/agents.md): environments that answer the model's turns,"
        " picked per row by extra_info.interaction_kwargs.name.",
    )
    agent_loop_config_path: str | None = setting(
        None,
        "The agent loops file (docs/agents.md): your own loops, picked per row by the"
        " dataset's agent_name (verl's rollout.agent.agent_loop_config_path).",
    )
    format: str = setting(
        "hermes", "How the model writes a tool call: hermes (<tool_call> JSON, Qwen2.5/Qwen3)."
    )
    max_assistant_turns: int = setting(4, "Model turns in one trajectory, at most.")
    max_user_turns: int | None = setting(
        None,
        "Environment turns in one trajectory, at most (tool results and interaction"
        " feedback, each one turn); null: as many as the model turns leave room for.",
    )
    max_parallel_calls: int = setting(8, "Tool calls run from one model turn, at most.")
    max_tool_response_length: int = setting(
        2000, "Characters of one tool result the model reads; the rest is cut and marked."
    )
    tool_timeout_s: float = setting(30.0, "Seconds one tool call may take.")
    default_agent: str = setting(
        "tool_agent",
        "The agent loop of samples without an agent_name: single_turn, tool_agent or one the"
        " agent loops file declares.",
    )
    # verl's other multi-turn keys (docs/verl-compat.md).
    tool_response_truncate_side: str = setting(
        "right",
        "Which side of a long tool result is cut: right (the start is kept, marked); verl's"
        " left and middle are refused.",
    )
    function_tool_path: str | None = inert(
        None,
        "verl's Python functions as tools; not in this engine (refused when set): declare"
        " them in the tools file (docs/tools.md).",
    )
    use_inference_chat_template: bool = inert(
        False,
        "verl's choice of chat template for training tokens; changes nothing here: the"
        " trained tokens are those the model generated and read.",
    )
    tokenization_sanity_check_mode: str = inert(
        "strict", "verl's check of its re-tokenization; changes nothing here (no re-tokenizing)."
    )
    num_repeat_rollouts: int | None = inert(
        None, "verl's repeated interaction rollouts; changes nothing here (rollout.n samples)."
    )


def rules(cfg: EngineConfig) -> list[str]:
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    key = "actor_rollout_ref.rollout.multi_turn"
    if not mt.enable:
        return []
    p = positive(
        [
            (f"{key}.max_assistant_turns", mt.max_assistant_turns),
            (f"{key}.max_parallel_calls", mt.max_parallel_calls),
            (f"{key}.max_tool_response_length", mt.max_tool_response_length),
        ]
    )
    if mt.max_user_turns is not None:
        p += positive([(f"{key}.max_user_turns", mt.max_user_turns)])
    if not mt.tool_timeout_s > 0:
        p.append(f"{key}.tool_timeout_s must be positive, got {mt.tool_timeout_s}")
    if mt.default_agent not in AGENT_LOOPS and not mt.agent_loop_config_path:
        # a declared loop's name is checked against the file when the engine starts
        p.append(
            f"{key}.default_agent: unknown agent loop {mt.default_agent!r}; use one of"
            f" {', '.join(AGENT_LOOPS)}, or declare yours in {key}.agent_loop_config_path"
        )
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.tensor_model_parallel_size > 1 and rollout.name == "sglang":
        p.append(
            f"{key}.enable with actor_rollout_ref.rollout.name=sglang and"
            " tensor_model_parallel_size > 1: multi-turn on a tensor-parallel engine needs"
            " its members to step together, which the vLLM rollout does and the SGLang one"
            " does not yet; use rollout.name=vllm, or tensor_model_parallel_size=1"
        )
    p += _tool_problems(mt, key)
    return p


def _tool_problems(mt: MultiTurnConfig, key: str) -> list[str]:
    """A tools file is named and the call format is known (a torch-free import)."""
    from engine.agents.tools import get_tool_call_parser
    from engine.errors import ConfigError

    problems: list[str] = []
    if not (mt.tool_config_path or mt.interaction_config_path or mt.agent_loop_config_path):
        problems.append(
            f"{key}.tool_config_path: a multi-turn rollout needs its tools file (or an"
            " interactions file, interaction_config_path, or agent loops of your own,"
            " agent_loop_config_path); set it (docs/tools.md), or multi_turn.enable=false"
        )
    try:
        get_tool_call_parser(mt.format, mt.max_parallel_calls, key=f"{key}.format")
    except ConfigError as exc:
        problems += list(exc.problems)
    return problems
