"""The hang watchdog: a run that stops moving ends with every worker's stacks in its log.

The driver is the single controller: it knows which call it is waiting on and since
when. Every wait on the workers (``WorkerGroup.get``) registers with the run's
``Watchdog`` under its phase, the role and method waited on (``rollout.generate``,
``actor.update``, ``host.save_checkpoint``, ``actor.send_weights``), and notes each rank
as it returns; that is each worker's progress report, at no cost to the workers. A
thread of the driver checks the open waits once a second against their phase's bound
(``PhaseBounds``: the floor until the phase has been measured, then ``factor`` × its
longest recent time, never below the floor). Past it, the thread asks every worker of
every group for its Python stacks (all threads), prints them with the phase, the step
and the ranks that have not returned, and the waits raise ``Hung``: the run ends with
exit code 76 (``engine.errors``).

How a stuck worker's stacks are read: each worker registers ``faulthandler`` for
SIGUSR1 at start (``StackFile``), writing into a file it holds open. Its handler runs in
C when the signal lands, whatever the main thread is doing (blocked in a collective,
sleeping, in a C loop that holds the GIL): it needs neither the main thread nor the
GIL, which an answer over Ray (a method of the actor, or a thread it serves) needs. The
signal is sent, and the file read, by a small Ray task placed on the worker's own node
(``_signal_and_read``), so it works across nodes and without a shared file system. The
file is unlinked as soon as it is opened and read through ``/proc/<pid>/fd/<fd>``, so
nothing is left behind, even by a killed worker.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, Any, Protocol

from engine.errors import EXIT_HUNG, EngineError

if TYPE_CHECKING:
    from engine.config.trainer import TrainerConfig

STACK_SIGNAL = signal.SIGUSR1
POLL_S = 1.0  # how often the thread checks, and how long a wait blocks between looks
RECENT = 10  # measurements of a phase its bound is taken from
COLLECT_TIMEOUT_S = 60.0  # for every worker's stacks, all at once


class Hung(EngineError):
    """A phase ran past its bound; the stacks are in the log."""

    exit_code = EXIT_HUNG
    reason = "hung"

    def __init__(self, summary: str) -> None:
        super().__init__(f"{summary}; every worker's stacks are in the log above")


# -- the bound ------------------------------------------------------------------------


class PhaseBounds:
    """How long each phase may take: ``max(floor_s, factor × the longest of its last
    RECENT times)``, and ``floor_s`` before it was measured (the first steps compile and
    warm up)."""

    def __init__(self, factor: float, floor_s: float, recent: int = RECENT) -> None:
        self.factor, self.floor_s, self.recent = factor, floor_s, recent
        self._times: dict[str, deque[float]] = {}

    def record(self, phase: str, seconds: float) -> None:
        self._times.setdefault(phase, deque(maxlen=self.recent)).append(seconds)

    def longest(self, phase: str) -> float | None:
        times = self._times.get(phase)
        return max(times) if times else None

    def bound(self, phase: str) -> float:
        longest = self.longest(phase)
        if longest is None:
            return self.floor_s
        return max(self.floor_s, self.factor * longest)

    def explain(self, phase: str) -> str:
        longest = self.longest(phase)
        if longest is None:
            return f"the floor, trainer.hang_timeout_floor_s={self.floor_s:g}; not measured yet"
        return (
            f"max(trainer.hang_timeout_floor_s={self.floor_s:g}, trainer.hang_timeout_factor="
            f"{self.factor:g} × {longest:.1f} s, its longest of the last {self.recent})"
        )


# -- the waits the driver watches -----------------------------------------------------


Rank = tuple[str, int]  # (the group's label, "" for the training group; the rank)


def rank_name(rank: Rank) -> str:
    group, r = rank
    return f"rank {r}" + (f" of the {group} group" if group else "")


@dataclasses.dataclass
class Wait:
    """One wait of the driver on ranks (of one group, or of several at once): its phase,
    since when, and when each rank returned."""

    phase: str
    ranks: list[Rank]
    started: float = dataclasses.field(default_factory=time.monotonic)
    returned: dict[Rank, float] = dataclasses.field(default_factory=dict)
    poll_s: float | None = POLL_S
    watchdog: Watchdog | None = None

    def done(self, rank: Rank) -> None:
        self.returned[rank] = time.monotonic() - self.started

    def check(self) -> None:
        """Raises ``Hung`` once the watchdog has declared the run hung."""
        if self.watchdog is not None and self.watchdog.hung is not None:
            raise self.watchdog.hung

    @property
    def waiting_on(self) -> list[Rank]:
        return [r for r in self.ranks if r not in self.returned]


class Watch(Protocol):
    """What a worker group's waits register with: a ``Watchdog`` or ``NoWatch``."""

    def waiting(self, phase: str, ranks: list[Rank]) -> AbstractContextManager[Wait]: ...


