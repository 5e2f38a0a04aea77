"""Part (b), in a process of its own per engine: generated tokens per second of the
agent loop (``engine.agents.loop.AgentRunner``), without tools and with tool calls in
flight; and, on an engine that streams turns (vLLM), the loop with each trajectory's
turns streamed against the same loop batched round by round.

The conditions, all on the same prompts (the tool's schema in every system prompt) and
sampling (``ignore_eos``: every model turn is exactly ``new_tokens`` long, so every
condition generates the same tokens per row):

- ``generate``: the engine's ``generate`` alone, no agent loop: the floor;
- ``single-turn``: ``AgentRunner.run(..., agent_names=["single_turn"] * rows)``;
- ``single-turn long``: the same on longer prompts, the context the tool rows' second
  turn sees (prompt, call, the tool's answer; checked equal): what the tool rows' model
  turn costs without any tool;
- ``tools 0 ms``: the built-in ``tool_agent`` loop, its first turn forced to a call of
  the ``wait`` tool with 0 ms (``forced.py``), the call run, its answer appended, and the
  second turn generated: the cost of a second turn and of the loop's tool machinery alone;
- ``tools L ms``: the same with a call that sleeps L ms: all rows' calls are in flight
  together, so the tool phase should last about L, not rows × L;
- ``tools 0-2L ms``: the same call, but each row's own latency from its
  ``extra_info.tools_kwargs`` (``{"wait": {"row_ms": d}}``), spread evenly over 0..2L
  (mean L) and shuffled over the rows: a batched round waits on its slowest call;
- ``tools 0-2L ms xR``: R rounds of a model turn and a ``wait`` call, then a last
  model turn, through a loop of the benchmark's own (``waiting_loop.py``: it makes the
  calls itself, no turn forced); every round deals the same latencies to the rows anew,
  so a batched rollout waits on R slowest calls, a streamed row on its own R.

The batched conditions go through ``Counted``, which has no ``turn_stream``: the driver
takes one ``generate`` per round of turns, on any engine. On an engine with a
``turn_stream`` (vLLM), ``single-turn``, ``tools L ms``, ``tools 0-2L ms`` and its
``xR`` run a second time through ``Streamed`` (``... streamed``): each turn submitted
when its loop asks, so a row whose tool answered goes on while slower rows still wait.

vLLM's prefix cache is reset before every run: each starts cold, as a new batch would.
"""

from __future__ import annotations

import json
import os
import random
import socket
import time
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent_bench.cpu import Span
from agent_bench.forced import Counted, Streamed, call_ids
from agent_bench.tool_calls import wait_tool
from agent_bench.waiting_loop import NAME, WaitingLoop, round_latencies


@dataclass(frozen=True)
class Condition:
    name: str
    loop: bool = True  # False: the engine's generate alone
    long: bool = False  # on the context the tool rows' second turn sees
    tool_ms: int | None = None  # the forced call's ms; None: single-turn rows
    spread: bool = False  # each row's own latency, 0..2 x tool_ms (its tools_kwargs)
    streamed: bool = False  # through the engine's turn_stream, not one generate a round
    rounds: int = 0  # tool rounds of the benchmark's own loop (waiting_loop.py); 0: not it

    @property
    def turns(self) -> int:
        """Model turns per row: one, the forced call's not counted; rounds + 1 in the
        benchmark's loop."""
        return self.rounds + 1 if self.rounds else 1


def conditions(tool_ms: int, tool_rounds: int, streams: bool) -> list[Condition]:
    """In the order they run; each streamed one right after its batched twin, so that
    the two meet the same neighbours."""
    spread = Condition(f"tools 0-{2 * tool_ms} ms", tool_ms=tool_ms, spread=True)
    batched = [
        Condition("generate", loop=False),
        Condition("single-turn"),
        Condition("single-turn long", long=True),
        Condition("tools 0 ms", tool_ms=0),
        Condition(f"tools {tool_ms} ms", tool_ms=tool_ms),
        spread,
    ]
    if tool_rounds >= 2:
        batched.append(replace(spread, name=f"{spread.name} x{tool_rounds}", rounds=tool_rounds))
    twins = {"single-turn", f"tools {tool_ms} ms", spread.name} if streams else set()
    if streams and tool_rounds >= 2:
        twins.add(batched[-1].name)
    out = []
    for c in batched:
        out.append(c)
        if c.name in twins:
            out.append(replace(c, name=f"{c.name} streamed", streamed=True))
    return out


def spread_ms(rows: int, tool_ms: int, seed: int) -> list[int]:
    """Each row's latency: evenly over 0..2 x tool_ms (mean tool_ms), in a seeded order
    (row order would also be submission order: fast rows first)."""
    ms = [round(2 * tool_ms * k / (rows - 1)) if rows > 1 else tool_ms for k in range(rows)]
    random.Random(seed).shuffle(ms)
    return ms


