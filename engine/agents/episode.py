"""One trajectory as an agent loop sees it, and everything a loop may do with it.

An agent loop is a coroutine over an ``Episode``: it asks the model for a turn
(``await episode.generate()``), reads it, runs tools, consults the row's interaction,
adds what the environment says (masked out of the losses), and returns when the
episode is over. The episode keeps the token accounting exact and the limits enforced:
the model's tokens are kept as sampled, with their log-probs; the budget and the turn
limit end it; ``generate`` returns None once it has ended, so a loop can be written as

    while (turn := await episode.generate()) is not None:
        ...

Which engine serves ``generate`` (batched turn by turn on HF, each turn as it comes on
vLLM) is the driver's business (``engine.agents.driver``), not the loop's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from engine.agents.interactions import (
    Feedback,
    InteractionError,
    as_feedback,
    row_interaction,
)
from engine.agents.tools import (
    EXECUTED,
    OK,
    TIMEOUT,
    TRUNCATED,
    ParsedTurn,
    ToolResult,
    execute,
)
from engine.agents.tools.sample import sample_tool_kwargs
from engine.agents.trajectory import ANSWERED, LENGTH, MAX_TURNS, AgentLimits, Trajectory
from engine.errors import EngineError

if TYPE_CHECKING:
    from engine.agents.chat import ChatFormat
    from engine.agents.interactions import Interaction
    from engine.agents.tools import Tool, ToolCallParser

ENDINGS = (ANSWERED, MAX_TURNS, LENGTH)


class AgentLoopError(EngineError):
    """An agent loop failed while the rollout ran (its name, the row, what it raised)."""


@dataclass(frozen=True)
class ModelTurn:
    """A model turn as the loop reads it."""

    token_ids: list[int]  # as sampled (cut to the budget), already in the trajectory
    text: str  # decoded as written, special tokens included, less its end-of-turn token
    finished: bool  # ended with its end-of-turn token, not cut by a limit


@dataclass(frozen=True)
class AgentContext:
    """What every episode of a rollout worker shares: the chat template, the call
    format, the tools, the limits and the interactions."""

    chat: ChatFormat
    parser: ToolCallParser
    tools: Mapping[str, Tool]
    limits: AgentLimits
    interactions: Mapping[str, Interaction] = field(default_factory=dict)


# The driver's side of ``generate``: (prompt and response so far, most new tokens) ->
# (token ids, their log-probs or None, ended with the end token)
Ask = Callable[[list[int], int], Awaitable[tuple[list[int], list[float] | None, bool]]]


class Episode:
    def __init__(
        self,
        index: int,
        agent: str,
        trajectory: Trajectory,
        context: AgentContext,
        extra_info: Mapping[str, Any],
        ask: Ask,
    ) -> None:
        self.index = index  # the row in the worker's batch
        self.agent = agent  # the agent loop's name
        self.trajectory = trajectory
        self.context = context
        self.extra_info = dict(extra_info)  # the row's, as the dataset gives it
        self.tools_kwargs = sample_tool_kwargs(self.extra_info)  # the row's own tool keywords
        self._ask = ask
        self._last_finished = False
        self._interaction_started = False

    # -- what the loop reads --------------------------------------------------------

    @property
    def chat(self) -> ChatFormat:
        return self.context.chat

    @property
    def prompt_ids(self) -> list[int]:
        return list(self.trajectory.prompt_ids)

    @property
    def response_ids(self) -> list[int]:
        return list(self.trajectory.response_ids)

    @property
    def turns(self) -> int:
        return self.trajectory.turns

    @property
    def turns_left(self) -> int:
        return max(0, self.context.limits.max_turns - self.trajectory.turns)

    @property
    def user_turns_left(self) -> int | None:
        """Environment turns left (``max_user_turns``); None when they are not limited."""
        most = self.context.limits.max_user_turns
        return None if most is None else max(0, most - self.trajectory.user_turns)

    @property
    def room(self) -> int:
        """Tokens left in the response budget (model and environment together)."""
        return max(0, self.trajectory.room(self.context.limits))

    @property
    def running(self) -> bool:
        return self.trajectory.running

    @property
    def ended(self) -> str | None:
        return self.trajectory.ended

    # -- the model ----------------------------------------------------------------

    async def generate(self, max_new_tokens: int | None = None) -> ModelTurn | None:
        """The model's next turn, added to the trajectory (mask 1, its log-probs kept);
        None once the episode has ended, or when the turn limit or the budget leaves no
        turn to take (the episode then ends for that reason). A turn that fills the
        budget without its end token ends the episode too."""
        t = self.trajectory
        if not t.running:
            return None
        if t.turns >= self.context.limits.max_turns:
            t.ended = MAX_TURNS
            return None
        room = self.room
        if room <= 0:
            t.ended = LENGTH
            return None
        want = room if max_new_tokens is None else max(1, min(int(max_new_tokens), room))
        ids, logprobs, finished = await self._ask(t.prompt_ids + t.response_ids, want)
        kept = t.add_model_turn(list(ids), logprobs, self.context.limits)
        complete = bool(finished) and len(kept) == len(ids)
        self._last_finished = complete
        if not complete and self.room <= 0:
            t.ended = LENGTH
        return ModelTurn(kept, self.chat.turn_text(kept), complete)

    # -- tools ----------------------------------------------------------------------

    def parse_tool_calls(self, turn: ModelTurn | str) -> ParsedTurn:
        """The calls in a turn, by the rollout's call format (``multi_turn.format``)."""
        return self.context.parser.parse(turn.text if isinstance(turn, ModelTurn) else turn)

    async def call_tools(self, parsed: ParsedTurn) -> list[ToolResult]:
        """A turn's calls, run at once, a timeout each, with the row's tool keywords;
        counted in the trajectory's statistics. What the parser could not read counts as
        errors; nothing is added to the conversation (``add_tool_results`` does).

        Nothing runs when no result could come back: the episode has ended, no
        environment turn is left (it ends, ``max_turns``), or the budget has no room for
        even empty results (it ends, ``length``); the result is then ``[]``."""
        limits = self.context.limits
        t = self.trajectory
        if not self._room_for(len(parsed.calls) + len(parsed.errors)):
            return []
        results = await execute(
            parsed.calls,
            self.context.tools,
            timeout_s=limits.tool_timeout_s,
            max_output_chars=limits.max_tool_response_chars,
            sample=self.tools_kwargs,
        )
        t.tool_calls += sum(r.kind in EXECUTED for r in results)
        t.tool_errors += len(parsed.errors) + sum(
            r.kind not in (OK, TRUNCATED, TIMEOUT) for r in results
        )
        t.tool_timeouts += sum(r.kind == TIMEOUT for r in results)
        t.tool_latency_s += sum(r.latency_s for r in results)
        return results

    def add_tool_results(self, parsed: ParsedTurn, results: Sequence[ToolResult]) -> bool:
        """The results (and a message for each call the parser could not read) as the
        next messages; False when they do not fit the budget (the episode has ended)."""
        messages = [r.as_message() for r in results]
        messages += [{"role": "tool", "name": "error", "content": e} for e in parsed.errors]
        return self.add_messages(messages)

    # -- the environment -------------------------------------------------------------

    def add_messages(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Chat messages (tool results, the user's next words) after the model's turn,
        through the chat template, with the next assistant turn opened: mask 0. False
        when they do not fit the budget whole (the episode has ended: a cut message
        would open a turn the model never saw)."""
        return self.add_tokens(self.chat.continuation_ids(list(messages)))

    def add_tokens(self, token_ids: Sequence[int]) -> bool:
        """Environment tokens as they are (mask 0), for loops that render their own: one
        environment turn (``max_user_turns``)."""
        t = self.trajectory
        if not t.running:
            return False
        if self.user_turns_left == 0:
            t.ended = MAX_TURNS
            return False
        added = t.add_environment(list(token_ids), self.context.limits)
        t.user_turns += int(added)
        return added

    def _room_for(self, results: int) -> bool:
        """Whether ``results`` tool results could still come back; ends the episode
        (``max_turns`` or ``length``) when they could not."""
        t = self.trajectory
        if not t.running:
            return False
        if self.user_turns_left == 0:
            t.ended = MAX_TURNS
            return False
        empty = [{"role": "tool", "name": "", "content": ""}] * max(results, 1)
        if len(self.chat.continuation_ids(empty)) > self.room:
            t.ended = LENGTH
            return False
        return True

    def interact(self, turn: ModelTurn | str) -> Feedback | None:
        """The row's interaction's answer to a model turn (its score kept for the
        reward); None when the row has none. An exception in it stops the run."""
        name = self._interaction()
        if name is None:
            return None
        text = turn.text if isinstance(turn, ModelTurn) else turn
        state = self.trajectory.interaction_state
        try:
            answer = self.context.interactions[name].respond(state, text)
        except Exception as exc:
            raise InteractionError(
                f"interaction {name!r}: respond() failed: {type(exc).__name__}: {exc}"
            ) from exc
        feedback = as_feedback(answer, name)
        self.trajectory.turn_scores.append(feedback.score)
        return feedback

    def add_feedback(self, feedback: Feedback) -> bool:
        """An interaction's message as the user's next turn (mask 0), counted."""
        added = self.add_messages([{"role": "user", "content": feedback.message}])
        self.trajectory.feedback_turns += int(added)
        return added

    def score(self, value: float) -> None:
        """A turn's score, for the reward (``extra_info["turn_scores"]``), from a loop
        that scores turns itself."""
        self.trajectory.turn_scores.append(float(value))

    def end(self, reason: str = ANSWERED) -> None:
        """End the episode: ``answered`` (the model is done), ``max_turns`` or ``length``."""
        if reason not in ENDINGS:
            raise AgentLoopError(
                f"agent loop {self.agent!r}: end({reason!r}); use one of {', '.join(ENDINGS)}"
            )
        if self.trajectory.running:
            self.trajectory.ended = reason

    # -- the driver's -----------------------------------------------------------------

    def close(self) -> None:
        """After the loop returned: an episode still running ends as its last turn did."""
        t = self.trajectory
        if t.turns == 0:
            raise AgentLoopError(
                f"agent loop {self.agent!r} returned without a model turn (row {self.index});"
                " a trajectory needs at least one: await episode.generate()"
            )
        if t.running:
            t.ended = ANSWERED if self._last_finished else LENGTH

    def _interaction(self) -> str | None:
        """The row's interaction, started at its first use."""
        t = self.trajectory
        if not self._interaction_started:
            self._interaction_started = True
            picked = row_interaction(
                self.extra_info.get("interaction_kwargs"), list(self.context.interactions)
            )
            if picked is not None:
                name, start_kwargs = picked
                t.interaction = name
                try:
                    t.interaction_state = self.context.interactions[name].start(**start_kwargs)
                except Exception as exc:
                    raise InteractionError(
                        f"interaction {name!r}: start() failed: {type(exc).__name__}: {exc}"
                    ) from exc
        return t.interaction
