"""The SkyPilot backend: any cloud or Kubernetes, as a managed job or on a cluster.

rlctl builds the task and checks what SkyPilot's parser does not (accelerator names,
which cloud offers which accelerator); SkyPilot provisions, runs and recovers it.

    recipe + plan ──► task config (a dict; ``render`` dumps it as ``task.yaml``)
        resources   accelerators NAME:COUNT with ordered fallbacks, infra, spot, disk,
                    ports, image_id docker:<the accelerator's image>, job_recovery;
                    cpus N+ for a cpu:N recipe
        num_nodes, envs (plain), secrets (names only: values go in secrets_overrides)
        file_mounts the rlctl wheel and the recipe's shipped files (a tools file) from the
                    job's local directory, the checkpoint bucket at /checkpoints (the
                    engine resumes from it)
        setup       templates/skypilot/setup.sh.j2: the recipe's setup steps, every node
        run         templates/skypilot/run.sh.j2: Ray on port 6379 across the nodes
                    (templates/ray/ray_cluster.sh inlined), the engine on rank 0
    the site's profile (skypilot_profile.py, per infra): another image or none, and a
    prelude run first in setup and run (e.g. a Slurm cluster without Pyxis)

Two modes: a managed job (the default; ``sky.jobs.launch``, recovered after a
preemption, and started again when the engine's supervisor hands a restart back with exit
75, at most ``trainer.max_restarts`` times; nothing else is retried), or a
cluster (``cluster=NAME``: ``sky.launch``, with autostop or down). The SDK is imported
lazily: ``rlctl plan`` renders and validates without it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from secrets import token_hex
from typing import TYPE_CHECKING, Any

from rlctl import __version__
from rlctl.backends.base import Observed
from rlctl.backends.skypilot_infra import OWN_CLUSTERS, check_offered, fallbacks, parse_infra
from rlctl.backends.skypilot_profile import NodeSoftware, for_infra, load_profile
from rlctl.backends.skypilot_recovery import (
    EXIT_HANDED_BACK,
    bucket_handle,
    restart_command,
)
from rlctl.backends.skypilot_task import (  # noqa: F401 (CHECKPOINT_MOUNT: importable here too)
    CHECKPOINT_MOUNT,
    JobRecovery,
    SkyResources,
    SkyTask,
    checkpoint_mount,
    dump_task,
)
from rlctl.errors import RlctlError
from rlctl.job.prepared import Prepared, Rendered
from rlctl.job.render import TEMPLATES, render
from rlctl.job.spec import JobPaths, JobSpec, Layout
from rlctl.job.wheel import build_wheel, local_wheel
from rlctl.store.jobs import Job, JobState

if TYPE_CHECKING:
    import sky

INSTALL_HINT = "pip install 'rlctl[skypilot]'"
RAY_PORT = 6379  # SkyPilot's own Ray listens on 6380
REMOTE_ROOT = "/tmp/rlctl"  # where each job's files live on the nodes
JOIN_TIMEOUT_S = 900  # nodes of a multi-node cluster come up minutes apart on some clouds
DEFAULT_DISK_GB = 512  # image (~20 GB), model weights, HF cache, local checkpoint staging
RECOVERY_STRATEGIES = ("FAILOVER", "EAGER_NEXT_REGION")
_HEREDOC = "RLCTL_ENGINE_YAML_END"
PREFLIGHT_PORT = 29511  # rank 0's, for the pre-flight's all-reduce over the nodes
RAY_TOKEN = "RAY_AUTH_TOKEN"  # Ray's token authentication (templates/ray/ray_cluster.sh)


@dataclass(frozen=True)
class SkyPilotOptions:
    """Where and how the task runs (the CLI's --cloud, --cluster, --spot ...)."""

    cloud: str | None = None  # "gcp", "gcp/us-central1", "k8s/my-context"; None: any enabled
    cluster: str | None = None  # a cluster name: cluster mode; None: a managed job
    use_spot: bool = False
    disk_size_gb: int = DEFAULT_DISK_GB
    ports: tuple[int, ...] = ()
    fallbacks: bool = True  # ordered fallback accelerators where the plan allows
    recovery: str = "FAILOVER"  # managed jobs: FAILOVER | EAGER_NEXT_REGION
    idle_minutes_to_autostop: int | None = None  # cluster mode
    down: bool = False  # cluster mode: tear the cluster down when idle (or right after)
    remote_root: str = REMOTE_ROOT

    def __post_init__(self) -> None:
        if self.recovery not in RECOVERY_STRATEGIES:
            raise RlctlError(
                f"unknown recovery strategy {self.recovery!r}",
                hint=f"valid: {', '.join(RECOVERY_STRATEGIES)}",
            )
        if self.disk_size_gb < 50:
            raise RlctlError(
                f"disk size {self.disk_size_gb} GB is too small for the image and a model",
                hint="give at least 50 GB",
            )
        if self.cluster is not None and not _CLUSTER_NAME.fullmatch(self.cluster):
            raise RlctlError(
                f"cluster name {self.cluster!r} is not valid for SkyPilot",
                hint="lower-case letters, digits and '-', starting with a letter",
            )
        if (self.idle_minutes_to_autostop is not None or self.down) and self.cluster is None:
            raise RlctlError(
                "autostop and down apply to a cluster",
                hint="give --cluster NAME, or leave them out: a managed job cleans up itself",
            )


_CLUSTER_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclass(frozen=True)
class SkyPilotRendered(Rendered):
    """The files, and the task they show, which ``submit`` hands to SkyPilot."""

    task: SkyTask


# ---------------------------------------------------------------------------------


def _local_file(job_id: str, name: str) -> Path:
    """Where a shipped file is written on this machine for SkyPilot to mount: beside
    the job's wheel, in its local job directory."""
    return local_wheel(job_id).parent / name


def safe_name(job_id: str) -> str:
    """A SkyPilot cluster/job name for a job id (lower case, letters, digits, '-')."""
    name = re.sub(r"[^a-z0-9-]+", "-", job_id.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"rlctl-{name}"
    return name[:63].rstrip("-")


class SkyPilotBackend:
    name = "skypilot"

    def __init__(
        self,
        options: SkyPilotOptions | None = None,
        profile: Mapping[str, NodeSoftware] | None = None,
    ) -> None:
        """``options``: this launch's (the CLI's); ``profile``: the site's settings by
        infra (default: ``<RLCTL_HOME>/skypilot.yaml``, see skypilot_profile.py)."""
        self.options = options or SkyPilotOptions()
        self.infra = parse_infra(self.options.cloud)
        self.software = for_infra(load_profile() if profile is None else profile, self.infra.value)

    # ---- rendering (no SkyPilot needed) ---------------------------------------

    def paths(self, job_id: str, checkpoints: str | None = None) -> JobPaths:
        """A bucket in ``checkpoints`` is mounted on the nodes: the engine writes there."""
        root = f"{self.options.remote_root.rstrip('/')}/{job_id}"
        mount = checkpoint_mount(checkpoints)
        if mount is None:
            return JobPaths(root=root, checkpoints=checkpoints)
        return JobPaths(root=root, checkpoints=mount[1], mount=mount[0])

    def render(self, job_id: str, spec: JobSpec) -> SkyPilotRendered:
        task = self.build_task(job_id, spec)
        header = (
            f"# rlctl job {job_id} ({spec.recipe.name}): a SkyPilot task, rendered by rlctl"
            f" {__version__}.\n# Secrets appear by name only: pass their values with"
            " `sky launch --secret NAME` (read from your environment).\n"
        )
        files = {
            "task.yaml": header + dump_task(task.to_yaml_config()),
            "setup.sh": task.setup,
            "run.sh": task.run,
            **spec.file_texts,  # mounted from the job's local directory (build_task)
        }
        return SkyPilotRendered(files, self._software(spec, task.resources.image_id), task)

    def build_task(self, job_id: str, spec: JobSpec) -> SkyTask:
        """The SkyPilot task that runs ``spec`` as job ``job_id``."""
        lay = spec.layout
        env = dict(lay.hardware.env) if lay.hardware else {}
        env.update(spec.env)
        # the wheel of this rlctl, which the setup installs on every node, and the
        # recipe's shipped files (written there by ``sky_task``)
        mounts = {spec.paths.wheel: str(local_wheel(job_id))}
        for f in spec.files:
            mounts[f"{spec.paths.root}/{f.name}"] = str(_local_file(job_id, f.name))
        return SkyTask(
            name=safe_name(job_id),
            num_nodes=lay.nodes,
            resources=self._resources(spec),
            envs=env,
            # Values never here: rlctl passes them as secrets_overrides at launch. The Ray
            # token is made per launch (every node needs the same one to join the cluster).
            secrets=(*spec.secrets, RAY_TOKEN),
            file_mounts=mounts,
            bucket=spec.paths.mount,
            setup=self._setup(job_id, spec),
            run=self._run(job_id, spec, lay, env),
        )

    def _resources(self, spec: JobSpec) -> SkyResources:
        lay = spec.layout
        acc = lay.hardware
        opts = self.options
        choices: list[str] = []
        if acc is not None:
            check_offered(acc, self.infra)
            offered = fallbacks(acc, self.infra) if opts.fallbacks else []
            choices = [f"{a.skypilot_name}:{lay.devices_per_node}" for a in offered]
            choices = (
                choices if len(choices) > 1 else [f"{acc.skypilot_name}:{lay.devices_per_node}"]
            )
        # SkyPilot recovers a preempted run without counting it. A failure is the
        # supervisor's to judge (``restart_command``): it exits 75 for a restart, which
        # SkyPilot makes (recover_on_exit_codes, unlimited: the supervisor counts them
        # against trainer.max_restarts), and any other code fails the job at once (a
        # configuration error, a failed pre-flight: never retried).
        recovery = JobRecovery(opts.recovery, 0, (EXIT_HANDED_BACK,))
        return SkyResources(
            infra=self.infra.value or None,
            accelerators=tuple(choices),
            # cpu:N is N workers, one CPU each (the local backend runs the quickstart's
            # two on two cores); asking for more refuses nodes the job fits on.
            cpus=f"{max(2, lay.devices_per_node)}+" if acc is None else None,
            use_spot=opts.use_spot,
            disk_size=opts.disk_size_gb,
            image_id=self.image_id(spec),
            ports=tuple(int(p) for p in opts.ports),
            job_recovery=recovery if opts.cluster is None else None,
        )

    def image_id(self, spec: JobSpec) -> str | None:
        """SkyPilot's ``image_id``: the recipe's image, else the site profile's (``none``:
        the nodes' own software, no container), else the plan's; refused when it is the
        plan's default and that is on no public registry."""
        if spec.recipe.image:
            image_id = NodeSoftware(image=spec.recipe.image).image_id(spec.image.ref)
        else:
            image_id = self.software.image_id(spec.image.ref)
        spec.image.check_pullable(image_id, f"skypilot ({self.infra.value or 'any cloud'})")
        return image_id

    def _software(self, spec: JobSpec, image_id: str | None) -> tuple[str, ...]:
        """What ``rlctl plan`` says about the nodes' software."""
        image = image_id.removeprefix("docker:") if image_id else "none (the nodes' own software)"
        if image_id and image == spec.image.ref:
            image += f": {spec.image.contents}"
        return (f"image: {image}", spec.setup_line("the image's Python"))

    def _setup(self, job_id: str, spec: JobSpec) -> str:
        return render(
            "skypilot/setup.sh.j2",
            job_id=job_id,
            recipe_name=spec.recipe.name,
            root=spec.paths.root,
            prelude=list(self.software.prelude),
            install=spec.install_command,
            setup=[spec.on_node(step) for step in spec.setup],
        )

    def _run(
        self,
        job_id: str,
        spec: JobSpec,
        lay: Layout,
        env: Mapping[str, str],
        engine_command: tuple[str, ...] | None = None,
        ray_port: int = RAY_PORT,
        join_timeout_s: int = JOIN_TIMEOUT_S,
    ) -> str:
        engine_yaml = spec.engine_yaml
        if not engine_yaml.endswith("\n"):
            engine_yaml += "\n"
        if _HEREDOC in engine_yaml.splitlines():
            raise RlctlError(f"the engine config contains the line {_HEREDOC!r}")
        return render(
            "skypilot/run.sh.j2",
            job_id=job_id,
            short_id=re.sub(r"[^a-z0-9]", "", job_id.lower())[-12:] or "job",
            recipe_name=spec.recipe.name,
            version=__version__,
            env=env,
            secret_names=list(spec.secrets),
            prelude=list(self.software.prelude),
            root=spec.paths.root,
            ray_library=ray_library(),
            ray_port=ray_port,
            ray_resource=lay.hardware.ray_resource if lay.hardware else "",
            nodes=lay.nodes,
            devices_per_node=lay.devices_per_node,
            devices_needed=lay.nodes * lay.devices_per_node,
            join_timeout_s=join_timeout_s,
            poll_s=5,
            engine_config=spec.paths.engine_config,
            engine_yaml=engine_yaml,
            heredoc=_HEREDOC,
            ray=f"{spec.paths.env}/bin/ray",
            engine_command=spec.on_node(
                engine_command or restart_command(spec, self.options.cluster is None)
            ),
            preflight=spec.on_node(spec.preflight),
            preflight_port=PREFLIGHT_PORT,
        )

    def estimate(self, spec: JobSpec) -> str:
        """The estimated hourly cost (``rlctl plan``), or "price unavailable"."""
        from rlctl.planner.cost import describe, hourly_cost

        if self.infra.cloud in OWN_CLUSTERS:
            return f"no price: {self.infra.cloud} is your own cluster"
        lay = spec.layout
        acc = lay.hardware
        if lay.accelerator is None:
            return describe(None)
        return describe(
            hourly_cost(
                acc.skypilot_name,
                lay.devices_per_node,
                lay.nodes,
                cloud=self.infra.cloud,
                region=self.infra.location.split("/")[0] or None,
                spot=self.options.use_spot,
            )
        )

    # ---- talking to SkyPilot --------------------------------------------------

    def sky_task(
        self, job_id: str, spec: JobSpec, task: SkyTask, secrets: Mapping[str, str]
    ) -> sky.Task:
        """The ``sky.Task`` SkyPilot's own parser makes of ``task`` (secret values passed
        as overrides, never written into the config), with the file mounts' sources
        written on this machine."""
        sky = import_sky()
        build_wheel(local_wheel(job_id, create=True).parent)  # the file mount's source
        for f in spec.files:  # and theirs
            local = _local_file(job_id, f.name)
            local.parent.mkdir(parents=True, exist_ok=True)
            local.write_text(f.text)
        missing = [name for name in spec.secrets if name not in secrets]
        if missing:
            raise RlctlError(f"no values for the secrets {', '.join(missing)}")
        values = {RAY_TOKEN: token_hex(16), **{k: secrets[k] for k in spec.secrets}}
        try:
            return sky.Task.from_yaml_config(
                task.to_yaml_config(), secrets_overrides=list(values.items())
            )
        except Exception as exc:  # SkyPilot's schema errors name the field
            raise RlctlError(
                f"SkyPilot refused the task: {exc}",
                hint="this is a bug in rlctl's task for your options: please report it",
            ) from None

    def preflight(self) -> None:
        """Fail early, before anything is recorded: SkyPilot installed, and the cloud
        asked for (or some cloud) enabled. Reads the API server's cached result of the
        last ``sky check`` (cheap; starts a local API server if none runs, as every
        SkyPilot call does) instead of probing credentials again."""
        try:
            enabled = [str(c).casefold() for c in self._enabled_clouds()]
        except RlctlError:
            raise
        except Exception as exc:
            raise RlctlError(
                f"cannot reach the SkyPilot API server: {exc}",
                hint="start it with `sky api start` (or check `sky api info`)",
            ) from None
        if not enabled:
            raise RlctlError(
                "no cloud is enabled in SkyPilot",
                hint="set up credentials and run `sky check` (docs/skypilot.md)",
            )
        want = self.infra.cloud
        if want and want not in enabled:
            raise RlctlError(
                f"{want} is not enabled in SkyPilot (enabled: {', '.join(enabled)})",
                hint=f"set up its credentials and run `sky check {want}`",
            )

    def _enabled_clouds(self) -> list[str]:
        import_sky()
        from sky.client import sdk

        return sdk.get(sdk.enabled_clouds())

    def submit(self, job: Job, prepared: Prepared, secrets: Mapping[str, str]) -> dict:
        sky = import_sky()
        rendered = prepared.rendered
        assert isinstance(rendered, SkyPilotRendered), "prepared for another backend"
        task = self.sky_task(job.id, prepared.spec, rendered.task, secrets)
        name = safe_name(job.id)
        opts = self.options
        if opts.cluster is None:
            request = sky.jobs.launch(task, name=name)
            job_ids, _ = sky.stream_and_get(request)
            job_id = job_ids[0] if isinstance(job_ids, list | tuple) else job_ids
            handle = {"mode": "managed", "name": name, "job_id": job_id, "request_id": str(request)}
            return {**handle, **bucket_handle(prepared.spec, managed=True)}
        request = sky.launch(
            task,
            cluster_name=opts.cluster,
            idle_minutes_to_autostop=opts.idle_minutes_to_autostop,
            down=opts.down,
        )
        job_id, _ = sky.stream_and_get(request)
        return {
            "mode": "cluster",
            "cluster": opts.cluster,
            "name": name,
            "job_id": job_id,
            "request_id": str(request),
            "down": opts.down,  # stop tears the cluster down too (read by a later CLI call)
            **bucket_handle(prepared.spec, managed=False),
        }

    def status(self, job: Job) -> Observed:
        sky = import_sky()
        handle = job.handle
        if handle["mode"] == "managed":
            # queue_v2: (records, total, counts by status, total unfiltered); the
            # deprecated queue() printed its warning into `rlctl status --json`
            result = sky.get(
                sky.jobs.queue_v2(refresh=False, skip_finished=False, job_ids=[handle["job_id"]])
            )
            records = result[0] if isinstance(result, tuple) else result
            for record in records:
                if _field(record, "job_id") == handle["job_id"]:
                    return managed_state(
                        _value(_field(record, "status")),
                        _field(record, "failure_reason"),
                        _field(record, "recovery_count") or 0,
                    )
            return Observed(JobState.FAILED, "SkyPilot no longer lists the managed job")
        try:
            statuses = sky.get(sky.job_status(handle["cluster"], [handle["job_id"]]))
        except Exception as exc:  # the cluster is gone (down, autostopped with down)
            return Observed(JobState.FAILED, f"cluster {handle['cluster']}: {exc}")
        statuses = statuses or {}
        found = statuses.get(handle["job_id"], statuses.get(str(handle["job_id"])))
        if found is None:
            return Observed(JobState.FAILED, f"cluster {handle['cluster']} has no such job")
        return cluster_state(_value(found))

    def logs(self, job: Job, follow: bool) -> Iterator[str]:
        """The job's output, line by line. ``preload_content=False`` makes the SDK
        return the stream as it comes (chunks of text; None once it is complete)."""
        sky = import_sky()
        handle = job.handle
        if handle["mode"] != "managed":
            yield from _lines(
                sky.tail_logs(handle["cluster"], handle["job_id"], follow, preload_content=False)
            )
            return
        ended = False
        for line in _lines(
            sky.jobs.tail_logs(job_id=handle["job_id"], follow=follow, preload_content=False)
        ):
            ended = ended or ENDED_MANAGED_JOB in line
            yield line
        if ended:
            # SkyPilot 0.14 keeps a managed job's own output only while its cluster is
            # up; the jobs controller's log stays: the recoveries, the exit codes, and
            # a failed run's output, which the controller copies before it cleans up.
            yield "rlctl: the job's own output went with its cluster; the jobs controller's log:"
            yield from _lines(
                sky.jobs.tail_logs(
                    job_id=handle["job_id"], follow=False, controller=True, preload_content=False
                )
            )

    def stop(self, job: Job, grace_s: float) -> None:
        sky = import_sky()
        handle = job.handle
        if handle["mode"] == "managed":
            sky.get(sky.jobs.cancel(job_ids=[handle["job_id"]]))
            return
        sky.get(sky.cancel(handle["cluster"], job_ids=[handle["job_id"]]))
        if handle.get("down"):
            sky.get(sky.down(handle["cluster"]))


ENDED_MANAGED_JOB = "is already in terminal state"  # SkyPilot's words for an ended job


def _lines(chunks: Iterator[str | None]) -> Iterator[str]:
    """The SDK's stream (chunks of text; None once it is complete), line by line."""
    pending = ""
    for chunk in chunks:
        if chunk is None:
            break
        pending += chunk
        *done, pending = pending.split("\n")
        yield from done
    if pending:
        yield pending


# ---------------------------------------------------------------------------------

_MANAGED = {
    "PENDING": (JobState.PENDING, None),
    "SUBMITTED": (JobState.PENDING, None),
    "STARTING": (JobState.PROVISIONING, "starting"),
    "RUNNING": (JobState.RUNNING, None),
    "RECOVERING": (JobState.RUNNING, "recovering"),
    "WINDING_DOWN": (JobState.RUNNING, "winding down"),
    "CANCELLING": (JobState.RUNNING, "cancelling"),
    "SUCCEEDED": (JobState.SUCCEEDED, None),
    "CANCELLED": (JobState.CANCELLED, "cancelled in SkyPilot"),
    "FAILED": (JobState.FAILED, "the job failed"),
    "FAILED_SETUP": (JobState.FAILED, "the setup section failed"),
    "FAILED_PRECHECKS": (JobState.FAILED, "SkyPilot's prechecks failed"),
    "FAILED_NO_RESOURCE": (JobState.FAILED, "no resources to run it (all clouds tried)"),
    "FAILED_CONTROLLER": (JobState.FAILED, "the jobs controller failed"),
}
_CLUSTER = {
    "INIT": (JobState.PENDING, None),
    "PENDING": (JobState.PENDING, None),
    "SETTING_UP": (JobState.PROVISIONING, "setting up"),
    "RUNNING": (JobState.RUNNING, None),
    "SUCCEEDED": (JobState.SUCCEEDED, None),
    "CANCELLED": (JobState.CANCELLED, "cancelled in SkyPilot"),
    "FAILED": (JobState.FAILED, "the job failed"),
    "FAILED_SETUP": (JobState.FAILED, "the setup section failed"),
    "FAILED_DRIVER": (JobState.FAILED, "the job's driver failed"),
}


def managed_state(status: str, failure_reason: str | None = None, recoveries: int = 0) -> Observed:
    """rlctl's state of a managed job; the reason says how often SkyPilot recovered it
    (a preemption, a lost node, a restart after a failure)."""
    state, reason = _MANAGED.get(status, (JobState.RUNNING, f"SkyPilot status {status}"))
    if state is JobState.FAILED and failure_reason:
        reason = f"{reason}: {failure_reason}"
    if recoveries:
        times = f"recovered {recoveries} time{'s' if recoveries > 1 else ''}"
        reason = f"{reason}, {times}" if reason else times
    return Observed(state, reason)


def cluster_state(status: str) -> Observed:
    state, reason = _CLUSTER.get(status, (JobState.RUNNING, f"SkyPilot status {status}"))
    return Observed(state, reason)


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _value(status: Any) -> str:
    return str(getattr(status, "value", status))


def ray_library() -> str:
    """The shared Ray bootstrap functions, inlined into the run section (SkyPilot's
    ``run`` is one string: the nodes have no copy of rlctl's templates)."""
    path = Path(TEMPLATES) / "ray" / "ray_cluster.sh"
    return path.read_text()


def import_sky() -> Any:
    try:
        import sky
    except ImportError:
        raise RlctlError(
            "the SkyPilot backend needs SkyPilot, which is not installed",
            hint=f"install it: {INSTALL_HINT}",
        ) from None
    return sky