class NoWatch:
    """The watchdog off (``trainer.hang_timeout_factor=0``), or no run: waits block."""

    @contextmanager
    def waiting(self, phase: str, ranks: list[Rank]) -> Iterator[Wait]:
        yield Wait(phase, ranks, poll_s=None)


@dataclasses.dataclass(frozen=True)
class WorkerRow:
    """A row of the run's workers.json: where one rank's process is, and its stack file."""

    rank: int
    group: str
    pid: int
    node_id: str
    stack_file: str

    @property
    def key(self) -> Rank:
        return (self.group, self.rank)


class Watchdog:
    """The driver's thread that ends a run whose workers stopped answering."""

    def __init__(
        self,
        bounds: PhaseBounds,
        workers: list[WorkerRow],
        step: Callable[[], int],
        out: Any = None,
        poll_s: float = POLL_S,
    ) -> None:
        self.bounds, self.workers, self.step, self.poll_s = bounds, workers, step, poll_s
        self.out = out  # where the report goes; None: sys.stdout at the time (the run's log)
        self.hung: Hung | None = None
        self._waits: dict[int, Wait] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="engine-watchdog", daemon=True)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=COLLECT_TIMEOUT_S + 10)

    @contextmanager
    def waiting(self, phase: str, ranks: list[Rank]) -> Iterator[Wait]:
        wait = Wait(phase, list(ranks), poll_s=self.poll_s, watchdog=self)
        with self._lock:
            self._waits[id(wait)] = wait
        ok = False
        try:
            yield wait
            ok = True
        finally:
            with self._lock:
                del self._waits[id(wait)]
            if ok:  # a failed or cut-off wait is no measure of the phase
                self.bounds.record(phase, time.monotonic() - wait.started)

    def overdue(self, now: float | None = None) -> Wait | None:
        """The open wait furthest past its bound, if any is."""
        now = time.monotonic() if now is None else now
        with self._lock:
            waits = list(self._waits.values())
        late = [(now - w.started - self.bounds.bound(w.phase), w) for w in waits]
        late = [(over, w) for over, w in late if over > 0]
        return max(late, key=lambda item: item[0])[1] if late else None

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            wait = self.overdue()
            if wait is not None:
                self.declare(wait)
                return

    def declare(self, wait: Wait) -> None:
        """Print the report with every worker's stacks, then let the waits raise."""
        elapsed = time.monotonic() - wait.started
        summary = (
            f"the run hung at step {self.step()}: {wait.phase} ran {elapsed:.0f} s, past its"
            f" bound of {self.bounds.bound(wait.phase):.0f} s; not returned:"
            f" {_ranks(wait.waiting_on)}"
        )
        stacks = collect_stacks(self.workers)
        out = self.out or sys.stdout
        print(report(summary, wait, self.bounds, self.workers, stacks), file=out, flush=True)
        self.hung = Hung(summary)


def _ranks(ranks: list[Rank]) -> str:
    return ", ".join(rank_name(r) for r in ranks) or "none"


def in_collective(stack: str) -> bool:
    """A stack that waits in torch.distributed (a rank waiting on the stuck one)."""
    return f"torch{os.sep}distributed{os.sep}" in stack


def report(
    summary: str,
    wait: Wait,
    bounds: PhaseBounds,
    workers: list[WorkerRow],
    stacks: dict[WorkerRow, str],
) -> str:
    """The log's account of a hang: the phase, the bound and why, the ranks that did
    not return (those not waiting in a collective named as the likely stuck ones), then
    every worker's stacks and the driver's."""
    stuck = wait.waiting_on
    rows = {row.key: row for row in workers}
    collective = [r for r in stuck if r in rows and in_collective(stacks.get(rows[r], ""))]
    likely = [r for r in stuck if r not in collective]
    lines = [
        f"watchdog: {summary}",
        f"watchdog: the bound is {bounds.explain(wait.phase)}",
        f"watchdog: returned: {_returned(wait)}; not returned: {_ranks(stuck)}"
        f" (of these, waiting in torch.distributed: {_ranks(collective)});"
        f" likely stuck: {_ranks(likely)}",
    ]
    for row in workers:
        state = f"in {wait.phase}, not returned" if row.key in stuck else "not in this wait"
        lines.append(f"watchdog: ---- stacks of {rank_name(row.key)}, pid {row.pid} ({state}) ----")
        lines.append(stacks.get(row, "(no stacks)").rstrip())
    lines.append(f"watchdog: ---- stacks of the driver, pid {os.getpid()} ----")
    lines.append(driver_stacks().rstrip())
    lines.append(f"watchdog: ending the run (exit code {EXIT_HUNG})")
    return "\n".join(lines)


