"""The supervisor's loop (engine.supervisor) around a fake engine: a command that exits
with the codes it is given, one per start, and writes the engine's exit record when told
to. What follows each ending, the limit, signals, requeues and the record on disk."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.exits import ExitRecord
from engine.supervisor import (
    EXIT_LIMIT,
    RECOVERED,
    REQUEUE,
    RESTART,
    STOP,
    Attempt,
    Restarts,
    Supervisor,
    decide,
    read_restarts,
    supervisor_args,
)

REPO = Path(__file__).resolve().parents[2]

# argv[1]: a JSON list of [exit code, reason or null, seconds to run first], one per
# start (argv[2] counts the starts); a reason is written as the engine's exit record.
# SIGTERM makes it exit 75, as the engine does after saving.
FAKE_ENGINE = r"""
import json, os, signal, sys, time
plan, counter = json.load(open(sys.argv[1])), sys.argv[2]
n = int(open(counter).read()) if os.path.exists(counter) else 0
open(counter, "w").write(str(n + 1))
code, reason, seconds, *on_term = plan[n]
def stop(*_):
    code, reason = on_term[0] if on_term else (75, "preempted")
    write(code, reason)
    sys.exit(code)
def write(code, reason):
    if reason:
        with open(os.environ["ENGINE_EXIT_RECORD"], "w") as f:
            json.dump({"exit_code": code, "reason": reason, "message": f"{reason} #{n + 1}"}, f)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
time.sleep(seconds)
if code < 0:
    os.kill(os.getpid(), -code)
