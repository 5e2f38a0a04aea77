"""Multi-turn trajectories that advance on their own (issue 17's "many in flight").

On an engine that serves requests as they come (``TurnStream``: vLLM, stepped here),
every trajectory's turn is its own request: when it finishes, the trajectory's tool calls
start at once on an event loop of their own, and when they answer, its next turn goes to
the engine, while the engine keeps generating the others' turns. One trajectory waiting
on a slow tool holds no other, and a short turn never waits for a long one. Engines
without a stream (the HF rollout) take the turns batched (``ToolAgent._run_turns``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from engine.agents.interactions import Feedback
from engine.agents.trajectory import LENGTH, Trajectory
from engine.types import SamplingParams

if TYPE_CHECKING:
    from engine.agents.loop import ToolAgent
    from engine.agents.tools import ParsedTurn


@dataclass(frozen=True)
class Completion:
    """A finished turn: the request's handle, its tokens (cut after the end token),
    their log-probs (when asked) and whether it ended with the end token."""

    handle: str
    token_ids: list[int]
    logprobs: list[float] | None
    finished: bool


class TurnStream(Protocol):
    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> str: ...

    def step(self) -> list[Completion]: ...

    def abort(self) -> None: ...


def run_streaming(
    agent: ToolAgent, stream: TurnStream, trajectories: list[Trajectory], sampling: SamplingParams
) -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="agent-tools", daemon=True)
    thread.start()
    generating: dict[str, Trajectory] = {}
    calling: dict[concurrent.futures.Future, tuple[Trajectory, ParsedTurn]] = {}
    ready = [t for t in trajectories if t.running]
    try:
        while ready or generating or calling:
            for t in ready:
                room = t.room(agent.limits)
                if room <= 0:  # the budget is spent: no turn to take
                    t.ended = LENGTH
                    continue
                turn_sampling = replace(sampling, max_new_tokens=min(sampling.max_new_tokens, room))
                generating[stream.submit(t.prompt_ids + t.response_ids, turn_sampling)] = t
            ready = []
            if generating:
                for done in stream.step():
                    t = generating.pop(done.handle)
                    after = agent.after_turn(t, done.token_ids, done.logprobs, done.finished)
                    if isinstance(after, Feedback):
                        agent.give_feedback(t, after)
                        ready += [t] if t.running else []
                    elif after is not None:
                        future = asyncio.run_coroutine_threadsafe(agent.call_tools(t, after), loop)
                        calling[future] = (t, after)
            if calling:
                # while turns generate, only look; with none, wait for a tool to answer
                answered, _ = concurrent.futures.wait(
                    calling,
                    timeout=0 if generating else None,
                    return_when=concurrent.futures.FIRST_COMPLETED,
                )
                for future in answered:
                    t, turn = calling.pop(future)
                    agent.answer(t, turn, future.result())
                    ready += [t] if t.running else []
    except BaseException:
        stream.abort()
        raise
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
