"""The Slurm backend: an sbatch job that forms a Ray cluster over its allocation.

``templates/slurm/job.sbatch.j2`` does the work on the cluster (one Ray node per Slurm
node, the engine on the head, Ray stopped at the end, the engine's exit code as the
job's); this module renders it, stages the job's files in a directory on the cluster's
shared filesystem, and talks to Slurm: ``sbatch`` to submit, ``squeue`` then ``sacct``
(then ``sacct -c`` and ``scontrol`` where accounting is off) to observe, ``scancel`` to
stop. Everything runs on this host, or on a login node over SSH (``ssh`` in the profile,
or ``--ssh user@host``), files staged there as one tar stream.

A cluster profile (``<RLCTL_HOME>/slurm.yaml``, ``slurm_profile.py``) holds what a site
needs; docs/slurm.md lists its fields.
"""

from __future__ import annotations

import io
import os
import re
import shlex
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from rlctl import __version__
from rlctl.backends.base import Observed
from rlctl.backends.slurm_profile import (  # noqa: F401 (the profile, importable from here too)
    PLAIN_PATH,
    PROFILE_FILE,
    SlurmProfile,
    load_profile,
    profile_from_mapping,
)
from rlctl.errors import RlctlError
from rlctl.hardware import Accelerator
from rlctl.job.prepared import Prepared, Rendered
from rlctl.job.render import TEMPLATES, render
from rlctl.job.spec import JobPaths, JobSpec
from rlctl.job.wheel import build_wheel, local_wheel
from rlctl.store.jobs import Job, JobState

LOG = "job.log"
DRIVER_LOG = "driver.log"  # the driver's output alone (also in job.log)
EXIT_CODE = "exit_code"
STOP_MARKER = "stop-requested"
REQUEUE_MARKER = "requeue"  # the supervisor's: the batch script requeues the job
PREEMPTED = 75  # the engine's "stopped on SIGTERM, requeue me"
TAIL_LINES = 5
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=20")
SSH_FAILED = 255  # ssh's own exit status when it could not run the remote command

_SLURM_ID = re.compile(r"^[0-9]+(_[0-9]+)?$")
# squeue's errors when it could not ask slurmctld (a job it no longer knows is "Invalid job id")
_UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|timed out|Connection refused|Zero Bytes were transmitted"
)


# ---------------------------------------------------------------------------
# running commands here or on the login node


