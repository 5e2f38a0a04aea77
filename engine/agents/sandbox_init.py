"""The sandbox's inside: started by engine/agents/sandbox.py as

    python -I -S -B sandbox_init.py PLAN_FD STATUS_FD

(the plan, a JSON file, passed open: under bubblewrap its path is not visible).

Stdlib only, and never imports the engine: it runs under the interpreter's isolated
flags, as root where the engine is root, before anything is dropped. Three processes:

- the supervisor enters the new namespaces (unshare) and forks the init; the parent
  kills its process group when its own deadline passes;
- the init is pid 1 of the new pid namespace (or, without one, a child subreaper): it
  sets up the file system, forks the user process, enforces the wall clock, kills
  whatever the code left running and reports to the parent, one JSON object a line on
  STATUS_FD;
- the user process takes the rlimits, drops to the sandbox uid, sets no_new_privs and
  execs the code's interpreter.

Each step that the plan asks for either works or fails the run: a run never continues
with less isolation than the parent's probe found and reports.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import signal
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# keyctl(2): its number differs by architecture.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
KEYCTL_JOIN_SESSION_KEYRING = 1

# mount_setattr(2), Linux 5.12; one number on every architecture (the unified table).
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1

# The file system inside: everything read-only, one private tmpfs for /tmp (and, bound
# from it, /var/tmp and /dev/shm), and the working directory in it.
SHARED_TMP = (("/var/tmp", ".var-tmp"), ("/dev/shm", ".shm"))

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


class SetupError(Exception):
    """A step the plan requires failed: the run stops before any code runs."""


class Deadline(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _c(text: str | None) -> bytes | None:
    return None if text is None else os.fsencode(text)


def _mount(
    source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None
) -> None:
    ret = _libc.mount(_c(source), _c(target), _c(fstype), flags, _c(data))
    _check(ret, f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, arg, 0, 0, 0), f"prctl {option}")


class Status:
    """Reports to the parent, one JSON object a line; a parent gone is not an error."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, **message: object) -> None:
        data = (json.dumps(message) + "\n").encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(self.fd, data) :]


# ---------------------------------------------------------------- supervisor


def enter_namespaces(plan: dict) -> list[str]:
    """unshare the namespaces the plan's mode asks for; the pid namespace takes effect
    for the next child, which becomes its pid 1."""
    mode = plan["mode"]
    if mode == "bwrap":  # bubblewrap made them, and the file system
        return list(plan["applied"])
    if mode not in ("namespaces", "userns"):
        return []
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC
    if mode == "userns":
        flags |= CLONE_NEWUSER
    uid, gid = os.getuid(), os.getgid()
    _check(_libc.unshare(flags), "unshare")
    applied = ["network namespace", "pid namespace", "ipc namespace"]
    if mode == "userns":
        # Map only our own ids, to themselves: inside, the code is not root, so its
        # exec drops the namespace's capabilities and it cannot undo the mounts.
        for path, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{path}", "w") as f:
                f.write(text)
        applied.insert(0, "user namespace")
    return applied


def supervise(plan: dict, status: Status) -> int:
    try:
        applied = enter_namespaces(plan)
    except OSError as exc:
        status.send(error=f"cannot enter the namespaces: {exc}")
        return 1
    supervisor = os.getpid()
    if plan["mode"] == "bwrap":
        # bwrap --as-pid-1 made this process pid 1 of its pid namespace: the init.
        return run_init(plan, status, applied, supervisor)
    pid = os.fork()
    if pid == 0:
        os._exit(run_init(plan, status, applied, supervisor))
    os.close(status.fd)
    while True:
        try:
            _, wait_status = os.waitpid(pid, 0)
            return max(os.waitstatus_to_exitcode(wait_status), 0)
        except InterruptedError:
            continue


# ---------------------------------------------------------------- init


def run_init(plan: dict, status: Status, applied: list[str], supervisor: int) -> int:
    try:
        return init(plan, status, applied, supervisor)
    except BaseException as exc:
        status.send(error=f"sandbox init failed: {type(exc).__name__}: {exc}")
        return 1


def init(plan: dict, status: Status, applied: list[str], supervisor: int) -> int:
    namespaced = plan["mode"] in ("namespaces", "userns", "bwrap")
    # Die with the supervisor: the parent's last resort is to kill its process group.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if not namespaced:
        if os.getppid() != supervisor:
            return 1
        # Orphans the code leaves come back to us, so that none outlives the run.
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        applied.append("subreaper (leftover processes killed)")
    try:
        workdir = plan["workdir"]
        if plan["mode"] in ("namespaces", "userns"):
            applied += build_filesystem(plan)
        elif plan["mode"] == "bwrap":
            os.makedirs(workdir, mode=0o700)
        write_code(plan, workdir)
        baseline = process_baseline(plan)
        applied.append(new_session_keyring())
    except (OSError, SetupError) as exc:
        status.send(error=f"sandbox setup failed: {exc}")
        return 1

    err_r, err_w = os.pipe()
    main = os.fork()
    if main == 0:
        os.close(err_r)
        become_user(plan, workdir, baseline, err_w)  # never returns
    os.close(err_w)
    problem = _read_all(err_r).decode(errors="replace")
    os.close(err_r)
    if problem:
        os.waitpid(main, 0)
        status.send(error=f"sandbox setup failed: {problem}")
        return 1
    applied += user_isolation(plan)
    status.send(isolation=applied)

    outcome = wait_for(main, plan["wall_seconds"])
    if not namespaced:
        kill_descendants()
    # In a pid namespace, our exit kills every process left in it.
    status.send(**outcome)
    return 0


