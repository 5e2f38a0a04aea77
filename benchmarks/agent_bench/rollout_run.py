"""Part (b), in a process of its own per engine: generated tokens per second of the
agent loop (``engine.agents.loop.AgentRunner``), without tools and with tool calls in
flight.

The conditions, all on the same prompts (the tool's schema in every system prompt) and
sampling (``ignore_eos``: every model turn is exactly ``new_tokens`` long, so every
condition generates the same tokens per row):

- ``generate``: the engine's ``generate`` alone, no agent loop: the floor;
- ``single-turn``: ``AgentRunner.run(..., agent_names=["single_turn"] * rows)``;
- ``single-turn long``: the same on longer prompts, the context the tool rows' second
  turn sees (prompt, call, the tool's answer; checked equal): what the tool rows' model
  turn costs without any tool;
- ``tools 0 ms``: the built-in ``tool_agent`` loop, its first turn forced to a call of
  the ``wait`` tool with 0 ms (``forced.py``), the call run, its answer appended, and the second turn generated:
  the cost of a second turn and of the loop's tool machinery alone;
- ``tools L ms``: the same with a call that sleeps L ms: all rows' calls are in flight
  together, so the tool phase should last about L, not rows × L.

vLLM's prefix cache is reset before every run: each starts cold, as a new batch would.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from agent_bench.cpu import Span
from agent_bench.forced import Counted, call_ids
from agent_bench.tool_calls import wait_tool

CONDITIONS = ("generate", "single-turn", "single-turn long", "tools 0 ms", "tools {ms} ms")


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
        # The context the tool rows' model turn sees: prompt, forced call, the tool's answer
        answer = {"role": "tool", "name": "wait", "content": f"waited {args.tool_ms} ms"}
        after = self.forced[args.tool_ms] + chat.continuation_ids([answer])
        self.long_prompts = [p + after for p in self.prompts]
        self.sampling = SamplingParams(max_new_tokens=args.new_tokens, ignore_eos=True)
        max_len = max(map(len, self.long_prompts)) + args.new_tokens
        start = time.perf_counter()
        self.engine = build_engine(args.child, args.model_dir, self.tokenizer, max_len, args.rows)
        self.start_s = time.perf_counter() - start

    def run(self, condition: str) -> dict[str, Any]:
        import torch

        from engine.types import GenerationRequest

        torch.manual_seed(self.args.seed)
        reset = getattr(getattr(self.engine, "llm", None), "reset_prefix_cache", None)
        if reset is not None:
            reset()
        ms = int(condition.split()[1]) if condition.startswith("tools") else None
        prompts = self.long_prompts if condition == "single-turn long" else self.prompts
        engine = Counted(self.engine, self.forced.get(ms) if ms is not None else None, prompts)
        self.intervals.clear()
        span = Span()
        if condition == "generate":
            engine.generate(GenerationRequest(prompts, self.sampling))
            trajectories = []
        else:
            names = ["single_turn" if ms is None else "tool_agent"] * len(prompts)
            trajectories = self.runner.run(engine, prompts, self.sampling, agent_names=names)
        span.end()
        calls = sum(t.tool_calls for t in trajectories)
        if ms is not None and (calls != len(prompts) or any(t.tool_errors for t in trajectories)):
            raise RuntimeError(f"{condition}: {calls} calls for {len(prompts)} rows, or errors")
        if ms == self.args.tool_ms and engine.sent != self.long_prompts:
            raise RuntimeError(f"{condition}: the second turn's context is not single-turn long's")
        return {
            "wall_s": span.wall_s,
            "other_cores": span.other_cores,
            "model_tokens": engine.tokens,
            "tokens_per_s": engine.tokens / span.wall_s,
            "generate_s": engine.generate_s,
            "generate_calls": engine.calls,
            "tool_calls": calls,
            "tool_wall_s": tool_union_s(self.intervals),
            "tool_sum_s": sum(b - a for a, b in self.intervals),  # one after another
            "tool_latency_sum_s": sum(t.tool_latency_s for t in trajectories),  # execute's
        }


def child(args: Any) -> None:
    """Every condition once not counted, then ``rollout_repeat`` rounds of all of them."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    bench = Bench(args)
    conditions = [c.format(ms=args.tool_ms) for c in CONDITIONS]
    for condition in conditions:
        bench.run(condition)
    runs: dict[str, list[dict[str, Any]]] = {c: [] for c in conditions}
    for _ in range(args.rollout_repeat):
        # whether the neighbours were quiet, read over the whole round: a single run's
        # tenths of a second are too short for /proc/stat's 10 ms ticks
        span = Span()
        records = {condition: bench.run(condition) for condition in conditions}
        span.end()
        for condition, record in records.items():
            runs[condition].append({**record, "round_other_cores": span.other_cores})
    result = {
        "engine": args.child,
        "engine_start_s": bench.start_s,
        "torch_threads": torch.get_num_threads(),
        "prompt_tokens": [len(p) for p in bench.prompts],
        "forced_tokens": len(bench.forced[args.tool_ms]),
        "runs": runs,
    }
    Path(args.child_out).write_text(json.dumps(result))
    close = getattr(bench.engine, "close", None)
    if callable(close):
        close()
