"""scripts/gpu_proof.sh in its dry mode (CPU, gloo, small shapes, the same code paths as on
a GPU), so that the proof cannot rot between the rare runs on a GPU machine: every case
runs the engine's worker code and reports its phases beside the planner's estimate, the
variants agree on π_old, LoRA trains the adapter alone, and the whole-engine run's
overrides pass the engine's checks."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]

pytestmark = pytest.mark.slow


def test_the_gpu_proof_runs_dry_on_cpu(tmp_path):
    # this checkout first: the venv's editable install may point at another one
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "GPU_PROOF_OUT": str(tmp_path)}
    proc = subprocess.run(
        ["bash", str(REPO / "scripts/gpu_proof.sh"), "--dry", "--engine-check-only",
         "--workdir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (report,) = tmp_path.glob("gpu_proof-*-dry.txt")
    results = json.loads(report.with_suffix(".json").read_text())
    assert report.read_text().startswith("cpu (dry mode), torch ")

    cases = {c["variant"]: c for c in results["cases"]}
    assert sorted(cases) == ["base", "fused", "lora", "packed"]
    for name, case in cases.items():
        assert "error" not in case, case.get("error")
        phases = case["phases"]
        assert {"log_probs", "update"} <= set(phases)
        update = phases["update"]
        assert update["weights_changed"], name  # the optimizer step landed
        assert all(g > 0 for g in update["grad_norm"])
        assert update["tokens"] > 0 and update["tokens_per_s"] > 0
        # beside each peak, the planner's estimate of the same configuration
        assert update["plan_gib"] > 0 and case["plan"]["train_peak_gib"] == update["plan_gib"]
    # generation runs where it differs (the adapter's), at full length (ignore_eos)
    shape = results["shape"]
    for name in ("base", "lora"):
        generate = cases[name]["phases"]["generate"]
        assert generate["tokens"] == shape["prompts"] * shape["n"] * shape["response_len"]
        assert generate["plan_gib"] == cases[name]["plan"]["rollout_peak_gib"]
    # the same samples and weights: the fused head, packed rows and a fresh adapter (B = 0)
    # give the base case's π_old and, on the same advantages, its gradient
    base_norm = cases["base"]["phases"]["update"]["grad_norm"][0]
    for name in ("fused", "packed"):
        assert cases[name]["logp_max_abs_diff_vs_first"] < 1e-5
        assert cases[name]["phases"]["update"]["grad_norm"][0] == pytest.approx(base_norm, rel=1e-4)
    assert cases["lora"]["logp_max_abs_diff_vs_first"] < 1e-5
    # LoRA trains the adapter alone
    assert cases["lora"]["trainable_params"] < cases["base"]["trainable_params"] / 2
    # the whole engine's run: its overrides checked by the engine (no Ray run here)
    engine = results["engine"]
    assert engine["check_only"] and engine["returncode"] == 0, engine["stderr_tail"]
    assert "config ok: grpo advantages" in engine["stdout_tail"]
