"""Shared by the whole-run tests: the synthetic task's files, the overrides the CPU runs
start from, and the ways to run the engine.

A run goes in this process (``run_engine``: ``engine.runtime.run_training``) on one local
Ray cluster that every module's runs share, with its worker processes kept from one run
to the next where two runs place the same roles the same way (``KeptWorkers``). A test
starts ``python -m engine.main`` as a process of its own (``engine_process``) only where
the process is what it tests: a signal, a kill, an exit code, what a job inherits from
its environment. Every process of a run does its math on one thread (``THREADS``): two
workers and a driver share the two cores without oversubscribing them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).parents[2]
E2E = Path(__file__).parent

# Two CPU workers, the synthetic task, short responses: a few seconds a step.
BASE = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    "data.max_prompt_length=64",
    "data.max_response_length=8",
    "reward_model.num_workers=1",
    "actor_rollout_ref.actor.optim.lr=2e-3",
    "trainer.val_before_train=false",
)
# One thread for the math of each process of a run: Ray gives its workers
# OMP_NUM_THREADS=1, but the driver (this process, or an engine subprocess) and the
# processes they spawn (the reward's) would take a thread per core beside two workers.
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
SCORED = "critic/score/mean"  # in every training step's record, in no validation-only one


def _read_metrics(run_dir: Path) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


@dataclass
class Run:
    """A finished in-process run: its config (as loaded) and its metrics."""

    cfg: Any  # engine.config.EngineConfig
    records: list[dict]  # every line of metrics.jsonl, in order

    @property
    def steps(self) -> list[dict]:
        """The training steps' records (a validation before training has its own)."""
        return [r for r in self.records if SCORED in r]


@pytest.fixture(scope="module")
def synthetic_data(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("synthetic"), n_train=512, n_val=32)


@pytest.fixture(scope="session")
def base_overrides() -> list[str]:
    """The engine overrides a CPU run starts from (two workers, short responses)."""
    return list(BASE)


@pytest.fixture(scope="session")
def read_metrics():
    """``read_metrics(run_dir) -> list[dict]``: a run's ``metrics.jsonl``, a record a line."""
    return _read_metrics


@pytest.fixture(scope="module")
def one_thread():
    """``THREADS`` in this process's environment, for the whole-run tests: the Ray node
    started here inherits it, and so every worker; so does each engine subprocess. Per
    module, so the environment is the session's again outside tests/e2e (GNU nproc reads
    OMP_NUM_THREADS: the Slurm tests' nodes once got one CPU each from it).
    (Torch's pool here is set at one thread for the runs only, ``_in_process``: a
    fixture's own work in this process takes both cores.)"""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in THREADS.items():
            patch.setenv(name, value)
        yield


@pytest.fixture(scope="module")
def ray_cluster(one_thread):
    """The local Ray cluster of the in-process runs: started by the first module that
    needs it and kept for the next; stopped when the tests leave tests/e2e
    (``pytest_runtest_teardown`` below)."""
    import ray

    from engine.config import load_config
    from engine.runtime import init_ray

    if not ray.is_initialized():
        init_ray(load_config(["actor_rollout_ref.model.path=x", "data.train_files=x", *BASE]))


@pytest.hookimpl(trylast=True)  # after the module's fixtures (its kept workers) are gone
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if nextitem is not None and nextitem.path.is_relative_to(E2E):
        return
    if "ray" in sys.modules:
        sys.modules["ray"].shutdown()


