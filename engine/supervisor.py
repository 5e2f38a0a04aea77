"""The engine under a supervisor that starts it again after a failure worth retrying:

    python -m engine.supervisor --max-restarts 3 --record restarts.json -- --config engine.yaml

The job scripts of the local and Slurm backends run this in place of ``python -m
engine.main`` (templates/local_job.sh.j2, templates/slurm/job.sbatch.j2's driver step).
It runs the engine's command (``sys.executable -m engine.main`` and the arguments after
``--``) as its child; when the child ends for a reason worth retrying (``engine.exits``:
preempted, hung, a worker's process or node died) it starts it again, at most
``--max-restarts`` times over the job's whole life, and the engine resumes from its last
complete checkpoint (``trainer.resume_mode=auto``). A configuration error, the NaN stop, an
error that would recur, or a stop asked from outside ends it with the engine's exit code.

Every attempt and what followed it goes to ``--record`` (``restarts.json`` in the job's
directory: ``rlctl status`` shows it), rewritten whole at each attempt's start and end (a
temporary file renamed over it), so that a reader never sees half a record. The engine
says why it ended in a record of its own beside it (``ENGINE_EXIT_RECORD``), removed
before each start so that a stale one is never read.

Signals: SIGTERM to the supervisor goes on to the engine (which saves and exits 75) and
no restart follows: the stop came from outside (``rlctl stop``, or the scheduler taking
the allocation back). SIGINT only ends the restarts (a terminal's Ctrl-C reaches the
engine too). With ``--requeue-marker`` (Slurm with requeue on), such a stop
that exited 75 (or 1 with its workers dead: the stop reached them too) is left to the
scheduler, budget permitting, unless ``--stop-marker``
exists (the user's stop): the supervisor records it as a requeue and creates the marker,
and the batch script requeues the job. A job the scheduler requeued by itself (a node
failed) is counted too: ``SLURM_RESTART_COUNT`` above the requeues on record.

With ``--hand-back CODE`` (SkyPilot's managed jobs) the supervisor never restarts the
engine itself: an ending worth retrying, budget permitting, ends it with CODE, which the
task lists in ``recover_on_exit_codes``, and SkyPilot starts the whole job again (Ray on
every node too: a node whose Ray died comes back). Any other ending leaves with a code
SkyPilot does not retry (``max_restarts_on_errors: 0``): a configuration error fails at
once. The record then lives beside the checkpoints, in the bucket, so that the count
outlives the cluster. A stop from outside (SIGTERM: the cluster going away) and an
attempt found running at the start (it ended with its cluster) are preemptions, which
SkyPilot recovers without counting, and so does the record.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.exits import (
    EXIT_RECORD_ENV,
    ExitRecord,
    classify,
    read_exit_record,
    write_json_atomically,
)

RECORD_FILE = "restarts.json"  # in the job's directory
EXIT_RECORD_FILE = "exit_reason.json"  # the engine's, beside the record
DELAY_S = 5.0  # between attempts: the last one's processes finish going
SCHEDULER_RESTARTS_ENV = "SLURM_RESTART_COUNT"  # the job's requeues, whoever made them
EXIT_LIMIT = 1  # a requeued job already past its restarts: not started again

# What follows an attempt.
RESTART = "restart"  # started again here, by the supervisor
REQUEUE = "requeue"  # left to the scheduler, which starts the job again
STOP = "stop"  # the job ends with the attempt's exit code
RECOVERED = "recovered"  # its cluster went; SkyPilot recovered the job (not counted)
RESTARTED = (RESTART, REQUEUE)


@dataclasses.dataclass
class Attempt:
    """One start of the engine. ``next`` and ``why`` once it ended; ``exit_code`` is
    None for an attempt whose end nobody saw (its allocation went with it)."""

    number: int
    started_at: float  # Unix time
    ended_at: float | None = None
    exit_code: int | None = None
    reason: str | None = None  # engine.exits.REASONS
    message: str = ""
    next: str | None = None  # RESTART, REQUEUE, RECOVERED, STOP; None while it runs
    why: str = ""

    @property
    def running(self) -> bool:
        return self.next is None


@dataclasses.dataclass
class Restarts:
    """The job's attempts, as ``restarts.json`` holds them."""

    max_restarts: int
    attempts: list[Attempt] = dataclasses.field(default_factory=list)

    @property
    def used(self) -> int:
        """Restarts so far: the attempts another start followed."""
        return sum(1 for a in self.attempts if a.next in RESTARTED)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> Restarts:
        attempts = [Attempt(**a) for a in data["attempts"]]
        return cls(int(data["max_restarts"]), attempts)


