"""rlctl launch · plan · validate"""

from __future__ import annotations

import json

import typer

from rlctl.cli import options


def register(app: typer.Typer) -> None:
    app.command()(launch)
    app.command()(plan)
    app.command()(validate)


def launch(
    recipe: options.Recipe,
    backend: options.Backend = "local",
    cloud: options.Cloud = None,
    cluster: options.Cluster = None,
    spot: options.Spot = False,
    ssh: options.Ssh = None,
    partition: options.Partition = None,
    account: options.Account = None,
    follow: bool = typer.Option(False, "--follow", "-f", help="Stream the logs after launching."),
) -> None:
    """Launch a recipe as a job.

    Example: `rlctl launch quickstart` · `rlctl launch recipes/dapo_qwen32b.yaml --cloud gcp`
    """
    from rlctl import api

    backend, opts = options.backend_options(backend, cloud, cluster, spot, ssh, partition, account)
    job = api.launch(recipe, backend=backend, **opts)
    typer.echo(f"launched {job.id} ({job.backend}); follow with: rlctl logs {job.id} -f")
    if follow:
        for line in api.logs(job.id, follow=True):
            typer.echo(line)


def plan(
    recipe: options.Recipe,
    backend: options.Backend = "local",
    cloud: options.Cloud = None,
    cluster: options.Cluster = None,
    spot: options.Spot = False,
    ssh: options.Ssh = None,
    partition: options.Partition = None,
    account: options.Account = None,
    emit_yaml: str | None = typer.Option(
        None, "--emit-yaml", help="SkyPilot: write the task to this file (for `sky launch`)."
    ),
    as_json: options.Json = False,
) -> None:
    """Show what a recipe would run: sizing, memory, the engine config, the job script.
    Nothing is launched or recorded.

    Example: `rlctl plan recipes/dapo_qwen32b.yaml` · `rlctl plan dapo_qwen32b --cloud gcp --emit-yaml task.yaml`
    """
    from pathlib import Path

    from rlctl import api
    from rlctl.recipe.load import load_recipe

    backend, opts = options.backend_options(backend, cloud, cluster, spot, ssh, partition, account)
    recipe_obj = load_recipe(api.find_recipe(recipe))
    prepared = api.prepare(recipe_obj, backend=backend, job_id="job-id", **opts)
    if emit_yaml:
        if "task.yaml" not in prepared.files:
            raise typer.BadParameter("--emit-yaml writes a SkyPilot task: use it with --cloud")
        Path(emit_yaml).write_text(prepared.files["task.yaml"])
    if as_json:
        typer.echo(json.dumps({"plan": prepared.plan.to_json(), "files": prepared.files}, indent=1))
        return
    from rlctl.cli.show import show_plan

    show_plan(prepared)


def validate(recipe: options.Recipe) -> None:
    """Check a recipe: its fields, its hardware and every engine key, as it would launch.

    Example: `rlctl validate recipes/quickstart.yaml`
    """
    from rlctl import api

    checked = api.validate(recipe)
    typer.echo(f"ok: {checked.name} ({checked.algorithm}, {checked.model})")
