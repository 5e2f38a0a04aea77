"""The sandbox for model-written code (engine/sandbox/run.py): each test is an attack
that must be stopped, written so that it fails if the protection it tests is removed.

Most run twice: in the strongest mode this machine allows (namespaces as root, a user
namespace otherwise) and in the fallback (a fresh uid as root, nothing otherwise), where
they check that what the fallback lacks is said in the result's ``isolation``. Every
test has a hard timeout, and every bomb is bounded even with its protection gone.
The file system's attacks are in test_sandbox_files.py; what normal code and misuse get
back, in test_sandbox_runs.py.
"""

from __future__ import annotations

import asyncio
import errno
import os
import secrets
import socket
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Callable

import pytest

from engine.sandbox import run as sandbox
from engine.sandbox.cgroup import hierarchy as cgroup_hierarchy
from engine.sandbox.run import SandboxLimits, run_python, run_python_async
from tests.engine.sandbox.sandbox_modes import (
    NAMESPACED,
    REPO,
    fill,
    process_name,
    processes_named,
    run_memory,
)

pytestmark = pytest.mark.timeout(120)


# ---------------------------------------------------------------- normal code, in each mode


def test_code_runs_with_the_standard_library_and_stdin(
    make_limits: Callable[..., SandboxLimits],
) -> None:
    code = """
        import collections, fractions, itertools, json, math, re
        print(math.factorial(10), json.dumps({"a": [1, 2]}), re.findall(r"\\d+", "a1b22"))
        print(list(itertools.accumulate([1, 2, 3])), collections.Counter("aab")["a"])
        print(fractions.Fraction(1, 3) + fractions.Fraction(1, 6), input().upper())
        print("é ✓")
    """
    result = run_python(textwrap.dedent(code), make_limits(), stdin="hello\n")
    assert result.ok, result
    assert result.stdout.splitlines() == [
        "3628800 {\"a\": [1, 2]} ['1', '22']",
        "[1, 3, 6] 2",
        "1/2 HELLO",
        "é ✓",
    ]
    assert result.stderr == "" and result.error is None and not result.truncated


# ---------------------------------------------------------------- network


@pytest.fixture
def listening_port() -> int:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server.getsockname()[1]
    server.close()


def test_localhost_is_unreachable(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits], listening_port: int
) -> None:
    code = fill(
        """
        import socket
        try:
            socket.create_connection(("127.0.0.1", PORT), timeout=5).close()
            print("connected")
        except OSError as exc:
            print("refused", exc.errno)
        """,
        PORT=listening_port,
    )
    # Without the sandbox, this very code connects: the refusal below is the sandbox's.
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert plain.stdout.strip() == "connected", plain
    result = run_python(code, make_limits())
    if sandbox_mode in NAMESPACED:
        assert result.stdout.startswith("refused"), result
        assert "network namespace" in result.isolation
    else:
        # No namespace here: the gap is real, and the result says so.
        assert result.stdout.strip() == "connected"
        assert "NO network isolation" in result.isolation


def test_name_resolution_fails() -> None:
    if sandbox.isolation_mode() not in NAMESPACED:
        pytest.skip("no network namespace on this machine")
    code = """
        import socket
        try:
            print(socket.getaddrinfo("pypi.org", 443)[0][4][0])
        except OSError as exc:
            print("unresolved", type(exc).__name__)
    """
    code = textwrap.dedent(code)
    result = run_python(code)
    assert result.stdout.startswith("unresolved"), result
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    if plain.stdout.startswith("unresolved"):
        pytest.skip("this machine resolves no names: cannot show the namespace matters")


# ---------------------------------------------------------------- CPU and wall clock


def test_a_busy_loop_stops_at_the_cpu_limit(make_limits: Callable[..., SandboxLimits]) -> None:
    result = run_python("while True:\n    pass\n", make_limits(cpu_seconds=1, wall_seconds=60))
    assert result.cpu_exceeded and not result.timed_out, result
    assert result.signal_name == "SIGXCPU"
    assert result.cpu_seconds is not None and result.cpu_seconds > 0.9


def test_catching_sigxcpu_does_not_escape_the_cpu_limit() -> None:
    code = """
        import signal
        signal.signal(signal.SIGXCPU, lambda *_: print("caught", flush=True))
        while True:
            pass
    """
    result = run_python(textwrap.dedent(code), SandboxLimits(cpu_seconds=1, wall_seconds=60))
    assert "caught" in result.stdout
    assert result.signal_name == "SIGKILL" and result.cpu_exceeded and not result.timed_out


