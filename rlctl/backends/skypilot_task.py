"""The SkyPilot task, typed: built once from the job (``SkyPilotBackend.build_task``);
``to_yaml_config`` makes the dict SkyPilot's parser takes (``sky.Task.from_yaml_config``)
and ``task.yaml`` shows, and nothing else does."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from rlctl.errors import RlctlError
from rlctl.job.spec import BucketMount

CHECKPOINT_MOUNT = "/checkpoints"
BUCKET_SCHEMES = ("s3", "gs", "r2")


@dataclass(frozen=True)
class JobRecovery:
    """A managed job's: SkyPilot recovers a preempted run without counting it, restarts
    a failed one (any other non-zero exit) at most ``max_restarts_on_errors`` times, and
    one that exited with a code in ``recover_on_exit_codes`` always."""

    strategy: str  # FAILOVER | EAGER_NEXT_REGION
    max_restarts_on_errors: int
    recover_on_exit_codes: tuple[int, ...] = ()


@dataclass(frozen=True)
class SkyResources:
    infra: str | None  # None: any enabled cloud
    accelerators: tuple[str, ...]  # NAME:COUNT, in order of preference; () for CPU nodes
    cpus: str | None  # "N+" for a CPU job
    use_spot: bool
    disk_size: int  # GB
    image_id: str | None  # None: the nodes' own software
    ports: tuple[int, ...]
    job_recovery: JobRecovery | None  # None: cluster mode

    def to_yaml_config(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.infra:
            out["infra"] = self.infra
        if self.cpus is not None:
            out["cpus"] = self.cpus
        if len(self.accelerators) > 1:
            out["ordered"] = [{"accelerators": a} for a in self.accelerators]
        elif self.accelerators:
            out["accelerators"] = self.accelerators[0]
        out["use_spot"] = self.use_spot
        out["disk_size"] = self.disk_size
        if self.image_id is not None:
            out["image_id"] = self.image_id
        if self.ports:
            out["ports"] = list(self.ports)
        if self.job_recovery is not None:
            recovery = self.job_recovery
            out["job_recovery"] = {
                "strategy": recovery.strategy,
                "max_restarts_on_errors": recovery.max_restarts_on_errors,
            }
            if recovery.recover_on_exit_codes:
                out["job_recovery"]["recover_on_exit_codes"] = list(recovery.recover_on_exit_codes)
        return out


@dataclass(frozen=True)
class SkyTask:
    name: str
    num_nodes: int
    resources: SkyResources
    envs: Mapping[str, str]  # plain values
    secrets: tuple[str, ...]  # names only: values are passed at launch
    file_mounts: Mapping[str, str]  # path on the nodes -> file on this machine
    bucket: BucketMount | None  # the checkpoints' bucket
    setup: str
    run: str

    def to_yaml_config(self) -> dict[str, Any]:
        """The task as a dict (what ``sky.Task.from_yaml_config`` takes)."""
        config: dict[str, Any] = {
            "name": self.name,
            "num_nodes": self.num_nodes,
            "resources": self.resources.to_yaml_config(),
        }
        if self.envs:
            config["envs"] = dict(self.envs)
        config["secrets"] = {name: None for name in self.secrets}
        mounts: dict[str, Any] = dict(self.file_mounts)
        if self.bucket is not None:
            # MOUNT writes each file to the bucket when it is closed, in order: the
            # engine's "complete" marker lands after the checkpoint's files (MOUNT_CACHED
            # uploads later, in any order, so a preemption could leave a marker before
            # its shards).
            mounts[self.bucket.at] = {"source": self.bucket.source, "mode": "MOUNT"}
        config["file_mounts"] = mounts
        config["setup"] = self.setup
        config["run"] = self.run
        return config


def checkpoint_mount(url: str | None) -> tuple[BucketMount, str] | None:
    """``s3://bucket/a/b`` -> (the bucket's mount, the path under it where the engine
    keeps its checkpoints); None for a local path or no bucket."""
    if not url or "://" not in url:
        return None
    scheme, _, rest = url.partition("://")
    bucket, _, sub = rest.partition("/")
    if scheme not in BUCKET_SCHEMES or not bucket:
        raise RlctlError(
            f"checkpoints: {url!r} is not a bucket SkyPilot can mount",
            hint="use s3://BUCKET/path, gs://BUCKET/path or r2://BUCKET/path",
        )
    path = f"{CHECKPOINT_MOUNT}/{sub.strip('/')}" if sub.strip("/") else CHECKPOINT_MOUNT
    return BucketMount(source=f"{scheme}://{bucket}", at=CHECKPOINT_MOUNT), path


class _TaskDumper(yaml.SafeDumper):
    """Multi-line strings (setup, run) as literal blocks: the YAML reads like the script."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_TaskDumper.add_representer(str, _str)


def dump_task(config: Mapping[str, Any]) -> str:
    """The task as YAML that ``sky launch`` reads back to the same config."""
    return yaml.dump(dict(config), Dumper=_TaskDumper, sort_keys=False, width=100)
