"""The isolation modes the sandbox tests run in, and their helpers
(tests/engine/sandbox/test_sandbox*.py).

A test that takes the ``sandbox_mode`` fixture (conftest.py) runs twice: in the strongest
mode this machine allows (namespaces as root, a user namespace otherwise) and forced into
its fallback (a fresh uid as root, nothing otherwise); ``make_limits`` makes limits that
work in that mode.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.sandbox import run as sandbox
from engine.sandbox.bwrap import find_bwrap
from engine.sandbox.run import SandboxLimits

ROOT = os.geteuid() == 0
REPO = Path(__file__).resolve().parents[3]
NAMESPACED = (sandbox.NAMESPACES, sandbox.USERNS, sandbox.BWRAP)
# The modes a test runs in: bubblewrap's too where a user who is not root has it.
MODES = ["strongest", "fallback"] + (["bwrap"] if not ROOT and find_bwrap() else [])


def _usable_by_others(path: str) -> bool:
    """Whether any uid may run ``path``: every directory above it searchable by others."""
    p = Path(path)
    try:
        if not p.stat().st_mode & stat.S_IXOTH or not p.stat().st_mode & stat.S_IROTH:
            return False
        return all(d.stat().st_mode & stat.S_IXOTH for d in p.parents)
    except OSError:
        return False


def _python_for_a_fresh_uid() -> str | None:
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if candidate and _usable_by_others(os.path.realpath(candidate)):
            return os.path.realpath(candidate)
    return None


@pytest.fixture(params=MODES)
def sandbox_mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    strongest = sandbox.isolation_mode()
    if request.param == "strongest":
        return strongest
    fallback = {"bwrap": sandbox.BWRAP, "fallback": sandbox.UID if ROOT else sandbox.NONE}
    fallback = fallback[request.param]
    if fallback == strongest:
        pytest.skip(f"{fallback} is already the strongest mode on this machine")
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: fallback)
    return fallback


@pytest.fixture
def make_limits(sandbox_mode: str) -> Callable[..., SandboxLimits]:
    """Limits for the mode under test: small, and an interpreter a fresh uid may run."""

    def make(**overrides: object) -> SandboxLimits:
        values: dict = {"wall_seconds": 30, "memory_bytes": 256 << 20, "max_processes": 16}
        if sandbox_mode == sandbox.UID:
            python = _python_for_a_fresh_uid()
            if python is None:
                pytest.skip("no interpreter here that another uid may run")
            values["python"] = python
        values.update(overrides)
        return SandboxLimits(**values)

    return make


def may_show(hidden: str) -> set[str]:
    """What a hidden directory may show: the way to the interpreter and to the
    sandbox's init script, bound back when they live under it."""
    kept = [sys.base_prefix, Path(sys.executable).resolve().parent.parent, sandbox.__file__]
    names = set()
    for path in (Path(os.path.realpath(p)) for p in kept):
        if path.is_relative_to(hidden) and path != Path(hidden):
            names.add(path.relative_to(hidden).parts[0])
    return names


def process_name() -> str:
    """A process name (15 characters at most) to find the code's processes by."""
    return "sbx" + secrets.token_hex(5)


def processes_named(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() == name:
                    found.append(int(entry))
            except OSError:
                pass
    return found


def fill(text: str, **values: object) -> str:
    text = textwrap.dedent(text)
    for key, value in values.items():
        text = text.replace(key, repr(value))
    return text


def run_memory(limits: SandboxLimits) -> int:
    """What a run's cgroup lets it hold in all: the code's memory, its scratch files,
    and the sandbox's own two processes."""
    return limits.memory_bytes + limits.scratch_bytes + 2 * sandbox._WATCHER_BYTES
