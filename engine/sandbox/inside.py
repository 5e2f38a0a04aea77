"""The sandbox's inside: started by engine/sandbox/run.py as

    python -I -S -B /proc/self/fd/SCRIPT_FD PLAN_FD STATUS_FD

(this file and the plan, a JSON file, passed open: neither path is visible inside).

One file, over the project's 600-line guide on purpose: it is the whole program the
sandbox runs, handed over open, and a second module would be a second file to pass in
and to trust (or a path the sandbox could see). Stdlib only, and never imports the
engine: it runs under the interpreter's isolated flags, as root where the engine is
root, before anything is dropped. Three processes:

- the supervisor joins the run's cgroup, enters the new namespaces (unshare) and forks
  the init; the parent kills its process group when its own deadline passes;
- the init is pid 1 of the new pid namespace (or, without one, a child subreaper): it
  caps the IPC namespace, builds the file system view, forks the user process, enforces
  the wall clock by its own clock (no signal the code may send changes the verdict),
  kills whatever the code left running and reports to the parent, one JSON object a
  line on STATUS_FD, a socket the code cannot open;
- the user process takes the rlimits, enters a user namespace of its own (the code's
  keys die with it), drops to the sandbox uid, sets no_new_privs and execs the code's
  interpreter.

The supervisor and the init are not dumpable (no ptrace, no /proc/PID/fd for code of
the same uid) and ignore every signal they can. Each step that the plan asks for
either works or fails the run: a run never continues with less isolation than the
parent's probe found and reports.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import resource
import select
import signal
import sys
import time

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
MNT_DETACH = 2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38

# keyctl(2) and pivot_root(2): their numbers differ by architecture.
_ARCH = os.uname().machine
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(_ARCH)
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}.get(_ARCH)
KEYCTL_JOIN_SESSION_KEYRING = 1

# mount_setattr(2), Linux 5.12; one number on every architecture (the unified table).
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_RECURSIVE = 0x8000
MOUNT_ATTR_RDONLY = 1

# The private /tmp holds, bound from it, /var/tmp and /dev/shm.
SHARED_TMP = (("/var/tmp", ".var-tmp"), ("/dev/shm", ".shm"))
# The minimal /dev: the host's harmless devices, bound one by one, and links.
DEVICES = ("null", "zero", "full", "random", "urandom")
DEV_LINKS = (
    ("/proc/self/fd", "fd"),
    ("/proc/self/fd/0", "stdin"),
    ("/proc/self/fd/1", "stdout"),
    ("/proc/self/fd/2", "stderr"),
    ("pts/ptmx", "ptmx"),
)
PTYS = 16  # pseudo-terminals the private devpts instance holds

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
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


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


class Status:
    """Reports to the parent, one JSON object a line; a parent gone is not an error."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, **message: object) -> None:
        data = (json.dumps(message) + "\n").encode()
        with contextlib.suppress(OSError):
            while data:
                data = data[os.write(self.fd, data) :]


def guard_self() -> None:
    """Not dumpable (ptrace and /proc/PID/fd need privileges then), and deaf to every
    signal that can be ignored, but SIGCHLD (which only wakes the init's wait)."""
    _prctl(PR_SET_DUMPABLE, 0)
    for sig in signal.valid_signals():
        if sig not in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
            with contextlib.suppress(OSError, ValueError, RuntimeError):
                signal.signal(sig, signal.SIG_IGN)


# ---------------------------------------------------------------- supervisor


def enter_namespaces(plan: dict) -> list[str]:
    """unshare the namespaces the plan's mode asks for; the pid namespace takes effect
    for the next child, which becomes its pid 1. As root the namespaces belong to the
    host's user namespace (the code's own user namespace comes later, in the user
    process); otherwise to a new one in which the sandbox is root (its only id, the
    engine's own), so that it may cap the IPC namespace."""
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
    if mode == "userns":
        _write("/proc/self/setgroups", "deny")
        _write("/proc/self/uid_map", f"0 {uid} 1")
        _write("/proc/self/gid_map", f"0 {gid} 1")
    return ["network namespace", "pid namespace", "ipc namespace"]


