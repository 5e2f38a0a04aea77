"""Trajectories that advance on their own on an engine serving turns as they come: the
same trajectories, exact to the token, as the batched loop; and one trajectory waiting on
a slow tool holds no other (the other's next turn is asked for while the tool runs).
The engine is a script of turns served through the TurnStream interface (the real vLLM
stream is checked against vLLM's own batched generation in tests/engine/rollout)."""

from __future__ import annotations

import contextlib
import threading

import pytest

from engine.agents.chat import ChatFormat
from engine.agents.interactions import parse_interactions
from engine.agents.loop import AgentRunner
from engine.agents.tools import FunctionTool, get_tool_call_parser
from engine.agents.trajectory import ANSWERED, AgentLimits
from engine.models.tiny import build_tokenizer
from engine.rollout.turn_stream import Completion
from engine.types import GenerationRequest, SamplingParams
from tests.engine.agents.test_agent_loop import Script


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


class StreamedScript:
    """The script served one request at a time: each ``step`` finishes the oldest turn
    submitted; ``submitted`` records each request's prompt, in order."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.queue: list[tuple[str, Completion]] = []
        self.submitted: list[list[int]] = []
        self.on_submit = lambda prompt: None

    @contextlib.contextmanager
    def turn_stream(self):
        yield self

    def submit(self, prompt_ids, sampling):
        self.submitted.append(list(prompt_ids))
        self.on_submit(prompt_ids)
        out = self.script.generate(GenerationRequest([list(prompt_ids)], sampling))
        handle = f"h{len(self.submitted)}"
        lps = out.logprobs[0] if out.logprobs is not None else None
        self.queue.append((handle, Completion(handle, out.response_ids[0], lps, out.finished[0])))
        return handle

    def step(self):
        return [self.queue.pop(0)[1]] if self.queue else []

    def abort(self):
        self.queue.clear()


def tool(fn):
    schema = {"type": "function", "function": {"name": fn.__name__, "description": "",
              "parameters": {"type": "object", "properties": {}}}}  # fmt: skip
    return FunctionTool(fn.__name__, schema, fn)


def agent(tokenizer, tools, interactions=None, timeout=20.0):
    return AgentRunner(
        ChatFormat(tokenizer, tool_schemas_of(tools)),
        get_tool_call_parser("hermes"),
        tools,
        AgentLimits(max_turns=3, max_response_tokens=300, tool_timeout_s=timeout),
        interactions or {},
    )


def tool_schemas_of(tools):
    return [t.schema for t in tools.values()]


def call(name):
    return f'<tool_call>{{"name": "{name}", "arguments": {{}}}}</tool_call>'


def fields(t):
    return (t.response_ids, t.response_mask, t.logprobs, t.turns, t.ended, t.turn_scores)


def test_streamed_trajectories_are_the_batched_ones(tokenizer):
    def clock():
        return "noon"

    tools = {"clock": tool(clock)}
    retry = {"name": "retry", "class_name": "retry", "config": {"data_source": "synthetic/add"}}
    interactions = parse_interactions({"interaction": [retry]})
    a = agent(tokenizer, tools, interactions)
    prompts = [a.chat.prompt_ids([{"role": "user", "content": f"Question {i}."}]) for i in range(3)]
    rows = [[call("clock"), "It is noon."], ["5", "7"], ["7"]]
    kwargs = [None, {"name": "retry", "ground_truth": "7"}, {"ground_truth": "7"}]
    sampling = SamplingParams(max_new_tokens=60)
    batched = a.run(
        Script(tokenizer, rows),
        prompts,
        sampling,
        extra_info=[{"interaction_kwargs": k} for k in kwargs],
    )
    streamed = a.run(
        StreamedScript(Script(tokenizer, rows)),
        prompts,
        sampling,
        extra_info=[{"interaction_kwargs": k} for k in kwargs],
    )
    assert [fields(t) for t in streamed] == [fields(t) for t in batched]
    assert [t.ended for t in streamed] == [ANSWERED] * 3
    assert [t.turns for t in streamed] == [2, 2, 1]


def test_a_trajectory_waiting_on_a_slow_tool_holds_no_other(tokenizer):
    other_went_on = threading.Event()

    def slow():  # answers only once the other trajectory has asked for its next turn
        return "in time" if other_went_on.wait(timeout=10) else "held up"

    def fast():
        return "quick"

    a = agent(tokenizer, {"slow": tool(slow), "fast": tool(fast)})
    prompts = [a.chat.prompt_ids([{"role": "user", "content": q}]) for q in ("A?", "B?")]
    engine = StreamedScript(
        Script(tokenizer, [[call("slow"), "A done."], [call("fast"), "B done."]])
    )
    b_second = prompts[1] + tokenizer.encode(call("fast"), add_special_tokens=False)

    def watch(prompt):
        if prompt[: len(b_second)] == b_second:
            other_went_on.set()

    engine.on_submit = watch
    slow_row, fast_row = a.run(engine, prompts, SamplingParams(max_new_tokens=60))
    assert "in time" in tokenizer.decode(slow_row.response_ids)
    assert (slow_row.ended, fast_row.ended) == (ANSWERED, ANSWERED)
    # B's second turn was asked for before A's
    order = [next(i for i, p in enumerate(prompts) if s[: len(p)] == p) for s in engine.submitted]
    assert order == [0, 1, 1, 0]
