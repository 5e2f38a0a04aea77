"""Multi-turn rollouts on a tensor-parallel engine: one member runs the loops, all step.

A vLLM engine with tensor parallelism ``tp`` runs SPMD in ``tp`` rollout workers
(``engine.rollout.tp``): each member must make the same engine calls with the same
requests, or their schedules part ways and the group hangs. Agent loops cannot run in
every member: tools would run ``tp`` times and could answer differently (a clock, a
sandbox's timing), and the trajectories would diverge. So the group's first member, its
leader, gathers the group's rows and runs every loop, with their tools and interactions;
each engine step it takes, it first tells the others (the requests added since the last
step), and they take the same step on their part of the engine. At the end the leader
sends the trajectories and each member keeps its own rows: the controller sees no
difference.

The messages go over the group's gloo process group, from the leader:
``("open",)`` (the stream opens: a collective seed follows), ``("step", requests)``,
``("abort",)``, ``("close",)``, and last ``("end", output)``, where the output is None
when the leader failed (the members then fail too, and the run stops with the leader's
error).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch.distributed as dist

from engine.agents.loop import AgentRunner, as_generation_output
from engine.controller.dispatch import take
from engine.errors import EngineError
from engine.rollout.tp import TPLayout, gather_group_rows
from engine.rollout.turn_stream import Completion
from engine.types import GenerationOutput, GenerationRequest, SamplingParams


class _Channel:
    """Messages from the group's leader to every member."""

    def __init__(self, layout: TPLayout, group: Any) -> None:
        self.leader = layout.group_ranks[0]
        self.group = group

    def send(self, *message: Any) -> None:
        dist.broadcast_object_list([message], src=self.leader, group=self.group)

    def receive(self) -> tuple[Any, ...]:
        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.leader, group=self.group)
        return box[0]


class _LeaderStream:
    """The leader's turn stream: each step is first told to the group."""

    def __init__(self, inner: Any, channel: _Channel) -> None:
        self.inner, self.channel = inner, channel
        self.added: list[tuple[list[int], SamplingParams]] = []

    def submit(self, prompt_ids: list[int], sampling: SamplingParams) -> str:
        self.added.append((list(prompt_ids), sampling))
        return self.inner.submit(prompt_ids, sampling)

    def step(self) -> list[Completion]:
        self.channel.send("step", self.added)
        self.added = []
        return self.inner.step()

    def abort(self) -> None:
        self.channel.send("abort")
        self.inner.abort()


class _LeaderEngine:
    """What the driver sees on the leader: the engine's turn stream, told to the group."""

    def __init__(self, engine: Any, channel: _Channel) -> None:
        self.engine, self.channel = engine, channel

    @contextlib.contextmanager
    def turn_stream(self) -> Iterator[_LeaderStream]:
        self.channel.send("open")
        try:
            with self.engine.turn_stream() as inner:
                yield _LeaderStream(inner, self.channel)
        finally:
            self.channel.send("close")


def run_in_group(
    runner: AgentRunner, engine: Any, request: GenerationRequest, logprobs: bool
) -> GenerationOutput:
    """This member's rows of the group's trajectories (every member calls this)."""
    layout, group = engine.layout, engine.group
    names = request.agent_names or ["single_turn"] * len(request.prompt_ids)
    infos = request.extra_info or [{}] * len(request.prompt_ids)
    rows, mine = gather_group_rows(
        list(zip(request.prompt_ids, names, infos, strict=True)), layout, group
    )
    channel = _Channel(layout, group)
    if layout.tp_rank == 0:
        output = None
        try:
            trajectories = runner.run(
                _LeaderEngine(engine, channel),
                [r[0] for r in rows],
                request.sampling,
                [r[1] for r in rows],
                [r[2] for r in rows],
            )
            output = as_generation_output(trajectories, logprobs)
        finally:
            channel.send("end", output)
    else:
        output = _follow(engine, channel)
    return take(output, mine)


def _follow(engine: Any, channel: _Channel) -> GenerationOutput:
    """Take the leader's steps until it ends; its output."""
    while True:
        message = channel.receive()
        if message[0] == "open":
            with engine.turn_stream() as stream:
                while (message := channel.receive())[0] != "close":
                    if message[0] == "step":
                        for prompt_ids, sampling in message[1]:
                            stream.submit(prompt_ids, sampling)
                        stream.step()
                    elif message[0] == "abort":
                        stream.abort()
        elif message[0] == "end":
            if message[1] is None:
                raise EngineError(
                    "the multi-turn rollout failed on this tensor-parallel group's first"
                    " member (its error stops the run)"
                )
            return message[1]