def join_cgroup(plan: dict) -> None:
    """Join the run's cgroup (its ``cgroup.procs``, opened by the parent): every process
    after this one counts against the run's memory and task limits."""
    for fd in plan["cgroup_fds"]:
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def supervise(plan: dict, status: Status) -> int:
    try:
        join_cgroup(plan)
        applied = enter_namespaces(plan)  # (its own id maps need it still dumpable)
        guard_self()
    except OSError as exc:
        status.send(error=f"cannot enter the cgroup or the namespaces: {exc}")
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
    mode = plan["mode"]
    namespaced = mode in ("namespaces", "userns", "bwrap")
    # Die with the supervisor: the parent's last resort is to kill its process group.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    guard_self()
    if not namespaced:
        if os.getppid() != supervisor:
            return 1
        # Orphans the code leaves come back to us, so that none outlives the run.
        _prctl(PR_SET_CHILD_SUBREAPER, 1)
        applied.append("subreaper (leftover processes killed)")
    try:
        workdir = plan["workdir"]
        if mode in ("namespaces", "userns"):
            applied += cap_ipc(plan)
            if mode == "userns":
                # One user namespace more (the code's own), and none below it.
                _write("/proc/sys/user/max_user_namespaces", "1")
            applied += build_view(plan)
        elif mode == "bwrap":
            os.makedirs(workdir, mode=0o700)
        write_code(plan, workdir)
        baseline = process_baseline(plan)
        applied.append(new_session_keyring())
    except (OSError, SetupError) as exc:
        status.send(error=f"sandbox setup failed: {exc}")
        return 1

    err_r, err_w = os.pipe()
    ask_r, ask_w = os.pipe()  # the user process: "map me" (root's namespaces mode)
    go_r, go_w = os.pipe()
    main = os.fork()
    if main == 0:
        for fd in (err_r, ask_r, go_w):
            os.close(fd)
        become_user(plan, workdir, baseline, err_w, ask_w, go_r)  # never returns
    for fd in (err_w, ask_w, go_r):
        os.close(fd)
    if _read_all(ask_r):  # it entered its user namespace: map its ids
        uid, gid = plan["uid"], plan["gid"]
        with contextlib.suppress(OSError):  # a failure shows as its own error
            _write(f"/proc/{main}/uid_map", f"{uid} {uid} 1")
            _write(f"/proc/{main}/gid_map", f"{gid} {gid} 1")
            os.write(go_w, b"m")
    os.close(go_w)
    os.close(ask_r)
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


