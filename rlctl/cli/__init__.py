"""The ``rlctl`` command line: a thin layer over ``rlctl.api``, one module per noun.

Errors the user can fix print one short message and the fix; a traceback only
with RLCTL_DEBUG=1. Nothing here imports torch, ray or skypilot.
"""

from __future__ import annotations

import os
import sys

import typer

from rlctl import __version__

app = typer.Typer(
    name="rlctl",
    help="Launch RL post-training of LLMs: on this machine, on Slurm, or on any cloud.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="markdown",
)

EXIT_USER_ERROR = 2


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
    """rlctl turns a recipe into a running RL job.

    Examples:

        rlctl launch quickstart                # the CPU quickstart, here
        rlctl plan recipes/dapo_qwen32b.yaml   # what would run, no side effects
        rlctl doctor recipes/dapo_qwen32b.yaml # pre-flight checks, in seconds
        rlctl status; rlctl logs JOB -f; rlctl stop JOB
    """


def _register() -> None:
    from rlctl.cli import doctor, jobs, launch, recipes

    launch.register(app)
    doctor.register(app)
    jobs.register(app)
    recipes.register(app)


def main() -> None:
    _register()
    try:
        app(standalone_mode=False, prog_name="rlctl")
    except SystemExit:
        raise
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # the one error boundary
        if os.environ.get("RLCTL_DEBUG"):
            raise
        from rlctl.errors import RlctlError

        if isinstance(exc, RlctlError):
            typer.secho(f"error: {exc}", err=True, fg="red")
            if exc.hint:
                typer.echo(f"fix: {exc.hint}", err=True)
            sys.exit(EXIT_USER_ERROR)
        # exits and usage errors (no such option, a missing argument) of click or of the
        # copy of it typer >= 0.20 carries: told by their interface, not their classes, and
        # click never imported (typer >= 0.29 no longer installs it)
        code = getattr(exc, "exit_code", None)
        if isinstance(code, int):
            if callable(getattr(exc, "show", None)):
                exc.show()
            sys.exit(code)
        typer.secho(f"error: {type(exc).__name__}: {exc}", err=True, fg="red")
        typer.echo("(set RLCTL_DEBUG=1 for the traceback)", err=True)
        sys.exit(1)
