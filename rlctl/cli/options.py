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
