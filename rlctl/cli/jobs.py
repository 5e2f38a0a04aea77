"""rlctl status · list · logs · stop"""

from __future__ import annotations

import json
import time

import typer

from rlctl.cli import options


def register(app: typer.Typer) -> None:
    app.command()(status)
    app.command(name="list")(list_)
    app.command()(logs)
    app.command()(stop)


def status(
    job: str = typer.Argument(None, help="A job id or prefix; all jobs when omitted."),
    as_json: options.Json = False,
) -> None:
    """Show jobs, with their state refreshed from where they run; one job also shows
    its run's progress (step, score, seconds per step, time left, a score sparkline,
    each role's peak memory against the plan and the limit, restarts).

    Example: `rlctl status` · `rlctl status quickstart-k3x9`
    """
    from rlctl import api

    jobs = api.status(job)
    if job is None:
        _print_jobs(jobs, as_json)
        return
    from rlctl.store.progress import format_progress

    progress = api.progress(jobs[0])
    if as_json:
        typer.echo(json.dumps([_job_dict(jobs[0]) | {"progress": progress.to_json()}], indent=1))
        return
    _print_jobs(jobs, as_json)
    for line in format_progress(progress):
        typer.echo(line)


def list_(
    limit: int = typer.Option(50, min=1, help="At most this many, newest first."),
    all_jobs: bool = typer.Option(
        False, "--all", "-a", help="Every recorded job, finished ones included (no --limit)."
    ),
    as_json: options.Json = False,
) -> None:
    """List recorded jobs, newest first (no refresh: fast).

    Example: `rlctl list --limit 10` · `rlctl list --all`
    """
    from rlctl import api

    _print_jobs(api.list_jobs(limit=None if all_jobs else limit), as_json)


def logs(
    job: options.JobRef,
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming until the job ends."),
) -> None:
    """Print a job's output, then each role's peak memory against the plan (when its
    run logged them and this machine can read its files).

    Example: `rlctl logs quickstart-k3x9 -f`
    """
    from rlctl import api

    for line in api.logs(job, follow=follow):
        typer.echo(line)
    memory = api.memory_lines(job)
    if memory:
        typer.echo("")
        for line in memory:
            typer.echo(line)


def stop(
    job: options.JobRef,
    grace: float = typer.Option(
        60.0, help="Seconds to let the run save and exit before killing it."
    ),
) -> None:
    """Stop a job: gracefully (it saves a checkpoint), then forcefully after --grace.

    Example: `rlctl stop quickstart-k3x9`
    """
    from rlctl import api

    stopped = api.stop(job, grace_s=grace)
    typer.echo(f"{stopped.id}: {stopped.state.value} ({stopped.reason})")


def _print_jobs(jobs, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([_job_dict(j) for j in jobs], indent=1))
        return
    if not jobs:
        typer.echo("no jobs yet: rlctl launch quickstart")
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in ("JOB", "STATE", "BACKEND", "AGE", "REASON"):
        table.add_column(column)
    now = time.time()
    for j in jobs:
        table.add_row(j.id, j.state.value, j.backend, _age(now - j.created_at), j.reason or "")
    Console().print(table)


def _job_dict(job) -> dict:
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "backend": job.backend,
        "created_at": job.created_at,
        "log_path": job.handle.get("log") if job.handle else None,
    }


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
