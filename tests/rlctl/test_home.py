"""Site settings files under RLCTL_HOME (the Slurm and SkyPilot profiles)."""

import pytest

from rlctl.backends.slurm import load_profile
from rlctl.errors import RlctlError
from rlctl.home import read_site_file


def test_a_missing_site_file_is_no_settings(tmp_path):
    assert read_site_file("slurm.yaml", "a mapping", tmp_path / "slurm.yaml") is None


def test_a_broken_site_file_names_itself_and_what_is_wrong(tmp_path):
    path = tmp_path / "slurm.yaml"
    path.write_text("partition: [gpu\n")
    with pytest.raises(RlctlError, match=r"slurm\.yaml: not valid YAML"):
        read_site_file("slurm.yaml", "a mapping", path)
    path.write_text("- gpu\n")
    with pytest.raises(RlctlError, match="a Slurm profile is a mapping of fields"):
        load_profile(path)


def test_site_files_live_in_rlctl_home(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    (tmp_path / "skypilot.yaml").write_text("slurm/site: {image: none}\n")
    assert read_site_file("skypilot.yaml", "a mapping") == {"slurm/site": {"image": "none"}}
