"""Synchronous colocated vs the rollout on its own worker: synchronous, one step off and
fully asynchronous.

Issue 18's comparison, on this machine's 2 cores: the same model, task, batch and
number of steps, each mode in its own process (``python -m engine.main``), the modes
interleaved round by round so that a noisy neighbour hits each alike:

- ``colocated``: two workers, each generating and training half the batch (the default);
- ``separate-sync``: one worker trains, one generates, taking turns (weights pushed over
  the bridge after every update);
- ``one-step-off``: the same two workers, the next batch generated while this one
  trains (``async_training.mode=one_step_off``): π_old from a pass of its own (the
  proximal policy), TIS against the sampler;
- ``one-step-bypass``: the same, with the sampler's own log-probs as π_old (verl's bypass
  mode): no π_old pass;
- ``fully-async``: the rollout generating without stopping, batches from the samples that
  finished (``async_training.mode=fully_async``, staleness threshold 1, partial
  rollouts), bypass mode; ``fully-async-0.5``: the same with threshold 0.5.

Printed per mode: seconds per step (median over the run's steps after the first), samples
per second, and the training time (the steps' own seconds, summed: start-up excluded) at
which the score's 5-step mean first reaches the target, 90% of the colocated run's final
5-step mean; then each mode's ratios to ``colocated``.

    .venv/bin/python benchmarks/async_modes.py --steps 40 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEPARATE = [
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
]
MODES = {
    "colocated": ["trainer.n_gpus_per_node=2"],
    "separate-sync": SEPARATE,
    "one-step-off": [
        *SEPARATE,
        "async_training.mode=one_step_off",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
    ],
    "one-step-bypass": [
        *SEPARATE,
        "async_training.mode=one_step_off",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
    ],
    "fully-async": [
        *SEPARATE,
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=1",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
    ],
    "fully-async-0.5": [
        *SEPARATE,
        "async_training.mode=fully_async",
        "async_training.staleness_threshold=0.5",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
    ],
}
WINDOW = 5  # steps in the score's moving mean


def run_mode(name: str, args: argparse.Namespace, model: Path, data: Path, out: Path) -> dict:
    run_dir = out / name
    overrides = [
        "trainer.device=cpu",
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={data / 'train.parquet'}",
        "algorithm.adv_estimator=grpo",
        "data.max_prompt_length=64",
        f"data.max_response_length={args.response_length}",
        f"data.train_batch_size={args.prompts}",
        f"actor_rollout_ref.rollout.n={args.n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.optim.lr=2e-3",
        "reward_model.num_workers=1",
        "trainer.val_before_train=false",
        f"trainer.total_training_steps={args.steps}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        *MODES[name],
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "engine.main", *overrides],
        capture_output=True, text=True, env=env, timeout=3600,
    )  # fmt: skip
    process_s = time.perf_counter() - start
    if result.returncode != 0:
        return {"mode": name, "failed": result.stderr[-1500:]}
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    records = [r for r in records if "critic/score/mean" in r]
    steps = [r["timing_s/step"] for r in records]
    return {
        "mode": name,
        "process_s": process_s,
        "step_s": steps,
        "scores": [r["critic/score/mean"] for r in records],
        "samples": args.prompts * args.n,
    }


def time_to(scores: list[float], steps: list[float], target: float) -> float | None:
    """Training seconds until the score's moving mean first reaches ``target``."""
    elapsed = 0.0
    for i, seconds in enumerate(steps):
        elapsed += seconds
        window = scores[max(0, i - WINDOW + 1) : i + 1]
        if len(window) == WINDOW and sum(window) / WINDOW >= target:
            return elapsed
    return None


def report(runs: list[dict]) -> str:
    lines = []
    by_mode: dict[str, list[dict]] = {}
    for r in runs:
        by_mode.setdefault(r["mode"], []).append(r)
    base = [r for r in by_mode.get("colocated", []) if "failed" not in r]
    if not base:
        return "colocated failed: no baseline\n" + json.dumps(runs)[:3000]
    final = statistics.median(sum(r["scores"][-WINDOW:]) / WINDOW for r in base)
    target = 0.9 * final
    lines.append(
        f"target score (90% of colocated's final {WINDOW}-step mean {final:.4f}): {target:.4f}"
    )
    summary = {}
    for mode, rs in by_mode.items():
        for i, r in enumerate(rs):
            if "failed" in r:
                lines.append(f"{mode} round {i + 1}: FAILED\n{r['failed']}")
                continue
            step = statistics.median(r["step_s"][1:])
            reach = time_to(r["scores"], r["step_s"], target)
            summary.setdefault(mode, []).append((step, r["samples"] / step, reach))
            lines.append(
                f"{mode:14s} round {i + 1}: {step:.3f} s/step, {r['samples'] / step:.1f}"
                f" samples/s, target reached after {'-' if reach is None else f'{reach:.1f} s'}"
                f" of training (process {r['process_s']:.0f} s; final {WINDOW}-step mean"
                f" {sum(r['scores'][-WINDOW:]) / WINDOW:.4f})"
            )
    lines.append(
        "ratios to colocated, round by round (samples/s; time to target, lower is better):"
    )
    for mode, rows in summary.items():
        pairs = []
        for (_, rate, reach), (_, base_rate, base_reach) in zip(
            rows, summary["colocated"], strict=False
        ):
            when = "-" if reach is None or base_reach is None else f"{reach / base_reach:.2f}x"
            pairs.append(f"{rate / base_rate:.2f}x / {when}")
        lines.append(f"  {mode:14s} " + ", ".join(pairs))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--response-length", type=int, default=8)
    parser.add_argument("--modes", nargs="*", default=list(MODES))
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from engine.data.synthetic import write_synthetic_dataset
    from engine.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        build_tiny_model(root / "model")
        write_synthetic_dataset(root / "data", n_train=2048, n_val=32)
        runs = []
        for round_ in range(args.rounds):
            for mode in args.modes:
                print(f"round {round_ + 1}: {mode} ...", flush=True)
                runs.append(
                    run_mode(mode, args, root / "model", root / "data", root / f"r{round_}")
                )
        print(f"\n{args.prompts} prompts x {args.n} samples, {args.response_length} new tokens,"
              f" {args.steps} steps; machine: {os.cpu_count()} cores")  # fmt: skip
        print(report(runs))


if __name__ == "__main__":
    main()
