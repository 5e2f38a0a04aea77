"""rlctl doctor"""

from __future__ import annotations

import sys

import typer

from rlctl.cli import options


def register(app: typer.Typer) -> None:
    app.command()(doctor)


def doctor(
    recipe: options.Recipe,
    backend: options.Backend = "local",
    cloud: options.Cloud = None,
    cluster: options.Cluster = None,
    spot: options.Spot = False,
    ssh: options.Ssh = None,
    partition: options.Partition = None,
    account: options.Account = None,
) -> None:
    """Check a recipe before a long run, in seconds: its plan, the image's engine version,
    the secrets, the checkpoint bucket and, for a local run, this machine's devices, disk,
    versions and model. Exits 2 when a check fails, each failure naming the fix.

    Example: `rlctl doctor recipes/dapo_qwen32b.yaml --cloud gcp` · `rlctl doctor quickstart`
    """
    from rlctl.doctor import doctor as run_doctor

    backend, opts = options.backend_options(backend, cloud, cluster, spot, ssh, partition, account)
    findings = run_doctor(recipe, backend=backend, **opts)
    for finding in findings:
        typer.echo(finding.line(), err=not finding.ok)
    if not all(f.ok for f in findings):
        sys.exit(2)