def _returned(wait: Wait) -> str:
    done = sorted(wait.returned.items())
    return ", ".join(f"{rank_name(r)} after {s:.1f} s" for r, s in done) or "none"


def driver_stacks() -> str:
    names = {t.ident: t.name for t in threading.enumerate()}
    parts = []
    for ident, frame in sys._current_frames().items():
        parts.append(f"Thread {names.get(ident, ident)}:")
        parts.append("".join(traceback.format_stack(frame)).rstrip())
    return "\n".join(parts)


@contextmanager
def watching(
    trainer: TrainerConfig, workers: Any, table: list[dict], step: Callable[[], int]
) -> Iterator[None]:
    """The run's loop under the watchdog (``workers``: a worker group or
    ``SeparateGroups``; ``table``: the rows of workers.json), unless
    ``trainer.hang_timeout_factor=0``; the workers' waits unwatched again after."""
    if trainer.hang_timeout_factor == 0:
        yield
        return
    rows = [
        WorkerRow(r["rank"], r.get("group", ""), r["pid"], r["node_id"], r["stack_file"])
        for r in table
    ]
    bounds = PhaseBounds(trainer.hang_timeout_factor, trainer.hang_timeout_floor_s)
    with Watchdog(bounds, rows, step) as watchdog:
        workers.set_watch(watchdog)
        try:
            yield
        finally:
            workers.set_watch(NoWatch())


# -- reading the workers' stacks ------------------------------------------------------


def collect_stacks(
    workers: list[WorkerRow], timeout_s: float = COLLECT_TIMEOUT_S
) -> dict[WorkerRow, str]:
    """Every worker's stacks, each read on its own node; a node that does not answer in
    ``timeout_s`` is said so."""
    if not workers:
        return {}
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    reader = ray.remote(num_cpus=0)(_signal_and_read)
    refs = {
        reader.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(row.node_id, soft=False)
        ).remote(row.pid, row.stack_file): row
        for row in workers
    }
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    stacks = {row: f"(its node did not answer in {timeout_s:.0f} s)" for row in workers}
    for ref in ready:
        try:
            stacks[refs[ref]] = ray.get(ref)
        except Exception as exc:  # the report goes on without this worker's stacks
            stacks[refs[ref]] = f"(reading its stacks failed: {exc})"
    return stacks


def _signal_and_read(pid: int, path: str, settle_s: float = 5.0) -> str:
    """On the worker's node: SIGUSR1 to the worker, then what its handler wrote."""
    try:
        start = os.stat(path).st_size
        os.kill(pid, STACK_SIGNAL)
    except (FileNotFoundError, ProcessLookupError):
        return "(the process has exited)"
    deadline = time.monotonic() + settle_s
    size, still = start, 0
    while time.monotonic() < deadline and still < 3:  # grown, then unchanged for 0.3 s
        time.sleep(0.1)
        now = os.stat(path).st_size
        still = still + 1 if now == size and now > start else 0
        size = now
    with open(path, "rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace") or "(its handler wrote nothing)"


class StackFile:
    """In a worker: SIGUSR1 writes every thread's Python stack into a file of its own."""

    def __init__(self) -> None:
        fd, path = tempfile.mkstemp(prefix="rlctl-stacks-", suffix=".txt")
        self.file = os.fdopen(fd, "w")
        os.unlink(path)  # read through /proc: nothing to clean up, even after a kill
        self.path = f"/proc/{os.getpid()}/fd/{fd}"
        faulthandler.register(STACK_SIGNAL, file=self.file, all_threads=True, chain=False)

    def close(self) -> None:
        faulthandler.unregister(STACK_SIGNAL)
        self.file.close()


# -- a hang on purpose, for tests only ------------------------------------------------

# RLCTL_TEST_HANG_AT=role.method:N:R makes rank R (of the training group) never return
# from its Nth call of role.method (tests/e2e/test_hang_watchdog_cpu.py). Never set in a real run.
TEST_HANG_ENV = "RLCTL_TEST_HANG_AT"


def hang_point_for_test(group: str, rank: int) -> tuple[str, int] | None:
    """This worker's ``(role.method, N)`` to hang at, from ``TEST_HANG_ENV``; None (the
    only value outside tests) when unset or for another rank."""
    value = os.environ.get(TEST_HANG_ENV)
    if not value or group:
        return None
    phase, nth, at_rank = value.split(":")
    return (phase, int(nth)) if int(at_rank) == rank else None


def hang_forever_for_test() -> None:
    """Never returns (tests only: ``TEST_HANG_ENV``)."""
    while True:
        time.sleep(3600)
