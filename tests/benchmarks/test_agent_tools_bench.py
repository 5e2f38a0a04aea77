"""benchmarks/agent_tools.py end to end at its smallest: every part runs and the
comparison is like with like (no timing is asserted: the figures are the script's job)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
SCRIPT = REPO / "benchmarks" / "agent_tools.py"

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("engine", ["hf", pytest.param("vllm", marks=pytest.mark.vllm)])
def test_the_agent_tools_benchmark_runs_end_to_end(engine, tiny_model_dir, tmp_path):
    out = tmp_path / "out.json"
    argv = [
        sys.executable, str(SCRIPT), "--model-dir", str(tiny_model_dir), "--engines", engine,
        "--rows", "2", "--new-tokens", "2", "--calls", "1", "--concurrency", "1,2",
        "--repeat", "1", "--rollout-repeat", "1", "--tool-ms", "5", "--tool-rounds", "2",
        "--out", str(out),
    ]  # fmt: skip
    # this checkout first: the venv's editable install may point at another one
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "(a) tool calls through execute" in proc.stdout
    assert f"(b) the agent loop on {engine}" in proc.stdout and "FAILED" not in proc.stdout
    # (c) only where the engine streams turns (vLLM's turn_stream; HF has none)
    assert ("(c) streamed vs batched turns on vllm" in proc.stdout) == (engine == "vllm")

    result = json.loads(out.read_text())
    calls = result["tool_calls"]
    assert [k for k in calls if k != "asyncio.run, no call (floor)"] == [
        "calculator 17*23",
        "code_interpreter print(1+1)",
        "wait 5 ms (thread)",
    ]
    for label, by_k in calls.items():
        assert list(by_k) == (["1"] if "floor" in label else ["1", "2"])  # JSON's keys
        assert all(r["calls"] >= int(k) for k, records in by_k.items() for r in records)

    (rollout,) = result["rollouts"]
    runs = rollout["runs"]
    batched = ["generate", "single-turn", "single-turn long", "tools 0 ms", "tools 5 ms"]
    batched += ["tools 0-10 ms", "tools 0-10 ms x2"]  # each row's own latency, 0..2 x 5 ms
    streamed = [f"{name} streamed" for name in ("single-turn", "tools 5 ms", *batched[-2:])]
    assert sorted(runs) == sorted(batched + (streamed if engine == "vllm" else []))
    assert sorted(rollout["spread_ms"]) == [0, 10]
    # two rounds, each dealing both latencies to the two rows
    assert [sorted(r) for r in zip(*rollout["round_ms"], strict=True)] == [[0, 10], [0, 10]]
    # every model turn is 2 tokens: 2 rows x 2 (the forced turns not counted), but 3 turns
    # a row with two rounds of calls
    for name, records in runs.items():
        assert {r["model_tokens"] for r in records} == {12 if "x2" in name else 4}, name
    # each tool row called the tool once a round; batched, each round of turns was one
    # generate (the forced first turns none); streamed, the engine was stepped (a step a
    # token at least), never one generate
    each = {"single-turn": (0, 1), "tools 0 ms": (2, 1), "tools 5 ms": (2, 1)}
    each |= {"tools 0-10 ms": (2, 1), "tools 0-10 ms x2": (4, 3)}
    for name, (tool_calls, generate_calls) in each.items():
        (record,) = runs[name]
        assert (record["tool_calls"], record["generate_calls"]) == (tool_calls, generate_calls)
        if f"{name} streamed" in runs:
            (record,) = runs[f"{name} streamed"]
            assert record["tool_calls"] == tool_calls and record["generate_calls"] >= 2
