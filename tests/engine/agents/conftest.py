"""The sandbox tests' fixtures: the isolation mode a test runs in (sandbox_modes.py)."""

from tests.engine.agents.sandbox_modes import make_limits, sandbox_mode  # noqa: F401
