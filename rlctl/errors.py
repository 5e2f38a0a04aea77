"""Launcher exceptions: each says what is wrong and, in ``hint``, what to change.

The CLI's error boundary prints ``str(error)`` and then the hint; a traceback only
with the debug variable. ``assert`` stays for internal invariants.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RlctlError(Exception):
    """An error the user can fix. ``str()`` is the problem; ``hint`` is the fix."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


class UnknownAcceleratorError(RlctlError):
    """An accelerator name that the hardware table does not know (or cannot pin down)."""

    def __init__(
        self, message: str, hint: str | None = None, suggestions: tuple[str, ...] = ()
    ) -> None:
        super().__init__(message, hint)
        self.suggestions = suggestions


class AcceleratorSpecError(RlctlError):
    """A malformed ``NAME[:COUNT]`` accelerator spec (bad count, extra fields)."""


def closest_or_all(name: object, known: Iterable[str], listing: str = "fields") -> str:
    """The hint for an unknown name: the closest known one, else every known name."""
    known = list(known)
    close = difflib.get_close_matches(str(name), known, n=1)
    return f"did you mean {close[0]!r}?" if close else f"{listing}: {', '.join(known)}"
