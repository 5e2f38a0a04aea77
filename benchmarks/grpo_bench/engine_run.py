"""The engine (``python -m engine.main``) on the benchmark's configuration, with the HF
or the vLLM rollout, read back from its metrics.jsonl."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .config import REPO, Setup, StepRecord, child_env
from .contention import CpuSnapshot, other_cores, snapshot, tree_cpu_s

# The engine's per-step stages (timing_s/*) shown in the breakdown; what the step spends
# outside them is "other". The engine's "gen" timer includes "reward".
ENGINE_STAGES = ("gen", "reward", "old_log_prob", "adv", "update_actor")


def engine_overrides(
    setup: Setup, workers: int, cpus_per_worker: int, run_dir: Path, rollout: str = "hf"
) -> list[str]:
    per_device = setup.samples // workers  # samples each worker gets per mini-batch
    overrides = [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={setup.train_file}",
        f"data.train_batch_size={setup.prompts}",
        f"data.max_response_length={setup.max_new_tokens}",
        "data.shuffle=false",
        f"actor_rollout_ref.model.path={setup.model_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing="
        + str(setup.gradient_checkpointing).lower(),
        f"actor_rollout_ref.actor.ppo_mini_batch_size={setup.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_device}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.actor.optim.lr={setup.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={setup.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={setup.grad_clip}",
        f"actor_rollout_ref.rollout.n={setup.n}",
        f"actor_rollout_ref.rollout.temperature={setup.temperature}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_device}",
        "trainer.device=cpu",
        "trainer.val_before_train=false",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.cpus_per_worker={cpus_per_worker}",
        f"trainer.total_training_steps={setup.total_steps}",
        f"trainer.seed={setup.seed}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        "reward_model.num_workers=1",
    ]
    if rollout != "hf":
        # The same work as TRL's vLLM system: no second pass for the rollout's
        # log-probs (TRL's importance-sampling correction is off to match).
        overrides += [f"actor_rollout_ref.rollout.name={rollout}"]
    return overrides


def run_engine(
    setup: Setup, workers: int, cpus_per_worker: int, run_dir: Path, rollout: str = "hf"
) -> dict[str, Any]:
    """Run the engine to the end; read its per-step metrics from metrics.jsonl. The
    console's step lines are timestamped as they arrive: the intervals between them
    are the wall time of whole steps (controller bookkeeping and logging included)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    overrides = engine_overrides(setup, workers, cpus_per_worker, run_dir, rollout)
    cmd = [sys.executable, "-m", "engine.main", *overrides]
    vllm_path = setup.vllm_path if rollout == "vllm" else None
    start = time.perf_counter()
    arrivals: list[CpuSnapshot] = []
    log_lines: list[str] = []
    with subprocess.Popen(
        cmd,
        cwd=REPO,
        env=child_env(None, vllm_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_lines.append(line)
            if line.startswith("step "):
                arrivals.append(snapshot(tree_cpu_s(proc.pid)))
    if proc.returncode != 0:
        tail = "".join(log_lines[-30:])
        raise RuntimeError(f"the engine exited with code {proc.returncode}:\n{tail}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = []
    for i, record in enumerate(records):
        stages = {s: record.get(f"timing_s/{s}", 0.0) for s in ENGINE_STAGES}
        stages["gen"] -= stages["reward"]  # generation alone
        previous = arrivals[i - 1] if 0 < i < len(arrivals) else None
        steps.append(
            StepRecord(
                seconds=record["timing_s/step"],
                tokens=int(record["perf/total_num_tokens"]),
                stages=stages,
                response_length=record["response_length/mean"],
                wall_s=arrivals[i].t - previous.t if previous else None,
                other_cores=other_cores(previous, arrivals[i]) if previous else None,
            )
        )
    return {"steps": steps[setup.warmup :], "process_s": time.perf_counter() - start}