def _single_process_dist() -> None:
    """vLLM's in-process executor (external_launcher) reads a torch.distributed world."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def build_engine(name: str, model_dir: str, tokenizer: Any, max_model_len: int, rows: int) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from engine.config import RolloutConfig
    from engine.rollout.hf import HFRollout, eos_ids
    from engine.rollout.translate import EngineSettings, kv_cache_bytes_for

    if name == "hf":
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        return HFRollout(model, tokenizer, torch.device("cpu"))
    from engine.rollout.vllm import VLLMRollout

    _single_process_dist()
    hf_config = AutoConfig.from_pretrained(model_dir)
    # the same EOS ids as the HF rollout's: the tokenizer's and the generation config's
    generation = SimpleNamespace(generation_config=GenerationConfig.from_pretrained(model_dir))
    settings = EngineSettings(
        model_dir,
        eos_token_ids=frozenset(eos_ids(tokenizer, generation)),
        max_model_len=max_model_len,
        load_format="auto",  # the weights from disk: nothing to push
        dtype="float32",
        kv_cache_bytes=kv_cache_bytes_for(hf_config, "float32", max_model_len, rows),
    )
    engine = VLLMRollout(RolloutConfig(name="vllm", dtype="float32", enforce_eager=True), settings)
    engine.wake()  # built asleep; on CPU (no sleep mode) a no-op
    return engine


def tool_union_s(intervals: list[tuple[float, float]]) -> float:
    """Seconds during which at least one tool call was running."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