def cap_ipc(plan: dict) -> list[str]:
    """Bound the new IPC namespace (its own sysctls; the code cannot change them): SysV
    shared memory to the run's memory in all, few segments, queues and semaphores, and
    segments removed once no process holds them. Without these a new IPC namespace has
    no bound at all on shared memory."""
    page = os.sysconf("SC_PAGE_SIZE")
    values = {
        "kernel/shmmax": plan["memory_bytes"],
        "kernel/shmall": max(plan["memory_bytes"] // page, 1),
        "kernel/shmmni": 16,
        "kernel/shm_rmid_forced": 1,
        "kernel/msgmni": 16,
        "kernel/msgmnb": 65536,
        "kernel/msgmax": 8192,
        "kernel/sem": "32 512 32 16",
        "fs/mqueue/queues_max": 8,
    }
    failed = []
    for name, value in values.items():
        try:
            _write(f"/proc/sys/{name}", str(value))
        except OSError as exc:
            failed.append(f"{name} ({exc.strerror})")
    if not failed:
        return [f"ipc namespace capped (shared memory {plan['memory_bytes'] >> 20} MiB)"]
    if plan["mode"] == "namespaces":
        raise SetupError("cannot cap the IPC namespace: " + ", ".join(failed))
    return ["ipc namespace NOT capped: " + ", ".join(failed)]


# ---------------------------------------------------------------- the file system view


def build_view(plan: dict) -> list[str]:
    """A new root of only what the interpreter needs (engine/sandbox/view.py), read-only, with
    a private /tmp (/var/tmp, /dev/shm), /dev, devpts and /proc; pivoted into, and the
    host's tree detached."""
    view, root = plan["view"], plan["view_root"]
    # Nothing mounted here may reach the host's mount table.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,nr_inodes=1024,mode=0755")
    for source, target in view["binds"]:
        inside = root + target
        os.makedirs(os.path.dirname(inside), mode=0o755, exist_ok=True)
        if os.path.isdir(source):
            os.makedirs(inside, mode=0o755, exist_ok=True)
        else:
            os.close(os.open(inside, os.O_WRONLY | os.O_CREAT, 0o644))
        _mount(source, inside, None, MS_BIND | MS_REC)
    for target, path in view["links"]:
        os.symlink(target, root + path)
    build_dev(root + "/dev")
    for path in ("/tmp", "/proc", "/var/tmp"):
        os.makedirs(root + path, mode=0o755, exist_ok=True)
    readonly_tree(root, plan.get("readonly_fallback", False))
    notes = [plan["view_note"]]

    # The pid namespace's own /proc (mounted while the host's is still there: the
    # kernel asks for a visible one first). Its sysctls read-only in a user namespace,
    # where the code's uid is the one that owns them.
    _mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    if plan["mode"] == "userns":
        sys_dir = root + "/proc/sys"
        _mount(sys_dir, sys_dir, None, MS_BIND | MS_REC)
        flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
        _mount(None, sys_dir, None, flags)
    notes.append("private /proc")

    size, files = plan["scratch_bytes"], plan["scratch_files"]
    tmp_options = f"size={size},nr_inodes={files},mode=1777"
    _mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, tmp_options)
    for target, name in SHARED_TMP:
        source = os.path.join(root + "/tmp", name)
        os.mkdir(source)
        os.chmod(source, 0o1777)
        _mount(source, root + target, None, MS_BIND)
    notes.append(f"private /tmp /var/tmp /dev/shm ({size >> 20} MiB, {files} files)")
    devpts = f"newinstance,ptmxmode=0666,mode=0620,max={PTYS}"
    _mount("devpts", root + "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, devpts)
    notes.append(f"minimal /dev, private devpts ({PTYS} ptys)")

    if SYS_PIVOT_ROOT is None:
        raise SetupError(f"pivot_root's number on {_ARCH} is not known here")
    os.chdir(root)
    _check(_libc.syscall(ctypes.c_long(SYS_PIVOT_ROOT), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "umount the host's root")
    os.chdir("/")
    os.makedirs(plan["workdir"], mode=0o700)
    return notes


def build_dev(dev: str) -> None:
    os.makedirs(dev, mode=0o755, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,nr_inodes=64,mode=0755")
    for name in DEVICES:
        node = os.path.join(dev, name)
        os.close(os.open(node, os.O_WRONLY | os.O_CREAT, 0o666))
        _mount(f"/dev/{name}", node, None, MS_BIND)
    for target, name in DEV_LINKS:
        os.symlink(target, os.path.join(dev, name))
    for name in ("pts", "shm"):
        os.mkdir(os.path.join(dev, name), 0o755)


def readonly_tree(top: str, force_fallback: bool) -> None:
    """Every mount at and under ``top`` read-only: one mount_setattr call where the
    kernel has it (5.12), else a bind remount of each keeping its flags (which a user
    namespace may not clear)."""
    if not force_fallback:
        attr = _MountAttr(attr_set=MOUNT_ATTR_RDONLY)
        ret = _libc.syscall(
            ctypes.c_long(SYS_MOUNT_SETATTR),
            ctypes.c_int(AT_FDCWD),
            ctypes.c_char_p(os.fsencode(top)),
            ctypes.c_uint(AT_RECURSIVE),
            ctypes.byref(attr),
            ctypes.c_size_t(ctypes.sizeof(attr)),
        )
        if ret == 0:
            return
        if ctypes.get_errno() not in (38, 22):  # ENOSYS, EINVAL: an older kernel
            _check(ret, f"mount_setattr {top}")
    failed = []
    for mountpoint in _mountpoints(top):
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


def _mountpoints(top: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            field = line.split()[4]
            # mountinfo escapes space, tab, newline and backslash as octal.
            raw = re.sub(rb"\\([0-7]{3})", lambda m: bytes([int(m.group(1), 8)]), field)
            point = os.fsdecode(raw)
            if point == top or point.startswith(top.rstrip("/") + "/"):
                points.append(point)
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

    The kernel counts (since 5.14) per user namespace and uid: the code's own user
    namespace (namespaces, userns) or its fresh uid (uid) start at none. Otherwise the
    processes of the user that /proc shows: under bwrap those of its namespaces
    (exact); without any, all of them, so the code gets ``max_processes`` more (racy,
    and only approximate: that mode isolates little anyway)."""
    mode = plan["mode"]
    if mode in ("namespaces", "uid") or (mode == "userns" and _kernel_at_least(5, 14)):
        return 0
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
    if plan["mode"] in ("namespaces", "userns"):
        notes.append("own user namespace (its keys die with it; no nested ones)")
    if plan["uid"] is not None:
        notes.append(f"uid {plan['uid']}")
    else:
        notes.append(f"uid {plan['host_uid']} (the engine's own)")
    notes.append("no_new_privs")
    notes.append("rlimits cpu/nproc/fsize/nofile/core" + ("/as" if plan["address_space"] else ""))
    return notes


# ---------------------------------------------------------------- user process


def become_user(plan: dict, workdir: str, baseline: int, err_w: int, ask_w: int, go_r: int) -> None:
    """In the forked user process: limits, its user namespace, identity, then exec. Any
    failure is written to err_w (closed on a successful exec) and the process exits."""
    try:
        os.set_inheritable(err_w, False)
        # Its own /proc/self files again (the id maps below); exec decides after.
        _prctl(PR_SET_DUMPABLE, 1)
        # Back to the defaults: ignored signals stay ignored across exec.
        for sig in signal.valid_signals():
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                with contextlib.suppress(OSError, ValueError, RuntimeError):
                    signal.signal(sig, signal.SIG_DFL)
        cpu = int(plan["cpu_seconds"])
        limits = [
            # SIGXCPU at the limit, SIGKILL one second later if the code catches it.
            (resource.RLIMIT_CPU, (cpu, cpu + 1)),
            (resource.RLIMIT_FSIZE, (plan["file_bytes"],) * 2),
            (resource.RLIMIT_NOFILE, (plan["open_files"],) * 2),
            (resource.RLIMIT_CORE, (0, 0)),
        ]
        if plan["address_space"]:  # without a cgroup to bound the run's memory
            limits.append((resource.RLIMIT_AS, (plan["address_space"],) * 2))
        for which, value in limits:
            resource.setrlimit(which, value)
        mode, uid, gid = plan["mode"], plan["uid"], plan["gid"]
        if uid is not None:
            os.setgroups([])
        if mode == "namespaces":
            # A user namespace of its own, its ids mapped by the init (root outside).
            _check(_libc.unshare(CLONE_NEWUSER), "unshare the code's user namespace")
            os.write(ask_w, b"u")
            os.close(ask_w)
            if os.read(go_r, 1) != b"m":
                raise SetupError("the init could not map the code's user namespace")
            _write("/proc/sys/user/max_user_namespaces", "0")
        elif mode == "userns":
            # Below the sandbox's (in which it is root): the engine's uid, not root.
            outer_uid, outer_gid = os.getuid(), os.getgid()
            _check(_libc.unshare(CLONE_NEWUSER), "unshare the code's user namespace")
            _write("/proc/self/setgroups", "deny")
            _write("/proc/self/uid_map", f"{plan['host_uid']} {outer_uid} 1")
            _write("/proc/self/gid_map", f"{plan['host_gid']} {outer_gid} 1")
        # After the user namespace: its count starts with this process.
        nproc = plan["max_processes"] + baseline
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        if uid is not None:
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            if os.getuid() == 0 or os.geteuid() == 0:
                raise SetupError("still root after setresuid")
        # No setuid binary (su, sudo) can give root back.
        _prctl(PR_SET_NO_NEW_PRIVS, 1)
        # After the uid change, which clears it.
        _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        os.chdir(workdir)
        os.umask(0o077)
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
        if isinstance(exc, PermissionError) and plan["mode"] == "uid":
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
    """Reap children until the code's process exits or the wall clock, read from this
    process's own monotonic clock, runs out (then kill it). SIGCHLD only wakes the
    wait: a signal the code sends cannot end it early or make it a timeout. Orphans
    reparented to us are reaped on the way."""
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    deadline = time.monotonic() + max(wall_seconds, 0.001)
    ended = None
    while ended is None:
        while True:
            try:
                pid, wait_status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                pid = 0
            if pid == 0:
                break
            if pid == main:
                ended = wait_status, usage
        left = deadline - time.monotonic()
        if ended is not None or left <= 0:
            break
        with contextlib.suppress(InterruptedError):
            select.select([wake_r], [], [], left)
        with contextlib.suppress(BlockingIOError):
            os.read(wake_r, 4096)
    signal.set_wakeup_fd(-1)
    timed_out = ended is None
    if ended is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(main, signal.SIGKILL)
        ended = os.wait4(main, 0)[1:]
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
