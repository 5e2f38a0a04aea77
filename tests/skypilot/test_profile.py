"""The site profile (<RLCTL_HOME>/skypilot.yaml) and the run section's CPU count: what
the real launch on SkyPilot's Slurm infra needed (test_sky_slurm_e2e.py)."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from rlctl.api import bundled_recipes, plan_recipe
from rlctl.backends.skypilot import RAY_TOKEN, SkyPilotBackend, SkyPilotOptions
from rlctl.backends.skypilot_profile import NodeSoftware, for_infra, load_profile
from rlctl.errors import RlctlError
from rlctl.job.spec import build_spec

sky = pytest.importorskip("sky", reason="skypilot is not installed: pip install 'rlctl[skypilot]'")
RECIPES = {r.name: r for r in bundled_recipes()}
PRELUDE = "source /shared/envs/rl/bin/activate"


def _config(cloud, profile, recipe="quickstart"):
    backend = SkyPilotBackend(SkyPilotOptions(cloud=cloud), profile=profile)
    spec = build_spec(
        RECIPES[recipe],
        plan_recipe(RECIPES[recipe]),
        backend.paths("j", RECIPES[recipe].checkpoints),
    )
    return backend.build_task("j", spec).to_yaml_config()


def test_profile_file_sets_image_and_prelude_for_its_infra(tmp_path, monkeypatch):
    (tmp_path / "skypilot.yaml").write_text(
        yaml.safe_dump(
            {
                "slurm": {"prelude": ["module load cuda"]},
                "slurm/my-cluster": {"image": "none", "prelude": [PRELUDE]},
                "k8s": {"image": "registry.example.com/rl:1"},
            }
        )
    )
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    config = (
        SkyPilotBackend(SkyPilotOptions(cloud="slurm/my-cluster"))
        .build_task("j", _spec_for("slurm/my-cluster"))
        .to_yaml_config()
    )
    assert "image_id" not in config["resources"]  # the nodes' own software
    for section in ("setup", "run"):  # first, before anything needs Python or Ray
        assert PRELUDE in config[section]
        assert config[section].index(PRELUDE) < config[section].index("mkdir -p")
    assert "module load cuda" not in config["run"]  # the more specific entry wins
    task = sky.Task.from_yaml_config(config, secrets_overrides=[(RAY_TOKEN, "t")])
    assert all(r.image_id is None for r in task.resources)

    on_k8s = _config("k8s/my-context", load_profile())
    assert on_k8s["resources"]["image_id"] == "docker:registry.example.com/rl:1"
    on_other = _config("slurm/other", load_profile())  # the "slurm" entry: prelude, image
    assert "module load cuda" in on_other["run"]
    assert on_other["resources"]["image_id"] == "docker:vllm/vllm-openai:v0.33.0"


def _spec_for(cloud):
    backend = SkyPilotBackend(SkyPilotOptions(cloud=cloud), profile={})
    recipe = RECIPES["quickstart"]
    return build_spec(recipe, plan_recipe(recipe), backend.paths("j", recipe.checkpoints))


def test_no_profile_keeps_the_plans_public_image():
    for cloud in ("gcp", "slurm/x", None):
        config = _config(cloud, {}, recipe="grpo-qwen05b-gsm8k")
        assert config["resources"]["image_id"] == "docker:vllm/vllm-openai:v0.33.0"
        assert "# the site's prelude (<RLCTL_HOME>" not in config["run"]
    assert for_infra({"slurm": NodeSoftware(image="none")}, None) == NodeSoftware()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slurm: {imgae: none}", "unknown field 'imgae'"),
        ("slurm: {prelude: 3}", "prelude must be a list"),
        ("slurm: [a]", "settings are a mapping"),
        ("- slurm", "a mapping of infra"),
        ("slurm: {image: 'a b'}", "is not a container image name"),
        ("slurm: {image: '--help'}", "is not a container image name"),
        ("slurm: {image: 'a''b\"c'}", "is not a container image name"),
        ("'gcp/us-central1; rm -rf x': {image: none}", "is not a gcp region"),
        ("slurm: {image: a}\nslurm: {image: b}", "appears twice in one mapping, at lines 1 and 2"),
        ("gpc: {image: none}", "unknown cloud 'gpc'"),
    ],
)
def test_bad_profile_says_what_is_wrong(tmp_path, text, message):
    path = tmp_path / "skypilot.yaml"
    path.write_text(text)
    with pytest.raises(RlctlError, match=message) as err:
        for_infra(load_profile(path), "slurm/x")
    if "imgae" in text:
        assert err.value.hint == "did you mean 'image'?"


def test_cpu_request_matches_the_workers():
    """cpu:N asks for N CPUs per node (at least 2): a 2-CPU node runs the quickstart."""
    assert _config("slurm/x", {})["resources"]["cpus"] == "2+"


def test_ray_gets_every_cpu_though_skypilot_sets_omp_num_threads(tmp_path):
    """SkyPilot runs the task with OMP_NUM_THREADS=1, which plain ``nproc`` honours: Ray
    got one CPU and the quickstart waited for its second worker (seen on Slurm)."""
    run = _config("slurm/x", {})["run"]
    line = next(line for line in run.splitlines() if line.startswith("cpus="))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_THREAD_LIMIT": "1"}
    env.pop("RLCTL_NUM_CPUS", None)
    out = subprocess.run(
        ["bash", "-c", f'{line}\necho "$cpus"'], env=env, capture_output=True, text=True
    )
    assert int(out.stdout) == len(os.sched_getaffinity(0))