@dataclass
class Shell:
    """Runs argv on this host, or on ``ssh`` (the argv is quoted for the remote shell)."""

    ssh: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def argv(self, argv: list[str]) -> list[str]:
        if self.ssh is None:
            return argv
        return ["ssh", *SSH_OPTIONS, self.ssh, shlex.join(argv)]

    def run(
        self, argv: list[str], input: bytes | None = None, check: bool = False, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        try:
            result = subprocess.run(
                self.argv(argv),
                input=input,
                capture_output=True,
                timeout=timeout,
                env={**os.environ, **self.env} if self.env else None,
            )
        except FileNotFoundError as exc:
            raise RlctlError(
                f"{exc.filename} not found on this host",
                hint="install the Slurm client tools here, or submit through a login node"
                " with --ssh user@host (or ssh: in the Slurm profile)",
            ) from None
        except subprocess.TimeoutExpired:
            raise RlctlError(
                f"{' '.join(argv[:2])} did not answer in {timeout:.0f} s"
                + (f" (over ssh to {self.ssh})" if self.ssh else ""),
                hint="is slurmctld up? `scontrol ping` says",
            ) from None
        if self.ssh is not None and result.returncode == SSH_FAILED:
            # ssh itself failed (no route, refused, auth): the remote command never ran, so
            # its silence says nothing about the job (not "gone", not "failed")
            raise RlctlError(
                f"ssh to {self.ssh} failed: {_text(result.stderr).strip() or 'exit 255'}",
                hint=f"check `ssh {self.ssh} true` works without a prompt (keys, ~/.ssh/config)",
            )
        if check and result.returncode != 0:
            raise RlctlError(
                f"{argv[0]} failed (exit {result.returncode}): {_text(result.stderr).strip()}"
            )
        return result


def _text(data: bytes | str | None) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


# ---------------------------------------------------------------------------
# the backend


class SlurmBackend:
    name = "slurm"

    def __init__(self, profile: SlurmProfile | None = None, **overrides: Any) -> None:
        """``overrides`` (ssh=, partition=, ...) win over the profile's fields: the CLI's
        options."""
        base = profile or load_profile()
        given = {k: v for k, v in overrides.items() if v is not None}
        self.profile = profile_from_mapping(
            {**{f.name: getattr(base, f.name) for f in fields(base)}, **given}
        )
        self._remote_home: str | None = None

    # -- paths and rendering --------------------------------------------------------

    def paths(self, job_id: str, checkpoints: str | None = None) -> JobPaths:
        return JobPaths(root=f"{self._job_root()}/{job_id}", checkpoints=checkpoints)

    def _job_root(self) -> str:
        root = self.profile.job_root.rstrip("/") or "/"
        if root == "~" or root.startswith("~/"):
            root = self._home() + root[1:]
        if not root.startswith("/"):
            raise RlctlError(
                f"slurm: job_root {self.profile.job_root!r} must be absolute or start with ~/"
            )
        return root

    def _home(self) -> str:
        if self.profile.ssh is None:
            return str(Path.home())
        if self._remote_home is None:
            out = Shell(self.profile.ssh).run(["printenv", "HOME"], check=True)
            self._remote_home = _text(out.stdout).strip()
            if not PLAIN_PATH.match(self._remote_home):
                raise RlctlError(f"slurm: odd home directory on {self.profile.ssh}")
        return self._remote_home

    def render(self, job_id: str, spec: JobSpec) -> Rendered:
        p = self.profile
        root = spec.paths.root
        if not PLAIN_PATH.match(root):
            raise RlctlError(f"slurm: job directory {root!r} must be a plain path")
        lay = spec.layout
        per_node = lay.devices_per_node
        nodes = max(lay.nodes, spec.recipe.hardware.nodes or 1)
        # `auto`: any GPU the partition has (untyped GRES), not the plan's assumption
        acc = lay.hardware if lay.accelerator_named else None
        cpu = lay.accelerator is None
        cpus = p.cpus_per_task or (max(2, per_node * lay.cpus_per_worker) if cpu else 8 * per_node)
        options = [
            f"--job-name={job_id}",
            f"--nodes={nodes}",
            "--ntasks-per-node=1",
            f"--cpus-per-task={cpus}",
            f"--output={root}/{LOG}",
            "--open-mode=append",  # a requeued job appends to the same log
        ]
        if not cpu:
            options.append(_device_request(p.gpu_request, acc, per_node))
        for name in ("partition", "account", "qos", "constraint", "time", "mem"):
            value = getattr(p, name)
            if value is not None:
                options.append(f"--{name}={value}")
        if p.exclusive:
            options.append("--exclusive")
        if p.requeue:
            options += ["--requeue", f"--signal=B:TERM@{p.signal_grace_s}"]
        else:
            options.append("--no-requeue")
        hardware_env = dict(acc.env) if acc else {}
        if p.network_interface:
            for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
                hardware_env[var] = p.network_interface
            if acc and acc.vendor == "ascend":
                hardware_env["HCCL_SOCKET_IFNAME"] = p.network_interface
        image = self.image(spec)
        script = render(
            "slurm/job.sbatch.j2",
            job_id=job_id,
            recipe_name=spec.recipe.name,
            version=__version__,
            sbatch_options=options,
            extra_sbatch=list(p.sbatch),
            root=root,
            prelude=list(p.prelude),
            hardware_name=acc.name if acc else "CPU",
            hardware_env=hardware_env,
            env=spec.env,
            secret_names=list(spec.secrets),
            nodes=nodes,
            ray_resource="CPU" if cpu else (acc.ray_resource if acc else "GPU"),
            devices_per_node=0 if cpu else per_node,
            ray_wait_s=p.ray_wait_s,
            container=p.container,
            image=image,
            mounts=",".join((f"{root}:{root}", *p.container_mounts)),
            apptainer_flags=_apptainer_flags(acc),
            head_ip_command=p.head_ip_command,
            ray=f"{spec.paths.env}/bin/ray",
            install_command=spec.install_command,
            setup=[spec.on_node(step) for step in spec.setup],
            preflight=spec.on_node(spec.preflight),
            engine_command=spec.on_node(
                spec.supervised_command(
                    requeue_marker=f"{root}/{REQUEUE_MARKER}" if p.requeue else None,
                    stop_marker=f"{root}/{STOP_MARKER}",
                )
            ),
        )
        library = (TEMPLATES / "ray" / "ray_cluster.sh").read_text()
        files = {
            "job.sbatch": script,
            "ray_cluster.sh": library,
            "engine.yaml": spec.engine_yaml,
            **spec.file_texts,  # on the shared filesystem: every node reads them
        }
        return Rendered(files, self._software(spec, image))

    def image(self, spec: JobSpec) -> str | None:
        """The container image the steps run in (None: no container runtime): the
        recipe's, else the profile's, else the plan's, refused when that is on no public
        registry."""
        if not self.profile.container:
            return None
        image = spec.recipe.image or self.profile.image or spec.image.ref
        spec.image.check_pullable(image, f"slurm ({self.profile.container})")
        return image

    def _software(self, spec: JobSpec, image: str | None) -> tuple[str, ...]:
        """What ``rlctl plan`` says about the nodes' software."""
        where = (
            f"image: {image} ({self.profile.container})"
            if image
            else "the nodes' own python3 (after the profile's prelude); no container"
        )
        return (where, spec.setup_line("that Python"))

    # -- submit -------------------------------------------------------------------

    def submit(self, job: Job, prepared: Prepared, secrets: Mapping[str, str]) -> dict:
        spec = prepared.spec
        root = spec.paths.root
        files: dict[str, str | bytes] = dict(prepared.files)
        wheel = build_wheel(local_wheel(job.id, create=True).parent)
        files[Path(spec.paths.wheel).name] = wheel.read_bytes()
        shell = Shell(self.profile.ssh)
        self._stage(shell, root, files)
        sbatch = ["sbatch", "--parsable", f"--chdir={root}", f"{root}/job.sbatch"]
        if shell.ssh is None:
            result = Shell(None, env=dict(secrets)).run(sbatch)
        else:
            result = shell.run(_with_secrets(sbatch), input=_secret_lines(secrets))
        if result.returncode != 0:
            message = _text(result.stderr).strip() or _text(result.stdout).strip()
            raise RlctlError(
                f"Slurm refused the job: {message}",
                hint="check partition/account/qos in the Slurm profile or options"
                " (`sinfo -s` lists partitions)",
            )
        slurm_id = _text(result.stdout).strip().split(";")[0]
        if not _SLURM_ID.match(slurm_id):
            raise RlctlError(f"sbatch answered {slurm_id!r}, not a job id")
        return {
            "slurm_job_id": slurm_id,
            "root": root,
            "log": f"{root}/{LOG}",
            "ssh": shell.ssh,
        }

    def _stage(self, shell: Shell, root: str, files: Mapping[str, str | bytes]) -> None:
        if shell.ssh is None:
            path = Path(root)
            path.mkdir(parents=True, exist_ok=True)
            for name, content in files.items():
                (path / name).parent.mkdir(parents=True, exist_ok=True)  # shipped tools/
                (path / name).write_bytes(
                    content if isinstance(content, bytes) else content.encode()
                )
            (path / "job.sbatch").chmod(0o755)
            return
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            for name, content in files.items():
                data = content if isinstance(content, bytes) else content.encode()
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o755 if name == "job.sbatch" else 0o644
                info.mtime = int(time.time())
                tar.addfile(info, io.BytesIO(data))
        script = 'mkdir -p "$1" && tar -x -C "$1"'
        shell.run(["sh", "-c", script, "rlctl-stage", root], input=buffer.getvalue(), check=True)

    # -- observe ----------------------------------------------------------------

    def status(self, job: Job) -> Observed:
        shell = Shell(job.handle.get("ssh"))
        slurm_id = job.handle["slurm_job_id"]
        queued = shell.run(["squeue", "-h", "-j", slurm_id, "-o", "%T|%r"])
        line = _text(queued.stdout).strip()
        if queued.returncode == 0 and line:
            state, _, reason = line.splitlines()[0].partition("|")
            return _queued(state, reason)
        final = self._final_state(shell, slurm_id)
        if final is None:
            code = self._read(shell, f"{job.handle['root']}/{EXIT_CODE}").strip()
            if code.lstrip("-").isdigit():
                final = ("COMPLETED" if code == "0" else "FAILED", int(code))
            elif queued.returncode != 0 and _UNREACHABLE.search(_text(queued.stderr)):
                # slurmctld down or busy: the job's state is unknown, not over; the next
                # status asks again
                raise RlctlError(
                    f"squeue failed (exit {queued.returncode}):"
                    f" {_text(queued.stderr).strip()}; job {slurm_id}'s state is unknown",
                    hint="is slurmctld up? `scontrol ping` says",
                )
            else:
                return Observed(
                    JobState.FAILED,
                    f"Slurm no longer knows job {slurm_id} and it left no exit code",
                )
        state, code = final
        return self._finished(shell, job, state, code)

    def _final_state(self, shell: Shell, slurm_id: str) -> tuple[str, int | None] | None:
        """(Slurm state, exit code) of an ended job: sacct, sacct -c, then scontrol."""
        for argv in (
            ["sacct", "-n", "-P", "-X", "-j", slurm_id, "-o", "State,ExitCode"],
            ["sacct", "-c", "-n", "-P", "-j", slurm_id, "-o", "JobID,State,ExitCode"],
        ):
            result = shell.run(argv)
            if result.returncode != 0:
                continue
            for row in _text(result.stdout).splitlines():
                cols = row.strip().split("|")
                if len(cols) == 3 and cols[0] != slurm_id:
                    continue  # sacct -c lists every job in the file
                cols = cols[-2:]
                if len(cols) == 2 and cols[0]:
                    return cols[0].split()[0], _exit_code(cols[1])
        shown = shell.run(["scontrol", "show", "job", "-o", slurm_id])
        if shown.returncode == 0:
            text = _text(shown.stdout)
            state = re.search(r"\bJobState=(\S+)", text)
            code = re.search(r"\bExitCode=(\S+)", text)
            if state:
                return state.group(1), _exit_code(code.group(1) if code else "")
        return None

    def _finished(self, shell: Shell, job: Job, state: str, code: int | None) -> Observed:
        if state == "COMPLETED" and code in (0, None):
            return Observed(JobState.SUCCEEDED, "exit code 0", 0)
        if state.startswith("CANCELLED"):
            return Observed(JobState.CANCELLED, "cancelled in Slurm (scancel)", code)
        # The engine's own output (driver.log) says why; the job log ends with Slurm's
        # teardown lines. A job that failed before the driver started has only the latter.
        tail = self._tail(shell, f"{job.handle['root']}/{DRIVER_LOG}")
        if tail == "empty log":
            tail = self._tail(shell, job.handle["log"])
        why = {
            "TIMEOUT": "hit its time limit",
            "PREEMPTED": "preempted",
            "NODE_FAIL": "a node failed",
            "OUT_OF_MEMORY": "ran out of memory",
            "BOOT_FAIL": "a node failed to boot",
            "DEADLINE": "missed its deadline",
        }.get(state)
        if why is None:
            from engine.schema import exit_words

            why = f"exit code {code}, {exit_words(code)}"
        if code == PREEMPTED:
            why = "stopped on SIGTERM (exit code 75)"
        return Observed(JobState.FAILED, f"Slurm {state}: {why}: {tail}", code)

    def _read(self, shell: Shell, path: str) -> str:
        if shell.ssh is None:
            try:
                return Path(path).read_text(errors="replace")
            except OSError:
                return ""
        return _text(shell.run(["cat", path]).stdout)

    def _tail(self, shell: Shell, log: str) -> str:
        if shell.ssh is None:
            text = self._read(shell, log)
        else:
            text = _text(shell.run(["tail", "-n", "50", log]).stdout)
        lines = [line for line in text.splitlines() if line.strip()]
        return " | ".join(lines[-TAIL_LINES:]) if lines else "empty log"

    def logs(self, job: Job, follow: bool) -> Iterator[str]:
        shell = Shell(job.handle.get("ssh"))
        log = job.handle["log"]
        if shell.ssh is None:
            from rlctl.backends.local import follow_file

            yield from follow_file(Path(log), follow, lambda: self.status(job).state.terminal)
            return
        if not follow:
            yield from _text(shell.run(["cat", log], timeout=300).stdout).splitlines()
            return
        # tail -F on the login node until the job leaves the queue, then a last read.
        script = (
            'tail -n +1 -F "$1" 2>/dev/null & t=$!; '
            'while [ -n "$(squeue -h -j "$2" -o %i 2>/dev/null)" ]; do sleep 3; done; '
            'sleep 2; kill "$t"'
        )
        argv = shell.argv(["sh", "-c", script, "rlctl-logs", log, job.handle["slurm_job_id"]])
        with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, errors="replace") as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                yield line.rstrip("\n")

    # -- stop -------------------------------------------------------------------

    def stop(self, job: Job, grace_s: float) -> None:
        """Graceful first: the stop marker makes the batch script SIGTERM the engine (which
        saves and exits; no requeue follows), then ``scancel`` after ``grace_s``."""
        shell = Shell(job.handle.get("ssh"))
        slurm_id = job.handle["slurm_job_id"]
        marker = f"{job.handle['root']}/{STOP_MARKER}"
        if shell.ssh is None:
            Path(marker).touch()
        else:
            shell.run(["touch", marker])
        state = _text(shell.run(["squeue", "-h", "-j", slurm_id, "-o", "%T"]).stdout).strip()
        if state == "RUNNING" and grace_s > 0:  # the batch script sees the marker
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline:
                queued = shell.run(["squeue", "-h", "-j", slurm_id, "-o", "%i"])
                if not _text(queued.stdout).strip():
                    return
                time.sleep(1)
        if state:
            result = shell.run(["scancel", slurm_id])
            if result.returncode != 0:
                raise RlctlError(f"scancel {slurm_id} failed: {_text(result.stderr).strip()}")


