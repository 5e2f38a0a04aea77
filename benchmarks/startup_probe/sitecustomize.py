"""The start-up probe of ``benchmarks/first_step.py``: put first on ``PYTHONPATH``, so
that every Python process of a benchmarked run (the driver, Ray's workers) loads it.

With ``FIRST_STEP_PROBE=FILE`` set, it wraps the functions whose start or end is a
start-up milestone, in whichever revision of the engine runs (they exist with the same
meaning before and after the start-up work of issue 27), and appends one line per call,
``<time.time()> <pid> <milestone>``, to FILE. Without the variable it does nothing.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import inspect
import os
import sys
import time

OUT = os.environ.get("FIRST_STEP_PROBE")

# module -> (attribute, "start" | "end", milestone); engine.startup names the milestones
HOOKS: dict[str, list[tuple[str, str, str]]] = {
    # the driver's heavy imports are done when it first loads a tokenizer
    "transformers.models.auto.tokenization_auto": [
        ("AutoTokenizer.from_pretrained", "start", "imports")
    ],
    # the last check of the data (before and after: the last call of the data's reading),
    # named _check_model_configs since model.override_config is read; a revision has one
    "engine.runtime": [
        ("_check_ulysses_heads", "end", "data"),
        ("_check_model_configs", "end", "data"),
        ("init_ray", "end", "ray"),
    ],
    "engine.workers.host": [
        ("WorkerHost.__init__", "end", "workers"),
        ("WorkerHost._build_roles", "end", "models"),
    ],
    "engine.loop.trainer": [
        ("Trainer.validate", "end", "validation"),
        ("Trainer.train_step", "start", "first_step"),
        ("Trainer.train_step", "end", "first_step_end"),
    ],
}


def mark(milestone: str) -> None:
    now = time.time()
    with open(OUT, "a") as f:  # type: ignore[arg-type]
        f.write(f"{now:.4f} {os.getpid()} {milestone}\n")
        if milestone == "first_step":  # in the driver: what the start-up cost in CPU
            f.write(f"{now:.4f} {os.getpid()} cpu_s {tree_cpu_seconds():.2f}\n")


def tree_cpu_seconds() -> float:
    """CPU seconds (user and system) of this process and every descendant so far, the
    ended ones included as far as their parents reaped them (Ray's idle workers)."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for process in [me, *me.children(recursive=True)]:
        try:
            t = process.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def wrap(module: object, qualname: str, when: str, milestone: str) -> None:
    *path, name = qualname.split(".")
    owner = module
    for part in path:
        owner = getattr(owner, part, None)
    if owner is None or not hasattr(owner, name):
        return
    static = inspect.getattr_static(owner, name)
    kind = type(static) if isinstance(static, (classmethod, staticmethod)) else None
    fn = static.__func__ if kind else static

    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        if when == "start":
            mark(milestone)
        try:
            return fn(*args, **kwargs)
        finally:
            if when == "end":
                mark(milestone)

    setattr(owner, name, kind(wrapped) if kind else wrapped)


class Finder(importlib.abc.MetaPathFinder):
    """Wraps a hooked module's functions once it has run."""

    def find_spec(self, name, path, target=None):
        if name not in HOOKS:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            for qualname, when, milestone in HOOKS[name]:
                wrap(module, qualname, when, milestone)

        spec.loader.exec_module = exec_module
        return spec


if OUT:
    sys.meta_path.insert(0, Finder())
