"""This host as a SkyPilot Slurm cluster for the opt-in SkyPilot tests
(test_sky_slurm_e2e.py: clusters; test_sky_managed_e2e.py: managed jobs): the setup and
teardown scripts around a block, and the environment rlctl's SkyPilot client needs (a
private HOME and API server port, from the setup's env file)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BASE = Path(os.environ.get("RLCTL_SKY_BASE", "/tmp/rlctl-sky"))


@contextlib.contextmanager
def sky_slurm(*clusters: str, managed: bool = False) -> Iterator[dict[str, str]]:
    """``sky_slurm_setup.sh`` (uv seeded for ``clusters``; with ``managed``, the jobs
    controller and the probe stand-in of its step 8), the environment, then the
    teardown whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm daemons, sshd and packages need root")
    pytest.importorskip("sky", reason="skypilot is not installed: pip install 'rlctl[skypilot]'")
    started = time.monotonic()
    script_env = {**os.environ, "RLCTL_PYTHON": sys.executable}
    setup = subprocess.run(
        ["bash", str(HERE / "sky_slurm_setup.sh"), *clusters],
        capture_output=True, text=True, timeout=900,
        env={**script_env, "RLCTL_SKY_MANAGED": "1" if managed else "0"},
    )  # fmt: skip
    try:
        assert setup.returncode == 0, (setup.stdout + setup.stderr)[-3000:]
        print(f"\nsky_slurm_setup.sh: {time.monotonic() - started:.0f} s")
        env = dict(os.environ)
        for line in (BASE / "env").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line.removeprefix("export ").partition("=")
                env[key] = value.replace("$PATH", os.environ["PATH"])
        yield env
    finally:
        down = subprocess.run(
            ["bash", str(HERE / "sky_slurm_teardown.sh")],
            capture_output=True, text=True, timeout=600, env=script_env,
        )  # fmt: skip
        print(down.stdout[-1500:], down.stderr[-1500:])
