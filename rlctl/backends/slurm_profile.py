"""A Slurm site's settings: ``<RLCTL_HOME>/slurm.yaml`` (docs/slurm.md lists the fields).

Every value that lands on an ``#SBATCH`` line or names a container, a mount or a network
interface is checked for its shape when the profile loads: quoting cannot help on an
``#SBATCH`` line, and a value that is an option (``--help``, ``-rf``) is not a value.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from rlctl.errors import RlctlError, closest_or_all
from rlctl.home import read_site_file, rlctl_home
from rlctl.recipe.values import check_image

PROFILE_FILE = "slurm.yaml"
CONTAINERS = ("pyxis", "apptainer")
GPU_REQUESTS = ("gres", "gres-untyped", "gpus-per-node")
# A value on an #SBATCH line: one word, nothing a shell or sbatch's parser treats specially
# beyond what Slurm syntax needs (node ranges, feature expressions, time and memory units).
# Never starting with '-' (sbatch would read it as another option).
_SBATCH_VALUE = re.compile(r"^[A-Za-z0-9_.,:@%+=/\[\]*|&!()][A-Za-z0-9_.,:@%+=/\-\[\]*|&!()]*$")
# An extra #SBATCH line: --long-option[=value] or -X [value] (one letter: `-rf` is not an
# option), the value not starting with '-'.
_SBATCH_LINE = re.compile(
    r"^(--[A-Za-z][A-Za-z0-9-]*(=| )|-[A-Za-z]( |$))(?!-)[^\s'\"`$\\;<>]*$|^--[A-Za-z][A-Za-z0-9-]*$"
)
# Options an extra line may not give: rlctl sets them (the job's name, size, log, working
# directory, environment and requeue), or they keep sbatch from submitting the job
# (help, usage, version, test-only) or from returning (wait).
_SBATCH_RESERVED = {
    "job-name": "J", "nodes": "N", "ntasks-per-node": "", "cpus-per-task": "c",
    "output": "o", "error": "e", "open-mode": "", "chdir": "D", "export": "",
    "requeue": "", "no-requeue": "", "signal": "", "parsable": "", "wrap": "",
    "help": "h", "usage": "", "version": "V", "test-only": "", "wait": "W",
}  # fmt: skip
_IFNAME = re.compile(r"^[\^=]?[A-Za-z0-9][A-Za-z0-9_.:-]*(,[A-Za-z0-9][A-Za-z0-9_.:-]*)*$")
PLAIN_PATH = re.compile(r"^[A-Za-z0-9_./~+-]+$")


@dataclass(frozen=True)
class SlurmProfile:
    """A site's settings: ``<RLCTL_HOME>/slurm.yaml``. Every field is optional."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    time: str | None = None  # --time, e.g. "24:00:00"
    mem: str | None = None  # --mem per node, e.g. "0" (all of it) or "200G"
    cpus_per_task: int | None = None  # CPUs per node (one task per node)
    exclusive: bool = False
    requeue: bool = False  # requeue on preemption; the engine resumes from its checkpoint
    signal_grace_s: int = 120  # with requeue: SIGTERM this long before the time limit
    gpu_request: str = "gres"  # gres (gpu:h100:8) | gres-untyped (gpu:8) | gpus-per-node
    ssh: str | None = None  # user@login-node; none: this host runs sbatch
    job_root: str = "~/rlctl-jobs"  # on the cluster's shared filesystem
    sbatch: tuple[str, ...] = ()  # extra #SBATCH lines, e.g. "--reservation=rl"
    prelude: tuple[str, ...] = ()  # shell lines run first on every node (module load, venv)
    container: str | None = None  # pyxis | apptainer
    image: str | None = None  # default: the accelerator's rlctl engine image
    container_mounts: tuple[str, ...] = ()  # besides the job root
    network_interface: str | None = None  # NCCL/GLOO/HCCL_SOCKET_IFNAME
    ray_wait_s: int = 600  # how long the nodes and devices may take to join
    head_ip_command: str = "hostname -I | awk '{print $1}'"

    def __post_init__(self) -> None:
        for name in ("partition", "account", "qos", "constraint", "time", "mem"):
            value = getattr(self, name)
            if value is not None:
                _check_sbatch_value(name, value)
        for line in self.sbatch:
            _check_sbatch_line(line)
        if self.image is not None:
            check_image(self.image, "slurm profile")
        for mount in self.container_mounts:
            if mount.startswith("-") or not _SBATCH_VALUE.match(mount) or "," in mount:
                raise RlctlError(
                    f"slurm profile: container_mounts entry {mount!r} is not SRC[:DST[:FLAGS]]",
                    hint="one mount per entry: paths of letters, digits and . _ / : + -",
                )
        if self.network_interface is not None and not _IFNAME.match(self.network_interface):
            raise RlctlError(
                f"slurm profile: network_interface {self.network_interface!r} is not an"
                " interface name",
                hint="e.g. ib0, eth0, or NCCL's forms ^docker or =eth0,eth1",
            )
        if self.container is not None and self.container not in CONTAINERS:
            raise RlctlError(
                f"slurm profile: container {self.container!r} is not one of {CONTAINERS}"
            )
        if self.gpu_request not in GPU_REQUESTS:
            raise RlctlError(
                f"slurm profile: gpu_request {self.gpu_request!r} is not one of {GPU_REQUESTS}"
            )
        if not PLAIN_PATH.match(self.job_root):
            raise RlctlError(
                f"slurm profile: job_root {self.job_root!r} must be a plain path",
                hint="letters, digits and . _ / ~ + - only (it lands on #SBATCH lines)",
            )
        for line in self.prelude:
            if "\n" in line:
                raise RlctlError("slurm profile: a prelude entry holds a newline: one line each")
        if self.ssh is not None and (self.ssh.startswith("-") or not self.ssh.strip()):
            raise RlctlError(f"slurm profile: ssh {self.ssh!r} is not a host")


