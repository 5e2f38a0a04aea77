"""A named registry: one algorithm variant, one registered function.

Variants are looked up by the name a user writes in config; an unknown name
fails with the list of valid ones and the closest match.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from typing import Generic, TypeVar

F = TypeVar("F", bound=Callable)


class UnknownNameError(KeyError):
    """A config named a variant that is not registered."""

    def __str__(self) -> str:  # KeyError quotes its argument; show the message as written
        return str(self.args[0])


def unknown_name_message(kind: str, name: str, valid: list[str] | tuple[str, ...]) -> str:
    """The message for an unknown variant name: the bad value, the valid ones, a suggestion."""
    message = f"unknown {kind} {name!r}; valid: {', '.join(sorted(valid))}"
    close = difflib.get_close_matches(name, list(valid), n=1)
    if close:
        message += f" (did you mean {close[0]!r}?)"
    return message


class Registry(Generic[F]):
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, *names: str) -> Callable[[F], F]:
        """Register the decorated function under one or more names (aliases)."""

        def decorator(fn: F) -> F:
            for name in names:
                if name in self._fns:
                    raise ValueError(f"{self.kind} {name!r} is already registered")
                self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._fns[name]
        except KeyError:
            raise UnknownNameError(unknown_name_message(self.kind, name, self.names())) from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._fns)

    def __contains__(self, name: object) -> bool:
        return name in self._fns