write(code, reason)
sys.exit(code)
"""


def fake(tmp_path: Path, *plan: tuple) -> list:
    """An engine whose n-th start ends as ``plan[n]`` says: (code, reason), (code, reason,
    seconds it runs first) or (..., seconds, [code, reason] it ends with on SIGTERM)."""
    steps = [[*p, 0.0] if len(p) == 2 else list(p) for p in plan]
    (tmp_path / "plan.json").write_text(json.dumps(steps))
    (tmp_path / "fake.py").write_text(FAKE_ENGINE)
    return [sys.executable, str(tmp_path / "fake.py"), str(tmp_path / "plan.json"),
            str(tmp_path / "starts")]  # fmt: skip


def supervise(tmp_path: Path, command: list, max_restarts: int, **kwargs) -> tuple[int, Restarts]:
    record = tmp_path / "restarts.json"
    code = Supervisor(command, record, max_restarts, delay_s=0, **kwargs).run()
    restarts = read_restarts(record)
    assert restarts is not None
    return code, restarts


def summary(restarts: Restarts) -> list[tuple]:
    return [(a.exit_code, a.reason, a.next) for a in restarts.attempts]


def test_a_hang_is_restarted_and_the_run_finishes(tmp_path):
    code, restarts = supervise(tmp_path, fake(tmp_path, (76, "hung"), (0, None)), 3)
    assert code == 0
    assert summary(restarts) == [(76, "hung", RESTART), (0, "finished", STOP)]
    assert restarts.used == 1 and restarts.max_restarts == 3
    first = restarts.attempts[0]
    assert first.message == "hung #1" and first.why.startswith("restart 1 of 3")
    assert first.started_at <= first.ended_at <= restarts.attempts[1].started_at


def test_retryable_endings_until_the_limit(tmp_path):
    command = fake(tmp_path, (1, "worker_died"), (75, "preempted"), (76, "hung"), (0, None))
    code, restarts = supervise(tmp_path, command, 2)
    assert code == 76
    assert summary(restarts) == [
        (1, "worker_died", RESTART),
        (75, "preempted", RESTART),
        (76, "hung", STOP),
    ]
    assert restarts.attempts[-1].why == "no restart left (trainer.max_restarts=2)"


@pytest.mark.parametrize(
    ("code", "reason", "recorded"),
    [
        (2, "config", "config"),
        (2, None, "config"),
        (2, "nan_updates", "nan_updates"),
        (1, "worker_error", "worker_error"),
        (1, "error", "error"),
        (1, None, "error"),  # a failure that wrote no record: not known to be transient
        (-9, None, "killed"),  # the OOM killer's SIGKILL
    ],
)
def test_what_would_fail_again_is_never_restarted(tmp_path, code, reason, recorded):
    exit_code, restarts = supervise(tmp_path, fake(tmp_path, (code, reason), (0, None)), 3)
    assert exit_code == (137 if code == -9 else code)
    assert summary(restarts) == [(exit_code, recorded, STOP)]
    assert restarts.attempts[0].why == "not retried: not a fault a restart cures"
    assert (tmp_path / "starts").read_text() == "1"


def test_with_no_restarts_allowed_nothing_restarts(tmp_path):
    code, restarts = supervise(tmp_path, fake(tmp_path, (76, "hung"), (0, None)), 0)
    assert code == 76 and summary(restarts) == [(76, "hung", STOP)]


def test_a_stale_exit_record_is_never_read(tmp_path):
    """The engine's record of an earlier attempt (a dead worker) must not make a later
    failure that wrote none look retryable."""
    (tmp_path / "exit_reason.json").write_text(
        json.dumps({"exit_code": 1, "reason": "worker_died", "message": "old"})
    )
    code, restarts = supervise(tmp_path, fake(tmp_path, (1, None), (0, None)), 3)
    assert code == 1 and summary(restarts) == [(1, "error", STOP)]


def test_the_record_is_rewritten_whole_while_an_attempt_runs(tmp_path):
    """Started: the running attempt is on record (no end yet), as valid JSON."""
    record = tmp_path / "restarts.json"
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from engine.supervisor import Supervisor\n"
        f"sys.exit(Supervisor({fake(tmp_path, (0, None, 30.0))!r}, Path({str(record)!r}), 3,"
        " delay_s=0).run())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        running = read_restarts(record)
        assert running is not None and [a.running for a in running.attempts] == [True]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert [p.name for p in tmp_path.glob(".restarts.json*")] == []  # no temp file left


def run_signalled(tmp_path: Path, plan: list, sig: int = signal.SIGTERM, **kwargs) -> int:
    """The supervisor as a process of its own, ``sig`` sent to it once its engine runs."""
    record = tmp_path / "restarts.json"
    options = ", ".join(
        f"{k}={v!r}" if isinstance(v, int) else f"{k}=Path({str(v)!r})" for k, v in kwargs.items()
    )
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from engine.supervisor import Supervisor\n"
        f"sys.exit(Supervisor({fake(tmp_path, *plan)!r}, Path({str(record)!r}), 3, delay_s=0,"
        f" {options}).run())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.send_signal(sig)
    return proc.wait(timeout=60)


def test_a_stop_from_outside_reaches_the_engine_and_is_not_restarted(tmp_path):
    """SIGTERM to the supervisor (rlctl stop): the engine gets it, saves, exits 75; the
    run is not started again."""
    code = run_signalled(tmp_path, [(0, None, 30.0), (0, None)])
    assert code == 75
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(75, "preempted", STOP)]
    assert restarts.attempts[0].why.startswith("stopped from outside")
    assert (tmp_path / "starts").read_text() == "1"


def test_a_stop_between_attempts_ends_the_job_without_the_restart(tmp_path):
    record = tmp_path / "restarts.json"
    script = (
        f"import sys; sys.path.insert(0, {str(REPO)!r})\n"
        "from pathlib import Path\n"
        "from engine.supervisor import Supervisor\n"
        f"sys.exit(Supervisor({fake(tmp_path, (76, 'hung'), (0, None))!r},"
        f" Path({str(record)!r}), 3, delay_s=600).run())\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    for line in proc.stderr:  # the supervisor's line: attempt 1 ended, restart next
        if line.startswith("supervisor: attempt 1 ended"):
            break
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 76  # not the 600 s pause
    restarts = read_restarts(record)
    assert restarts is not None and summary(restarts) == [(76, "hung", STOP)]
    assert restarts.attempts[0].why == "stopped from outside before the restart"
    assert (tmp_path / "starts").read_text() == "1"


def test_sigint_ends_the_restarts_and_leaves_the_engine_to_its_own(tmp_path):
    """A terminal's Ctrl-C reaches the engine by itself: the supervisor passes nothing on,
    and restarts nothing after it."""
    code = run_signalled(tmp_path, [(76, "hung", 3.0), (0, None)], sig=signal.SIGINT)
    assert code == 76
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(76, "hung", STOP)]
    assert (tmp_path / "starts").read_text() == "1"


def test_a_preemption_is_left_to_the_scheduler_to_requeue(tmp_path):
    marker = tmp_path / "requeue"
    code = run_signalled(tmp_path, [(0, None, 30.0)], requeue_marker=marker)
    assert code == 75 and marker.exists()
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(75, "preempted", REQUEUE)]
    assert restarts.used == 1


def test_the_users_stop_is_never_requeued(tmp_path):
    marker, stop = tmp_path / "requeue", tmp_path / "stop-requested"
    stop.touch()
    code = run_signalled(tmp_path, [(0, None, 30.0)], requeue_marker=marker, stop_marker=stop)
    assert code == 75 and not marker.exists()
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(75, "preempted", STOP)]


def test_a_requeued_job_counts_the_schedulers_requeues(tmp_path):
    """Slurm requeued the job by itself twice (a node failed mid-attempt, then before the
    engine started): both count against the limit, and past it the job does not start."""
    record = tmp_path / "restarts.json"
    before = Restarts(1, [Attempt(1, time.time())])  # running when its allocation ended
    record.write_text(json.dumps(before.to_json()))
    command = fake(tmp_path, (0, None))
    code = Supervisor(command, record, 1, delay_s=0, scheduler_restarts=2).run()
    restarts = read_restarts(record)
    assert restarts is not None
    assert code == 1 and not (tmp_path / "starts").exists()
    assert [a.next for a in restarts.attempts] == [REQUEUE, REQUEUE]
    assert restarts.attempts[0].why == "its allocation ended under it"
    assert restarts.used == 2


def test_a_requeued_job_within_its_limit_runs_on(tmp_path):
    record = tmp_path / "restarts.json"
    first = Attempt(1, time.time(), time.time(), 75, "preempted", "", REQUEUE, "restart 1 of 3")
    record.write_text(json.dumps(Restarts(3, [first]).to_json()))
    command = fake(tmp_path, (0, None))
    code = Supervisor(command, record, 3, delay_s=0, scheduler_restarts=1).run()
    restarts = read_restarts(record)
    assert code == 0 and restarts is not None
    assert summary(restarts) == [(75, "preempted", REQUEUE), (0, "finished", STOP)]


# --hand-back 75 (SkyPilot's managed jobs: recover_on_exit_codes [75], no retries of its own)


def test_hand_back_makes_each_restart_skypilots(tmp_path):
    """A hang: not started again here; the supervisor exits 75 for SkyPilot to start the
    job again, and the next start (a new supervisor, the same record) goes on counting."""
    command = fake(tmp_path, (76, "hung"), (1, "worker_died"), (0, None))
    code, restarts = supervise(tmp_path, command, 3, hand_back=75)
    assert code == 75 and (tmp_path / "starts").read_text() == "1"
    assert summary(restarts) == [(76, "hung", REQUEUE)]
    assert restarts.attempts[0].why == "restart 1 of 3: SkyPilot starts the job again"
    code, restarts = supervise(tmp_path, command, 3, hand_back=75)
    assert code == 75 and restarts.used == 2
    code, restarts = supervise(tmp_path, command, 3, hand_back=75)
    assert code == 0
    assert summary(restarts) == [
        (76, "hung", REQUEUE),
        (1, "worker_died", REQUEUE),
        (0, "finished", STOP),
    ]


@pytest.mark.parametrize(("code", "reason"), [(2, "config"), (2, None), (1, "worker_error")])
def test_hand_back_never_hands_back_what_would_fail_again(tmp_path, code, reason):
    exit_code, restarts = supervise(tmp_path, fake(tmp_path, (code, reason)), 3, hand_back=75)
    assert exit_code == code and summary(restarts)[0][2] == STOP


def test_hand_back_past_the_limit_exits_with_a_code_skypilot_does_not_retry(tmp_path):
    """A preemption with no restart left exits 75 from the engine: handed on as 75,
    SkyPilot would recover it without end."""
    command = fake(tmp_path, (75, "preempted"), (75, "preempted"))
    assert supervise(tmp_path, command, 1, hand_back=75)[0] == 75
    code, restarts = supervise(tmp_path, command, 1, hand_back=75)
    assert code == EXIT_LIMIT
    assert restarts.attempts[-1].why == "no restart left (trainer.max_restarts=1)"


def test_hand_back_a_cluster_lost_mid_attempt_is_not_counted(tmp_path):
    """The record (in the bucket) shows an attempt still running: its cluster went, and
    SkyPilot recovered the job without counting it; so does the supervisor."""
    record = tmp_path / "restarts.json"
    record.write_text(json.dumps(Restarts(1, [Attempt(1, time.time())]).to_json()))
    code, restarts = supervise(tmp_path, fake(tmp_path, (0, None)), 1, hand_back=75)
    assert code == 0
    assert [a.next for a in restarts.attempts] == [RECOVERED, STOP]
    assert restarts.used == 0


def test_hand_back_a_stop_from_outside_is_a_preemption_not_counted(tmp_path):
    """SIGTERM to the supervisor and the engine alike (the allocation going away): saved,
    75 for SkyPilot, and no restart spent (SkyPilot does not count a preemption)."""
    code = run_signalled(tmp_path, [(0, None, 30.0)], hand_back=75)
    assert code == 75
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(75, "preempted", RECOVERED)]
    assert restarts.used == 0


def test_hand_back_any_end_under_a_stop_from_outside_is_a_preemption(tmp_path):
    """The allocation going away kills Ray's daemons under the engine too: it may end
    with an error rather than its own save (seen in the managed-job e2e: exit 1 while
    Slurm cancelled the allocation); still the cluster's going, recorded as recovered
    and not counted."""
    code = run_signalled(tmp_path, [(0, None, 30.0, [1, "error"])], hand_back=75)
    assert code == 75
    restarts = read_restarts(tmp_path / "restarts.json")
    assert restarts is not None and summary(restarts) == [(1, "error", RECOVERED)]
    assert restarts.used == 0


@pytest.mark.parametrize(
    ("reason", "used", "stopped", "requeue", "user_stop", "expected"),
    [
        ("finished", 0, False, False, False, STOP),
        ("hung", 0, False, False, False, RESTART),
        ("hung", 3, False, False, False, STOP),
        ("hung", 0, True, True, False, STOP),  # stopped while it hung: a stop
        ("worker_died", 2, False, False, False, RESTART),
        ("preempted", 0, False, False, False, RESTART),  # the engine alone got SIGTERM
        ("preempted", 0, True, False, False, STOP),
        ("preempted", 0, True, True, False, REQUEUE),
        ("preempted", 3, True, True, False, STOP),
        ("preempted", 0, True, True, True, STOP),
        # SIGTERM to every process at once: the workers died under the engine
        ("worker_died", 0, True, True, False, REQUEUE),
        ("worker_died", 0, True, False, False, STOP),
        ("worker_died", 0, True, True, True, STOP),
        ("config", 0, False, False, False, STOP),
        ("nan_updates", 0, False, False, False, STOP),
    ],
)
def test_decide(reason, used, stopped, requeue, user_stop, expected):
    outcome = ExitRecord({"hung": 76, "preempted": 75, "config": 2}.get(reason, 1), reason)
    assert decide(outcome, used, 3, stopped, requeue, user_stop).next == expected


def test_the_command_line_job_scripts_run():
    args = supervisor_args(3, "/j/restarts.json", ["--config", "/j/engine.yaml"])
    assert args == ["-m", "engine.supervisor", "--max-restarts", "3", "--record",
                    "/j/restarts.json", "--", "--config", "/j/engine.yaml"]  # fmt: skip
    from engine.supervisor import _parser

    parsed = _parser().parse_args(
        supervisor_args(1, "r.json", ["--config", "e.yaml", "a.b=1"], "q", "s")[2:]
    )
    assert parsed.engine_args == ["--config", "e.yaml", "a.b=1"]
    assert (parsed.max_restarts, parsed.record, str(parsed.requeue_marker)) == (1, "r.json", "q")


def test_the_key_is_checked_once_up_front():
    from engine.config import load_config
    from engine.errors import ConfigError

    base = ["actor_rollout_ref.model.path=x", "data.train_files=x"]
    assert load_config(base).trainer.max_restarts == 3
    assert load_config([*base, "trainer.max_restarts=0"]).trainer.max_restarts == 0
    with pytest.raises(ConfigError, match=r"trainer\.max_restarts must be >= 0"):
        load_config([*base, "trainer.max_restarts=-1"])


def test_an_sft_run_goes_under_the_supervisor_with_its_module():
    from engine.supervisor import _parser, supervisor_args

    args = supervisor_args(0, "r.json", ["--config", "e.yaml"], module="engine.sft")
    assert args[:2] == ["-m", "engine.supervisor"] and "--module" in args
    parsed = _parser().parse_args(args[2:])
    assert (parsed.module, parsed.engine_args) == ("engine.sft", ["--config", "e.yaml"])
    assert "--module" not in supervisor_args(0, "r.json", [])  # engine.main by default
