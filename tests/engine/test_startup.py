"""The start-up: its milestones (engine.startup), and the driver reading its data while
Ray and the workers' processes start (engine.runtime.run_training), with the same data
and the same errors as when it read them first."""

from __future__ import annotations

import gc
import subprocess
import sys
import threading
import time
from pathlib import Path

import pandas as pd
import pytest

from engine.config import load_config
from engine.errors import ConfigError, EngineError
from engine.reward.manager import RewardManager
from engine.reward.registry import RewardError
from engine.startup import STARTUP_PREFIX, StartupClock, gc_paused, process_start_time

REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- the clock


def test_a_milestone_counts_once_and_the_first_step_reports_once(capsys):
    clock = StartupClock(started=100.0)
    clock.mark("ray", at=104.5)
    clock.mark("ray", at=109.0)  # a later mark of the same milestone: the first counts
    clock.mark("workers", at=106.0)
    metrics = clock.first_step_done()
    assert metrics[f"{STARTUP_PREFIX}ray"] == 4.5
    assert metrics[f"{STARTUP_PREFIX}workers"] == 6.0
    assert metrics[f"{STARTUP_PREFIX}first_step_end"] > 6.0  # now, from 100 s after 1970
    assert list(metrics) == [f"{STARTUP_PREFIX}{m}" for m in ("ray", "workers", "first_step_end")]
    assert capsys.readouterr().out.startswith(
        "start-up, seconds from the start: ray 4.5, workers 6.0, first_step_end"
    )
    assert clock.first_step_done() == {}  # the second step's record holds none
    assert capsys.readouterr().out == ""


def test_the_process_start_is_when_the_process_started():
    """Read from the kernel in a new process: before it ran any Python of its own."""
    launched = time.time()
    out = subprocess.run(
        [sys.executable, "-c", "from engine.startup import process_start_time as p; print(p())"],
        capture_output=True, text=True, check=True, cwd=REPO,
    ).stdout  # fmt: skip
    started = float(out)
    assert launched - 1.0 <= started <= time.time()  # clock ticks are 10 ms
    assert process_start_time() <= time.time()


@pytest.mark.parametrize("enabled", [True, False])
def test_imports_run_with_the_collector_paused_and_leave_it_as_it_was(enabled):
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() == enabled
        with pytest.raises(ImportError), gc_paused():
            import engine.no_such_module  # noqa: F401
        assert gc.isenabled() == enabled
    finally:
        gc.enable() if was else gc.disable()


def test_the_runtime_imports_no_torch_before_ray_starts():
    """Ray's start waits for nothing heavy: torch comes with the data, on its thread."""
    code = "import sys, engine.main, engine.runtime; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    assert out.strip() == "False"


# ----------------------------------------------------------------------------- run_training


@pytest.fixture(scope="module")
def data_files(tmp_path_factory):
    from engine.data.synthetic import write_synthetic_dataset

    return write_synthetic_dataset(tmp_path_factory.mktemp("data"), n_train=64, n_val=8)


def _config(model_dir, train, val, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            f"data.train_files={train}",
            f"data.val_files={val}",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "trainer.device=cpu",
            "trainer.n_gpus_per_node=1",
            *extra,
        ]
    )


class Started(Exception):
    """Raised by the stand-in workers' start: the run got as far as building roles."""


class StandInWorkers:
    """What ``spawn_workers`` returns, recording what it is asked."""

    def __init__(self, seen: dict) -> None:
        self.seen = seen

    def start(self, cfg):
        self.seen["cfg"] = cfg
        raise Started

    def shutdown(self, grace_s: float = 10.0):
        self.seen["shut_down"] = True


def _stand_ins(monkeypatch, *, concurrent: bool):
    """Ray's start and the workers replaced. ``concurrent``: Ray's start waits (up to a
    minute) until the data is being read, and the data's reading until the workers'
    processes are spawned, which both can only be if they run at once."""
    from engine import runtime

    seen: dict = {}
    reading, spawned = threading.Event(), threading.Event()
    read_data = runtime.read_data

    def reading_data(*args):
        seen["data_thread"] = threading.current_thread().name
        reading.set()
        if concurrent:
            seen["spawned_meanwhile"] = spawned.wait(timeout=60)
        return read_data(*args)

    def init_ray(cfg):
        if concurrent:
            seen["overlapped"] = reading.wait(timeout=60)
        seen["ray_thread"] = threading.current_thread().name

    def spawn_workers(cfg):
        seen["spawned_cfg"] = cfg
        spawned.set()
        return StandInWorkers(seen)

    def start_reward(self):
        seen["reward_thread"] = threading.current_thread().name

    monkeypatch.setattr(runtime, "read_data", reading_data)
    monkeypatch.setattr(RewardManager, "start", start_reward)
    monkeypatch.setattr(runtime, "init_ray", init_ray)
    monkeypatch.setattr(runtime, "spawn_workers", spawn_workers)
    return seen


