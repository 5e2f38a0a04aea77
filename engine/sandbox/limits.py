"""What one run of sandboxed code may use (engine/sandbox/run.py runs it).

Torch-free and import-light: a tool wrapper or the config can build limits without
starting anything."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import EngineError

# Python with -I -S needs about 20 MiB of address space to start; below this it may not.
MIN_MEMORY_BYTES = 64 << 20


class SandboxError(EngineError):
    """The sandbox was asked for something it cannot do (bad limits, or namespaces
    required on a machine without them). Never raised for what the code itself does."""


@dataclass(frozen=True)
class SandboxLimits:
    """The resources one run may use and who it runs as. Where a cgroup can be made
    (docs/sandbox.md), ``memory_bytes`` and ``max_processes`` bound the run as a whole,
    as the kernel counts them; without one, RLIMITs bind each process (a run that forks
    may use up to ``max_processes`` times ``memory_bytes``). The wall clock bounds the
    whole run."""

    # RLIMIT_CPU of each process, in seconds (SIGXCPU at the limit, SIGKILL a second on).
    cpu_seconds: int = 10
    # The whole run, from the start of the code to its end: then every process is killed.
    wall_seconds: float = 30.0
    # The run's memory, in bytes: with a cgroup, all its processes' memory together
    # (shared memory, memfd, pipe buffers and kernel memory included; its scratch files
    # beside it, up to scratch_bytes), past which the kernel kills a process of the run;
    # without one, RLIMIT_AS of each process (an allocation past it raises MemoryError).
    memory_bytes: int = 1 << 30
    # Processes (and threads) the code may have at once, its own first one included: the
    # cgroup's pids.max where there is one, and RLIMIT_NPROC.
    max_processes: int = 16
    # Bytes kept of stdout and of stderr each; the rest is read and dropped.
    output_bytes: int = 64 << 10
    # RLIMIT_FSIZE: the largest file the code may write, in bytes.
    file_bytes: int = 16 << 20
    # The private /tmp (with the working directory, /var/tmp and /dev/shm in it), in
    # bytes; only where a mount namespace is available.
    scratch_bytes: int = 64 << 20
    # Files and directories the private /tmp may hold (its tmpfs's nr_inodes: each costs
    # the kernel memory whatever its size); only where a mount namespace is available.
    scratch_files: int = 4096
    # RLIMIT_NOFILE: open file descriptors per process.
    open_files: int = 256
    # The interpreter the code runs in (None: the engine's own, its real path). It must
    # be readable by the sandbox uid when no mount namespace is available.
    python: str | None = None
    # Run as root: each run takes a fresh uid (and gid) from [first, last), so that
    # RLIMIT_NPROC counts that run's processes alone and runs cannot signal each other.
    uid_range: tuple[int, int] = (0x70000000, 0x71000000)
    # Refuse to run (SandboxError) where network, pid and mount namespaces are missing,
    # instead of running with the weaker isolation the result's ``isolation`` names.
    require_namespaces: bool = False

    def __post_init__(self) -> None:
        problems = self.problems()
        if problems:
            raise SandboxError("invalid sandbox limits: " + "; ".join(problems))

    def problems(self) -> list[str]:
        """Each bad field with what to write instead; empty when the limits are usable."""
        out: list[str] = []
        least = {"cpu_seconds": 1, "max_processes": 1, "output_bytes": 1, "file_bytes": 1}
        least |= {"open_files": 16, "memory_bytes": MIN_MEMORY_BYTES, "scratch_bytes": 1 << 20}
        least |= {"scratch_files": 16}
        for name, low in least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                out.append(f"{name}={value!r} must be an integer of at least {low}")
        wall = self.wall_seconds
        if isinstance(wall, bool) or not isinstance(wall, int | float) or not 0 < wall < 1e6:
            out.append(f"wall_seconds={wall!r} must be a number of seconds above 0")
        first, last = self.uid_range
        if not (isinstance(first, int) and isinstance(last, int) and 0 < first < last <= 2**31 - 1):
            out.append(
                f"uid_range={self.uid_range!r} must be (first, last) with 0 < first < last < 2**31"
            )
        if self.python is not None and not isinstance(self.python, str):
            out.append(f"python={self.python!r} must be a path to an interpreter, or None")
        return out
