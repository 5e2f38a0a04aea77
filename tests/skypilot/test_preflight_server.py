"""The preflight check against a real SkyPilot API server (started locally, no cloud
credentials here): it must refuse before anything is launched, and say how to fix it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("sky", reason="skypilot is not installed: pip install 'rlctl[skypilot]'")
pytestmark = [pytest.mark.slow, pytest.mark.cluster]

CHECK = """
from rlctl.backends.skypilot import SkyPilotBackend, SkyPilotOptions
from rlctl.errors import RlctlError
try:
    SkyPilotBackend(SkyPilotOptions(cloud="gcp")).preflight()
except RlctlError as exc:
    print("REFUSED:", exc, "| hint:", exc.hint)
else:
    print("ACCEPTED")
"""


def test_no_enabled_cloud_is_refused_by_a_real_api_server(tmp_path):
    # A private HOME: the server's state (~/.sky) and its port file stay in tmp_path.
    env = {**os.environ, "HOME": str(tmp_path), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    sky_cli = os.path.join(os.path.dirname(sys.executable), "sky")
    try:
        out = subprocess.run(
            [sys.executable, "-c", CHECK],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
        )
        assert "REFUSED: no cloud is enabled in SkyPilot" in out.stdout, out.stdout + out.stderr
        assert "sky check" in out.stdout
    finally:
        subprocess.run([sky_cli, "api", "stop"], env=env, capture_output=True, timeout=120)
