"""The sandbox for untrusted, model-written code (docs/sandbox.md): a process with no
network, its own scratch directory, limits on CPU, memory, processes, files and output,
and a wall clock.

    from engine.sandbox import SandboxLimits, run_python
    result = run_python("print(2 ** 10)", SandboxLimits(wall_seconds=5))

``run``: the parent's side (plan, start, read, clean up); ``inside``: the program that
runs inside, handed over as an open file; ``limits``: what a run may use; ``view``,
``bwrap``: its file system and namespaces; ``cgroup``: its memory and process bounds;
``streams``: its output and status pipes; ``leftovers``: what a run leaves to remove.
"""

from engine.sandbox.limits import SandboxError, SandboxLimits
from engine.sandbox.run import SandboxResult, isolation_mode, run_python, run_python_async

__all__ = [
    "SandboxError",
    "SandboxLimits",
    "SandboxResult",
    "isolation_mode",
    "run_python",
    "run_python_async",
]
