"""Tool calls and the agent loop: how fast tools run, and what they cost a rollout.

(a) Tool calls per second through ``engine.agents.tools.execute``: the calculator, the
    sandboxed code interpreter (``print(1+1)``) and a tool that sleeps a fixed time in
    its thread, each run one call at a time and with 8 and 32 calls in flight; the
    speed-up over one at a time.
(b) Generated tokens per second of the agent loop (``AgentRunner``) on a rollout engine
    (the HF rollout, and vLLM's CPU build when installed), each engine in a process of
    its own, for the same prompts and sampling: the engine's ``generate`` alone,
    single-turn rows, and rows whose first turn is a tool call (forced: a random tiny
    model never writes one; see agent_bench/forced.py) to a tool of 0 ms, of
    ``--tool-ms``, and of each row's own latency (0..2 x ``--tool-ms``, from the row's
    ``extra_info.tools_kwargs``), and rows of ``--tool-rounds`` rounds of a model turn
    and a call of such latencies (a loop of the benchmark's own). The tool phase's wall
    time is set beside the calls' latencies added up: the calls of all rows overlap.
(c) On an engine that streams turns (vLLM's ``turn_stream``), the same rows, loop and
    sampling with the driver's two paths side by side: batched (one ``generate`` per
    round of turns, after the round's slowest call) and streamed (each turn submitted as
    its loop asks: a row whose tool answered goes on while slower ones wait); wall time
    per rollout, tokens per second, and streamed over batched within each round.

    python benchmarks/agent_tools.py                    # (a) 5 rounds, (b) HF and vLLM, 10
    python benchmarks/agent_tools.py --engines hf --rollout-repeat 20 --rows 64
    python benchmarks/agent_tools.py --model-dir /tmp/tiny    # reuse a built tiny model

The model is the tiny Qwen2 of ``engine.models.tiny`` (built at start unless
``--model-dir``), float32 on the CPU. Every measurement is repeated in rounds,
interleaved, after one round not counted (``--repeat`` rounds of (a), ``--rollout-repeat``
of (b) and (c), which run together); ratios are taken between the best rounds and within
each round.
Parts: benchmarks/agent_bench/.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_bench.config import REPO, child_env

ENGINES = ("hf", "vllm")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=32, help="trajectories in the batch (b, c)")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per model turn (b, c)")
    parser.add_argument(
        "--tool-ms", type=int, default=50, help="the slow tool's latency, mean of the spread (a-c)"
    )
    parser.add_argument(
        "--tool-rounds",
        type=int,
        default=3,
        help="tool rounds of the several-round rows (b, c; below 2: none)",
    )
    parser.add_argument("--calls", type=int, default=16, help="least calls per measurement (a)")
    parser.add_argument(
        "--concurrency", default="1,8,32", help="calls in flight, comma-separated (a)"
    )
    parser.add_argument("--repeat", type=int, default=5, help="rounds of (a)")
    parser.add_argument(
        "--rollout-repeat",
        type=int,
        default=10,
        help="rounds of (b) and (c) (a round takes seconds)",
    )
    parser.add_argument(
        "--engines", default=",".join(ENGINES), help="rollout engines for (b, c); '' for none"
    )
    parser.add_argument("--model-dir", help="a tiny model built by engine.models.tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--threads", type=int, help="torch threads in (b) (default: torch's, one a core)"
    )
    parser.add_argument("--out", type=Path, help="also write every measurement as JSON")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.concurrency = [int(k) for k in args.concurrency.split(",")]
    args.engines = [e for e in args.engines.split(",") if e]
    counts = (args.rows, args.new_tokens, args.calls, args.repeat, args.rollout_repeat)
    if min(*counts, *args.concurrency) < 1 or (args.threads is not None and args.threads < 1):
        parser.error("every count (--rows ... --rollout-repeat, --concurrency, --threads) >= 1")
    if args.tool_ms < 0 or args.tool_rounds < 0 or set(args.engines) - set(ENGINES):
        parser.error(f"--tool-ms, --tool-rounds >= 0; --engines from {', '.join(ENGINES)}")
    return args


def run_engine(args: argparse.Namespace, engine: str, workdir: Path) -> dict[str, Any]:
    """Part (b) for one engine in its own process (vLLM's CPU build takes over the
    process's torch threads and torch.distributed); its failure is reported, not fatal."""
    out = workdir / f"{engine}.json"
    argv = [
        sys.executable, str(Path(__file__).resolve()), "--child", engine, "--child-out", str(out),
        "--model-dir", args.model_dir, "--rows", str(args.rows),
        "--new-tokens", str(args.new_tokens), "--tool-ms", str(args.tool_ms),
        "--tool-rounds", str(args.tool_rounds),
        "--rollout-repeat", str(args.rollout_repeat), "--seed", str(args.seed),
        *(["--threads", str(args.threads)] if args.threads else []),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(
        argv, cwd=REPO, env=child_env(args.threads), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"engine": engine, "error": f"exit code {proc.returncode}: {tail[0]}"}
    result = json.loads(out.read_text())
    result["process_s"] = time.perf_counter() - start
    return result


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))  # this checkout's engine, before any installed copy
    if args.child:
        from agent_bench.rollout_run import child

        child(args)
        return
    from agent_bench import report, tool_calls

    with tempfile.TemporaryDirectory(prefix="agent-bench-") as tmp:
        workdir = Path(tmp)
        if not args.model_dir:
            from engine.models.tiny import build_tiny_model

            print("building the tiny model ...", file=sys.stderr, flush=True)
            args.model_dir = str(build_tiny_model(workdir / "model", seed=args.seed))
        print("(a) tool calls ...", file=sys.stderr, flush=True)
        calls = tool_calls.run(args.calls, args.tool_ms, args.concurrency, args.repeat)
        rollouts = []
        for engine in args.engines:
            print(f"(b) the agent loop on {engine} ...", file=sys.stderr, flush=True)
            rollouts.append(run_engine(args, engine, workdir))
    info = report.machine()
    print(report.machine_line(info))
    print(
        f"setup: (a) at least {args.calls} calls and 0.2 s per measurement, {args.repeat}"
        f" rounds; (b) {args.rows} rows x {args.new_tokens} new tokens a model turn, T=1.0,"
        f" ignore_eos, tool latency {args.tool_ms} ms (spread: 0-{2 * args.tool_ms} ms a row),"
        f" x{args.tool_rounds}: {args.tool_rounds} calls a row, a model turn before and after"
        f" each; {args.rollout_repeat} rounds; tiny"
        f" Qwen2 (engine.models.tiny, seed {args.seed}), float32 CPU"
    )
    print(f"\n(a) tool calls through execute ({args.repeat} rounds)")
    print("\n".join(report.tool_table(calls)))
    for result in rollouts:
        if "error" in result:
            print(f"\n(b) {result['engine']}: FAILED: {result['error']}")
            continue
        prompt = result["prompt_tokens"]
        print(
            f"\n(b) the agent loop on {result['engine']} ({args.rollout_repeat} rounds; engine"
            f" start {result['engine_start_s']:.1f} s, process {result['process_s']:.0f} s, torch"
            f" threads {result['torch_threads']}, prompts {min(prompt)}-{max(prompt)} tokens,"
            f" forced call {result['forced_tokens']} tokens)"
        )
        print("\n".join(report.rollout_table(result["runs"])))
        if any(name.endswith(report.STREAMED) for name in result["runs"]):
            spread = result["spread_ms"]
            print(
                f"\n(c) streamed vs batched turns on {result['engine']} ({args.rollout_repeat}"
                f" rounds, each pair run back to back, the order reversed every other round;"
                f" tools 0-{2 * args.tool_ms} ms: rows' latencies {min(spread)}-{max(spread)} ms,"
                f" mean {sum(spread) / len(spread):.0f} ms)"
            )
            print("\n".join(report.stream_table(result["runs"])))
    print("\n" + report.NOTES)
    if args.out:
        payload = {"machine": info, "args": vars(args), "tool_calls": calls, "rollouts": rollouts}
        args.out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    main()
