"""Options shared by several commands, defined once."""

from __future__ import annotations

from typing import Annotated

import typer

Recipe = Annotated[str, typer.Argument(help="A recipe file, or the name of a bundled recipe.")]
JobRef = Annotated[str, typer.Argument(help="A job id (or a unique prefix of one).")]
Backend = Annotated[
    str,
    typer.Option("--backend", "-b", help="Where to run: local (default), slurm or skypilot."),
]
Json = Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")]
Cloud = Annotated[
    str | None,
    typer.Option(
        "--cloud",
        help="Run through SkyPilot on this cloud or Kubernetes (gcp, aws, azure, k8s, lambda,"
        " runpod, nebius; with /region[/zone]), or a Slurm cluster SkyPilot knows"
        " (slurm/NAME). Implies --backend skypilot.",
    ),
]
Cluster = Annotated[
    str | None,
    typer.Option("--cluster", help="SkyPilot: run on this named cluster instead of a managed job."),
]
Spot = Annotated[bool, typer.Option("--spot", help="SkyPilot: use spot/preemptible instances.")]


Ssh = Annotated[
    str | None,
    typer.Option(
        "--ssh", help="Slurm: submit through this login node (user@host). Implies --backend slurm."
    ),
]
Partition = Annotated[str | None, typer.Option("--partition", help="Slurm: the partition.")]
Account = Annotated[str | None, typer.Option("--account", help="Slurm: the account.")]


def backend_options(
    backend: str,
    cloud: str | None = None,
    cluster: str | None = None,
    spot: bool = False,
    ssh: str | None = None,
    partition: str | None = None,
    account: str | None = None,
) -> tuple[str, dict]:
    """The backend to use and its options, from the shared flags."""
    sky = bool(cloud or cluster or spot)
    slurm = bool(ssh or partition or account)
    if sky and slurm:
        raise typer.BadParameter(
            "--cloud/--cluster/--spot (SkyPilot) and --ssh/--partition/--account (Slurm) do not mix"
        )
    if sky:
        if backend not in ("local", "skypilot"):
            raise typer.BadParameter(
                f"--cloud/--cluster/--spot are SkyPilot's; not with --backend {backend}"
            )
        return "skypilot", {"cloud": cloud, "cluster": cluster, "use_spot": spot}
    if slurm:
        if backend not in ("local", "slurm"):
            raise typer.BadParameter(
                f"--ssh/--partition/--account are Slurm's; not with --backend {backend}"
            )
        return "slurm", {"ssh": ssh, "partition": partition, "account": account}
    return backend, {}
