"""A real Slurm cluster for the Slurm backend's tests: two emulated nodes on this host.

``slurm_cluster`` (session scope) installs the Debian packages if needed and starts munge,
slurmctld and one slurmd per node with ``start_slurm.sh``; afterwards ``stop_slurm.sh``
stops them by pid file. Tests that use it are skipped, with the reason, where that cannot
work: not root, not Debian/apt, or the install failing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
BASE = Path(os.environ.get("RLCTL_SLURM_BASE", "/tmp/rlctl-slurm"))
NODES = 2


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path  # SLURM_CONF for client commands
    nodes: int
    base: Path

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}


@pytest.fixture(scope="session")
def slurm_cluster() -> SlurmCluster:
    if os.geteuid() != 0:
        pytest.skip("a local Slurm needs root (packages, munge, slurmd)")
    if shutil.which("apt-get") is None and shutil.which("slurmctld") is None:
        pytest.skip("no apt-get to install Slurm, and no Slurm installed")
    env = {**os.environ, "RLCTL_SLURM_BASE": str(BASE), "RLCTL_SLURM_NODES": str(NODES)}
    started = subprocess.run(
        ["bash", str(HERE / "start_slurm.sh")], env=env, capture_output=True, text=True, timeout=600
    )
    if started.returncode != 0:
        output = (started.stdout + started.stderr)[-2000:]
        if shutil.which("slurmctld") is None:
            pytest.skip(f"could not install Slurm (apt): {output}")
        pytest.fail(f"start_slurm.sh failed:\n{output}")
    cluster = SlurmCluster(conf=BASE / "slurm.conf", nodes=NODES, base=BASE)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        subprocess.run(["bash", str(HERE / "stop_slurm.sh")], env=env, timeout=120)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