# ---------------------------------------------------------------------------
# helpers


_QUEUED = {
    "PENDING": JobState.PENDING,
    "CONFIGURING": JobState.PROVISIONING,
    "REQUEUED": JobState.PENDING,
    "REQUEUE_HOLD": JobState.PENDING,
    "REQUEUE_FED": JobState.PENDING,
    "RESV_DEL_HOLD": JobState.PENDING,
    "RUNNING": JobState.RUNNING,
    "COMPLETING": JobState.RUNNING,
    "SUSPENDED": JobState.RUNNING,
    "STAGE_OUT": JobState.RUNNING,
    "SIGNALING": JobState.RUNNING,
    "RESIZING": JobState.RUNNING,
}


def _queued(state: str, reason: str) -> Observed:
    mapped = _QUEUED.get(state, JobState.RUNNING)
    if mapped == JobState.PENDING:
        return Observed(mapped, f"queued: {reason}" if reason and reason != "None" else "queued")
    if state != "RUNNING":
        return Observed(mapped, state.lower())
    return Observed(mapped)


def _exit_code(text: str) -> int | None:
    """``"3:0"`` -> 3; ``"0:15"`` (killed by signal 15) -> 143."""
    code, _, signal = text.strip().partition(":")
    if not code.isdigit():
        return None
    if int(code) == 0 and signal.isdigit() and int(signal) > 0:
        return 128 + int(signal)
    return int(code)