class Bench:
    def __init__(self, args: Any) -> None:
        from transformers import AutoTokenizer

        from engine.agents.chat import ChatFormat
        from engine.agents.loop import AgentRunner
        from engine.agents.tools import get_tool_call_parser
        from engine.agents.tools.sample import tool_kwargs_problems
        from engine.agents.trajectory import AgentLimits
        from engine.types import SamplingParams

        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        self.intervals: list[tuple[float, float]] = []
        tool = wait_tool(record=self.intervals)
        chat = ChatFormat(self.tokenizer, [tool.schema])
        self.forced = {ms: call_ids(self.tokenizer, "wait", {"ms": ms}) for ms in (0, args.tool_ms)}
        room = max(map(len, self.forced.values())) + 64 + args.new_tokens  # call, answer, turn 2
        limits = AgentLimits(max_turns=2, max_response_tokens=room, tool_timeout_s=60.0)
        self.runner = AgentRunner(chat, get_tool_call_parser("hermes"), {"wait": tool}, limits)
        self.prompts = [
            chat.prompt_ids([{"role": "user", "content": f"Question {i}: what is {i} times 17?"}])
            for i in range(args.rows)
        ]
        self.spread_ms = spread_ms(args.rows, args.tool_ms, args.seed)
        self.spread_info = [{"tools_kwargs": {"wait": {"row_ms": ms}}} for ms in self.spread_ms]
        for i, info in enumerate(self.spread_info):  # as the engine checks rows at its start
            problems = tool_kwargs_problems(info, {"wait": tool}, f"row {i}")
            if problems:
                raise RuntimeError("; ".join(problems))

        def second_turn(ms: int) -> list[int]:
            """What a tool row's model turn follows: the forced call, the tool's answer."""
            answer = {"role": "tool", "name": "wait", "content": f"waited {ms} ms"}
            return self.forced[args.tool_ms] + chat.continuation_ids([answer])

        self.long_prompts = [p + second_turn(args.tool_ms) for p in self.prompts]
        self.spread_prompts = [
            p + second_turn(ms) for p, ms in zip(self.prompts, self.spread_ms, strict=True)
        ]
        self.sampling = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
        max_len = max(map(len, self.long_prompts + self.spread_prompts)) + args.new_tokens

        # Several tool rounds (waiting_loop.py): each round the spread's latencies, dealt
        # to the rows anew; a turn, its end token and the call's answer (under 64 tokens)
        # a round, then the last turn
        rounds = args.tool_rounds
        self.round_ms = round_latencies(self.spread_ms, rounds, args.seed + 1)
        budget = rounds * (args.new_tokens + 1 + 64) + args.new_tokens
        self.rounds_runner = AgentRunner(
            chat,
            get_tool_call_parser("hermes"),
            {"wait": tool},
            AgentLimits(max_turns=rounds + 1, max_response_tokens=budget, tool_timeout_s=60.0),
            loops={NAME: WaitingLoop()},
        )
        if rounds >= 2:
            max_len = max(max_len, max(map(len, self.prompts)) + budget)
        start = time.perf_counter()
        self.engine = build_engine(args.child, args.model_dir, self.tokenizer, max_len, args.rows)
        self.start_s = time.perf_counter() - start
        self.streams = hasattr(self.engine, "turn_stream")

    def run(self, condition: Condition) -> dict[str, Any]:
        import torch

        from engine.types import GenerationRequest

        torch.manual_seed(self.args.seed)
        reset = getattr(getattr(self.engine, "llm", None), "reset_prefix_cache", None)
        if reset is not None:
            reset()
        ms = condition.tool_ms
        prompts = self.long_prompts if condition.long else self.prompts
        wrapper = Streamed if condition.streamed else Counted
        engine = wrapper(self.engine, self.forced.get(ms) if ms is not None else None, prompts)
        runner, extra_info = self.runner, self.spread_info if condition.spread else None
        names = ["single_turn" if ms is None else "tool_agent"] * len(prompts)
        if condition.rounds:  # the loop makes its calls itself: no turn forced
            engine = wrapper(self.engine)
            runner, names = self.rounds_runner, [NAME] * len(prompts)
            extra_info = [{"wait_ms": row} for row in self.round_ms]
        self.intervals.clear()
        span = Span()
        if not condition.loop:
            engine.generate(GenerationRequest(prompts, self.sampling))
            trajectories = []
        else:
            trajectories = runner.run(
                engine, prompts, self.sampling, agent_names=names, extra_info=extra_info
            )
        span.end()
        self.check(condition, trajectories, engine)
        last_call = max((b for _, b in self.intervals), default=None)
        return {
            "wall_s": span.wall_s,
            "other_cores": span.other_cores,
            "model_tokens": engine.tokens,
            "tokens_per_s": engine.tokens / span.wall_s,
            "generate_s": engine.generate_s,
            "generate_calls": engine.calls,
            "tool_calls": sum(t.tool_calls for t in trajectories),
            "tool_wall_s": tool_union_s(self.intervals),
            "tool_sum_s": sum(b - a for a, b in self.intervals),  # one after another
            "tool_latency_sum_s": sum(t.tool_latency_s for t in trajectories),  # execute's
            # from the end of the slowest call to the end of the rollout: the generation
            # still left when the last row could go on
            "tail_s": span.start + span.wall_s - last_call if last_call is not None else None,
        }

    def check(self, condition: Condition, trajectories: list[Any], engine: Counted) -> None:
        """Like with like: every turn of every row generated whole by the engine; every
        tool row called once a round, without error, with its own latency; and the
        engine saw the contexts it should (in row order when batched; a streamed second
        turn goes in when its own tool has answered)."""
        ms, name, rows = condition.tool_ms, condition.name, len(self.prompts)
        if engine.tokens != rows * condition.turns * self.args.new_tokens:
            raise RuntimeError(f"{name}: the engine generated {engine.tokens} tokens")
        if ms is None:
            return
        calls = sum(t.tool_calls for t in trajectories)
        if calls != rows * max(condition.rounds, 1) or any(t.tool_errors for t in trajectories):
            raise RuntimeError(f"{name}: {calls} calls for {rows} rows, or errors")
        wanted = self.spread_ms if condition.spread else [ms] * rows
        if condition.rounds:
            wanted = [sum(row) for row in self.round_ms]
        if any(t.tool_latency_s < w / 1000 for t, w in zip(trajectories, wanted, strict=True)):
            raise RuntimeError(f"{name}: a call returned before its row's latency")
        if ms != self.args.tool_ms or condition.rounds:  # those contexts depend on sampling
            return
        sent = engine.sent
        expected = self.spread_prompts if condition.spread else self.long_prompts
        if condition.streamed:
            sent, expected = sorted(sent), sorted(expected)
        if sent != expected:
            raise RuntimeError(f"{name}: the second turns' contexts are not as expected")


def child(args: Any) -> None:
    """Every condition once not counted, then ``rollout_repeat`` rounds of all of them,
    in reverse order every other round (neither twin of a pair always runs first)."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench(args)
    order = conditions(args.tool_ms, args.tool_rounds, bench.streams)
    for condition in order:
        bench.run(condition)
    runs: dict[str, list[dict[str, Any]]] = {c.name: [] for c in order}
    for round_ in range(args.rollout_repeat):
        # whether the neighbours were quiet, read over the whole round: a single run's
        # tenths of a second are too short for /proc/stat's 10 ms ticks
        span = Span()
        records = {c.name: bench.run(c) for c in (order if round_ % 2 == 0 else order[::-1])}
        span.end()
        for name, record in records.items():
            runs[name].append({**record, "round_other_cores": span.other_cores})
    result = {
        "engine": args.child,
        "engine_start_s": bench.start_s,
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens": [len(p) for p in bench.prompts],
        "forced_tokens": len(bench.forced[args.tool_ms]),
        "spread_ms": bench.spread_ms,
        "round_ms": bench.round_ms,
        "runs": runs,
    }
    Path(args.child_out).write_text(json.dumps(result))
    close = getattr(bench.engine, "close", None)
    if callable(close):
        close()
