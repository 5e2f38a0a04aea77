import pytest


@pytest.fixture(autouse=True)
def _own_rlctl_home(tmp_path, monkeypatch):
    """A private RLCTL_HOME: a developer's ~/.rlctl/skypilot.yaml (the site profile) must
    not change the tasks these tests render."""
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path / "rlctl-home"))
