"""Engine exceptions: user errors carry the fix in their message."""


class EngineError(Exception):
    """An error the user can fix; the message says what to change."""


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
