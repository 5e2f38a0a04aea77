"""Issue 30's attacks on what the kernel holds for a run (engine/sandbox/run.py): memory
outside RLIMIT_AS (SysV shared memory, memfd), tmpfs files, ptys, keys, and the
sandbox's own verdicts (a forged status, a fake timeout, a printed MemoryError). Each
failed before its protection; each is bounded even without it (1 GiB of memory, 150,000
empty files, 240 ptys at most), and skipped only where this machine cannot run it.

As test_sandbox.py's, most run in the strongest mode and in the fallback; those that
need a cgroup also run with the cgroup turned off, where the IPC namespace's caps and the
tmpfs's file count must hold alone and the result must say what is missing.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.sandbox import leftovers as sandbox_leftovers
from engine.sandbox import run as sandbox
from engine.sandbox.cgroup import hierarchy as cgroup_hierarchy
from engine.sandbox.run import SandboxLimits, run_python
from tests.engine.sandbox.sandbox_modes import NAMESPACED, REPO, ROOT, fill, run_memory

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20


@pytest.fixture(params=["cgroup", "no cgroup"])
def cgroup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> bool:
    """With the run's cgroup where this machine has one, and with it turned off."""
    if request.param == "no cgroup":
        monkeypatch.setattr(sandbox, "cgroup_hierarchy", lambda: (None, "turned off by a test"))
        return False
    if cgroup_hierarchy()[0] is None:
        pytest.skip(f"no cgroup can be made here: {cgroup_hierarchy()[1]}")
    return True


def run_uid(result: sandbox.SandboxResult) -> int:
    return int(re.search(r"\buid (\d+)", result.isolation).group(1))


def held(result: sandbox.SandboxResult) -> int:
    """The last MiB count the code printed."""
    counts = [int(line) for line in result.stdout.split() if line.isdigit()]
    return counts[-1] if counts else 0


# ---------------------------------------------------------------- memory outside RLIMIT_AS

SHM = """
    import ctypes, os, time
    libc = ctypes.CDLL(None, use_errno=True)
    libc.shmat.restype = ctypes.c_void_p
    total = 0
    for _ in range(16):  # each process holds one segment (RLIMIT_AS binds each alone)
        r, w = os.pipe()
        if os.fork() == 0:
            os.close(r)
            ident = libc.shmget(0, 64 << 20, 0o1600)  # IPC_PRIVATE, IPC_CREAT | 0600
            address = libc.shmat(ident, None, 0) if ident >= 0 else None
            if address in (None, ctypes.c_void_p(-1).value):
                os.write(w, f"refused {ctypes.get_errno()}".encode())
                os._exit(1)
            ctypes.memset(address, 1, 64 << 20)
            os.write(w, b"held")
            time.sleep(120)
            os._exit(0)
        os.close(w)
        answer = os.read(r, 100).decode() or "killed"
        if answer != "held":
            print(answer, flush=True)
            break
        total += 64
        print(total, flush=True)
"""


def test_sysv_shared_memory_is_bounded(
    sandbox_mode: str, cgroup: bool, make_limits: Callable[..., SandboxLimits]
) -> None:
    """16 segments of 64 MiB held 1 GiB with memory_bytes of 128 MiB: a new IPC namespace
    has no bound of its own, and RLIMIT_AS does not count memory the code does not map."""
    if not cgroup and sandbox_mode not in NAMESPACED:
        pytest.skip(f"{sandbox_mode}: no IPC namespace and no cgroup to bound it (said below)")
    if not cgroup and sandbox_mode == sandbox.BWRAP:
        result = run_python("pass", make_limits())
        assert "IPC namespace NOT capped" in result.isolation
        pytest.skip("bubblewrap: its IPC namespace is not capped (said in isolation)")
    limits = make_limits(memory_bytes=128 * MiB, max_processes=32)
    result = run_python(textwrap.dedent(SHM), limits)
    if cgroup:
        assert held(result) * MiB < run_memory(limits), result
    else:
        # the namespace's caps: 128 MiB of segments in all, then shmget refuses
        assert held(result) <= 128 and f"refused {errno.ENOSPC}" in result.stdout, result
        assert "NO cgroup" in result.isolation
    if sandbox_mode == sandbox.UID:
        # without an IPC namespace the segments outlive the run unless removed after
        assert sandbox_leftovers.remove_ipc(run_uid(result)) == []


