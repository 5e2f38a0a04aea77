"""rlctl recipes"""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    app.command()(recipes)


def recipes() -> None:
    """List the bundled recipes, with a line each.

    Example: `rlctl recipes`, then `rlctl plan NAME`
    """
    from rlctl import api

    for recipe in api.bundled_recipes():
        typer.echo(f"{recipe.name:28} {recipe.description}")
