"""Launcher exceptions: each says what is wrong and, in ``hint``, what to change.

The CLI's error boundary prints ``str(error)`` and then the hint; a traceback only
with the debug variable. ``assert`` stays for internal invariants.
"""

from __future__ import annotations


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