def build_filesystem(plan: dict) -> list[str]:
    """A private, read-only view of the host's file system with a private /tmp."""
    notes = []
    # Nothing mounted here may reach the host's mount table.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # The interpreter may live under a directory we hide (/root/.pyenv, ~/miniconda3):
    # hold it open to bind it back after.
    keep = {p: os.open(p, os.O_PATH | os.O_DIRECTORY) for p in plan["keep"] if os.path.isdir(p)}
    readonly_root(plan.get("readonly_fallback", False))
    size = plan["scratch_bytes"]
    _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    _bind_kept("/tmp", keep)
    for target, name in SHARED_TMP:
        if os.path.isdir(target) and not os.path.islink(target):
            source = os.path.join("/tmp", name)
            os.mkdir(source)
            os.chmod(source, 0o1777)
            _mount(source, target, None, MS_BIND)
    os.makedirs(plan["workdir"], mode=0o700)
    notes.append(f"read-only file system, private /tmp /var/tmp /dev/shm ({size >> 20} MiB)")

    hidden = []
    for path in plan["hide"]:
        if os.path.isdir(path) and not os.path.islink(path):
            _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
            _bind_kept(path, keep)
            _mount(
                None, path, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, "size=1m,mode=0755"
            )
            hidden.append(path)
    for fd in keep.values():
        os.close(fd)
    if hidden:
        notes.append("hidden " + " ".join(hidden))
    try:
        # The pid namespace's own /proc: the host's processes (and their command
        # lines) are not visible.
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        notes.append("private /proc")
    except OSError as exc:
        notes.append(f"host /proc visible ({exc.strerror})")
    return notes


def _bind_kept(covered: str, keep: dict[str, int]) -> None:
    """Bind back, read-only, the kept directories that a mount on ``covered`` hid."""
    for kept, fd in keep.items():
        if kept == covered or kept.startswith(covered.rstrip("/") + "/"):
            os.makedirs(kept, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", kept, None, MS_BIND | MS_REC)


def readonly_root(force_fallback: bool) -> None:
    """Every mount read-only, recursively: one mount_setattr call where the kernel has
    it (5.12), else a bind remount of each mount keeping its flags (which a user
    namespace may not clear)."""
    if not force_fallback:
        attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
        ret = _libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR),
            ctypes.c_int(AT_FDCWD),
            ctypes.c_char_p(b"/"),
            ctypes.c_uint(AT_RECURSIVE),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        if ret == 0:
            return
        if ctypes.get_errno() not in (38, 22):  # ENOSYS, EINVAL: an older kernel
            _check(ret, "mount_setattr /")
    failed = []
    for mountpoint in _mountpoints():
        try:
            flags = os.statvfs(mountpoint).f_flag
        except OSError as exc:
            failed.append(f"{mountpoint} ({exc.strerror})")
            continue
        keep = 0
        for st_flag, ms_flag in (
            (2, MS_NOSUID),
            (4, MS_NODEV),
            (8, MS_NOEXEC),
            (1024, MS_NOATIME),
            (2048, MS_NODIRATIME),
            (4096, MS_RELATIME),
        ):
            if flags & st_flag:
                keep |= ms_flag
        try:
            _mount(None, mountpoint, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)
        except OSError as exc:
            failed.append(f"{mountpoint} ({exc.strerror})")
    if failed:
        raise SetupError("cannot make read-only: " + ", ".join(failed))


def _mountpoints() -> list[str]:
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as octal.
            raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)
            points.append(os.fsdecode(raw))
    return sorted(set(points), key=len)


def write_code(plan: dict, workdir: str) -> None:
    path = os.path.join(workdir, "main.py")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(plan["code"])
    if plan["uid"] is not None:
        for p in (workdir, path):
            os.chown(p, plan["uid"], plan["gid"])


def new_session_keyring() -> str:
    """Leave the engine's session keyring: its keys are readable by whoever possesses
    it, whatever their uid. Where keyctl is blocked (seccomp), the code cannot use it
    either."""
    if SYS_KEYCTL is None:
        return "engine's session keyring kept (keyctl unknown on this architecture)"
    ret = _libc.syscall(
        ctypes.c_long(SYS_KEYCTL), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_char_p(None)
    )
    if ret < 0 and ctypes.get_errno() in (1, 38):  # EPERM, ENOSYS: keyctl is filtered
        return "keyctl blocked"
    _check(ret, "keyctl join session keyring")
    return "own session keyring"


