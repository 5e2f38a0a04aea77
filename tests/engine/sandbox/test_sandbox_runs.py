"""Running code in the sandbox (engine/sandbox/run.py): what a run returns, from
normal code to misuse, and runs at once. The attacks are in test_sandbox.py."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from engine.sandbox import run as sandbox
from engine.sandbox.run import SandboxError, SandboxLimits, run_python, run_python_async

pytestmark = pytest.mark.timeout(120)

ROOT = os.geteuid() == 0


def test_an_exception_gives_its_traceback_and_a_failing_status() -> None:
    result = run_python("def f():\n    raise ValueError('boom')\nf()\n")
    assert result.exit_code == 1 and not result.ok
    assert "Traceback" in result.stderr and "ValueError: boom" in result.stderr
    assert "raise ValueError('boom')" in result.stderr  # the line, from the code's file


def test_exit_status_signal_and_syntax_errors_are_results_not_exceptions() -> None:
    assert run_python("import sys; sys.exit(3)").exit_code == 3
    killed = run_python("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert killed.exit_code is None and killed.signal_name == "SIGSEGV"
    broken = run_python("def (:")
    assert broken.exit_code == 1 and "SyntaxError" in broken.stderr


def test_the_interpreter_is_isolated_from_the_engines_environment() -> None:
    code = """
        import sys
        print(sys.flags.isolated, sys.flags.no_site, "site" in sys.modules)
        print(any("site-packages" in p for p in sys.path))
        try:
            import pytest
            print("pytest imported")
        except ImportError:
            print("no pytest")
    """
    result = run_python(textwrap.dedent(code))
    assert result.stdout.split() == ["1", "1", "False", "False", "no", "pytest"], result


def test_concurrent_runs_are_independent() -> None:
    async def many() -> list:
        codes = [f"import time; time.sleep(0.3); print({i} * {i})" for i in range(6)]
        codes.append("import time; time.sleep(60)")
        limits = SandboxLimits(wall_seconds=2)
        return await asyncio.gather(*(run_python_async(c, limits) for c in codes))

    results = asyncio.run(many())
    assert [r.stdout for r in results[:-1]] == [f"{i * i}\n" for i in range(6)]
    assert results[-1].timed_out and all(r.ok for r in results[:-1])


@pytest.mark.parametrize(
    "bad",
    [
        {"cpu_seconds": 0},
        {"wall_seconds": -1},
        {"memory_bytes": 1 << 20},
        {"max_processes": 0},
        {"output_bytes": 1.5},
        {"uid_range": (0, 10)},
    ],
)
def test_bad_limits_raise_naming_the_field(bad: dict) -> None:
    with pytest.raises(SandboxError, match=next(iter(bad))):
        SandboxLimits(**bad)


def test_a_broken_setup_is_reported_not_raised() -> None:
    result = run_python("print(1)", SandboxLimits(python="/nonexistent/python3"))
    assert result.error and "nonexistent" in result.error
    assert result.exit_code is None and not result.ok


def test_required_namespaces_refuse_a_weaker_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "isolation_mode", lambda: sandbox.UID if ROOT else sandbox.NONE)
    with pytest.raises(SandboxError, match="namespaces"):
        run_python("print(1)", SandboxLimits(require_namespaces=True))


def test_the_isolation_is_reported() -> None:
    mode = sandbox.isolation_mode()
    result = run_python("print(1)")
    assert result.isolation.startswith(mode + ": ")
    if mode == sandbox.NAMESPACES:
        for part in (
            "network namespace",
            "pid namespace",
            "visible (read-only)",
            "private /tmp",
            "own user namespace",
            "ipc namespace capped",
            "private devpts",
            "uid ",
            "no_new_privs",
        ):
            assert part in result.isolation
    summary = sandbox.isolation_summary()
    assert summary.startswith(f"mode: {mode}")


def test_the_probe_runs_once(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    monkeypatch.setattr(sandbox, "_probed", None)
    monkeypatch.setattr(sandbox, "_probe", lambda: calls.append(1) or (sandbox.NONE, ()))
    assert sandbox.isolation_mode() == sandbox.isolation_mode() == sandbox.NONE
    assert calls == [1]


def test_the_probe_takes_the_strongest_mode_that_works(monkeypatch: pytest.MonkeyPatch) -> None:
    tried = []

    def fake_run(code: str, limits: SandboxLimits, stdin: str, mode: str) -> object:
        tried.append(mode)
        broken = "unshare: Operation not permitted" if mode == sandbox.USERNS else None
        return SimpleNamespace(error=broken, exit_code=None if broken else 0, stderr="")

    monkeypatch.setattr(sandbox, "_run_sync", fake_run)
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: "/usr/bin/bwrap")
    failed = ("userns: unshare: Operation not permitted",)
    assert sandbox._probe(root=False) == (sandbox.BWRAP, failed)
    monkeypatch.setattr(sandbox, "find_bwrap", lambda: None)
    assert sandbox._probe(root=False)[0] == sandbox.NONE  # the last resort is taken untried
    assert sandbox._probe(root=True)[0] == sandbox.NAMESPACES  # root: never bwrap or nothing
    assert tried == [sandbox.USERNS, sandbox.BWRAP, sandbox.USERNS, sandbox.NAMESPACES]


def test_the_probe_finds_the_namespaces_this_machine_has() -> None:
    """A regression that broke the namespaces would otherwise only skip their tests."""
    flags = 0x00020000 | 0x40000000 | 0x20000000  # CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
    if not ROOT:
        flags |= 0x10000000  # CLONE_NEWUSER
    can = f"import ctypes, sys\nsys.exit(ctypes.CDLL(None, use_errno=True).unshare({flags}) != 0)"
    if subprocess.run([sys.executable, "-c", can], timeout=30).returncode != 0:
        pytest.skip("this machine gives no namespaces")
    assert sandbox.isolation_mode() == (sandbox.NAMESPACES if ROOT else sandbox.USERNS)
