"""The tool-using agent loop, batched turn by turn over any rollout engine.

Every running trajectory generates its next turn in one request (the HF rollout batches
them; vLLM takes them as one batch too); the turns that called tools have their calls
run concurrently (across trajectories as well: one slow tool holds no other call); their
results, tokenized through the chat template, are appended with mask 0 and the
trajectories that are still running go on. A trajectory ends when the model answers
without a tool call, at the turn limit, or at the response token budget.

    agent = ToolAgent(ChatFormat(tokenizer, tool_schemas(specs)), parser, tools, limits)
    trajectories = agent.run(engine, [agent.chat.prompt_ids(messages), ...], sampling)
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine.agents.chat import ChatFormat
from engine.agents.interactions import (
    Feedback,
    Interaction,
    InteractionError,
    as_feedback,
    row_interaction,
)
from engine.agents.tools import (
    OK,
    TIMEOUT,
    TRUNCATED,
    ParsedTurn,
    Tool,
    ToolCallParser,
    ToolResult,
    execute,
)
from engine.agents.trajectory import ANSWERED, LENGTH, MAX_TURNS, AgentLimits, Trajectory
from engine.rollout.base import RolloutEngine
from engine.types import GenerationOutput, GenerationRequest, SamplingParams


@dataclass
class ToolAgent:
    chat: ChatFormat
    parser: ToolCallParser
    tools: Mapping[str, Tool]
    limits: AgentLimits
    interactions: Mapping[str, Interaction] = field(default_factory=dict)

    def run(
        self,
        engine: RolloutEngine,
        prompts: Sequence[list[int]],
        sampling: SamplingParams,
        single_turn: Sequence[bool] | None = None,
        tools_kwargs: Sequence[Mapping[str, Mapping[str, Any]]] | None = None,
        interaction_kwargs: Sequence[Mapping[str, Any] | None] | None = None,
    ) -> list[Trajectory]:
        """One trajectory per prompt row (rows already expanded: engines generate one
        response per row, ``sampling.n`` is not read); rows flagged ``single_turn`` end
        after their first turn, as without tools. ``tools_kwargs``: each row's own
        keywords for its tools (``engine.agents.tools.sample``); ``interaction_kwargs``:
        each row's ``extra_info.interaction_kwargs`` (``engine.agents.interactions``)."""
        one = single_turn or [False] * len(prompts)
        own = tools_kwargs or [{}] * len(prompts)
        envs = interaction_kwargs or [None] * len(prompts)
        trajectories = [
            self._start(Trajectory(list(p), single_turn=o, tools_kwargs=dict(k)), e)
            for p, o, k, e in zip(prompts, one, own, envs, strict=True)
        ]
        while running := [t for t in trajectories if t.running]:
            turns = self._generate(engine, running, sampling)
            calling = []
            for t, turn in zip(running, turns, strict=True):
                if isinstance(turn, Feedback):  # the interaction answers: the user's turn
                    t.add_environment(
                        self.chat.continuation_ids([{"role": "user", "content": turn.message}]),
                        self.limits,
                    )
                elif turn is not None:
                    calling.append((t, turn))
            if calling:
                results = asyncio.run(self._run_tools(calling))
                for (t, turn), done in zip(calling, results, strict=True):
                    self._answer(t, turn, done)
        return trajectories

    def _start(self, t: Trajectory, kwargs: Mapping[str, Any] | None) -> Trajectory:
        """The row's interaction, started (a row without one has none)."""
        picked = row_interaction({"interaction_kwargs": kwargs}, list(self.interactions))
        if picked is not None and not t.single_turn:
            name, start_kwargs = picked
            t.interaction = name
            try:
                t.interaction_state = self.interactions[name].start(**start_kwargs)
            except Exception as exc:
                raise InteractionError(
                    f"interaction {name!r}: start() failed: {type(exc).__name__}: {exc}"
                ) from exc
        return t

    def _respond(self, t: Trajectory, reply: str) -> Feedback:
        name = t.interaction or ""
        try:
            answer = self.interactions[name].respond(t.interaction_state, reply)
        except Exception as exc:
            raise InteractionError(
                f"interaction {name!r}: respond() failed: {type(exc).__name__}: {exc}"
            ) from exc
        feedback = as_feedback(answer, name)
        t.turn_scores.append(feedback.score)
        return feedback

    def _generate(
        self, engine: RolloutEngine, running: list[Trajectory], sampling: SamplingParams
    ) -> list[ParsedTurn | Feedback | None]:
        """Each running trajectory's next model turn; the parsed turn of those that called
        a tool (or wrote a call the parser could not read), the interaction's feedback for
        those it sends back to the model, None for the others."""
        budget = max(t.room(self.limits) for t in running)
        request = GenerationRequest(
            prompt_ids=[t.prompt_ids + t.response_ids for t in running],
            sampling=replace(sampling, max_new_tokens=min(sampling.max_new_tokens, budget)),
        )
        out = engine.generate(request)
        turns: list[ParsedTurn | Feedback | None] = []
        for i, t in enumerate(running):
            logprobs = out.logprobs[i] if out.logprobs is not None else None
            kept = t.add_model_turn(list(out.response_ids[i]), logprobs, self.limits)
            complete = out.finished[i] and len(kept) == len(out.response_ids[i])
            if t.single_turn:
                t.ended = ANSWERED if complete else LENGTH
                turns.append(None)
                continue
            text = self.chat.tokenizer.decode(kept, skip_special_tokens=True)
            turn = self.parser.parse(text)
            if not complete:
                t.ended = LENGTH
            elif not turn.calls and not turn.errors:
                if t.interaction is None:
                    t.ended = ANSWERED
                    turns.append(None)
                    continue
                feedback = self._respond(t, text)
                if feedback.done:
                    t.ended = ANSWERED
                elif t.turns >= self.limits.max_turns:
                    t.ended = MAX_TURNS
                else:
                    t.feedback_turns += 1
                turns.append(feedback if t.running else None)
                continue
            elif t.turns >= self.limits.max_turns:
                t.ended = MAX_TURNS
            turns.append(turn if t.running else None)
        return turns

    async def _run_tools(
        self, calling: list[tuple[Trajectory, ParsedTurn]]
    ) -> list[list[ToolResult]]:
        return list(
            await asyncio.gather(
                *(
                    execute(
                        turn.calls,
                        self.tools,
                        timeout_s=self.limits.tool_timeout_s,
                        max_output_chars=self.limits.max_tool_response_chars,
                        sample=t.tools_kwargs,
                    )
                    for t, turn in calling
                )
            )
        )

    def _answer(self, t: Trajectory, turn: ParsedTurn, results: list[ToolResult]) -> None:
        """The tools' results (and what the parser could not read) as the next messages."""
        t.tool_calls += len(results)
        t.tool_errors += len(turn.errors) + sum(
            r.kind not in (OK, TRUNCATED, TIMEOUT) for r in results
        )
        t.tool_timeouts += sum(r.kind == TIMEOUT for r in results)
        t.tool_latency_s += sum(r.latency_s for r in results)
        messages = [r.as_message() for r in results]
        messages += [{"role": "tool", "name": "error", "content": e} for e in turn.errors]
        t.add_environment(self.chat.continuation_ids(messages), self.limits)


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