def read_restarts(path: Path) -> Restarts | None:
    """The record at ``path``; None when there is none or it is not one (a reader such as
    ``rlctl status`` must not fail on it)."""
    try:
        return Restarts.from_json(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclasses.dataclass(frozen=True)
class Decision:
    next: str
    why: str


def decide(
    outcome: ExitRecord,
    used: int,
    max_restarts: int,
    stopped: bool,
    requeue: bool = False,
    user_stop: bool = False,
) -> Decision:
    """What follows an attempt that ended with ``outcome``, ``used`` restarts spent.
    ``stopped``: the supervisor was signalled (a stop from outside); ``requeue``: the
    scheduler requeues a job whose allocation it takes back; ``user_stop``: the user's
    stop marker is there."""
    if outcome.reason == "finished":
        return Decision(STOP, "finished")
    if not outcome.retry:
        return Decision(STOP, "not retried: not a fault a restart cures")
    # A scheduler's stop may reach every process of the job at once (the driver, Ray's
    # daemons and the workers): the engine cannot save, its workers die under it, and
    # it resumes from its last complete checkpoint just the same.
    requeued = outcome.reason in ("preempted", "worker_died")
    if stopped and not (requeue and requeued and not user_stop):
        return Decision(STOP, "stopped from outside (rlctl stop, or the scheduler)")
    if used >= max_restarts:
        return Decision(STOP, f"no restart left (trainer.max_restarts={max_restarts})")
    left = f"restart {used + 1} of {max_restarts}"
    if stopped:
        return Decision(REQUEUE, f"{left}: the scheduler requeues the job")
    return Decision(RESTART, f"{left}: from the last complete checkpoint")


class Supervisor:
    """Runs ``command`` until it needs no restart; ``run()`` is its exit code."""

    def __init__(
        self,
        command: Sequence[str],
        record: Path,
        max_restarts: int,
        delay_s: float = DELAY_S,
        requeue_marker: Path | None = None,
        stop_marker: Path | None = None,
        scheduler_restarts: int = 0,
        hand_back: int | None = None,
        out: Any = None,
    ) -> None:
        self.command = list(command)
        self.record = record
        self.exit_record = record.with_name(EXIT_RECORD_FILE)
        self.delay_s = delay_s
        self.requeue_marker, self.stop_marker = requeue_marker, stop_marker
        self.hand_back = hand_back
        self.out = out  # where its lines go; None: sys.stderr at the time
        previous = read_restarts(record)
        self.restarts = Restarts(max_restarts, previous.attempts if previous else [])
        if hand_back is None:
            self._count_scheduler_restarts(scheduler_restarts)
        else:
            self._note_recovery()
        self.child: subprocess.Popen | None = None
        self.stopped = False  # a stop from outside: no restart after it
        self.terminate = False  # ... by SIGTERM, which the engine gets too

    def _count_scheduler_restarts(self, scheduler_restarts: int) -> None:
        """A requeued job: the attempt its allocation took with it ended there; and a
        requeue the scheduler made by itself (a node failed) counts as a restart."""
        attempts = self.restarts.attempts
        if attempts and attempts[-1].running:
            last = attempts[-1]
            last.next, last.why = REQUEUE, "its allocation ended under it"
            last.reason, last.message = None, "a node failed, or the scheduler took it back"
        requeues = sum(1 for a in attempts if a.next == REQUEUE)
        for _ in range(scheduler_restarts - requeues):
            attempts.append(
                Attempt(
                    len(attempts) + 1,
                    time.time(),
                    ended_at=time.time(),
                    message=f"the scheduler requeued the job ({SCHEDULER_RESTARTS_ENV})",
                    next=REQUEUE,
                    why="its allocation ended before the engine started",
                )
            )

    def _note_recovery(self) -> None:
        """SkyPilot started the job again while an attempt was running: its cluster
        went (a preemption), which SkyPilot recovers without counting; so does this."""
        attempts = self.restarts.attempts
        if attempts and attempts[-1].running:
            last = attempts[-1]
            last.next, last.why = RECOVERED, "its cluster went; SkyPilot recovered the job"
            last.message = "preempted, or a node failed"

    def say(self, line: str) -> None:
        print(f"supervisor: {line}", file=self.out or sys.stderr, flush=True)

    def save(self) -> None:
        write_json_atomically(self.record, self.restarts.to_json())

    def on_signal(self, signum: int, _frame: Any) -> None:
        """A stop from outside: no restart after it. SIGTERM is passed on to the engine
        (it saves and exits 75); SIGINT is not: a terminal's Ctrl-C reaches the whole
        process group, the engine included, and a second one would cut its exit short."""
        self.stopped = True
        self.terminate = self.terminate or signum == signal.SIGTERM
        if signum == signal.SIGTERM and self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self) -> int:
        r = self.restarts
        if r.used > r.max_restarts:
            self.save()
            self.say(
                f"not started: {r.used} restarts already (trainer.max_restarts={r.max_restarts})"
            )
            return EXIT_LIMIT
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.on_signal)
        while True:
            attempt = Attempt(len(r.attempts) + 1, time.time())
            r.attempts.append(attempt)
            code = self.attempt(attempt)
            if self.hand_back is not None:
                return self.handed_back(attempt, code)
            if attempt.next == REQUEUE and self.requeue_marker is not None:
                self.requeue_marker.touch()
            if attempt.next != RESTART:
                return code
            self.pause(self.delay_s)
            if self.stopped:
                attempt.next, attempt.why = STOP, "stopped from outside before the restart"
                self.save()
                self.say(attempt.why)
                return code

    def handed_back(self, attempt: Attempt, code: int) -> int:
        """``--hand-back``: a restart is SkyPilot's to make (exit ``hand_back``); any
        other ending must not exit with that code, or SkyPilot would start it again."""
        if self.stopped and code != 0:
            # SIGTERM from outside: the cluster going away (SkyPilot recovers that
            # without counting it) or the user's cancel (nothing is recovered). The
            # engine may end any way then: its own save on SIGTERM, or an error or a dead
            # worker as Ray's daemons die under it; it is the same preemption.
            attempt.next, attempt.why = RECOVERED, "stopped from outside: a preemption"
            self.save()
            return self.hand_back
        if attempt.next in RESTARTED:  # counted in ``used`` already
            r = self.restarts
            attempt.next = REQUEUE
            attempt.why = f"restart {r.used} of {r.max_restarts}: SkyPilot starts the job again"
            self.save()
            self.say(attempt.why)
            return self.hand_back
        return EXIT_LIMIT if code == self.hand_back else code

    def pause(self, seconds: float) -> None:
        """Between attempts; a stop from outside ends it (short sleeps: nothing a signal
        handler could deadlock on)."""
        deadline = time.monotonic() + seconds
        while not self.stopped and time.monotonic() < deadline:
            time.sleep(min(0.1, seconds))

    def attempt(self, attempt: Attempt) -> int:
        """One start of the engine, recorded before it and after."""
        self.exit_record.unlink(missing_ok=True)
        self.save()
        if attempt.number > 1:
            self.say(f"attempt {attempt.number}: starting the engine again")
        env = {**os.environ, EXIT_RECORD_ENV: str(self.exit_record)}
        self.child = subprocess.Popen(self.command, env=env)
        if self.terminate:  # it came while the engine was being started
            self.child.send_signal(signal.SIGTERM)
        code = self.child.wait()
        code = 128 - code if code < 0 else code  # killed by signal N: 128+N, as a shell says
        outcome = classify(code, read_exit_record(self.exit_record))
        decision = decide(
            outcome,
            self.restarts.used,
            self.restarts.max_restarts,
            self.stopped,
            requeue=self.requeue_marker is not None or self.hand_back is not None,
            user_stop=self.stop_marker is not None and self.stop_marker.exists(),
        )
        attempt.ended_at, attempt.exit_code = time.time(), code
        attempt.reason, attempt.message = outcome.reason, outcome.message
        attempt.next, attempt.why = decision.next, decision.why
        self.save()
        self.say(
            f"attempt {attempt.number} ended with exit code {code}, {outcome.words}; {decision.why}"
        )
        return code