def load_profile(path: Path | None = None) -> SlurmProfile:
    """The profile at ``path`` (default ``<RLCTL_HOME>/slurm.yaml``); defaults if absent."""
    path = path or rlctl_home(create=False) / PROFILE_FILE
    raw = read_site_file(PROFILE_FILE, "a Slurm profile is a mapping of fields", path)
    if raw is None:
        return SlurmProfile()
    return profile_from_mapping(raw, source=str(path))


def profile_from_mapping(raw: Mapping[str, Any], source: str = "slurm profile") -> SlurmProfile:
    known = {f.name: f for f in fields(SlurmProfile)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in known:
            raise RlctlError(f"{source}: unknown field {key!r}", hint=closest_or_all(key, known))
        kind = str(known[key].type)
        if value is None:
            values[key] = None
        elif kind.startswith("tuple"):
            items = (
                [value]
                if isinstance(value, str)
                else list(value)
                if isinstance(value, tuple)
                else value
            )
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise RlctlError(f"{source}: {key} must be a list of strings, got {value!r}")
            values[key] = tuple(items)
        elif kind == "bool":
            if not isinstance(value, bool):
                raise RlctlError(f"{source}: {key} must be true or false, got {value!r}")
            values[key] = value
        elif kind.startswith("int"):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise RlctlError(f"{source}: {key} must be a whole number, got {value!r}")
            values[key] = value
        elif key == "time" and isinstance(value, int) and not isinstance(value, bool):
            # YAML 1.1 reads an unquoted 24:00:00 as the base-60 number 86400, which
            # sbatch would take as 86400 minutes
            raise RlctlError(
                f"{source}: time {value!r} is a number (YAML reads an unquoted 24:00:00 as"
                " 86400 in base 60)",
                hint='quote it: time: "24:00:00" (or give minutes as "90")',
            )
        elif isinstance(value, dict | list | bool | float):
            raise RlctlError(f"{source}: {key} must be text, got {value!r}")
        else:
            values[key] = str(value)
    return SlurmProfile(**values)


def _check_sbatch_line(line: str) -> None:
    if not _SBATCH_LINE.match(line):
        raise RlctlError(
            f"slurm profile: sbatch line {line!r} is not one sbatch option",
            hint="write each as --option=value (no spaces, quotes or shell characters; the"
            " value not starting with '-')",
        )
    option = line.lstrip("-").split("=")[0].split(" ")[0]
    long_name = next(
        (k for k, short in _SBATCH_RESERVED.items() if option in (k, short) and option), None
    )
    if long_name is not None and (line.startswith("--") or len(option) == 1):
        raise RlctlError(
            f"slurm profile: sbatch line {line!r}: --{long_name} is rlctl's to set (or keeps"
            " sbatch from submitting the job)",
            hint="the profile's own fields set the partition, account, time, requeue ...;"
            " the recipe's hardware sets the nodes",
        )


def _check_sbatch_value(name: str, value: str) -> None:
    if not _SBATCH_VALUE.match(value):
        raise RlctlError(
            f"slurm: {name} {value!r} cannot go on an #SBATCH line",
            hint="one word of letters, digits and Slurm's own syntax (, : - [ ] & |), not"
            " starting with '-'",
        )
