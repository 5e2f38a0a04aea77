"""The launcher's templates and recipes reach an installed wheel, and are found there."""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rlctl import bundled

REPO = Path(__file__).resolve().parents[2]


def test_a_source_checkout_reads_its_own_files():
    assert bundled.bundled_dir("templates") == REPO / "templates"
    assert (bundled.bundled_dir("recipes") / "quickstart.yaml").is_file()


def test_an_installed_wheel_reads_the_shared_copy(tmp_path, monkeypatch):
    # site-packages has no templates/ next to the package: the data-files copy is used.
    installed = tmp_path / "share" / "rlctl"
    (installed / "templates").mkdir(parents=True)
    monkeypatch.setattr(bundled, "SOURCE_ROOT", tmp_path / "site-packages")
    monkeypatch.setattr(bundled, "INSTALLED_ROOT", installed)
    assert bundled.bundled_dir("templates") == installed / "templates"


@pytest.mark.slow
def test_the_wheel_carries_every_template_and_recipe(tmp_path):
    """pyproject's data-files globs are per directory: a new template folder or file type
    that they miss would work in a checkout and be absent from an installed rlctl."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(REPO)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = tmp_path.glob("rlctl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    shipped = {n.split("/data/share/rlctl/", 1)[1] for n in names if "/data/share/rlctl/" in n}
    wanted = {
        str(p.relative_to(REPO))
        for folder in ("templates", "recipes")
        for p in (REPO / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert wanted <= shipped, sorted(wanted - shipped)