def test_the_data_is_read_while_ray_and_the_workers_start(tiny_model_dir, data_files, monkeypatch):
    from engine.runtime import run_training

    seen = _stand_ins(monkeypatch, concurrent=True)
    clock = StartupClock()
    with pytest.raises(Started):
        run_training(_config(tiny_model_dir, *data_files, "trainer.total_epochs=2"), clock)
    assert seen["overlapped"] and seen["spawned_meanwhile"]
    assert seen["ray_thread"] == threading.main_thread().name != seen["data_thread"]
    assert seen["reward_thread"] == seen["data_thread"]  # its processes started there next
    # the roles are built with the schedule's length the data makes: 64 rows / 8, two
    # epochs (the processes were spawned before it was known)
    assert seen["cfg"].actor_rollout_ref.actor.optim.total_training_steps == 16
    assert seen["spawned_cfg"].actor_rollout_ref.actor.optim.total_training_steps == -1  # unknown
    assert seen["cfg"].trainer.device == seen["spawned_cfg"].trainer.device == "cpu"
    assert {"imports", "data", "ray"} <= set(clock.seconds)
    assert seen["shut_down"]


def test_the_data_read_on_its_thread_is_the_data_read_first(tiny_model_dir, data_files):
    """read_data on a thread of its own (as run_training runs it) and on this one: the
    same tokenizer, rows, batches and step count."""
    from engine.runtime import AgentFiles, read_data

    cfg = _config(tiny_model_dir, *data_files)
    here = read_data(cfg, AgentFiles(), StartupClock())
    result: list = []
    thread = threading.Thread(
        target=lambda: result.append(read_data(cfg, AgentFiles(), StartupClock()))
    )
    thread.start()
    thread.join()
    (there,) = result
    assert there.total_steps == here.total_steps == 8
    assert there.tokenizer.get_vocab() == here.tokenizer.get_vocab()
    assert len(there.train) == len(here.train) and len(there.val) == len(here.val)
    for a, b in zip(there.loader, here.loader, strict=True):
        assert [s.prompt_ids for s in a] == [s.prompt_ids for s in b]


def test_a_data_source_nothing_scores_stops_the_run_before_any_worker(
    tiny_model_dir, data_files, tmp_path, monkeypatch
):
    from engine.runtime import run_training

    train, val = data_files
    unknown = tmp_path / "train.parquet"
    rows = pd.read_parquet(train)
    rows["data_source"] = "no_such_source"
    rows.to_parquet(unknown)
    seen = _stand_ins(monkeypatch, concurrent=False)
    with pytest.raises(RewardError, match="no_such_source"):
        run_training(_config(tiny_model_dir, unknown, val))
    assert "cfg" not in seen and seen["shut_down"]  # no model loaded; the processes ended


def test_a_data_problem_found_on_the_data_thread_is_raised_as_it_was(
    tiny_model_dir, data_files, monkeypatch
):
    """Fewer rows than one batch: the data thread's error, after Ray's start."""
    from engine.runtime import run_training

    seen = _stand_ins(monkeypatch, concurrent=False)
    train, val = data_files
    with pytest.raises(EngineError, match="larger than the dataset"):
        run_training(_config(tiny_model_dir, train, val, "data.train_batch_size=128",
                             "actor_rollout_ref.actor.ppo_mini_batch_size=128"))  # fmt: skip
    assert "cfg" not in seen and "ray_thread" in seen and seen["shut_down"]


def test_a_default_agent_no_file_declares_stops_the_run_before_ray_starts(
    tiny_model_dir, data_files, tmp_path, monkeypatch
):
    """Checked with the agents' files, before Ray's start and the data's reading begin."""
    from engine.runtime import run_training

    (tmp_path / "two_steps.py").write_text(
        "class TwoSteps:\n    def __init__(self, config):\n        pass\n\n"
        "    async def run(self, episode):\n        pass\n"
    )
    loops = tmp_path / "loops.yaml"
    loops.write_text("- name: two_steps\n  _target_: two_steps.py:TwoSteps\n")
    seen = _stand_ins(monkeypatch, concurrent=False)
    key = "actor_rollout_ref.rollout.multi_turn"
    cfg = _config(
        tiny_model_dir, *data_files, f"{key}.enable=true", f"{key}.default_agent=two_step",
        f"{key}.agent_loop_config_path={loops}", "data.max_prompt_length=384",
    )  # fmt: skip
    with pytest.raises(ConfigError, match=f"{key}.default_agent: unknown agent loop 'two_step'"):
        run_training(cfg)
    assert seen == {}  # neither Ray's start nor the data's reading began
