"""The GPU proof's whole-engine run: ``python -m engine.main`` (Ray, the worker group, the
trainer) for a few GRPO steps on the proof's locally built model and the shipped synthetic
task, one device. Its step times and scores go into the proof's results.

Runs only where Ray imports (on the GPU machine it travels in ``.gpu-proof/``; see
``scripts/gpu_proof_pack.sh``); ``check_only`` validates the same overrides with
``--check`` instead (no torch, no Ray), which the dry mode's test does so that the keys
cannot rot between GPU runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def overrides(model_dir: Path, data_dir: Path, run_dir: Path, steps: int, dry: bool) -> list[str]:
    """GRPO on the synthetic sums: 16 prompts × 4 samples (dry: 4 × 2), responses of up to
    64 tokens, the planner-free settings a one-device run needs."""
    prompts, n = (4, 2) if dry else (16, 4)
    return [
        "algorithm.adv_estimator=grpo",
        f"actor_rollout_ref.model.path={model_dir}",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'val.parquet'}",
        "data.max_prompt_length=64",
        f"data.max_response_length={8 if dry else 64}",
        f"data.train_batch_size={prompts}",
        f"actor_rollout_ref.rollout.n={n}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={prompts * n}",
        "actor_rollout_ref.rollout.name=hf",
        f"trainer.device={'cpu' if dry else 'cuda'}",
        "trainer.n_gpus_per_node=1",
        f"trainer.total_training_steps={steps}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.logger=[console]",
        f"trainer.default_local_dir={run_dir}",
    ]


def engine_run(model_dir: Path, workdir: Path, steps: int, dry: bool, check_only: bool,
               timeout_s: float = 240) -> dict[str, Any]:  # fmt: skip
    """Run (or ``--check``) the engine; its outcome, step times and scores."""
    from engine.data.synthetic import write_synthetic_dataset

    data_dir, run_dir = workdir / "data", workdir / "run"
    if not (data_dir / "train.parquet").exists():
        write_synthetic_dataset(data_dir, n_train=256, n_val=16)
    args = overrides(model_dir, data_dir, run_dir, steps, dry)
    cmd = [sys.executable, "-m", "engine.main", *(["--check"] if check_only else []), *args]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env,
                              cwd=ROOT)  # fmt: skip
        code, out, err = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        code, out, err = (
            None,
            _text(exc.stdout),
            _text(exc.stderr) + f"\ntimed out after {timeout_s} s",
        )
    result: dict[str, Any] = {
        "command": "python -m engine.main " + " ".join(args),
        "check_only": check_only,
        "returncode": code,
        "wall_s": time.perf_counter() - start,
        "stdout_tail": out[-2000:],
        "stderr_tail": err[-3000:] if code != 0 else "",
    }
    metrics = run_dir / "metrics.jsonl"
    if not check_only and metrics.exists():
        records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
        steps_done = [r for r in records if "timing_s/step" in r]
        result["steps"] = [
            {k: r.get(k) for k in ("step", "timing_s/step", "timing_s/gen", "timing_s/update_actor",
                                   "critic/score/mean", "actor/grad_norm", "actor/pg_loss")}
            for r in steps_done
        ]  # fmt: skip
    return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data
