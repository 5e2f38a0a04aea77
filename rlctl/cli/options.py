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
        " runpod, nebius; with /region[/zone]). Implies --backend skypilot.",
    ),
]
Cluster = Annotated[
    str | None,
    typer.Option("--cluster", help="SkyPilot: run on this named cluster instead of a managed job."),
]
Spot = Annotated[bool, typer.Option("--spot", help="SkyPilot: use spot/preemptible instances.")]


def backend_options(
    backend: str, cloud: str | None, cluster: str | None, spot: bool
) -> tuple[str, dict]:
    """The backend to use and its options, from the shared flags."""
    if cloud or cluster or spot:
        if backend not in ("local", "skypilot"):
            raise typer.BadParameter(
                f"--cloud/--cluster/--spot are SkyPilot's; not with --backend {backend}"
            )
        return "skypilot", {"cloud": cloud, "cluster": cluster, "use_spot": spot}
    return backend, {}
