"""Time to the first step of the quickstart, milestone by milestone, this checkout
against another.

    python benchmarks/first_step.py --runs 5                    # this checkout alone
    python benchmarks/first_step.py --runs 5 --vs /tmp/before   # and another, interleaved
    python benchmarks/first_step.py --workers 1                 # trainer.n_gpus_per_node=1

Each run is ``scripts/quickstart.sh`` of a checkout (the tiny model, the synthetic data,
its overrides) for one step, in a fresh process with a fresh local Ray cluster, and
``startup_probe/sitecustomize.py`` first on ``PYTHONPATH``: it records, in the driver and
in Ray's worker processes, when each start-up milestone is reached, by wrapping the
functions that reach it (they exist, with the same meaning, before and after the
start-up work of issue 27, so both sides are measured alike). Every figure is seconds
from the moment the benchmark starts the process:

    imports     the driver's heavy imports done (its first tokenizer load starts)
    data        the driver's datasets read and checked
    ray         ray.init returned
    workers     the last worker process up (its WorkerHost made)
    models      the last rank's roles built (process group, model, tokenizer)
    validation  the validation before the first step done (the quickstart asks for it)
    first_step  the first training step starts; first_step_end: it ends
    exit        the process ended (a one-step run: the last validation, shutdown)
    cpu_s       CPU seconds the driver and every process under it (Ray's daemons and
                workers, the reward's processes) had spent at the first step: on a
                shared machine the steadiest figure

``--vs DIR`` runs a second checkout (``git worktree add /tmp/before <commit>``) in turn
with this one, A B B A A B ..., so that drift in the machine's load hits both alike, and
prints each milestone's median ratio this/that over the pairs with its range. The tiny
model and the data are built once, by this checkout, and both sides use them. Where the
engine logs its own milestones (``timing_s/startup/*``, measured from the process's start
as the kernel records it) they are printed too, as a check of the probe.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).resolve().parent / "startup_probe"
DRIVER_MILESTONES = ("imports", "data", "ray", "validation", "first_step", "first_step_end")
WORKER_MILESTONES = ("workers", "models")  # the last worker's
ORDER = (
    "imports",
    "data",
    "ray",
    "workers",
    "models",
    "validation",
    "first_step",
    "first_step_end",
    "exit",
    "cpu_s",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each checkout")
    parser.add_argument("--vs", help="another checkout of the project, run in turn with this")
    parser.add_argument("--workers", type=int, default=2, help="trainer.n_gpus_per_node")
    parser.add_argument("--workdir", help="where the model, data and runs go (kept)")
    parser.add_argument("--out", help="also write every run's milestones here, as JSON")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a run may take")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="first-step-"))
    prepare(workdir)
    sides = {"this": HERE} | ({"vs": Path(args.vs).resolve()} if args.vs else {})
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    same: list[bool] = []  # each pair: the same metrics (same seed, same data)
    print(machine(), flush=True)
    for i in range(args.runs):
        # A B, then B A: neither side always runs on the machine the other just warmed
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            figures = run_once(sides[side], workdir, f"{side}-{i}", args.workers, args.timeout)
            runs[side].append(figures)
            shown = " ".join(f"{k} {figures[k]:.1f}" for k in ORDER if k in figures)
            print(f"run {i + 1} {side}: {shown}", flush=True)
        if "vs" in sides:
            same.append(trained(workdir / f"this-{i}-run") == trained(workdir / f"vs-{i}-run"))
    print()
    print(report(runs, sides, args.workers))
    if same:
        print(
            f"\nthe same metrics (every step's, but timing_s/ and perf/) on both sides:"
            f" {sum(same)} of {len(same)} pairs"
        )
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "runs": runs}, indent=1))


def prepare(workdir: Path) -> None:
    """The quickstart's model and data, built once (quickstart.sh skips what exists)."""
    env = {**os.environ, "PYTHONPATH": str(HERE), "HF_HUB_OFFLINE": "1"}
    if not (workdir / "model" / "config.json").exists():
        subprocess.run(
            [sys.executable, "-m", "engine.models.tiny", str(workdir / "model")],
            env=env,
            check=True,
            capture_output=True,
        )
    if not (workdir / "data" / "train.parquet").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "engine.data.prepare",
                "synthetic",
                "--out",
                str(workdir / "data"),
            ],
            env=env,
            check=True,
            capture_output=True,
        )


