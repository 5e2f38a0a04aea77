"""A SkyPilot managed job's recovery, rlctl's side: the engine under its supervisor,
which hands each restart back to SkyPilot (exit 75: ``job_recovery`` starts the whole
job again), and the files the run keeps in the checkpoints' bucket that ``rlctl status``
reads from this machine (the supervisor's record of restarts, the run's progress)."""

from __future__ import annotations

from pathlib import Path

from rlctl.job.spec import JobSpec

EXIT_HANDED_BACK = 75  # the engine's EXIT_PREEMPTED: the supervisor's "start the job again"


def restart_command(spec: JobSpec, managed: bool) -> tuple[str, ...]:
    """The engine under its supervisor. In a managed job it hands each restart to
    SkyPilot (exit 75: the job starts again on every node, Ray included), and its record
    of the attempts sits beside the checkpoints, in the bucket when they are there, so
    that the count outlives a cluster (without a bucket it is on the head node's disk,
    and a recovery onto a new cluster starts it anew). On a cluster of one's own
    (``--cluster``: nothing recovers the job) it restarts the engine in place."""
    if not managed:
        return spec.supervised_command()
    record = spec.paths.restarts
    if spec.paths.mount and spec.paths.checkpoints:
        record = f"{spec.paths.checkpoints}/{Path(record).name}"
    return spec.supervised_command(record=record, hand_back=EXIT_HANDED_BACK)


def restarts_url(spec: JobSpec) -> str | None:
    """Where ``rlctl status`` reads a managed job's record of its restarts: in the
    checkpoints' bucket, beside them (``restart_command``); None without a bucket."""
    url = spec.recipe.checkpoints
    if not spec.paths.mount or not url or not url.startswith(("s3://", "gs://")):
        return None
    return f"{url.rstrip('/')}/{Path(spec.paths.restarts).name}"


def progress_url(spec: JobSpec) -> str | None:
    """Where ``rlctl status`` reads the run's progress (engine.progress_file): beside
    the checkpoints when they are in a bucket, mounted or written to it by the engine;
    None otherwise (the metrics stay on the head node)."""
    from engine.schema import PROGRESS_FILE

    if spec.paths.mount and spec.recipe.checkpoints:
        folder = spec.recipe.checkpoints  # the mounted bucket, as this machine reaches it
    elif spec.checkpoints.startswith(("s3://", "gs://")):
        folder = spec.checkpoints
    else:
        return None
    return f"{folder.rstrip('/')}/{PROGRESS_FILE}"


def bucket_handle(spec: JobSpec, managed: bool) -> dict[str, str]:
    """The job's files in its bucket that ``rlctl status`` reads: the progress, and a
    managed job's restarts (on a cluster of one's own they stay on the head node)."""
    urls = {"restarts": restarts_url(spec) if managed else None, "progress": progress_url(spec)}
    return {key: url for key, url in urls.items() if url}