def reuse_key(cfg: Any) -> tuple | None:
    """What a worker group was started with, for a run whose roles a rebuild in the same
    processes starts afresh (``WorkerHost.reset``): FSDP training and the Hugging Face
    rollout, all colocated on one group. None for others: vLLM keeps engines and
    Megatron its parallel state per process, agent loops their tools, a reward model
    or a group of its own changes the placement."""
    from engine.workers.spawn import role_layouts

    arr = cfg.actor_rollout_ref
    fsdp = ("fsdp", "fsdp2")
    if (
        arr.rollout.placement != "colocate"
        or arr.rollout.name != "hf"
        or arr.rollout.multi_turn.enable
        or cfg.reward_model.enable
        or arr.actor.strategy not in fsdp
        or (cfg.use_critic and cfg.critic.strategy not in fsdp)
    ):
        return None
    t = cfg.trainer
    # the pool, the roles placed on it (spawn_workers: from these flags), how the roles
    # split rows (the group's dispatch)
    layouts = sorted(role_layouts(cfg).items())
    return (t.nnodes, t.n_gpus_per_node, t.cpus_per_worker, t.device, cfg.use_reference,
            cfg.use_critic, repr(layouts))  # fmt: skip


class _Held:
    """A group as a run holds it: the group's calls; ``start`` joins a new group's
    processes or rebuilds a kept one's roles for the run's config (counted: a run refused
    before it is refused before any model was built); ``shutdown`` ends a group that is
    not kept and leaves a kept one's processes to the next run (``KeptWorkers.release``
    ends them)."""

    def __init__(self, owner: KeptWorkers, group: Any, fresh: bool, kept: bool) -> None:
        self._owner, self._group, self._fresh, self._kept = owner, group, fresh, kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._group, name)

    def start(self, cfg: Any) -> None:
        self._owner.builds += 1
        if self._fresh:
            self._group.start(cfg)
        else:
            self._group.host_all("reset", cfg)

    def shutdown(self, grace_s: float = 10.0) -> None:
        if not self._kept:
            self._group.shutdown(grace_s)


class KeptWorkers:
    """The last run's worker group, kept for the next run with the same ``reuse_key``
    (the algorithm variants: other loss or controller keys, other flags of the same
    roles): its processes, their imports and their process group stay, and each host
    builds its roles again from the new config. A run of another key ends it first, and
    so does a run that fails (a rank may be left waiting in a collective)."""

    def __init__(
        self, spawn: Callable[[Any], Any], key: Callable[[Any], tuple | None] = reuse_key
    ) -> None:
        self._spawn = spawn  # engine.runtime.spawn_workers (engine.sft.runtime's for SFT)
        self._key = key  # a config's reuse key (None: never kept)
        self.key: tuple | None = None
        self.group: Any = None
        self.starts = 0  # runs that got worker processes, kept or new (tests count them)
        self.reused = 0  # ... of which the kept group's
        self.builds = 0  # runs whose workers went on to build their roles (models)

    def spawn(self, cfg: Any) -> Any:
        self.starts += 1
        key = self._key(cfg)
        if key is not None and key == self.key:
            self.reused += 1
            return _Held(self, self.group, fresh=False, kept=True)
        self.release()
        workers = self._spawn(cfg)
        if key is not None:
            self.key, self.group = key, workers
        return _Held(self, workers, fresh=True, kept=key is not None)

    def release(self) -> None:
        if self.group is not None:
            self.group.shutdown()
        self.key = self.group = None


@pytest.fixture(scope="module")
def kept_workers(ray_cluster):
    """The module's ``KeptWorkers``; its group ends with the module."""
    from engine import runtime

    kept = KeptWorkers(runtime.spawn_workers)
    yield kept
    kept.release()


def _in_process(kept: KeptWorkers, call: Callable[[], Any], runtime: Any = None) -> Any:
    """``call()``, a run of the engine here: its workers from ``kept`` (ended if the run
    fails once it has them), torch's pool here at one thread (``THREADS``) meanwhile.
    ``runtime``: the module whose ``spawn_workers`` the run calls (engine.runtime's)."""
    import torch

    if runtime is None:
        from engine import runtime

    threads, starts = torch.get_num_threads(), kept.starts
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runtime, "spawn_workers", kept.spawn)
        torch.set_num_threads(1)
        try:
            return call()
        except BaseException:
            if kept.starts != starts:  # refused before its workers: the kept ones are fine
                kept.release()
            raise
        finally:
            torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def run_engine(kept_workers, read_metrics):
    """``run_engine(*overrides) -> Run``: a training run in this process from ``BASE``
    and ``overrides`` (the later wins), on the shared cluster; an error raises as the
    engine raised it."""
    from engine.config import load_config
    from engine.runtime import run_dir, run_training

    def run(*overrides: str) -> Run:
        cfg = load_config([*BASE, *overrides])
        _in_process(kept_workers, lambda: run_training(cfg))
        return Run(cfg, read_metrics(run_dir(cfg)))

    return run