def process_baseline(plan: dict) -> int:
    """Processes RLIMIT_NPROC already counts for the code's uid, to add to its limit.

    The kernel counts (since 5.14) per user namespace: in our own user namespace the
    supervisor and this init; as a fresh uid, nothing. Otherwise the processes of the
    user that /proc shows: under bwrap those of its namespaces (exact); without any,
    all of them, so the code gets ``max_processes`` more (racy, and only approximate:
    that mode isolates little anyway)."""
    mode = plan["mode"]
    if mode == "namespaces" or mode == "uid":
        return 0
    if mode == "userns" and _kernel_at_least(5, 14):
        return 2
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def _kernel_at_least(major: int, minor: int) -> bool:
    parts = os.uname().release.split(".")
    try:
        return (int(parts[0]), int(parts[1].split("-")[0])) >= (major, minor)
    except (ValueError, IndexError):
        return False


def user_isolation(plan: dict) -> list[str]:
    notes = []
    if plan["uid"] is not None:
        notes.append(f"uid {plan['uid']}")
    else:
        notes.append(f"uid {os.getuid()} (the engine's own)")
    notes.append("no_new_privs")
    notes.append("rlimits cpu/as/nproc/fsize/nofile/core")
    return notes


# ---------------------------------------------------------------- user process


def become_user(plan: dict, workdir: str, baseline: int, err_w: int) -> None:
    """In the forked user process: limits, identity, then exec. Any failure is written
    to err_w (closed on a successful exec) and the process exits."""
    try:
        os.set_inheritable(err_w, False)
        cpu = int(plan["cpu_seconds"])
        limits = [
            # SIGXCPU at the limit, SIGKILL one second later if the code catches it.
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_AS, (plan["memory_bytes"],) * 2),
            (resource.RLIMIT_NPROC, (plan["max_processes"] + baseline,) * 2),
            (resource.RLIMIT_FSIZE, (plan["file_bytes"],) * 2),
            (resource.RLIMIT_NOFILE, (plan["open_files"],) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]
        for which, value in limits:
            resource.setrlimit(which, value)
        if plan["uid"] is not None:
            os.setgroups([])
            os.setresgid(plan["gid"], plan["gid"], plan["gid"])
            os.setresuid(plan["uid"], plan["uid"], plan["uid"])
            if os.getuid() == 0 or os.geteuid() == 0:
                raise SetupError("still root after setresuid")
        # No setuid binary (su, sudo) can give root back.
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        # After the uid change, which clears it.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.chdir(workdir)
        os.umask(0o077)
        for sig in (signal.SIGPIPE, signal.SIGXFSZ, signal.SIGALRM, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        python = plan["python"]
        os.closerange(3, err_w)
        os.closerange(err_w + 1, 1 << 16)
        os.execve(
            python,
            [python, *plan["python_args"], os.path.join(workdir, "main.py")],
            dict(os.environ),
        )
    except BaseException as exc:
        message = f"{type(exc).__name__}: {exc}"
        if isinstance(exc, PermissionError) and plan["uid"] is not None:
            message += (
                f" (uid {plan['uid']} cannot run {plan['python']}: without a mount namespace"
                " the interpreter must be readable by other users; set SandboxLimits.python)"
            )
        try:
            os.write(err_w, message.encode()[:2000])
        finally:
            os._exit(127)


# ---------------------------------------------------------------- waiting and cleanup


def wait_for(main: int, wall_seconds: float) -> dict:
    """Reap children until the code's process exits or the wall clock runs out (then
    kill it). Orphans reparented to us are reaped on the way."""

    def on_alarm(signum: int, frame: object) -> None:
        raise Deadline

    ended = None
    timed_out = False
    signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(wall_seconds, 0.001))
    try:
        while ended is None:
            pid, wait_status, usage = os.wait4(-1, 0)
            if pid == main:
                ended = wait_status, usage
    except Deadline:
        timed_out = ended is None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if ended is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(main, signal.SIGKILL)
        try:
            ended = os.wait4(main, 0)[1:]
        except ChildProcessError:  # reaped just as the alarm rang: its status is lost
            return {"exit": None, "signal": signal.SIGKILL, "timed_out": True, "cpu_seconds": None}
    wait_status, usage = ended
    code = os.waitstatus_to_exitcode(wait_status)
    return {
        "exit": code if code >= 0 else None,
        "signal": -code if code < 0 else None,
        "timed_out": timed_out,
        "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 3),
    }


def kill_descendants() -> None:
    """Without a pid namespace: kill every process the code left behind. As a child
    subreaper we inherit them all, orphans included, so this ends when we have none."""
    me = os.getpid()
    while True:
        for pid in _children(me):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            os.wait()
        except ChildProcessError:
            return


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 1 and int(fields[1]) == parent:
            found.append(int(entry))
    return found


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except InterruptedError:
            continue
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def main(argv: list[str]) -> int:
    with os.fdopen(int(argv[1]), encoding="utf-8") as f:
        plan = json.load(f)
    status_fd = int(argv[2])
    os.set_inheritable(status_fd, False)
    return supervise(plan, Status(status_fd))


if __name__ == "__main__":
    sys.exit(main(sys.argv))
