"""Runs the episodes' agent loops against a rollout engine.

The loops run as coroutines on an event loop of their own (a thread), with their tool
calls and interactions; the engine stays in the calling thread (the rollout worker's,
where its model and devices live). A loop's ``await episode.generate()`` becomes a
request to this thread, which serves the requests one of two ways:

- **batched** (any engine: the HF rollout): when every episode still running waits on
  the model, their turns are one ``generate`` call, in row order; one turn's tools run
  for all trajectories at once before the next turn (issue 17 allows this on HF).
- **streamed** (an engine with a ``turn_stream``: vLLM): each turn is its own request,
  submitted when it is asked for; the engine is stepped while any is in flight and each
  finished turn goes back to its loop at once. A trajectory waiting on a slow tool holds
  no other, and a short turn never waits for a long one. The first turns go in together,
  in row order.

An exception in a loop stops the run, naming the loop and the row; the others are
cancelled and the engine's requests aborted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import Any

from engine.agents.episode import AgentLoopError, Episode
from engine.errors import EngineError
from engine.rollout.base import RolloutEngine
from engine.rollout.turn_stream import TurnStream
from engine.types import GenerationRequest, SamplingParams

Run = Callable[[Episode], Coroutine[Any, Any, None]]


@dataclass
class _Asked:
    """A loop waiting on the model: its row, the tokens so far, the most new tokens."""

    index: int
    prompt_ids: list[int]
    max_new_tokens: int
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop

    def answer(self, ids: list[int], logprobs: list[float] | None, finished: bool) -> None:
        self.loop.call_soon_threadsafe(_set, self.future, (ids, logprobs, finished))


@dataclass
class _Done:
    index: int
    error: BaseException | None


def _set(future: asyncio.Future, value: Any) -> None:
    if not future.done():  # cancelled when the run stopped
        future.set_result(value)


class Requests:
    """What the loops ask of the engine's thread, in the order they ask it; each
    episode's ``ask`` is ``port(its row)``."""

    def __init__(self) -> None:
        self.queue: queue.Queue[_Asked | _Done] = queue.Queue()

    def port(self, index: int) -> Callable[..., Any]:
        async def ask(prompt_ids: list[int], max_new_tokens: int) -> Any:
            loop = asyncio.get_running_loop()
            future = loop.create_future()
            self.queue.put(_Asked(index, prompt_ids, max_new_tokens, future, loop))
            return await future

        return ask

    def next(self, block: bool) -> _Asked | _Done | None:
        try:
            return self.queue.get(block=block)
        except queue.Empty:
            return None


def drive(
    engine: RolloutEngine,
    episodes: Sequence[Episode],
    runs: Sequence[Run],
    requests: Requests,
    sampling: SamplingParams,
) -> None:
    """Run each episode's loop (``runs[i](episodes[i])``) to its end."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="agent-loops", daemon=True)
    thread.start()
    tasks = [
        asyncio.run_coroutine_threadsafe(_episode(run, episode, requests), loop)
        for run, episode in zip(runs, episodes, strict=True)
    ]
    try:
        stream = getattr(engine, "turn_stream", None)
        if stream is not None:
            with stream() as turns:
                _streamed(turns, episodes, requests, sampling)
        else:
            # An engine with a session (the HF rollout on FSDP) holds its weights
            # gathered for the whole run: ranks whose trajectories take different
            # numbers of turns make different numbers of calls, which must run no
            # collective.
            with getattr(engine, "session", contextlib.nullcontext)():
                _batched(engine, episodes, requests, sampling)
    finally:
        for task in tasks:
            task.cancel()
        concurrent.futures.wait(tasks, timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        if not thread.is_alive():
            loop.close()


async def _episode(run: Run, episode: Episode, requests: Requests) -> None:
    try:
        await run(episode)
        episode.close()
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        requests.queue.put(_Done(episode.index, exc))
        return
    requests.queue.put(_Done(episode.index, None))


def _failed(episodes: Sequence[Episode], done: _Done) -> BaseException:
    exc = done.error
    if isinstance(exc, EngineError):  # the loop's own or an interaction's: it names itself
        return exc
    episode = episodes[done.index]
    error = AgentLoopError(
        f"agent loop {episode.agent!r} failed on row {done.index}: {type(exc).__name__}: {exc}"
    )
    error.__cause__ = exc
    return error


def _batched(
    engine: RolloutEngine,
    episodes: Sequence[Episode],
    requests: Requests,
    sampling: SamplingParams,
) -> None:
    live = len(episodes)
    waiting: dict[int, _Asked] = {}
    while live:
        event = requests.next(block=True)
        if isinstance(event, _Done):
            live -= 1
            if event.error is not None:
                raise _failed(episodes, event)
        elif event is not None:
            waiting[event.index] = event
        if waiting and len(waiting) == live:
            asked = [waiting.pop(i) for i in sorted(waiting)]
            most = max(a.max_new_tokens for a in asked)
            out = engine.generate(
                GenerationRequest(
                    prompt_ids=[a.prompt_ids for a in asked],
                    sampling=replace(sampling, max_new_tokens=min(sampling.max_new_tokens, most)),
                )
            )
            for i, a in enumerate(asked):
                ids = list(out.response_ids[i])
                lps = list(out.logprobs[i]) if out.logprobs is not None else None
                cut = len(ids) > a.max_new_tokens  # a row that asked for fewer
                a.answer(
                    ids[: a.max_new_tokens],
                    lps[: a.max_new_tokens] if lps is not None else None,
                    out.finished[i] and not cut,
                )


def _streamed(
    turns: TurnStream,
    episodes: Sequence[Episode],
    requests: Requests,
    sampling: SamplingParams,
) -> None:
    live = len(episodes)
    generating: dict[str, _Asked] = {}
    first: dict[int, _Asked] | None = {}  # the first turns, until all are asked for
    try:
        while live:
            event = requests.next(block=not generating)
            while event is not None:
                if isinstance(event, _Done):
                    live -= 1
                    if event.error is not None:
                        raise _failed(episodes, event)
                elif first is not None:
                    first[event.index] = event
                else:
                    _submit(turns, event, sampling, generating)
                event = requests.next(block=False)
            if first is not None and len(first) == live:
                for i in sorted(first):
                    _submit(turns, first[i], sampling, generating)
                first = None
            if generating:
                for done in turns.step():
                    generating.pop(done.handle).answer(done.token_ids, done.logprobs, done.finished)
    except BaseException:
        turns.abort()
        raise


def _submit(
    turns: TurnStream, asked: _Asked, sampling: SamplingParams, generating: dict[str, _Asked]
) -> None:
    own = replace(sampling, max_new_tokens=min(sampling.max_new_tokens, asked.max_new_tokens))
    generating[turns.submit(asked.prompt_ids, own)] = asked
