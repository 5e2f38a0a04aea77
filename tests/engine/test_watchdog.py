"""The hang watchdog's parts without a run: the bound, the waits it watches, the report,
and a worker's stack file read while its thread is stuck (engine.watchdog). The whole
run that hangs is tests/e2e/test_hang_watchdog_cpu.py."""

import io
import os
import threading
import time

import pytest

from engine.config import load_config
from engine.errors import ConfigError
from engine.watchdog import (
    Hung,
    NoWatch,
    PhaseBounds,
    StackFile,
    Watchdog,
    WorkerRow,
    _signal_and_read,
    in_collective,
    report,
)


def test_bound_is_the_floor_until_the_phase_is_measured():
    bounds = PhaseBounds(factor=5, floor_s=600)
    assert bounds.bound("rollout.generate") == 600
    bounds.record("actor.update", 10)
    assert bounds.bound("rollout.generate") == 600  # another phase's time counts not


def test_bound_is_factor_times_the_longest_recent_time_never_below_the_floor():
    bounds = PhaseBounds(factor=5, floor_s=600)
    bounds.record("rollout.generate", 100)
    assert bounds.bound("rollout.generate") == 600  # 5 × 100 = 500 < the floor
    bounds.record("rollout.generate", 130)
    assert bounds.bound("rollout.generate") == 650  # 5 × 130
    bounds.record("rollout.generate", 20)  # a short one: the longest still counts
    assert bounds.bound("rollout.generate") == 650


def test_only_the_recent_times_count():
    bounds = PhaseBounds(factor=2, floor_s=1, recent=3)
    for seconds in (50, 10, 11, 12):  # 50 falls out of the last three
        bounds.record("actor.update", seconds)
    assert bounds.bound("actor.update") == 24  # 2 × 12
    assert "2 × 12.0 s" in bounds.explain("actor.update")
    assert "not measured yet" in bounds.explain("ref.log_probs")


def test_factor_one_is_the_longest_itself():
    bounds = PhaseBounds(factor=1, floor_s=0.5)
    bounds.record("p", 3.0)
    assert bounds.bound("p") == 3.0


@pytest.mark.parametrize(
    "overrides, problem",
    [
        (["trainer.hang_timeout_factor=0.5"], "hang_timeout_factor must be 0"),
        (["trainer.hang_timeout_factor=-1"], "hang_timeout_factor must be 0"),
        (["trainer.hang_timeout_floor_s=0"], "hang_timeout_floor_s must be > 0"),
    ],
)
def test_bad_keys_are_refused(overrides, problem):
    with pytest.raises(ConfigError, match=problem):
        load_config(["actor_rollout_ref.model.path=x", "data.train_files=x", *overrides])


def test_keys_tune_the_collective_timeout_and_zero_turns_it_off():
    cfg = load_config(
        [
            "actor_rollout_ref.model.path=x",
            "data.train_files=x",
            "trainer.hang_timeout_factor=0",
            "trainer.hang_timeout_floor_s=90",
        ]
    )
    assert cfg.trainer.hang_timeout_factor == 0
    assert cfg.trainer.collective_timeout_s == 180


def test_a_wait_past_its_bound_raises_hung_after_the_report():
    """Rank 0 returns, rank 1 never does: the thread declares the hang, the report
    names the phase, the step and rank 1, and the wait raises."""
    out = io.StringIO()
    bounds = PhaseBounds(factor=3, floor_s=0.2)
    with (
        Watchdog(bounds, [], step=lambda: 3, out=out, poll_s=0.02) as dog,
        pytest.raises(Hung) as raised,
        dog.waiting("rollout.generate", [("", 0), ("", 1)]) as wait,
    ):
        wait.done(("", 0))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            time.sleep(wait.poll_s)
            wait.check()
    assert raised.value.exit_code == 76
    text = out.getvalue()
    assert "hung at step 3: rollout.generate ran" in text
    assert "not returned: rank 1" in text and "likely stuck: rank 1" in text
    assert "stacks of the driver" in text and "exit code 76" in text
    assert bounds.longest("rollout.generate") is None  # a hung wait is no measurement


def test_finished_waits_are_measured_and_no_watch_blocks():
    bounds = PhaseBounds(factor=3, floor_s=60)
    with Watchdog(bounds, [], step=lambda: 1) as dog:
        with dog.waiting("actor.update", [("", 0)]) as wait:
            wait.done(("", 0))
        assert dog.overdue() is None
    assert bounds.longest("actor.update") is not None
    with NoWatch().waiting("actor.update", [("", 0)]) as wait:
        assert wait.poll_s is None  # ray.wait without a timeout, as before
        wait.check()


def test_overdue_picks_the_wait_furthest_past_its_bound():
    bounds = PhaseBounds(factor=2, floor_s=10)
    dog = Watchdog(bounds, [], step=lambda: 1)
    with dog.waiting("a", [("", 0)]) as a, dog.waiting("b", [("rollout", 0)]) as b:
        now = time.monotonic()
        assert dog.overdue(now) is None
        a.started, b.started = now - 11, now - 15
        assert dog.overdue(now) is b


def test_report_tells_the_stuck_rank_from_those_waiting_in_a_collective():
    rows = [WorkerRow(r, "", 100 + r, "node", f"/proc/x/fd/{r}") for r in (0, 1)]
    stacks = {
        rows[0]: 'File "/x/torch/distributed/distributed_c10d.py", line 1 in all_reduce',
        rows[1]: 'File "/x/engine/watchdog.py", line 9 in hang_forever_for_test',
    }
    bounds = PhaseBounds(factor=5, floor_s=30)
    dog = Watchdog(bounds, rows, step=lambda: 3)
    with dog.waiting("actor.update", [("", 0), ("", 1)]) as wait:
        text = report("summary", wait, bounds, rows, stacks)
    assert in_collective(stacks[rows[0]]) and not in_collective(stacks[rows[1]])
    assert "waiting in torch.distributed: rank 0); likely stuck: rank 1" in text
    assert "stacks of rank 1, pid 101 (in actor.update, not returned)" in text
    assert "in hang_forever_for_test" in text


def stuck_in_a_named_function(event: threading.Event) -> None:
    event.wait()


def test_sigusr1_dumps_every_thread_even_one_that_is_blocked():
    """A worker's stack file, read as the driver's node task reads it (here on this
    process): the blocked thread's function is in it."""
    stacks = StackFile()
    release = threading.Event()
    thread = threading.Thread(target=stuck_in_a_named_function, args=(release,))
    thread.start()
    try:
        assert stacks.path.startswith(f"/proc/{os.getpid()}/fd/")
        text = _signal_and_read(os.getpid(), stacks.path)
    finally:
        release.set()
        thread.join()
        stacks.close()
    assert "in stuck_in_a_named_function" in text
    assert "in test_sigusr1_dumps_every_thread_even_one_that_is_blocked" in text


def test_a_gone_process_is_said_so():
    assert _signal_and_read(os.getpid(), "/proc/self/fd/999999") == "(the process has exited)"