def run_once(
    checkout: Path, workdir: Path, name: str, workers: int, timeout: float
) -> dict[str, float]:
    """One quickstart run of ``checkout`` for one step: its milestones, in seconds from
    the process's start (``engine_*``: the engine's own, where it logs them)."""
    marks = workdir / f"{name}.marks"
    marks.unlink(missing_ok=True)
    run_dir = workdir / f"{name}-run"
    shutil.rmtree(run_dir, ignore_errors=True)  # a run directory with a checkpoint resumes
    env = {
        **os.environ,
        "QUICKSTART_DIR": str(workdir),
        "PYTHONPATH": str(PROBE),  # the quickstart runs from its checkout's root
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "FIRST_STEP_PROBE": str(marks),
    }
    env.pop("RAY_ADDRESS", None)
    command = [
        str(checkout / "scripts" / "quickstart.sh"),
        "trainer.total_training_steps=1",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.default_local_dir={run_dir}",
    ]
    log = workdir / f"{name}.log"
    started = time.time()
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        code = process.wait(timeout=timeout)
    ended = time.time()
    if code != 0:
        raise SystemExit(f"{name} failed with exit code {code}; see {log}")
    figures = milestones(marks.read_text(), process.pid, started)
    figures["exit"] = ended - started
    figures |= engine_milestones(run_dir)
    return figures


def trained(run_dir: Path) -> list[dict]:
    """What the run computed, step by step (the validation before it, the step, the
    validation after it), without what the machine decides (times, throughput, memory)."""
    from engine.loop.metrics import MACHINE_METRICS

    path = run_dir / "metrics.jsonl"
    return [
        {k: v for k, v in json.loads(line).items() if not k.startswith(MACHINE_METRICS)}
        for line in path.read_text().splitlines()
    ]


def milestones(text: str, driver_pid: int, started: float) -> dict[str, float]:
    """The probe's lines: each driver milestone's first time, each worker milestone's
    last worker's (the first time in each worker process)."""
    first: dict[tuple[int, str], float] = {}
    figures = {}
    for line in text.splitlines():
        at, pid, milestone, *value = line.split()
        if value:  # cpu_s: the CPU seconds the whole process tree spent to the first step
            figures[milestone] = float(value[0])
            continue
        first.setdefault((int(pid), milestone), float(at))
    for milestone in DRIVER_MILESTONES:
        if (driver_pid, milestone) in first:
            figures[milestone] = first[(driver_pid, milestone)] - started
    for milestone in WORKER_MILESTONES:
        times = [t for (pid, m), t in first.items() if m == milestone and pid != driver_pid]
        if times:
            figures[milestone] = max(times) - started
    return figures


def engine_milestones(run_dir: Path) -> dict[str, float]:
    """``timing_s/startup/*`` of the first step's record, where the engine logs them."""
    path = run_dir / "metrics.jsonl"
    prefix = "timing_s/startup/"
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        found = {f"engine_{k[len(prefix) :]}": v for k, v in record.items() if k.startswith(prefix)}
        if found:
            return found
    return {}


def report(runs: dict[str, list[dict[str, float]]], sides: dict[str, Path], workers: int) -> str:
    lines = [
        f"quickstart, {workers} worker(s), one step; seconds from the process's start;"
        f" {len(runs['this'])} runs of each: median (min-max)",
        "",
    ]
    header = "| milestone | " + " | ".join(f"{s} ({sides[s]})" for s in sides)
    if "vs" in sides:
        header += " | this/vs: median (min-max) of the pairs"
    lines += [header + " |", "|" + " --- |" * (header.count("|"))]
    names = [m for m in ORDER if any(m in r for r in runs["this"])]
    names += sorted({k for r in runs["this"] for k in r if k.startswith("engine_")})
    for name in names:
        row = [name]
        for side in sides:
            values = [r[name] for r in runs[side] if name in r]
            row.append(spread(values) if values else "-")
        if "vs" in sides:
            ratios = [
                a[name] / b[name]
                for a, b in zip(runs["this"], runs["vs"], strict=True)
                if name in a and name in b
            ]
            row.append(spread(ratios, digits=2) if ratios else "-")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def spread(values: list[float], digits: int = 1) -> str:
    return (
        f"{statistics.median(values):.{digits}f}"
        f" ({min(values):.{digits}f}-{max(values):.{digits}f})"
    )


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())},"
        f" load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