# An SFT run on two CPU workers (engine.sft), as BASE is the RL runs'.
SFT_BASE = (
    "trainer.device=cpu",
    "trainer.n_gpus_per_node=2",
    "trainer.logger=[console]",
    "data.max_length=64",
)


def sft_reuse_key(cfg: Any) -> tuple | None:
    """An SFT run's workers are kept for the next on the same devices (FSDP2: a host
    rebuilds its role from each run's config; Megatron keeps its parallel state)."""
    t = cfg.trainer
    if cfg.megatron:
        return None
    return ("sft", t.nnodes, t.n_gpus_per_node, t.cpus_per_worker, t.device,
            cfg.engine.ulysses_sequence_parallel_size)  # fmt: skip


@pytest.fixture(scope="module")
def run_sft(ray_cluster, read_metrics):
    """``run_sft(*overrides, stop=None) -> Run``: an SFT run (engine.sft.runtime.run_sft)
    in this process from ``SFT_BASE`` and ``overrides``, its workers kept between the
    module's runs; ``stop`` as run_sft's."""
    from engine.config.load import load
    from engine.config.sft import SFT, engine_view
    from engine.runtime import run_dir
    from engine.sft import runtime

    kept = KeptWorkers(runtime.spawn_workers, sft_reuse_key)

    def run(*overrides: str, stop: Callable | None = None) -> Run:
        cfg = load([*SFT_BASE, *overrides], schema=SFT).config
        _in_process(kept, lambda: runtime.run_sft(cfg, stop), runtime)
        return Run(cfg, read_metrics(run_dir(engine_view(cfg, 1))))

    yield run
    kept.release()


@pytest.fixture(scope="module")
def engine_main(kept_workers):
    """``engine_main(*args) -> int``: the engine's command (``engine.main.main``) in this
    process with ``args``, no ``BASE``; its exit code (0 when it returned). What it
    prints, ``capsys`` holds."""
    from engine.main import main

    def run(*args: str) -> int:
        try:
            _in_process(kept_workers, lambda: main(list(args)))
        except SystemExit as exit_:
            return exit_.code if isinstance(exit_.code, int) else 1
        return 0

    return run


@pytest.fixture(scope="session")
def engine_process():
    """``engine_process(*overrides, popen=False, timeout=600, supervisor=None,
    **kwargs)``: ``python -m engine.main`` with ``BASE`` and ``overrides`` as a process of
    its own (its own Ray cluster, workers and imports): finished (``subprocess.run``, its
    output captured as text), or running with ``popen=True`` (stdout and stderr together
    in its stdout). With ``supervisor`` (its options), the engine runs under ``python -m
    engine.supervisor``, as a job script runs it. ``kwargs`` go to ``subprocess``;
    ``env`` adds to this process's environment, with ``THREADS`` (its processes on one
    thread, as an in-process run's)."""

    def start(
        *overrides: str,
        popen: bool = False,
        timeout: float = 600,
        supervisor: Sequence[str] | None = None,
        **kwargs: Any,
    ):
        path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
        env = {**os.environ, **THREADS, "PYTHONPATH": path, **kwargs.pop("env", {})}
        command = ["-m", "engine.main"]
        if supervisor is not None:
            command = ["-m", "engine.supervisor", *supervisor, "--"]
        args = [sys.executable, *command, *BASE, *overrides]
        if popen:
            return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env, **kwargs)  # fmt: skip
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env,
                              **kwargs)  # fmt: skip

    return start