def test_the_wall_clock_kills_sleeping_code_and_its_children(
    make_limits: Callable[..., SandboxLimits],
) -> None:
    name = process_name()
    code = fill(
        """
        import os, time
        open("/proc/self/comm", "w").write(NAME)
        if os.fork() == 0:
            time.sleep(120)
        print("sleeping", flush=True)
        time.sleep(120)
        """,
        NAME=name,
    )
    result = run_python(code, make_limits(wall_seconds=1))
    assert result.timed_out and result.signal_name == "SIGKILL", result
    assert result.stdout == "sleeping\n"  # printed before the kill is kept
    assert result.wall_seconds < 60
    assert processes_named(name) == []


# ---------------------------------------------------------------- memory


def test_one_huge_allocation_fails(make_limits: Callable[..., SandboxLimits]) -> None:
    result = run_python("b = bytearray(10**10)\nprint('allocated')\n", make_limits())
    assert "allocated" not in result.stdout, result
    if cgroup_hierarchy()[0] is not None:
        # The kernel's verdict: it killed the code at the run's memory limit.
        assert result.memory_exceeded and result.signal_name == "SIGKILL", result
    else:
        # RLIMIT_AS: the allocation fails, a MemoryError the code could print itself.
        assert result.stderr.rstrip().endswith("MemoryError") and not result.memory_exceeded


def test_slow_growth_stops_at_the_memory_limit(make_limits: Callable[..., SandboxLimits]) -> None:
    # Bounded even without the limit: it stops itself at 2 GiB.
    code = """
        chunks = []
        for mib in range(2048):
            chunks.append(bytearray(1 << 20))
            if mib % 16 == 0:
                print(mib, flush=True)
        print("escaped")
    """
    limits = make_limits(memory_bytes=256 << 20)
    result = run_python(textwrap.dedent(code), limits)
    assert "escaped" not in result.stdout, result
    if cgroup_hierarchy()[0] is not None:
        # the run's memory in all: the code's, its scratch files', the sandbox's own
        assert result.memory_exceeded, result
        assert int(result.stdout.split()[-1]) < (run_memory(limits) >> 20)
    else:
        assert not result.memory_exceeded and int(result.stdout.split()[-1]) < 256


# ---------------------------------------------------------------- processes


