"""Fixtures of the sandbox's tests: the isolation mode each runs in (sandbox_modes.py)."""

from tests.engine.sandbox.sandbox_modes import make_limits, sandbox_mode  # noqa: F401
