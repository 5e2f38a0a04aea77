"""The ``rlctl`` command line: a thin layer over the Python API, one module per noun."""

from __future__ import annotations

import typer

from rlctl import __version__

app = typer.Typer(
    name="rlctl",
    help="Launch RL post-training of LLMs: local, Slurm, or any cloud through SkyPilot.",
    no_args_is_help=True,
    add_completion=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"rlctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """rlctl turns a recipe into a running RL job."""


def main() -> None:
    app()