def test_a_fork_bomb_is_bounded_and_cleaned_up(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    name = process_name()
    # Bounded even without the limit: 2000 sleeping children at most.
    code = fill(
        """
        import os, time
        open("/proc/self/comm", "w").write(NAME)
        forked = 0
        for _ in range(2000):
            try:
                pid = os.fork()
            except OSError:
                break
            if pid == 0:
                time.sleep(120)
                os._exit(0)
            forked += 1
        print(forked)
        """,
        NAME=name,
    )
    result = run_python(code, make_limits(max_processes=10))
    assert result.exit_code == 0, result
    forked = int(result.stdout)
    if sandbox_mode == sandbox.NONE:
        assert 0 <= forked <= 9  # the limit counts the user's other processes too
    else:
        assert forked == 9  # its own process and 9 more
    assert processes_named(name) == []


def test_a_daemonized_grandchild_does_not_outlive_the_run(
    make_limits: Callable[..., SandboxLimits],
) -> None:
    name = process_name()
    code = fill(
        """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                open("/proc/self/comm", "w").write(NAME)
                time.sleep(120)
            os._exit(0)
        os.wait()
        time.sleep(0.2)
        print("left it running")
        """,
        NAME=name,
    )
    result = run_python(code, make_limits())
    assert result.stdout == "left it running\n", result
    assert processes_named(name) == []


def test_a_fork_bomb_does_not_starve_a_concurrent_run() -> None:
    bomb = """
        import os, time
        for _ in range(2000):
            try:
                if os.fork() == 0:
                    time.sleep(120)
                    os._exit(0)
            except OSError:
                break
        time.sleep(2.5)
    """
    victim = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', 'print(7)'], capture_output=True, text=True).stdout)"
    limits = SandboxLimits(max_processes=8, wall_seconds=30)

    async def both() -> list:
        first = asyncio.ensure_future(run_python_async(textwrap.dedent(bomb), limits))
        await asyncio.sleep(0.8)  # the bomb holds all its processes by now
        return [await run_python_async(victim, limits), await first]

    victim_result, bomb_result = asyncio.run(both())
    assert victim_result.stdout.strip() == "7", victim_result
    assert bomb_result.exit_code == 0, bomb_result


def test_the_code_cannot_kill_what_watches_it(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    if sandbox_mode == sandbox.NONE:
        pytest.skip(
            "without namespaces or a uid of its own, the code may signal the engine's processes"
        )
    code = """
        import os, signal, time
        for pid in (1, os.getppid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError as exc:
                print("denied", exc.errno)
        time.sleep(0.3)
        print("still watched")
    """
    result = run_python(textwrap.dedent(code), make_limits())
    assert result.error is None and result.exit_code == 0, result
    assert result.stdout.endswith("still watched\n")


def test_the_code_holds_no_privilege(make_limits: Callable[..., SandboxLimits]) -> None:
    code = """
        import os
        status = dict(line.split(":", 1) for line in open("/proc/self/status"))
        print(status["CapEff"].strip(), status["CapPrm"].strip(), status["NoNewPrivs"].strip())
        try:
            os.setuid(0)
            print("became root")
        except OSError:
            print("refused")
    """
    result = run_python(textwrap.dedent(code), make_limits())
    assert result.stdout.split() == ["0000000000000000", "0000000000000000", "1", "refused"]


def test_the_engines_keyring_is_not_possessed(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("the test calls keyctl by its x86_64 number")
    # An engine in a session keyring of its own (a login's, `keyctl session`): whoever
    # inherits it possesses its keys, whatever their uid.
    session_id = "ctypes.CDLL(None).syscall(250, 0, -3, 0)"  # KEYCTL_GET_KEYRING_ID
    engine = f"""
import ctypes, sys
from engine.sandbox import run as sandbox
sandbox.isolation_mode = lambda: {sandbox_mode!r}
ctypes.CDLL(None).syscall(250, 1, None)  # KEYCTL_JOIN_SESSION_KEYRING, a new one
limits = sandbox.SandboxLimits(python={make_limits().python!r})
print({session_id}, sandbox.run_python("import ctypes; print({session_id})", limits).stdout)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", engine], capture_output=True, text=True, env=env, timeout=60
    )
    ours, theirs = run.stdout.split()
    assert ours != theirs, run


# ---------------------------------------------------------------- output


def test_huge_output_is_capped_and_the_parent_stays_small() -> None:
    code = """
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(100):
            sys.stdout.write(chunk)
        sys.stderr.write("e" * (10 << 20))
        print("done", file=sys.stderr)
    """
    limits = SandboxLimits(output_bytes=64 << 10, wall_seconds=60)
    tracemalloc.start()
    try:
        result = run_python(textwrap.dedent(code), limits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 0, result.error
    assert result.stdout == "x" * (64 << 10) and result.stdout_truncated
    assert len(result.stderr) == 64 << 10 and result.stderr_truncated
    assert peak < 8 << 20, f"the parent held {peak} bytes for 110 MiB of output"


# ---------------------------------------------------------------- secrets


def test_the_engines_secrets_are_not_visible(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits], monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = "canary-" + secrets.token_hex(8)
    monkeypatch.setenv("HF_TOKEN", canary)
    monkeypatch.setenv("RLCTL_SANDBOX_CANARY", canary)
    code = fill(
        """
        import os
        print(dict(os.environ))
        for path in (f"/proc/{PID}/environ", f"/proc/{PID}/cmdline", "/proc/1/environ"):
            try:
                print(path, open(path, "rb").read())
            except OSError as exc:
                print(path, "refused", exc.errno)
        """,
        PID=os.getpid(),
    )
    result = run_python(code, make_limits())
    assert result.exit_code == 0, result
    assert canary not in result.stdout
    assert "HF_TOKEN" not in result.stdout and "RLCTL_SANDBOX_CANARY" not in result.stdout
    if sandbox_mode in NAMESPACED:  # the engine's process is not even visible
        assert f"/proc/{os.getpid()}/environ refused {errno.ENOENT}" in result.stdout


# ---------------------------------------------------------------- cancelling


def test_a_cancelled_run_is_killed() -> None:
    name = process_name()
    code = fill("open('/proc/self/comm', 'w').write(NAME)\nimport time\ntime.sleep(120)", NAME=name)

    async def cancel() -> None:
        task = asyncio.ensure_future(run_python_async(code, SandboxLimits(wall_seconds=100)))
        for _ in range(100):
            await asyncio.sleep(0.1)
            if processes_named(name):
                break
        assert processes_named(name), "the code never started"
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel())
    for _ in range(50):  # the kill is sent at once; the kernel reaps a moment later
        if not processes_named(name):
            break
        time.sleep(0.1)
    assert processes_named(name) == []
