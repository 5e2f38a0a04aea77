"""Pre-flight checks on a node, before the engine starts (``python -m engine.doctor``), and
the pieces ``rlctl doctor`` runs from the launching machine (through engine.schema).

Each check returns the problems it found, each naming the node, the check and the fix;
none raises. The command runs the checks its options ask for and exits 2 when any
failed, so a job script can stop before the engine loads a model:

    python -m engine.doctor --devices cuda:8 --rollout vllm --disk /ckpt:120 \
        --secrets WANDB_API_KEY --bucket s3://b/run --model /models/qwen \
        --rendezvous head:29511 --rank 1 --world 2

Torch is imported only by the device and all-reduce checks, transformers only by the
model check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from engine.errors import EXIT_USER_ERROR

GIB = 2**30


@dataclass(frozen=True)
class Problem:
    check: str  # versions, devices, disk, secrets, bucket, model, network
    message: str  # what is wrong, with the fix

    def line(self, node: str) -> str:
        return f"{node}: {self.check}: {self.message}"


def check_versions(backends: Sequence[str]) -> list[Problem]:
    """The installed versions of ``backends`` (vllm, sglang, megatron) against the
    supported ranges (engine.versions)."""
    from engine.versions import SUPPORTED, installed_version, version_tuple

    problems = []
    for name in backends:
        spec = SUPPORTED[name]
        found = installed_version(name)
        if found is None:
            problems.append(
                Problem(
                    "versions",
                    f"{spec.module} is not installed: install rlctl[{spec.extra}] or use an"
                    f" image with {spec.distribution}{spec.range}",
                )
            )
            continue
        if not (version_tuple(spec.minimum) <= version_tuple(found) < version_tuple(spec.below)):
            problems.append(
                Problem(
                    "versions",
                    f"{spec.distribution} {found} is outside the supported range {spec.range}:"
                    f" use an image with {spec.distribution}=={spec.pinned} (the one the"
                    " engine is pinned against)",
                )
            )
    return problems


def check_devices(kind: str, count: int) -> list[Problem]:
    """At least ``count`` devices of ``kind`` (cuda, npu) visible here; cpu: nothing to
    count."""
    if kind == "cpu" or count < 1:
        return []
    import torch

    module = getattr(torch, kind, None)
    seen = module.device_count() if module is not None and module.is_available() else 0
    if seen >= count:
        return []
    return [
        Problem(
            "devices",
            f"{seen} {kind} device(s) visible, the plan needs {count} on each node: ask the"
            f" scheduler for {count} per node (--gres / accelerators), check"
            " CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, or plan for fewer devices",
        )
    ]


def check_disk(path: str, need_gib: float) -> list[Problem]:
    """``need_gib`` free where ``path`` (or its nearest existing parent) lives."""
    where = Path(path)
    while not where.exists() and where != where.parent:
        where = where.parent
    free = shutil.disk_usage(where).free / GIB
    if free >= need_gib:
        return []
    return [
        Problem(
            "disk",
            f"{free:.1f} GiB free at {path}, the checkpoints need about {need_gib:.1f} GiB:"
            " free space there, point trainer.default_local_dir at a larger disk, keep fewer"
            " checkpoints (trainer.max_actor_ckpt_to_keep), or save to a bucket",
        )
    ]


def check_secrets(names: Sequence[str], env: dict[str, str] | None = None) -> list[Problem]:
    env = dict(os.environ) if env is None else env
    missing = [n for n in names if not env.get(n)]
    if not missing:
        return []
    return [
        Problem(
            "secrets",
            f"not set: {', '.join(missing)}: export them where you launch (rlctl passes a"
            " recipe's secrets to every node) or remove them from the recipe's secrets",
        )
    ]


def check_bucket(root: str) -> list[Problem]:
    """Write a small object under ``root``, read it back and delete it."""
    from engine.storage import StorageError, open_store

    folder = f".rlctl-doctor-{uuid.uuid4().hex[:8]}"
    text = f"rlctl doctor {folder}"
    try:
        store = open_store(root)
        store.write_text(f"{folder}/probe", text)
        back = store.read_text(f"{folder}/probe")
        store.delete_dir(folder)
    except (StorageError, OSError) as error:
        return [Problem("bucket", f"cannot write and read {root}: {error}")]
    except Exception as error:  # the cloud SDK's own (credentials, permissions, network)
        return [
            Problem(
                "bucket",
                f"cannot write and read {root}: {type(error).__name__}: {error}: check the"
                " bucket's name and that this node's credentials may write to it",
            )
        ]
    if back != text:
        return [Problem("bucket", f"{root}: what was read back differs from what was written")]
    return []


def check_model(path: str, trust_remote_code: bool = False) -> list[Problem]:
    """The model's config readable where the engine will read it."""
    try:
        from transformers import AutoConfig

        AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as error:
        return [
            Problem(
                "model",
                f"cannot read the config of {path}: {type(error).__name__}: {error}: give a"
                " folder with config.json on this node, or a hub id with network (or"
                " HF_HOME's cache) here",
            )
        ]
    return []


