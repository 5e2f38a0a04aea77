"""Where jobs run: one module per backend, all behind ``base.Backend``."""

from __future__ import annotations

from rlctl.backends.base import Backend
from rlctl.errors import RlctlError

BACKENDS = ("local", "slurm", "skypilot")


def get_backend(name: str, **options) -> Backend:
    """The backend called ``name``; ``options`` are its own (e.g. SkyPilot's cloud)."""
    if name == "local":
        from rlctl.backends.local import LocalBackend

        return LocalBackend()
    if name == "slurm":
        from rlctl.backends.slurm import SlurmBackend

        return SlurmBackend(**options)
    if name == "skypilot":
        from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions

        return SkyPilotBackend(SkyPilotOptions(**options))
    if name in BACKENDS:
        raise RlctlError(
            f"the {name} backend is not available in this version of rlctl",
            hint="use --backend local for now",
        )
    raise RlctlError(f"unknown backend {name!r}", hint=f"valid: {', '.join(BACKENDS)}")