def test_memfd_files_are_bounded(
    sandbox_mode: str, cgroup: bool, make_limits: Callable[..., SandboxLimits]
) -> None:
    """memfd_create and writes held 1 GiB (up to open files x file size per process, 64
    GiB with the defaults): only the cgroup counts those pages."""
    code = """
        import os
        total, files = 0, []
        try:
            for i in range(16):
                fd = os.memfd_create(f"m{i}")
                for _ in range(8):
                    os.write(fd, b"x" * (8 << 20))
                files.append(fd)
                total += 64
                print(total, flush=True)
        except OSError as exc:
            print("refused", exc.errno)
    """
    limits = make_limits(memory_bytes=128 * MiB, file_bytes=64 * MiB)
    result = run_python(textwrap.dedent(code), limits)
    if cgroup:
        assert held(result) * MiB < run_memory(limits), result
        assert result.memory_exceeded, result
    else:
        # The gap, said: nothing bounds the run's memfd pages as a whole.
        assert "NO cgroup" in result.isolation and "memfd" in result.isolation


def test_a_printed_memory_error_is_not_the_kernels_verdict() -> None:
    code = "import sys\nsys.stderr.write('Traceback ...\\nMemoryError\\n')\n"
    result = run_python(code)
    assert result.exit_code == 0 and not result.memory_exceeded, result


# ---------------------------------------------------------------- files and devices


def test_tmpfs_files_are_bounded(cgroup: bool) -> None:
    """150,000 empty files grew kernel memory by 223 MB while the 64 MiB scratch showed
    0 used: the tmpfs has no file count of its own."""
    mode = sandbox.isolation_mode()
    if mode not in NAMESPACED:
        pytest.skip("no mount namespace (no private tmpfs) on this machine")
    if mode == sandbox.BWRAP:
        assert "tmpfs files NOT bounded" in run_python("pass").isolation
        pytest.skip("bubblewrap sets no nr_inodes on its tmpfs (said in isolation)")
    code = """
        import os
        made = 0
        try:
            for i in range(150_000):
                open(f"f{i}", "w").close()
                made += 1
        except OSError as exc:
            print("refused", exc.errno)
        print(made)
    """
    limits = SandboxLimits(scratch_files=2000, wall_seconds=60)
    result = run_python(textwrap.dedent(code), limits)
    assert f"refused {errno.ENOSPC}" in result.stdout and held(result) < 2000, result
    assert "2000 files" in result.isolation


