"""Runs a batch of rows, each through its agent loop, over any rollout engine.

    runner = AgentRunner(ChatFormat(tokenizer, tool_schemas(specs)), parser, tools, limits)
    trajectories = runner.run(engine, prompts, sampling, agent_names, extra_info)

Each row's loop is its ``agent_name`` (the built-ins ``tool_agent`` and ``single_turn``,
or one the agent loops file declares, ``engine.agents.loops``); each row becomes an
``Episode`` its loop drives, and ``engine.agents.driver`` serves their turns, batched on
engines that take a batch at a time (HF) and one by one as they come on vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from engine.agents.chat import ChatFormat
from engine.agents.driver import Requests, drive
from engine.agents.episode import AgentContext, AgentLoopError, Episode
from engine.agents.interactions import Interaction
from engine.agents.loops import builtin_loops
from engine.agents.tools import Tool, ToolCallParser
from engine.agents.trajectory import AgentLimits, Trajectory
from engine.rollout.base import RolloutEngine
from engine.types import GenerationOutput, SamplingParams

DEFAULT_AGENT = "tool_agent"


@dataclass
class AgentRunner:
    chat: ChatFormat
    parser: ToolCallParser
    tools: Mapping[str, Tool]
    limits: AgentLimits
    interactions: Mapping[str, Interaction] = field(default_factory=dict)
    loops: Mapping[str, Any] = field(default_factory=dict)  # the file's, by name

    def __post_init__(self) -> None:
        self.context = AgentContext(
            self.chat, self.parser, self.tools, self.limits, self.interactions
        )
        self.all_loops = {**builtin_loops(), **self.loops}

    def run(
        self,
        engine: RolloutEngine,
        prompts: Sequence[list[int]],
        sampling: SamplingParams,
        agent_names: Sequence[str] | None = None,
        extra_info: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt row (rows already expanded: engines generate one
        response per row, ``sampling.n`` is not read). ``agent_names``: each row's loop
        (``tool_agent`` for all when not given); ``extra_info``: each row's (its
        ``tools_kwargs`` and ``interaction_kwargs`` among them)."""
        names = list(agent_names) if agent_names is not None else [DEFAULT_AGENT] * len(prompts)
        infos = list(extra_info) if extra_info is not None else [None] * len(prompts)
        unknown = sorted(set(names) - set(self.all_loops))
        if unknown:  # the start-up check refuses these first; a direct caller gets this
            raise AgentLoopError(
                f"unknown agent loops {unknown}; declared: {', '.join(sorted(self.all_loops))}"
            )
        requests = Requests()
        episodes = [
            Episode(i, name, Trajectory(list(p)), self.context, info or {}, requests.port(i))
            for i, (p, name, info) in enumerate(zip(prompts, names, infos, strict=True))
        ]
        runs = [self.all_loops[name].run for name in names]
        drive(engine, episodes, runs, requests, sampling)
        return [e.trajectory for e in episodes]


def as_generation_output(trajectories: list[Trajectory], logprobs: bool) -> GenerationOutput:
    """The trajectories as the rollout's output: tokens, mask, log-probs (when the
    engine gives them), whether the model ended each itself, and their statistics."""
    return GenerationOutput(
        response_ids=[t.response_ids for t in trajectories],
        finished=[t.finished for t in trajectories],
        logprobs=[t.logprobs for t in trajectories] if logprobs else None,
        response_mask=[t.response_mask for t in trajectories],
        turn_scores=[list(t.turn_scores) for t in trajectories],
        agent_stats=[
            {
                "turns": float(t.turns),
                "feedback_turns": float(t.feedback_turns),
                "tool_calls": float(t.tool_calls),
                "tool_errors": float(t.tool_errors),
                "tool_timeouts": float(t.tool_timeouts),
                "tool_latency_s": t.tool_latency_s,
            }
            for t in trajectories
        ],
    )