def supervisor_args(
    max_restarts: int,
    record: str,
    engine_args: Sequence[str],
    requeue_marker: str | None = None,
    stop_marker: str | None = None,
    module: str = "engine.main",
    hand_back: int | None = None,
) -> list[str]:
    """The arguments of ``python -m engine.supervisor`` (what a job script runs after its
    Python) for the engine's ``engine_args`` (``module``: engine.main, or engine.sft)."""
    args = ["-m", "engine.supervisor", "--max-restarts", str(max_restarts), "--record", record]
    if module != "engine.main":
        args += ["--module", module]
    if requeue_marker is not None:
        args += ["--requeue-marker", requeue_marker]
    if stop_marker is not None:
        args += ["--stop-marker", stop_marker]
    if hand_back is not None:
        args += ["--hand-back", str(hand_back)]
    return [*args, "--", *engine_args]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m engine.supervisor",
        description="Run the engine (python -m engine.main ARGS) and start it again after a"
        " failure worth retrying (preempted, hung, a worker or node died).",
    )
    parser.add_argument("--max-restarts", type=int, required=True, metavar="N")
    parser.add_argument(
        "--module", default="engine.main", choices=("engine.main", "engine.sft"), help="the run"
    )
    parser.add_argument("--record", default=RECORD_FILE, metavar="FILE")
    parser.add_argument("--delay-s", type=float, default=DELAY_S, metavar="S")
    parser.add_argument("--requeue-marker", type=Path, metavar="FILE")
    parser.add_argument("--stop-marker", type=Path, metavar="FILE")
    parser.add_argument(
        "--hand-back", type=int, metavar="CODE", help="exit CODE in place of each restart"
    )
    parser.add_argument("engine_args", nargs="*", metavar="ARG")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    if args.max_restarts < 0:
        _parser().error("--max-restarts must be 0 or more")
    count = os.environ.get(SCHEDULER_RESTARTS_ENV, "")
    return Supervisor(
        [sys.executable, "-m", args.module, *args.engine_args],
        Path(args.record),
        args.max_restarts,
        delay_s=args.delay_s,
        requeue_marker=args.requeue_marker,
        stop_marker=args.stop_marker,
        scheduler_restarts=int(count) if count.isdigit() else 0,
        hand_back=args.hand_back,
    ).run()


if __name__ == "__main__":
    sys.exit(main())
