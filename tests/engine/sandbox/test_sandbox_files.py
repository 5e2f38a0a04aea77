"""The sandbox's file system (engine/sandbox/run.py): writes outside the scratch
directory, its removal, file size and scratch space, hidden directories and mounts that
stay put. As in test_sandbox.py, each test is an attack that must be stopped, and fails
if the protection it tests is removed.
"""

from __future__ import annotations

import ast
import errno
import os
import secrets
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from engine.sandbox import run as sandbox
from engine.sandbox.run import SandboxLimits, run_python
from tests.engine.sandbox.sandbox_modes import NAMESPACED, REPO, fill

pytestmark = pytest.mark.timeout(120)


def test_writes_outside_the_scratch_dir_fail_and_leave_nothing(
    sandbox_mode: str, make_limits: Callable[..., SandboxLimits], tmp_path: Path
) -> None:
    if sandbox_mode == sandbox.NONE:
        pytest.skip(
            "without namespaces or root, the code runs as the engine's user: it may write its files"
        )
    name = f"sbx-escape-{secrets.token_hex(4)}"
    home = Path(os.environ.get("HOME", "/root"))
    targets = [
        REPO / name,
        home / name,
        Path("/tmp") / name,
        Path("/var/tmp") / name,
        Path("/dev/shm") / name,
        tmp_path / name,
    ]
    code = fill(
        """
        for path in PATHS:
            try:
                with open(path, "w") as f:
                    f.write("escaped")
                print("wrote", path)
            except OSError as exc:
                print("refused", path, exc.errno)
        """,
        PATHS=[str(t) for t in targets],
    )
    result = run_python(code, make_limits())
    assert result.exit_code == 0, result
    refused = {line.split()[1] for line in result.stdout.splitlines() if line.startswith("refused")}
    # The engine's files and home: refused outright (read-only, or another uid's).
    assert {str(REPO / name), str(home / name), str(tmp_path / name)} <= refused, result.stdout
    # The world-writable directories: private (namespaces) or cleaned after (a fresh uid).
    assert [t for t in targets if t.exists()] == []


def test_the_scratch_dir_is_writable_and_removed_after(
    make_limits: Callable[..., SandboxLimits], monkeypatch: pytest.MonkeyPatch
) -> None:
    made: list[str] = []  # this run's scratch dirs (other tests may run sandboxes beside it)

    def mkdtemp(*args, _mkdtemp=tempfile.mkdtemp, **kwargs):
        made.append(_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    code = """
        import os
        with open("notes.txt", "w") as f:
            f.write("kept")
        os.makedirs("sub/dir")
        os.chmod("sub", 0)
        print(os.getcwd(), open("notes.txt").read())
        print(os.environ["HOME"] == os.environ["TMPDIR"] == os.getcwd())
    """
    result = run_python(textwrap.dedent(code), make_limits())
    cwd, content, same = result.stdout.split()
    assert (content, same) == ("kept", "True"), result
    scratch = [d for d in made if Path(d).name.startswith("rlctl-sandbox-")]
    assert len(scratch) == 1, made
    assert not Path(scratch[0]).exists()
    if not cwd.startswith("/tmp/sandbox"):  # the namespace's private /tmp is gone with it
        assert not Path(cwd).exists()


def test_file_size_and_scratch_space_are_bounded() -> None:
    code = """
        import os
        try:
            with open("big", "wb") as f:
                f.write(b"x" * (3 << 20))
        except OSError as exc:
            print("file", exc.errno)
        os.remove("big")
        try:
            for i in range(64):
                with open(f"part{i}", "wb") as f:
                    f.write(b"x" * (1 << 20))
            print("wrote 64 MiB")
        except OSError as exc:
            print("space", exc.errno)
    """
    limits = SandboxLimits(file_bytes=2 << 20, scratch_bytes=16 << 20)
    result = run_python(textwrap.dedent(code), limits)
    lines = result.stdout.splitlines()
    assert lines[0] == f"file {errno.EFBIG}", result
    if sandbox.isolation_mode() in NAMESPACED:
        assert lines[1] == f"space {errno.ENOSPC}"


def test_the_file_system_shows_only_what_the_interpreter_needs() -> None:
    """Issue 30: the whole host tree was readable (the project checkout, /opt, host
    paths in mountinfo): now only the system's directories, the interpreter's prefix
    and /etc's basics are there."""
    if sandbox.isolation_mode() not in NAMESPACED:
        pytest.skip("no mount namespace on this machine")
    code = fill(
        """
        import os
        print(sorted(os.listdir("/")))
        print(sorted(os.listdir("/etc")))
        print([p for p in PATHS if os.path.exists(p)])
        print(open("/proc/self/mountinfo").read().count(REPO))
        """,
        PATHS=[str(REPO), "/opt", "/home", "/srv", "/mnt", "/run", "/sys", "/boot", "/work"],
        REPO=str(REPO),
    )
    result = run_python(code)
    top, etc, present, mentions = result.stdout.splitlines()
    # the interpreter's way in (e.g. /root for a pyenv there) and nothing else
    allowed = {"bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp"}
    allowed |= {"usr", "var"} | {Path(p).parts[1] for p in (sys.base_prefix, sys.executable)}
    assert set(ast.literal_eval(top)) <= allowed, result
    assert set(ast.literal_eval(etc)) <= {
        "alternatives",
        "group",
        "hosts",
        "ld.so.cache",
        "localtime",
        "nsswitch.conf",
        "passwd",
    }
    assert ast.literal_eval(present) == [] and mentions == "0", result


def test_a_lock_on_a_host_file_cannot_be_taken() -> None:
    """flock works across the boundary on any file the code can open: the engine's files
    are not there to open."""
    if sandbox.isolation_mode() not in NAMESPACED:
        pytest.skip("no mount namespace on this machine")
    target = REPO / "pyproject.toml"
    code = fill(
        """
        import fcntl
        try:
            fcntl.flock(open(PATH), fcntl.LOCK_EX | fcntl.LOCK_NB)
            print("locked")
        except OSError as exc:
            print("refused", exc.errno)
        """,
        PATH=str(target),
    )
    result = run_python(code)
    assert result.stdout == f"refused {errno.ENOENT}\n", result


def test_a_nested_user_namespace_is_refused() -> None:
    """A user namespace of the code's own would give it a new IPC namespace (uncapped
    shared memory) and more of the kernel to attack; it could not undo the mounts."""
    if sandbox.isolation_mode() not in NAMESPACED:
        pytest.skip("no mount namespace on this machine")
    code = """
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        print(libc.unshare(0x10000000 | 0x00020000 | 0x08000000), ctypes.get_errno())
    """
    result = run_python(textwrap.dedent(code))
    ret, err = result.stdout.split()
    assert ret == "-1" and int(err) in (errno.ENOSPC, errno.EPERM), result


def test_readonly_fallback_without_mount_setattr(monkeypatch: pytest.MonkeyPatch) -> None:
    if sandbox.isolation_mode() not in NAMESPACED:
        pytest.skip("no mount namespace on this machine")
    monkeypatch.setattr(sandbox, "_READONLY_FALLBACK", True)
    path = Path("/usr") / f"sbx-escape-{secrets.token_hex(4)}"  # a host folder it sees
    try:
        result = run_python(f"open({str(path)!r}, 'w')")
        assert "Read-only file system" in result.stderr, result
        assert not path.exists()
    finally:
        path.unlink(missing_ok=True)