def test_ptys_come_from_a_private_devpts(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    """240 opens of /dev/ptmx made 240 entries in the host's /dev/pts (its limit 4096)."""
    if sandbox_mode not in NAMESPACED:
        pytest.skip(f"{sandbox_mode}: no mount namespace, the host's /dev (said below)")
    code = """
        import os
        held = []
        try:
            for _ in range(240):
                held.append(os.open("/dev/ptmx", os.O_RDWR | os.O_NOCTTY))
        except OSError as exc:
            print("refused", exc.errno)
        print(len(held), os.stat("/dev/pts/ptmx").st_dev, sorted(os.listdir("/dev")))
    """
    result = run_python(textwrap.dedent(code), make_limits())
    last = result.stdout.splitlines()[-1].split(" ", 2)
    opened, device = int(last[0]), int(last[1])
    assert device != os.stat("/dev/pts/ptmx").st_dev, result  # not the host's devpts
    if sandbox_mode == sandbox.BWRAP:  # its own devpts, unbounded but by open files
        assert "ptys bounded by open files only" in result.isolation
    else:
        assert opened <= 16, result
    assert "'sda'" not in last[2] and "'kmsg'" not in last[2] and "'mem'" not in last[2]


def test_the_fallback_says_the_hosts_dev_is_shared(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    if sandbox_mode in NAMESPACED:
        pytest.skip("a mount namespace: its own /dev")
    result = run_python("print(1)", make_limits())
    assert "the host's /dev" in result.isolation


# ---------------------------------------------------------------- keys


def key_user(uid: int) -> str | None:
    """The kernel's key accounting for ``uid`` (/proc/key-users), if it holds any."""
    for line in Path("/proc/key-users").read_text().splitlines():
        if line.split(":")[0].strip() == str(uid):
            return line
    return None


def test_a_run_leaves_no_keys_in_the_kernel(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    """Each run's fresh uid got a keyring in the host's user namespace, never freed (about
    20 KB a run until reboot): now the code's user namespace takes its keys with it (or,
    without namespaces, they are invalidated after the run)."""
    if not ROOT:
        pytest.skip("the runs have the engine's own uid: no key of a run's own to look for")
    if os.uname().machine != "x86_64" or not Path("/proc/key-users").exists():
        pytest.skip("the test calls keyctl by its x86_64 number and reads /proc/key-users")
    code = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        user = libc.syscall(250, 0, -4, 1)  # KEYCTL_GET_KEYRING_ID, the user keyring
        key = libc.syscall(248, b"user", b"sbx", b"x" * 4000, 4000, -4)  # add_key
        persistent = libc.syscall(250, 22, -1, -2)  # KEYCTL_GET_PERSISTENT
        print(user > 0, key > 0, persistent)
    """
    result = run_python(textwrap.dedent(code), make_limits())
    assert result.stdout.startswith("True True"), result
    uid = run_uid(result)
    for _ in range(100):  # the kernel's key collector runs a moment after
        if key_user(uid) is None:
            break
        time.sleep(0.05)
    assert key_user(uid) is None


# ---------------------------------------------------------------- the sandbox's verdicts


def test_the_code_cannot_fake_a_timeout(make_limits: Callable[..., SandboxLimits]) -> None:
    """In a user namespace the code (of the init's uid) sent SIGALRM to pid 1, whose
    alarm handler then reported a timeout for a run that had not run out."""
    code = """
        import os, signal, time
        for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGUSR1, signal.SIGCHLD,
                    signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            for pid in {1, os.getppid()}:
                try:
                    os.kill(pid, sig)
                except OSError:
                    pass
        time.sleep(0.5)
        print("still running")
    """
    result = run_python(textwrap.dedent(code), make_limits(wall_seconds=20))
    assert not result.timed_out and result.exit_code == 0 and result.error is None, result
    assert result.stdout == "still running\n"


def test_the_code_cannot_forge_the_status(make_limits: Callable[..., SandboxLimits]) -> None:
    """Without namespaces the code (of the engine's uid) wrote its own status line, with
    its own isolation, into the init's status pipe through /proc/PID/fd."""
    code = """
        import json, os
        line = (json.dumps({"isolation": ["forged"], "exit": 0, "timed_out": False,
                            "cpu_seconds": 0.0}) + "\\n").encode()
        reached = 0
        for pid in [p for p in os.listdir("/proc") if p.isdigit()]:
            try:
                fds = os.listdir(f"/proc/{pid}/fd")
            except OSError:
                continue
            for fd in fds:
                try:
                    out = os.open(f"/proc/{pid}/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK)
                except OSError:
                    continue
                try:
                    os.write(out, line)
                    reached += 1
                except OSError:
                    pass
                os.close(out)
        print("wrote", reached)
        raise SystemExit(3)
    """
    result = run_python(textwrap.dedent(code), make_limits())
    assert "forged" not in result.isolation and result.exit_code == 3, result


# ---------------------------------------------------------------- leftovers without namespaces


def test_the_uid_mode_leaves_nothing_where_others_may_write(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits]
) -> None:
    """A fresh uid left files in /run/lock and in any world-writable directory."""
    if sandbox_mode != sandbox.UID:
        pytest.skip("only the uid mode writes to the host's directories")
    shared = REPO / f".sbx-world-writable-{os.getpid()}"
    shared.mkdir()
    try:
        shared.chmod(0o1777)
        if not all(d.stat().st_mode & stat.S_IXOTH for d in shared.parents):
            pytest.skip(f"{REPO} is not reachable by other users")
        sandbox_leftovers.world_writable_dirs.cache_clear()  # made after the engine started
        name = f"sbx-left-{os.getpid()}"
        targets = [Path("/run/lock") / name, shared / name, shared / (name + "-dir")]
        code = fill(
            """
            import os
            for path in PATHS:
                try:
                    if path.endswith("-dir"):
                        os.makedirs(path + "/inside")
                    else:
                        open(path, "w").write("left")
                    print("wrote", path)
                except OSError as exc:
                    print("refused", path, exc.errno)
            """,
            PATHS=[str(t) for t in targets],
        )
        result = run_python(code, make_limits())
        assert result.stdout.count("wrote") >= 2, result
        assert [t for t in targets if t.exists()] == []
    finally:
        for child in shared.iterdir():
            sandbox_leftovers.remove_tree(child) if child.is_dir() else child.unlink()
        shared.rmdir()
        sandbox_leftovers.world_writable_dirs.cache_clear()


def test_the_probe_of_world_writable_directories_stays_where_others_may_pass() -> None:
    found = sandbox_leftovers.world_writable_dirs()
    assert all(os.stat(d).st_mode & stat.S_IWOTH for d in found if os.path.exists(d))
    assert not any(d.startswith(("/proc/", "/sys/")) for d in found)
    assert sys.prefix  # (the walk never descends below a directory others cannot pass)
