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
import contextlib
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
        # An engine with a session (the HF rollout on FSDP) holds its weights gathered
        # for the whole run: ranks whose trajectories take different numbers of turns
        # make different numbers of calls, which must run no collective.
        # An engine that serves turns as they come (vLLM) lets each trajectory advance
        # on its own (engine.agents.streaming); the others take turns batched.
        stream = getattr(engine, "turn_stream", None)
        if stream is not None:
            from engine.agents.streaming import run_streaming

            with stream() as turns:
                run_streaming(self, turns, trajectories, sampling)
            return trajectories
        with getattr(engine, "session", contextlib.nullcontext)():
            self._run_turns(engine, trajectories, sampling)
        return trajectories

    def _run_turns(
        self, engine: RolloutEngine, trajectories: list[Trajectory], sampling: SamplingParams
    ) -> None:
        while running := [t for t in trajectories if t.running]:
            turns = self._generate(engine, running, sampling)
            calling = []
            for t, turn in zip(running, turns, strict=True):
                if isinstance(turn, Feedback):
                    self.give_feedback(t, turn)
                elif turn is not None:
                    calling.append((t, turn))
            if calling:
                results = asyncio.run(self._run_tools(calling))
                for (t, turn), done in zip(calling, results, strict=True):
                    self.answer(t, turn, done)

    def _start(self, t: Trajectory, kwargs: Mapping[str, Any] | None) -> Trajectory:
        """The row's interaction, started (a row without one has none)."""
        picked = row_interaction(kwargs, list(self.interactions))
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
        return [
            self.after_turn(
                t,
                list(out.response_ids[i]),
                out.logprobs[i] if out.logprobs is not None else None,
                out.finished[i],
            )
            for i, t in enumerate(running)
        ]

    def after_turn(
        self, t: Trajectory, ids: list[int], logprobs: list[float] | None, finished: bool
    ) -> ParsedTurn | Feedback | None:
        """Take a model turn into its trajectory and say what comes next: the parsed turn
        when it called a tool (or wrote a call the parser could not read), the
        interaction's feedback when it sends the answer back, None when it ended."""
        kept = t.add_model_turn(ids, logprobs, self.limits)
        complete = finished and len(kept) == len(ids)
        if t.single_turn:
            t.ended = ANSWERED if complete else LENGTH
            return None
        text = self.chat.tokenizer.decode(kept, skip_special_tokens=True)
        turn = self.parser.parse(text)
        if not complete:
            t.ended = LENGTH
        elif not turn.calls and not turn.errors:
            if t.interaction is None:
                t.ended = ANSWERED
                return None
            feedback = self._respond(t, text)
            if feedback.done:
                t.ended = ANSWERED
            elif t.turns >= self.limits.max_turns:
                t.ended = MAX_TURNS
            else:
                t.feedback_turns += 1
            return feedback if t.running else None
        elif t.turns >= self.limits.max_turns:
            t.ended = MAX_TURNS
        return turn if t.running else None

    def give_feedback(self, t: Trajectory, feedback: Feedback) -> None:
        """The interaction's message as the user's next turn."""
        t.add_environment(
            self.chat.continuation_ids([{"role": "user", "content": feedback.message}]),
            self.limits,
        )

    async def _run_tools(
        self, calling: list[tuple[Trajectory, ParsedTurn]]
    ) -> list[list[ToolResult]]:
        return list(await asyncio.gather(*(self.call_tools(t, turn) for t, turn in calling)))

    async def call_tools(self, t: Trajectory, turn: ParsedTurn) -> list[ToolResult]:
        """One turn's calls, run at once, with the trajectory's own tool keywords."""
        return await execute(
            turn.calls,
            self.tools,
            timeout_s=self.limits.tool_timeout_s,
            max_output_chars=self.limits.max_tool_response_chars,
            sample=t.tools_kwargs,
        )

    def answer(self, t: Trajectory, turn: ParsedTurn, results: list[ToolResult]) -> None:
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
