"""The SkyPilot task rlctl renders: accepted by SkyPilot's own parser for every bundled
recipe on several clouds, refused by rlctl (with the reason) where it cannot run, and
never carrying a secret's value. The backend's SDK calls run against a stand-in for
the ``sky`` module (no cloud here); the task they get is SkyPilot's real ``Task``."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from engine.errors import EXIT_PREEMPTED
from rlctl.api import bundled_recipes, plan_recipe, prepare_for
from rlctl.backends.skypilot import (
    CHECKPOINT_MOUNT,
    RAY_TOKEN,
    SkyPilotBackend,
    SkyPilotOptions,
)
from rlctl.backends.skypilot_infra import CLOUD_ACCELERATORS, check_offered, parse_infra
from rlctl.errors import RlctlError
from rlctl.hardware import get_accelerator
from rlctl.job.spec import build_spec
from rlctl.job.wheel import local_wheel
from rlctl.recipe.load import RecipeError, parse_recipe
from rlctl.store.jobs import Job, JobState

sky = pytest.importorskip("sky", reason="skypilot is not installed: pip install 'rlctl[skypilot]'")

SENTINEL = "sentinel-secret-value-5c1e"
CLOUDS = ("gcp", "aws", "azure", "lambda", "runpod", "nebius", "k8s", "gcp/us-central1-a", None)
RECIPES = {r.name: r for r in bundled_recipes()}
# What rlctl must refuse among the bundled recipes, and why (the message says it).
REFUSED = {
    ("grpo-qwen3-8b-mi300x", cloud): "does not offer MI300X"
    for cloud in ("gcp", "aws", "azure", "lambda", "nebius", "gcp/us-central1-a")
} | {("grpo-qwen7b-ascend", cloud): "Ascend NPUs" for cloud in CLOUDS}


def _spec(recipe, backend, job_id="job-1"):
    return build_spec(recipe, plan_recipe(recipe), backend.paths(job_id, recipe.checkpoints))


def _plain(value):
    """SkyPilot keeps secret values wrapped (``SecretStr``)."""
    return value.get_secret_value() if hasattr(value, "get_secret_value") else value


def _secrets(spec):
    return {name: SENTINEL for name in spec.secrets}


@pytest.mark.parametrize("cloud", CLOUDS, ids=str)
@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_recipe_on_every_cloud_is_accepted_by_skypilot_or_refused(name, cloud):
    recipe = RECIPES[name]
    backend = SkyPilotBackend(SkyPilotOptions(cloud=cloud))
    spec = _spec(recipe, backend)
    if (name, cloud) in REFUSED:
        with pytest.raises(RlctlError, match=REFUSED[name, cloud]) as err:
            backend.render("job-1", spec)
        assert err.value.hint  # says what to do instead
        return
    rendered = backend.render("job-1", spec)
    files = rendered.files
    config = yaml.safe_load(files["task.yaml"])
    assert config == rendered.task.to_yaml_config()  # the YAML reads back exactly
    assert "\nrun: |" in files["task.yaml"]  # scripts as literal blocks
    task = backend.sky_task("job-1", spec, rendered.task, _secrets(spec))  # from_yaml_config
    plan = plan_recipe(recipe)
    assert task.num_nodes == plan.nodes
    resources = list(task.resources)
    if plan.accelerator:
        acc = get_accelerator(plan.accelerator)
        assert dict(resources[0].accelerators) == {acc.skypilot_name: plan.devices_per_node}
        assert all(r.image_id for r in resources)
        # the plan's public image, and the wheel of this rlctl that the setup installs
        assert spec.image.public
        assert f"docker:{spec.image.ref}" in json.dumps(config["resources"])
    wheel = local_wheel("job-1")
    assert config["file_mounts"][spec.paths.wheel] == str(wheel)
    assert wheel.is_file()  # built by task(), before SkyPilot reads the mount
    assert shlex.join(spec.install_command) in config["setup"]
    if cloud:
        assert config["resources"]["infra"].startswith(parse_infra(cloud).cloud)
    assert config["resources"]["job_recovery"]["strategy"] == "FAILOVER"
    assert set(config["secrets"]) == {*recipe.secrets, RAY_TOKEN}
    assert all(v is None for v in config["secrets"].values())
    assert _plain(task.secrets[RAY_TOKEN])
    assert all(_plain(task.secrets[n]) == SENTINEL for n in recipe.secrets)
    for text in files.values():
        assert SENTINEL not in text
    for script in ("setup.sh", "run.sh"):  # valid bash
        subprocess.run(["bash", "-n"], input=files[script], text=True, check=True)


def test_fallbacks_are_ordered_and_only_where_the_cloud_offers_them():
    recipe = RECIPES["ppo-qwen7b-gsm8k"]  # H100:8
    on_gcp = (
        SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
        .build_task("j", _spec(recipe, SkyPilotBackend()))
        .to_yaml_config()
    )
    assert on_gcp["resources"]["ordered"] == [
        {"accelerators": "H100:8"},
        {"accelerators": "H200:8"},
    ]
    # RunPod's catalog calls its H200 "H200-SXM": no fallback there.
    on_runpod = (
        SkyPilotBackend(SkyPilotOptions(cloud="runpod"))
        .build_task("j", _spec(recipe, SkyPilotBackend()))
        .to_yaml_config()
    )
    assert on_runpod["resources"]["accelerators"] == "H100:8"
    plain = (
        SkyPilotBackend(SkyPilotOptions(cloud="gcp", fallbacks=False))
        .build_task("j", _spec(recipe, SkyPilotBackend()))
        .to_yaml_config()
    )
    assert plain["resources"]["accelerators"] == "H100:8" and "ordered" not in plain["resources"]


def test_unknown_accelerator_is_refused_by_rlctl():
    raw = {
        "name": "x",
        "algorithm": "grpo",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "data": {"prepare": "gsm8k"},
        "hardware": {"accelerators": "H999:8"},
    }
    with pytest.raises(RecipeError, match="unknown accelerator 'H999'"):
        parse_recipe(raw)


@pytest.mark.parametrize(
    ("accelerator", "cloud", "message"),
    [
        ("MI300X", "lambda", "lambda does not offer MI300X"),
        ("Ascend910B", "gcp", "Ascend910B cannot run through SkyPilot"),
        ("Ascend910B", "k8s", "Ascend NPUs"),
        ("L40S", "gcp", "gcp does not offer L40S"),
        ("MI325X", "oci", "in no public cloud's SkyPilot catalog"),
        ("MI325X", None, "in no public cloud's SkyPilot catalog"),
    ],
)
def test_cloud_lacking_the_accelerator_is_refused(accelerator, cloud, message):
    with pytest.raises(RlctlError, match=message):
        check_offered(get_accelerator(accelerator), parse_infra(cloud))


def test_own_clusters_take_any_gpu():
    for cloud in ("k8s", "kubernetes/my-context", "slurm/mycluster"):
        check_offered(get_accelerator("MI325X"), parse_infra(cloud))
        check_offered(get_accelerator("H100"), parse_infra(cloud))


def test_table_names_only_accelerators_rlctl_knows():
    for names in CLOUD_ACCELERATORS.values():
        for name in names:
            assert get_accelerator(name).name == name


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("gcp", "gcp"),
        ("GCP/us-central1", "gcp/us-central1"),
        ("aws/us-east-1/us-east-1a", "aws/us-east-1/us-east-1a"),
        ("k8s", "kubernetes"),
        ("k8s/my-ctx", "kubernetes/my-ctx"),
        (None, None),
    ],
)
def test_infra(text, value):
    assert parse_infra(text).value == value


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("k8s/arn:aws:eks:us-west-2:123456789012:cluster/rl", "kubernetes/arn:aws:eks:us-west-2:123456789012:cluster/rl"),
        ("k8s/gke_proj_us-central1-a_rl", "kubernetes/gke_proj_us-central1-a_rl"),
        ("slurm/my-cluster/gpu", "slurm/my-cluster/gpu"),
    ],
)  # fmt: skip
def test_infra_names_as_sites_write_them(text, value):
    assert parse_infra(text).value == value


@pytest.mark.parametrize(
    "text",
    [
        "gcp/us-central1; rm -rf x",
        "gcp/$(touch pwned)",
        "gcp/us central1",
        "gcp/--help",
        "gcp/'q'",
        "gcp/a\nb",
        "aws/us-east-1/us-east-1a/extra",
        "gcp/a//b",
    ],
)
def test_region_text_is_checked_not_passed_verbatim(text):
    with pytest.raises(RlctlError, match=r"is not a (gcp|aws) region") as info:
        parse_infra(text)
    assert "e.g. gcp/us-central1" in info.value.hint


def test_unknown_cloud_suggests():
    with pytest.raises(RlctlError, match="did you mean 'gcp'"):
        parse_infra("gpc")


@pytest.mark.parametrize(
    ("url", "source", "engine_dir"),
    [
        ("s3://my-bucket/rlctl/run", "s3://my-bucket", f"{CHECKPOINT_MOUNT}/rlctl/run"),
        ("gs://b/x", "gs://b", f"{CHECKPOINT_MOUNT}/x"),
        ("r2://b", "r2://b", CHECKPOINT_MOUNT),
    ],
)
def test_checkpoint_bucket_is_mounted_and_the_engine_resumes_from_it(url, source, engine_dir):
    recipe = dataclasses.replace(RECIPES["ppo-qwen7b-gsm8k"], checkpoints=url)
    backend = SkyPilotBackend(SkyPilotOptions(cloud="aws"))
    spec = _spec(recipe, backend)
    config = backend.build_task("job-1", spec).to_yaml_config()
    assert config["file_mounts"][CHECKPOINT_MOUNT] == {"source": source, "mode": "MOUNT"}
    assert f"default_local_dir: {engine_dir}\n" in config["run"]
    assert "resume_mode: auto" in config["run"]
    task = sky.Task.from_yaml_config(config, secrets_overrides=[(RAY_TOKEN, "t")])
    assert CHECKPOINT_MOUNT in task.storage_mounts


@pytest.mark.parametrize(("restarts", "bucket"), [(0, False), (5, True)])
def test_managed_job_restarts_are_the_supervisors_and_skypilot_retries_nothing_else(
    restarts, bucket
):
    """One key for every backend, trainer.max_restarts, counted by the engine's
    supervisor, which exits 75 for each restart: SkyPilot recovers exit 75 and retries
    no other failure (a configuration error, a failed pre-flight), as its own parser
    reads the task. The record of the restarts sits beside the checkpoints: in the
    bucket when they are there, so that the count outlives the cluster."""
    base = RECIPES["grpo-qwen05b-gsm8k"]
    recipe = dataclasses.replace(
        base,
        engine={**base.engine, "trainer.max_restarts": restarts},
        checkpoints="s3://ckpt/runs/a" if bucket else None,
    )
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
    config = backend.build_task("job-1", _spec(recipe, backend)).to_yaml_config()
    recovery = {
        "strategy": "FAILOVER",
        "max_restarts_on_errors": 0,
        "recover_on_exit_codes": [EXIT_PREEMPTED],
    }
    assert config["resources"]["job_recovery"] == recovery
    supervisor = next(line for line in config["run"].splitlines() if "engine.supervisor" in line)
    assert f"--max-restarts {restarts} " in supervisor and "--hand-back 75 " in supervisor
    record = (
        f"{CHECKPOINT_MOUNT}/runs/a/restarts.json" if bucket else "/tmp/rlctl/job-1/restarts.json"
    )
    assert f"--record {record} " in supervisor
    task = sky.Task.from_yaml_config(config, secrets_overrides=[(RAY_TOKEN, "t")])
    assert all(r.job_recovery == recovery for r in task.resources)


def test_a_cluster_of_ones_own_restarts_the_engine_in_place():
    """``--cluster``: nothing recovers the job, so the supervisor restarts it itself."""
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp", cluster="mine"))
    config = backend.build_task("j", _spec(RECIPES["grpo-qwen05b-gsm8k"], backend)).to_yaml_config()
    supervisor = next(line for line in config["run"].splitlines() if "engine.supervisor" in line)
    assert "--hand-back" not in supervisor and "--max-restarts" in supervisor


def test_bucket_scheme_skypilot_cannot_mount_is_refused():
    recipe = dataclasses.replace(RECIPES["ppo-qwen7b-gsm8k"], checkpoints="hdfs://x/y")
    backend = SkyPilotBackend(SkyPilotOptions(cloud="aws"))
    with pytest.raises(RlctlError, match="not a bucket SkyPilot can mount"):
        backend.render("j", _spec(recipe, backend))


def test_spot_disk_ports_and_cluster_mode():
    recipe = RECIPES["grpo-qwen05b-gsm8k"]
    opts = SkyPilotOptions(
        cloud="gcp", use_spot=True, disk_size_gb=300, ports=(8265,), cluster="my-cluster"
    )
    config = (
        SkyPilotBackend(opts).build_task("j", _spec(recipe, SkyPilotBackend())).to_yaml_config()
    )
    res = config["resources"]
    assert (res["use_spot"], res["disk_size"], res["ports"]) == (True, 300, [8265])
    assert "job_recovery" not in res  # a cluster is not recovered: managed jobs are
    task = sky.Task.from_yaml_config(config, secrets_overrides=[(RAY_TOKEN, "t")])
    assert all(r.use_spot for r in task.resources)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"recovery": "SOMETIMES"},
        {"disk_size_gb": 10},
        {"cluster": "Bad_Name"},
        {"down": True},  # down without a cluster
    ],
)
def test_bad_options_are_refused(kwargs):
    with pytest.raises(RlctlError):
        SkyPilotOptions(**kwargs)


def test_ray_port_is_not_skypilots():
    recipe = RECIPES["dapo-qwen32b"]
    run = (
        SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
        .render("j", _spec(recipe, SkyPilotBackend()))
        .files["run.sh"]
    )
    assert "port=6379\n" in run
    assert "6380" not in run.replace("SkyPilot's Ray has 6380", "")
    assert 'address="auto"' not in run and "address=auto" not in run


# ---- the SDK calls, against a stand-in ``sky`` ---------------------------------


STREAM = ["line 1\nline", " 2\n", "last", None, "never"]  # tail_logs' chunks, by default


class FakeSky(types.ModuleType):
    """Records calls; returns what SkyPilot 0.14's SDK returns (request ids, then
    values from get/stream_and_get). ``Task`` is SkyPilot's real one."""

    def __init__(self):
        super().__init__("sky")
        self.Task = sky.Task
        self.calls: list[tuple[str, tuple, dict]] = []
        self.results: dict[str, object] = {}
        self.jobs = types.SimpleNamespace(
            launch=self._rec("jobs.launch"),
            queue_v2=self._rec("jobs.queue_v2"),
            cancel=self._rec("jobs.cancel"),
            tail_logs=self._logs("jobs.tail_logs"),
        )
        for name in ("launch", "job_status", "cancel", "down"):
            setattr(self, name, self._rec(name))
        self.tail_logs = self._logs("tail_logs")
        self.streams: dict[bool, list] = {}  # by controller=: what tail_logs streams

    def _rec(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            return f"request-{name}"

        return call

    def _logs(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if kwargs.get("output_stream") is not None and not kwargs.get("preload_content"):
                raise ValueError("output_stream cannot be specified when preload_content is False")
            return iter(self.streams.get(bool(kwargs.get("controller")), STREAM))

        return call

    def get(self, request):
        return self.results[request.removeprefix("request-")]

    stream_and_get = get


@pytest.fixture
def fake_sky(monkeypatch):
    fake = FakeSky()
    monkeypatch.setitem(sys.modules, "sky", fake)
    return fake


def _job(handle=None):
    return Job(
        id="dapo-qwen32b-abc123",
        name="dapo-qwen32b",
        recipe_path="recipes/dapo_qwen32b.yaml",
        recipe_yaml="",
        plan_json="{}",
        backend="skypilot",
        handle=handle or {},
        state=JobState.RUNNING,
        reason=None,
        exit_code=None,
        log_path=None,
        created_at=0.0,
        updated_at=0.0,
        started_at=None,
        ended_at=None,
    )


def test_managed_job_submit_status_logs_stop(fake_sky):
    recipe = RECIPES["dapo-qwen32b"]
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp", use_spot=True))
    prepared = prepare_for(recipe, backend, _job().id)
    fake_sky.results["jobs.launch"] = ([7], None)
    handle = backend.submit(_job(), prepared, {"WANDB_API_KEY": SENTINEL})
    assert handle["mode"] == "managed" and handle["job_id"] == 7
    assert SENTINEL not in json.dumps(handle)  # what the job store keeps
    name, args, kwargs = fake_sky.calls[0]
    assert name == "jobs.launch" and kwargs["name"] == "dapo-qwen32b-abc123"
    task = args[0]
    assert _plain(task.secrets["WANDB_API_KEY"]) == SENTINEL
    assert len(_plain(task.secrets[RAY_TOKEN])) == 32
    assert task.num_nodes == 16

    job = _job(handle)
    for status, state, reason in [
        ("STARTING", JobState.PROVISIONING, "starting"),
        ("RUNNING", JobState.RUNNING, None),
        ("RECOVERING", JobState.RUNNING, "recovering"),
        ("SUCCEEDED", JobState.SUCCEEDED, None),
        ("FAILED_NO_RESOURCE", JobState.FAILED, "no resources"),
        ("CANCELLED", JobState.CANCELLED, "cancelled"),
    ]:
        fake_sky.results["jobs.queue_v2"] = (
            [{"job_id": 7, "status": status, "failure_reason": None}],
            1,
            {},
            1,
        )
        seen = backend.status(job)
        assert seen.state is state
        assert (seen.reason is None) if reason is None else (reason in seen.reason)
    # SkyPilot's recovery count, in the reason
    fake_sky.results["jobs.queue_v2"] = (
        [{"job_id": 7, "status": "SUCCEEDED", "failure_reason": None, "recovery_count": 2}],
        1, {}, 1,
    )  # fmt: skip
    seen = backend.status(job)
    assert (seen.state, seen.reason) == (JobState.SUCCEEDED, "recovered 2 times")
    fake_sky.results["jobs.queue_v2"] = ([], 0, {}, 0)
    assert backend.status(job).state is JobState.FAILED

    assert list(backend.logs(job, follow=True)) == ["line 1", "line 2", "last"]
    assert fake_sky.calls[-1][2]["job_id"] == 7 and fake_sky.calls[-1][2]["follow"] is True
    # An ended managed job: SkyPilot 0.14 has only its controller's log left
    fake_sky.streams = {
        False: ["Job 7 is already in terminal state FAILED. For more details, run: ...\n", None],
        True: ["Job 7 failed: exit code 2\n== Logs of the user job ==\ndoctor: FAILED\n", None],
    }
    assert list(backend.logs(job, follow=False)) == [
        "Job 7 is already in terminal state FAILED. For more details, run: ...",
        "rlctl: the job's own output went with its cluster; the jobs controller's log:",
        "Job 7 failed: exit code 2",
        "== Logs of the user job ==",
        "doctor: FAILED",
    ]
    assert fake_sky.calls[-1][2] == {
        "job_id": 7, "follow": False, "controller": True, "preload_content": False
    }  # fmt: skip

    fake_sky.results["jobs.cancel"] = None
    backend.stop(job, grace_s=1)
    assert fake_sky.calls[-1][0] == "jobs.cancel" and fake_sky.calls[-1][2]["job_ids"] == [7]


def test_cluster_submit_status_stop(fake_sky):
    recipe = RECIPES["grpo-qwen05b-gsm8k"]
    opts = SkyPilotOptions(cloud="k8s", cluster="rl-dev", idle_minutes_to_autostop=30, down=True)
    backend = SkyPilotBackend(opts)
    fake_sky.results["launch"] = (3, object())
    handle = backend.submit(_job(), prepare_for(recipe, backend, _job().id), {})
    assert (handle["mode"], handle["cluster"], handle["job_id"]) == ("cluster", "rl-dev", 3)
    json.dumps(handle)  # storable
    kwargs = fake_sky.calls[0][2]
    assert kwargs == {"cluster_name": "rl-dev", "idle_minutes_to_autostop": 30, "down": True}
    job = _job(handle)
    fake_sky.results["job_status"] = {3: types.SimpleNamespace(value="SETTING_UP")}
    assert backend.status(job).state is JobState.PROVISIONING
    fake_sky.results["job_status"] = {"3": "FAILED"}  # keys as JSON may bring them
    assert backend.status(job).state is JobState.FAILED
    assert list(backend.logs(job, follow=False)) == ["line 1", "line 2", "last"]
    fake_sky.results["cancel"] = fake_sky.results["down"] = None
    SkyPilotBackend().stop(job, grace_s=1)  # as a later CLI call: options from the handle
    assert [c[0] for c in fake_sky.calls[-2:]] == ["cancel", "down"]


def test_skypilot_missing_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sky", None)  # import sky -> ImportError
    recipe = RECIPES["dapo-qwen32b"]
    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
    backend.render("j", _spec(recipe, backend))  # rendering needs no SkyPilot
    with pytest.raises(RlctlError) as err:
        backend.preflight()
    assert "pip install 'rlctl[skypilot]'" in err.value.hint


@pytest.mark.parametrize(
    ("enabled", "cloud", "message"),
    [
        ([], "gcp", "no cloud is enabled"),
        (["AWS"], "gcp", "gcp is not enabled"),
        (["GCP", "Kubernetes"], "k8s", None),
        (["Lambda"], None, None),
    ],
)
def test_preflight_reads_the_enabled_clouds(monkeypatch, enabled, cloud, message):
    backend = SkyPilotBackend(SkyPilotOptions(cloud=cloud))
    monkeypatch.setattr(SkyPilotBackend, "_enabled_clouds", lambda self: enabled)
    if message is None:
        backend.preflight()
    else:
        with pytest.raises(RlctlError, match=message) as err:
            backend.preflight()
        assert "sky check" in err.value.hint


def test_templates_are_where_the_backend_reads_them():
    root = Path(__file__).resolve().parents[2] / "templates"
    assert (root / "skypilot" / "run.sh.j2").is_file()
    assert (root / "ray" / "ray_cluster.sh").is_file()


def test_launch_through_the_api_stores_no_secret(fake_sky, monkeypatch, tmp_path):
    """rlctl.api.launch with this backend (as get_backend("skypilot") will return it):
    the job store holds SkyPilot's ids, and no secret value anywhere in its file."""
    import rlctl.api
    from rlctl.store.jobs import JobStore

    backend = SkyPilotBackend(SkyPilotOptions(cloud="gcp"))
    monkeypatch.setattr(rlctl.api, "get_backend", lambda name, **options: backend)
    # preflight has its own test against a real API server (test_preflight_server.py)
    monkeypatch.setattr(backend, "preflight", lambda: None)
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL)
    fake_sky.results["jobs.launch"] = ([12], None)
    store = JobStore(tmp_path / "jobs.db")
    job = rlctl.api.launch("dapo_qwen32b", backend="skypilot", store=store)
    assert job.state is JobState.RUNNING
    assert store.get(job.id).handle["job_id"] == 12
    fake_sky.results["jobs.queue_v2"] = (
        [{"job_id": 12, "status": "RECOVERING", "recovery_count": 1}], 1, {}, 1
    )  # fmt: skip
    job = rlctl.api.status(job.id, store=store)[0]
    assert (job.state, job.reason) == (JobState.RUNNING, "recovering, recovered 1 time")
    # the database, any journal next to it, and the job's directory (its wheel)
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".whl" for p in files)
    for path in files:
        assert SENTINEL.encode() not in path.read_bytes()
