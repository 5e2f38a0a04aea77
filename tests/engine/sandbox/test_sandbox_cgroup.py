"""The run's cgroup (engine/sandbox/cgroup.py): which hierarchy is found, and the
kernel's verdict read from it. The real thing runs in test_sandbox_kernel.py where this
machine has a cgroup (here: v1's memory and pids; v2's unified hierarchy only where its
controllers are free), so the v2 reading is checked on a directory laid out as
cgroup v2's, whose files are plain files here."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.sandbox import cgroup as sandbox_cgroup
from engine.sandbox.cgroup import Hierarchy, RunCgroup


def fake_v2(root: Path, subtree: str) -> Path:
    root.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory pids io\n")
    (root / "cgroup.subtree_control").write_text(subtree)
    return root


def test_v2_is_taken_where_memory_and_pids_are_given_to_children(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own = fake_v2(tmp_path / "unified" / "engine.scope", "memory pids\n")
    monkeypatch.setattr(
        sandbox_cgroup, "_cgroup_mounts", lambda: {"cgroup2": str(tmp_path / "unified")}
    )
    monkeypatch.setattr(sandbox_cgroup, "_own_cgroups", lambda: {"": "/engine.scope"})
    found, why = sandbox_cgroup._find()
    assert found == Hierarchy(2, str(own), str(own)) and why == ""


def test_v2_without_the_controllers_falls_back_to_v1_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_v2(tmp_path / "unified", "")
    (tmp_path / "unified" / "cgroup.controllers").write_text("hugetlb\n")
    memory, pids = tmp_path / "memory" / "job", tmp_path / "pids"
    memory.mkdir(parents=True)
    pids.mkdir()
    monkeypatch.setattr(
        sandbox_cgroup,
        "_cgroup_mounts",
        lambda: {
            "cgroup2": str(tmp_path / "unified"),
            "memory": str(tmp_path / "memory"),
            "pids": str(pids),
        },
    )
    monkeypatch.setattr(
        sandbox_cgroup, "_own_cgroups", lambda: {"": "/", "memory": "/job", "pids": "/"}
    )
    found, _ = sandbox_cgroup._find()
    assert found == Hierarchy(1, str(memory), str(pids) + "/")
    monkeypatch.setattr(sandbox_cgroup, "_own_cgroups", lambda: {"": "/"})
    found, why = sandbox_cgroup._find()
    assert found is None
    assert "no memory and pids controllers" in why and "no memory hierarchy" in why


def test_the_verdict_is_the_kernels_oom_kill_count(tmp_path: Path) -> None:
    run = RunCgroup.__new__(RunCgroup)
    run.hierarchy = Hierarchy(2, str(tmp_path), str(tmp_path))
    run.dirs = [str(tmp_path)]
    (tmp_path / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 2\noom_kill 1\n")
    assert run.oom_kills() == 1
    run.hierarchy = Hierarchy(1, str(tmp_path), str(tmp_path))
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")
    assert run.oom_kills() == 0


def test_a_real_run_cgroup_is_made_limited_and_removed() -> None:
    found, why = sandbox_cgroup.hierarchy()
    if found is None:
        pytest.skip(f"no cgroup can be made here: {why}")
    run = RunCgroup(found, 64 << 20, 5)
    try:
        assert all(Path(d).is_dir() for d in run.dirs) and len(run.fds()) == len(run.dirs)
        limit = "memory.max" if found.version == 2 else "memory.limit_in_bytes"
        assert int(Path(run.dirs[0], limit).read_text()) == 64 << 20
        assert Path(run.dirs[-1], "pids.max").read_text().strip() == "5"
    finally:
        run.remove()
    assert run.dirs == []