def _device_request(kind: str, acc: Accelerator | None, per_node: int) -> str:
    if kind == "gpus-per-node":
        return f"--gpus-per-node={per_node}"
    if kind == "gres-untyped" or acc is None:
        return f"--gres={acc.slurm_gres_name if acc else 'gpu'}:{per_node}"
    return f"--gres={acc.gres(per_node)}"


def _apptainer_flags(acc: Accelerator | None) -> list[str]:
    if acc is None:
        return []
    return {"nvidia": ["--nv"], "amd": ["--rocm"]}.get(acc.vendor, [])


def _secret_lines(secrets: Mapping[str, str]) -> bytes:
    """NAME=<hex of the value>, one a line: read by ``_with_secrets``' remote shell."""
    return "".join(f"{k}={v.encode().hex()}\n" for k, v in secrets.items()).encode()


def _with_secrets(argv: list[str]) -> list[str]:
    """argv, run after exporting the secrets read from stdin (values never on a command
    line or in a file)."""
    script = (
        'while IFS== read -r k v; do [ -n "$k" ] || continue; '
        'export "$k=$(printf \'%b\' "$(printf %s "$v" | sed \'s/../\\\\x&/g\')")"; '
        'done; exec "$@"'
    )
    return ["bash", "-c", script, "rlctl-submit", *argv]
