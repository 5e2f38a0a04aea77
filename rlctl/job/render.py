"""Render the files a job runs from ``templates/`` (Jinja).

Templates are data; every value from a recipe passes through ``shquote`` or
``shjoin`` (``shlex``) when it lands on a shell line, and the environment's secret
values never reach a template at all.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable
from typing import Any

import jinja2

from rlctl.bundled import bundled_dir

TEMPLATES = bundled_dir("templates")


def _shjoin(argv: Iterable[str]) -> str:
    return " ".join(shlex.quote(str(word)) for word in argv)


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)),
        undefined=jinja2.StrictUndefined,  # a missing value is an error, not an empty word
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,  # shell, not HTML: quoting is done by the filters
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["shjoin"] = _shjoin
    # For text inside a comment: a newline would end the comment and start a command.
    env.filters["oneline"] = lambda value: " ".join(str(value).split())
    return env


def render(template: str, **values: Any) -> str:
    return environment().get_template(template).render(**values)
