"""The wheel rlctl ships with a job is this rlctl, and a node's setup installs it over
the image's packages (rlctl/job/wheel.py, rlctl/node/jobenv.py), run for real: pip, a venv."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import engine
import rlctl
from rlctl import __version__
from rlctl.job.wheel import WHEEL_NAME, build_wheel, wheel_files
from rlctl.node.jobenv import MARKER

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_the_wheel_is_named_and_versioned_as_the_running_rlctl(wheel):
    assert wheel.name == WHEEL_NAME == f"rlctl-{__version__}-py3-none-any.whl"
    metadata = wheel_files(wheel)[f"rlctl-{__version__}.dist-info/METADATA"].decode()
    assert "\nName: rlctl\n" in metadata and f"\nVersion: {__version__}\n" in metadata
    assert 'extra == "engine"' in metadata  # the extras the node's setup asks for


def test_the_wheel_carries_the_code_this_process_imports_byte_for_byte(wheel):
    files = wheel_files(wheel)
    for package in (rlctl, engine):
        root = Path(package.__file__).parent
        for path in root.rglob("*.py"):
            name = f"{package.__name__}/{path.relative_to(root).as_posix()}"
            assert files.get(name) == path.read_bytes(), name
    assert not [n for n in files if "__pycache__" in n or n.endswith(".pyc")]
    data = f"rlctl-{__version__}.data/data/share/rlctl"
    assert f"{data}/templates/slurm/job.sbatch.j2" in files
    assert f"{data}/recipes/quickstart.yaml" in files


def test_record_hashes_every_file_and_builds_are_identical(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        record = zf.read(f"rlctl-{__version__}.dist-info/RECORD").decode().splitlines()
        for line in record:
            name, digest, size = line.rsplit(",", 2)
            if not digest:
                assert name.endswith("RECORD")
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={want}", len(data)), name
        assert len(record) == len(zf.namelist())
    again = build_wheel(tmp_path)
    assert again.read_bytes() == wheel.read_bytes()  # the same code, the same bytes
    assert [p.name for p in tmp_path.iterdir()] == [WHEEL_NAME]  # no temporary left


def _jobenv(wheel: Path, env: Path, extras: str = "engine") -> subprocess.CompletedProcess:
    """The setup line a node runs, with this test's Python as the image's."""
    return subprocess.run(
        [sys.executable, "-m", "rlctl.node.jobenv", str(env), str(wheel), "--extras", extras],
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(wheel), os.environ.get("PYTHONPATH", "")]),
            "PIP_NO_INDEX": "1",  # everything is in the base: nothing may be downloaded
        },
        cwd=env.parent,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_nodes_sharing_the_job_directory_make_its_environment_once(wheel, tmp_path):
    """Two nodes' setups at once on one file system (as two SkyPilot "nodes" of one host
    did, one failing in pip's files under the other): one makes it, one keeps it."""
    env = tmp_path / "env"
    command = [sys.executable, "-m", "rlctl.node.jobenv", str(env), str(wheel)]
    environ = {**os.environ, "PYTHONPATH": str(wheel), "PIP_NO_INDEX": "1"}
    nodes = [
        subprocess.Popen(command, env=environ, cwd=tmp_path, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for _ in range(2)
    ]  # fmt: skip
    outs = [p.communicate(timeout=300)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    states = sorted(line.split(":")[1].split()[-1] for o in outs for line in o.splitlines()
                    if line.startswith("rlctl: job environment"))  # fmt: skip
    assert states == ["installed", "kept"], outs


@pytest.mark.slow
def test_a_node_installs_the_wheel_over_the_images_packages(wheel, tmp_path):
    env = tmp_path / "env"
    made = _jobenv(wheel, env)
    assert made.returncode == 0, made.stderr
    site = next((env / "lib").glob("python3*/site-packages"))
    assert f"job environment installed: rlctl {__version__} from {site}/engine/" in made.stdout
    python = env / "bin" / "python"
    probe = subprocess.run(
        [str(python), "-c", "import rlctl, engine, torch, ray; print(rlctl.__file__); print(engine.__file__)"],
        capture_output=True, text=True, cwd=tmp_path, timeout=120,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    # the shipped code, not the checkout or the base's editable install; torch and Ray
    # from the base (the image) without a copy
    assert probe.stdout.split() == [
        str(site / "rlctl/__init__.py"),
        str(site / "engine/__init__.py"),
    ]
    assert not (site / "torch").exists() and not (site / "ray").exists()
    ray = subprocess.run([str(env / "bin" / "ray"), "--version"], capture_output=True, text=True)
    assert ray.returncode == 0 and "ray, version" in ray.stdout
    # the same wheel again (a requeued job): kept as it is
    marker = (env / MARKER).read_text()
    again = _jobenv(wheel, env)
    assert again.returncode == 0 and "job environment kept" in again.stdout
    assert (env / MARKER).read_text() == marker


def test_a_missing_wheel_or_a_requirement_nobody_has_fails_clearly(wheel, tmp_path):
    missing = subprocess.run(
        [sys.executable, "-m", "rlctl.node.jobenv", str(tmp_path / "env"), str(tmp_path / "no.whl")],
        capture_output=True, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert missing.returncode == 2 and "the job's wheel" in missing.stderr
    # a requirement the image lacks and the index has not: the step fails, and says so
    broken = subprocess.run(
        [sys.executable, "-m", "rlctl.node.jobenv", str(tmp_path / "env2"), str(wheel),
         "--pip-arg=--no-index", "--pip-arg=no-such-distribution-rlctl-test"],
        env={**os.environ, "PYTHONPATH": str(wheel)},
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert broken.returncode == 1 and "installing the job's Python failed" in broken.stderr


@pytest.mark.slow
def test_the_wheel_has_what_setuptools_would_put_in_it(wheel, tmp_path):
    """The same files as `pip wheel .` of the checkout (the build backend's view of the
    project), so a node gets what an installed release would have."""
    # A copy of the project's files: a checkout's build/ folder would leak stale modules
    # into setuptools' wheel.
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "rlctl", "engine", "templates", "recipes"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy2
        copy(REPO / name, src / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                          if copy is shutil.copytree else {}))  # fmt: skip
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(tmp_path), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (built,) = tmp_path.glob("rlctl-*.whl")
    theirs = {n for n in zipfile.ZipFile(built).namelist() if ".dist-info/" not in n}
    ours = {n for n in wheel_files(wheel) if ".dist-info/" not in n}
    assert ours == theirs, (sorted(ours - theirs)[:10], sorted(theirs - ours)[:10])
