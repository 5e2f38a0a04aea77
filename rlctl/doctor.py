"""``rlctl doctor RECIPE``: the pre-flight checks that can be made from this machine, in
seconds, before anything is launched or recorded (docs/quickstart.md#before-a-long-run).

From here: the recipe and its plan; the image's vLLM (or SGLang) release, read from an
image tag that names it, against the engine's supported range; the recipe's secrets set
in this environment; the checkpoint bucket written, read back and cleaned; and for the
local backend, where this machine is the node, the node's own checks (``python -m
engine.doctor``: installed versions, devices of the planned kind and count, disk for the
checkpoints, the model's config). Every job runs the node checks again on each of its
nodes before the engine starts (rlctl/job/preflight.py: the job script runs ``engine.doctor``
there, with an all-reduce over the nodes).
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlctl.errors import RlctlError
from rlctl.job.preflight import checkpoint_gib

if TYPE_CHECKING:
    from rlctl.job.prepared import Prepared

# Release images that name their engine's version in the tag.
_IMAGE_VERSIONS = {
    "vllm": re.compile(r"(?:^|/)vllm[-/]openai(?:-rocm)?:v?(\d+\.\d+(?:\.\d+)?)"),
    "sglang": re.compile(r"(?:^|/)sglang:v?(\d+\.\d+(?:\.\d+)?)"),
}


@dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    message: str

    def line(self) -> str:
        return f"{'ok' if self.ok else 'FAILED':6} {self.check}: {self.message}"


def image_finding(image: str, rollout: str) -> Finding:
    """The image's engine release, where its tag names it, against the supported range."""
    from engine.schema import SUPPORTED, version_tuple

    pattern = _IMAGE_VERSIONS.get(rollout)
    found = pattern.search(image) if pattern else None
    if found is None:
        return Finding("image", True, f"{image}: its {rollout} version is checked on the nodes")
    version, spec = found.group(1), SUPPORTED[rollout]
    if version_tuple(spec.minimum) <= version_tuple(version) < version_tuple(spec.below):
        return Finding("image", True, f"{image}: {rollout} {version} in {spec.range}")
    return Finding(
        "image",
        False,
        f"{image} has {rollout} {version}, outside the supported range {spec.range}: use"
        f" {rollout} {spec.pinned}'s image (leave `image:` out for the plan's default) or"
        " one with a release in the range",
    )


def doctor(ref: str, backend: str = "local", **backend_options: Any) -> list[Finding]:
    """Every check from here; a failure never stops the others."""
    from rlctl import api
    from rlctl.recipe.load import load_recipe

    try:
        recipe = load_recipe(api.find_recipe(ref))
        prepared = api.prepare(recipe, backend, job_id="doctor", **backend_options)
    except RlctlError as error:
        fix = f" (fix: {error.hint})" if error.hint else ""
        return [Finding("recipe", False, f"{error}{fix}")]
    plan = prepared.plan
    where = f"{plan.nodes} node(s) × {plan.devices_per_node} {plan.accelerator or 'CPU'}"
    findings = [Finding("recipe", True, f"{recipe.name} plans onto {where}")]
    if plan.accelerator is not None:
        image = recipe.image or prepared.spec.image.ref
        findings.append(image_finding(image, recipe.rollout))
    findings.append(_secrets(recipe.secrets))
    if recipe.checkpoints and "://" in recipe.checkpoints:
        findings.append(_bucket(recipe.checkpoints))
    if backend == "local":
        findings += _this_node(prepared)
    return findings


def _secrets(names: tuple[str, ...]) -> Finding:
    from engine.schema import check_secrets

    problems = check_secrets(list(names))
    if problems:
        return Finding("secrets", False, problems[0].message)
    return Finding("secrets", True, f"set: {', '.join(names)}" if names else "none asked for")


def _bucket(root: str) -> Finding:
    from engine.schema import check_bucket

    problems = check_bucket(root)
    if problems:
        return Finding("bucket", False, problems[0].message)
    return Finding("bucket", True, f"{root}: written, read back and cleaned up from here")


def _this_node(prepared: Prepared) -> list[Finding]:
    """The node's checks (``engine.doctor``) on this machine, in the engine's Python."""
    plan, recipe, spec = prepared.plan, prepared.recipe, prepared.spec
    kind = "cpu"
    if plan.accelerator is not None:
        from rlctl.hardware import get_accelerator

        kind = get_accelerator(plan.accelerator).torch_device
    args = [
        f"--devices={kind}:{plan.devices_per_node}",
        f"--disk={spec.paths.root}:{checkpoint_gib(plan.model.num_params):.2f}",
        f"--model={recipe.model}",
        "--node=this machine",
    ]
    if recipe.rollout != "hf":
        args.append(f"--rollout={recipe.rollout}")
    if recipe.model.startswith("rlctl:"):  # built where the job runs: no config yet
        args = [a for a in args if not a.startswith("--model")]
    done = subprocess.run(
        [sys.executable, "-m", "engine.doctor", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**_quiet_env(), "HF_HUB_OFFLINE": "1"},
    )
    checks = [
        (line.split(": ", 3)[2], line.split(": ", 3)[3])
        for line in done.stderr.splitlines()
        if line.startswith("doctor: FAILED ")
    ]
    if done.returncode not in (0, 2) or (done.returncode == 2 and not checks):
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return [Finding("node", False, f"engine.doctor failed here: {' / '.join(tail)}")]
    if not checks:
        return [Finding("node", True, "this machine: versions, devices, disk and model config")]
    return [Finding(check, False, f"this machine: {message}") for check, message in checks]


def _quiet_env() -> dict[str, str]:
    import os

    return {**os.environ, "TORCH_CPP_LOG_LEVEL": "FATAL"}
