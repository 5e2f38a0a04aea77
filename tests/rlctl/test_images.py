"""The image a job's nodes run: public by default, pinned to the engine's tested releases,
overridable, and refused before launch when it could not be pulled."""

from __future__ import annotations

import pytest
import yaml

from engine.versions import SUPPORTED
from rlctl import api
from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
from rlctl.backends.skypilot_profile import NodeSoftware
from rlctl.backends.slurm import SlurmBackend, SlurmProfile
from rlctl.errors import RlctlError
from rlctl.hardware import ACCELERATORS, get_accelerator
from rlctl.job.spec import build_spec
from rlctl.planner import images
from rlctl.recipe.load import RecipeError, load_recipe, parse_recipe
from rlctl.recipe.values import check_image


@pytest.fixture(autouse=True)
def _private_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "home"))


def test_public_images_are_pinned_to_the_releases_the_engine_is_tested_against():
    assert SUPPORTED["vllm"].pinned == images.VLLM
    assert SUPPORTED["sglang"].pinned == images.SGLANG


@pytest.mark.parametrize(
    ("accelerator", "rollout", "ref", "public"),
    [
        ("H100", "vllm", f"vllm/vllm-openai:v{images.VLLM}", True),
        ("H100", "hf", f"vllm/vllm-openai:v{images.VLLM}", True),
        ("L4", "sglang", f"lmsysorg/sglang:v{images.SGLANG}", True),
        ("MI300X", "vllm", f"vllm/vllm-openai-rocm:v{images.VLLM}", True),
        ("MI300X", "sglang", images.project_image("rocm-sglang"), False),
        ("Ascend910B", "vllm", images.project_image("ascend"), False),
        (None, "hf", f"vllm/vllm-openai:v{images.VLLM}", True),  # a CPU job on a cloud
    ],
)
def test_the_default_image_per_vendor_and_rollout(accelerator, rollout, ref, public):
    acc = get_accelerator(accelerator) if accelerator else None
    image = images.default_image(acc, rollout)
    assert (image.ref, image.public) == (ref, public)
    assert image.public or image.build  # not public: says what to do


@pytest.mark.parametrize("acc", ACCELERATORS, ids=lambda a: a.name)
def test_every_accelerator_and_rollout_has_an_image_that_passes_the_image_check(acc):
    for rollout in acc.rollout_backends:
        check_image(images.default_image(acc, rollout).ref, "catalog")


def test_a_private_default_is_refused_and_an_override_or_no_container_is_not():
    image = images.default_image(get_accelerator("Ascend910B"), "vllm")
    with pytest.raises(RlctlError, match="on no public registry") as err:
        image.check_pullable(f"docker:{image.ref}", "skypilot")
    assert "images/build.sh ascend" in err.value.hint and "image:" in err.value.hint
    image.check_pullable("registry.example.com/rl/ascend:1", "slurm")  # the user's own
    image.check_pullable(None, "slurm")  # no container: the nodes' own software
    public = images.default_image(get_accelerator("H100"), "vllm")
    public.check_pullable(public.ref, "skypilot")


ASCEND = {
    "name": "ascend-job",
    "algorithm": "grpo",
    "model": "Qwen/Qwen2.5-0.5B-Instruct",
    "data": {"prepare": "gsm8k"},
    "hardware": {"accelerators": "Ascend910B:8"},
}


def _spec(raw, backend):
    recipe = parse_recipe(raw)
    return build_spec(recipe, api.plan_recipe(recipe), backend.paths("job-1", recipe.checkpoints))


def test_slurm_in_a_container_refuses_the_private_default_before_anything_runs(tmp_path):
    backend = SlurmBackend(SlurmProfile(job_root=str(tmp_path / "jobs"), container="pyxis"))
    with pytest.raises(RlctlError, match=r"rlctl/engine:\S+-ascend is on no public registry"):
        backend.render("job-1", _spec(ASCEND, backend))
    assert not (tmp_path / "jobs").exists()
    # the recipe's image: wins over the default (and over the profile's)
    own = "registry.example.com/rl/ascend:1"
    files = backend.render("job-1", _spec({**ASCEND, "image": own}, backend)).files
    assert f"--container-image={own}" in files["job.sbatch"]
    # no container runtime: the image does not matter, the nodes' Python runs the job
    bare = SlurmBackend(SlurmProfile(job_root=str(tmp_path / "jobs")))
    assert "--container-image" not in bare.render("job-1", _spec(ASCEND, bare)).files["job.sbatch"]


def test_the_recipe_image_wins_over_the_site_profile_on_skypilot():
    gpu = {**ASCEND, "hardware": {"accelerators": "H100:8"}}
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"), profile={})
    backend.software = NodeSoftware(image="registry.example.com/site:1")
    site = backend.build_task("job-1", _spec(gpu, backend)).to_yaml_config()
    assert site["resources"]["image_id"] == "docker:registry.example.com/site:1"
    mine = backend.build_task(
        "job-1", _spec({**gpu, "image": "ghcr.io/me/rl:2"}, backend)
    ).to_yaml_config()
    assert mine["resources"]["image_id"] == "docker:ghcr.io/me/rl:2"


@pytest.mark.parametrize("value", ["--help", "a'b\"c", "x y", 3])
def test_a_recipe_image_that_is_not_an_image_name_is_refused_naming_the_field(tmp_path, value):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({**ASCEND, "image": value}))
    with pytest.raises(RecipeError, match=r"image: "):
        load_recipe(path)


def test_plan_says_which_image_and_what_the_setup_installs():
    gpu = parse_recipe({**ASCEND, "hardware": {"accelerators": "H100:8"}, "trainer": "megatron"})
    prepared = api.prepare(gpu, "skypilot", job_id="job-1", cloud="gcp")
    image, setup = prepared.software
    assert image == f"image: vllm/vllm-openai:v{images.VLLM}: {prepared.spec.image.contents}"
    assert "installs rlctl" in setup and "rlctl[engine,megatron]" in setup
    local = api.prepare(gpu, "local", job_id="job-1").software
    assert local[0].startswith("software: this Python (")
