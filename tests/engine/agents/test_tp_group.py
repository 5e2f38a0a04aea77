"""Multi-turn on a tensor-parallel engine (engine.agents.tp_group), in a real gloo world of
two ranks forming one TP group: the first member runs every loop of the group, with
their tools (each call runs once, not once per member); the other member's engine gets
the same requests in the same order, step for step (what an SPMD engine needs); each
member returns its own rows, the very trajectories one process makes of the same rows;
and a loop that fails on the leader stops both members."""

from __future__ import annotations

import contextlib
import json
import os
import socket

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.agents.chat import ChatFormat
from engine.agents.loop import AgentRunner, as_generation_output
from engine.agents.tools import FunctionTool, get_tool_call_parser
from engine.agents.trajectory import AgentLimits
from engine.models.tiny import build_tokenizer
from engine.types import GenerationRequest, SamplingParams
from tests.engine.agents.test_agent_loop import Script
from tests.engine.agents.test_streaming import StreamedScript, call

QUESTIONS = [["A?", "B?"], ["C?"]]  # each rank's rows
TURNS = [[call("clock"), "A done."], ["B done."], [call("clock"), "C done."]]  # group order
SAMPLING = SamplingParams(max_new_tokens=40)


def runner(tokenizer, log: str | None):
    def clock():
        if log:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return "noon"

    schema = {"type": "function", "function": {"name": "clock", "description": "",
              "parameters": {"type": "object", "properties": {}}}}  # fmt: skip

    class Broken:
        async def run(self, episode):
            raise RuntimeError("no board")

    return AgentRunner(
        ChatFormat(tokenizer, [schema]),
        get_tool_call_parser("hermes"),
        {"clock": FunctionTool("clock", schema, clock)},
        AgentLimits(max_turns=3, max_response_tokens=200),
        loops={"broken": Broken()},
    )


class Member:
    """A TP member's engine as the worker sees it: its group and its turn stream."""

    def __init__(self, tokenizer) -> None:
        from engine.rollout.tp import new_tp_group, tp_layout

        self.layout = tp_layout(2)
        self.group = new_tp_group(self.layout)
        self.stream = StreamedScript(Script(tokenizer, TURNS))

    @contextlib.contextmanager
    def turn_stream(self):
        with self.stream.turn_stream() as s:
            yield s


def _on_rank(rank: int, port: int, out: str) -> None:
    from engine.agents.tp_group import run_in_group
    from engine.errors import EngineError

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        tokenizer = build_tokenizer()
        r = runner(tokenizer, f"{out}/calls")
        engine = Member(tokenizer)
        prompts = [r.chat.prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS[rank]]
        request = GenerationRequest(prompts, SAMPLING, ["tool_agent"] * len(prompts))
        got = run_in_group(r, engine, request, logprobs=True)
        failed = ""
        try:
            run_in_group(r, Member(tokenizer), GenerationRequest(prompts, SAMPLING, ["broken"] * len(prompts)), logprobs=True)  # fmt: skip
        except EngineError as exc:
            failed = f"{type(exc).__name__}: {exc}"
        with open(f"{out}/{rank}.json", "w") as f:
            json.dump({"ids": got.response_ids, "mask": got.response_mask,
                       "submitted": engine.stream.submitted, "failed": failed}, f)  # fmt: skip
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_the_leader_runs_the_loops_and_every_member_steps_alike(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_on_rank, args=(port, str(tmp_path)), nprocs=2, join=True)
    leader, other = (json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1))

    # the same rows in one process, without a group
    tokenizer = build_tokenizer()
    r = runner(tokenizer, None)
    prompts = [
        r.chat.prompt_ids([{"role": "user", "content": q}]) for q in [*QUESTIONS[0], *QUESTIONS[1]]
    ]
    alone = as_generation_output(
        r.run(StreamedScript(Script(tokenizer, TURNS)), prompts, SAMPLING), logprobs=True
    )
    assert leader["ids"] == alone.response_ids[:2] and other["ids"] == alone.response_ids[2:]
    assert leader["mask"] == alone.response_mask[:2] and other["mask"] == alone.response_mask[2:]
    # two calls in the group's rows, each run once, by the leader's process
    calls = (tmp_path / "calls").read_text().split()
    assert len(calls) == 2 and len(set(calls)) == 1
    # the other member's engine saw what the leader's saw, in the same order
    assert other["submitted"] == leader["submitted"] and len(leader["submitted"]) == 5
    assert leader["failed"].startswith("AgentLoopError: agent loop 'broken' failed")
    assert other["failed"].startswith("EngineError: the multi-turn rollout failed on this")
