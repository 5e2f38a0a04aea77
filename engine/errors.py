"""Engine exceptions: user errors carry the fix in their message."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

# The engine's exit codes: 0 done; 1 a failure (a worker died or raised); 2 a
# configuration or usage error (EXIT_USER_ERROR); 75 stopped on SIGTERM, requeue me
# (engine.loop.trainer.Preempted); 76 a phase ran past the hang watchdog's bound, every
# worker's stacks are in the log (EXIT_HUNG, engine.watchdog). Which of them a restart
# may cure: engine.exits. docs/training.md, "Faults".
EXIT_FAILED = 1
EXIT_USER_ERROR = 2
EXIT_PREEMPTED = 75  # EX_TEMPFAIL
EXIT_HUNG = 76


class EngineError(Exception):
    """An error the user can fix; the message says what to change. ``reason`` names it
    for the exit record (engine.exits: whether a restart may cure it)."""

    exit_code = EXIT_USER_ERROR
    reason = "config"


class ConfigError(EngineError):
    """The configuration is invalid. Holds every problem found, not only the first."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        if len(self.problems) == 1:
            message = f"invalid engine config: {self.problems[0]}"
        else:
            lines = "\n".join(f"  - {p}" for p in self.problems)
            message = f"invalid engine config ({len(self.problems)} problems):\n{lines}"
        super().__init__(message)


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """The error boundary of the engine's commands (``engine.main``, ``engine.export``,
    ``engine.data.prepare``): an ``EngineError`` prints its message and exits with its
    code (2 unless it says otherwise); the traceback only with ENGINE_DEBUG=1."""
    try:
        yield
    except EngineError as exc:
        if os.environ.get("ENGINE_DEBUG"):
            raise
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