def check_network(address: str, rank: int, world: int, timeout_s: float) -> list[Problem]:
    """A one-element all-reduce over every node (gloo, over TCP): each node reaches the
    first at ``address`` (host:port) and the sum comes back as ``world``."""
    import torch
    import torch.distributed as dist

    host, port = address.rsplit(":", 1)
    try:
        store = dist.TCPStore(
            host,
            int(port),
            world,
            is_master=rank == 0,
            timeout=timedelta(seconds=timeout_s),
            wait_for_workers=False,
        )
        dist.init_process_group(
            "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s)
        )
        try:
            one = torch.ones(1)
            dist.all_reduce(one)
            ok = int(one.item()) == world
        finally:
            dist.destroy_process_group()
    except Exception as error:
        return [
            Problem(
                "network",
                f"rank {rank} of {world} could not all-reduce with the others through"
                f" {address} in {timeout_s:g} s ({type(error).__name__}: {error}): check"
                " that the nodes reach each other on that port (firewall, the interface"
                " GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME names)",
            )
        ]
    return [] if ok else [Problem("network", f"the all-reduce over {world} nodes gave {one}")]


def run(args: argparse.Namespace) -> list[Problem]:
    checks: list[Callable[[], list[Problem]]] = []
    if args.rollout or args.backend:
        checks.append(lambda: check_versions([*filter(None, [args.rollout]), *args.backend]))
    if args.devices:
        kind, _, count = args.devices.partition(":")
        checks.append(lambda: check_devices(kind, int(count or 1)))
    if args.disk:
        path, _, need = args.disk.rpartition(":")
        checks.append(lambda: check_disk(path, float(need)))
    if args.secrets:
        checks.append(lambda: check_secrets([s for s in args.secrets.split(",") if s]))
    if args.bucket:
        checks.append(lambda: check_bucket(args.bucket))
    if args.model:
        checks.append(lambda: check_model(args.model, args.trust_remote_code))
    if args.rendezvous:
        checks.append(lambda: check_network(args.rendezvous, args.rank, args.world, args.timeout))
    return [p for check in checks for p in check()]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.doctor", description=__doc__)
    parser.add_argument("--node", default=socket.gethostname(), help="this node's name")
    parser.add_argument("--devices", help="KIND:COUNT the plan needs on each node (cuda:8)")
    parser.add_argument("--rollout", help="the rollout engine whose version to check")
    parser.add_argument("--backend", action="append", default=[], help="megatron, ...")
    parser.add_argument("--disk", help="PATH:GIB free needed for checkpoints")
    parser.add_argument("--secrets", help="names that must be set, comma-separated")
    parser.add_argument("--bucket", help="a checkpoint bucket (or folder) to write and read")
    parser.add_argument("--model", help="the model path whose config must be readable")
    parser.add_argument("--trust-remote-code", action="store_true")
    parser.add_argument("--rendezvous", help="HOST:PORT of rank 0 for the all-reduce")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds for the all-reduce")
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")  # torch's own retry chatter
    if args.rollout == "hf":
        args.rollout = None  # transformers' own: nothing beside the engine's own pins
    problems = run(args)
    for problem in problems:
        print(f"doctor: FAILED {problem.line(args.node)}", file=sys.stderr, flush=True)
    if problems:
        sys.exit(EXIT_USER_ERROR)
    print(f"doctor: {args.node}: every check passed", flush=True)


if __name__ == "__main__":
    main()
