"""progress.json beside checkpoints kept apart from the run folder: what the tracker
writes there for `rlctl status`, kept across a resume, and never a reason to stop."""

from __future__ import annotations

import json
import math
from pathlib import Path

from engine.config import TrainerConfig
from engine.progress_file import KEPT, PROGRESS_FILE, mirror_folder
from engine.tracking import Tracker


def cfg(checkpoints: str, run_dir: str | None = None) -> TrainerConfig:
    return TrainerConfig(
        project_name="p", experiment_name="e", default_local_dir=checkpoints, run_dir=run_dir
    )


def step_metrics(step: int) -> dict:
    return {
        "critic/score/mean": step / 10,
        "timing_s/step": 2.0,
        "memory/peak_gib/actor.update": 1.5,
        "memory/limit_gib": 8.0,
        "actor/pg_loss": -0.5,  # not a headline: stays in metrics.jsonl only
    }


def run(trainer: TrainerConfig, run_dir: Path, steps: range, total: int, resumed: int = 0):
    with Tracker(trainer, run_dir, {}, total, resumed) as tracker:
        for step in steps:
            tracker.log(step, step_metrics(step))


def read(folder: Path) -> dict:
    return json.loads((folder / PROGRESS_FILE).read_text())


def test_the_mirror_goes_beside_checkpoints_only_when_they_are_apart(tmp_path):
    assert mirror_folder(cfg(str(tmp_path / "c"))) is None  # the run folder holds them
    assert mirror_folder(cfg(str(tmp_path / "c"), str(tmp_path / "c"))) is None
    assert mirror_folder(cfg(str(tmp_path / "c"), str(tmp_path / "r"))) == str(tmp_path / "c")
    assert mirror_folder(cfg("s3://b/runs/a")) == "s3://b/runs/a"
    assert mirror_folder(cfg("gs://b/x", str(tmp_path / "r"))) == "gs://b/x"


def test_each_step_rewrites_the_headline_of_the_last_steps(tmp_path):
    checkpoints, run_dir = tmp_path / "bucket", tmp_path / "run"
    run(cfg(str(checkpoints), str(run_dir)), run_dir, range(1, 4), total=10)
    got = read(checkpoints)
    assert got["total_steps"] == 10
    assert got["steps"][-1] == {
        "step": 3,
        "critic/score/mean": 0.3,
        "timing_s/step": 2.0,
        "memory/peak_gib/actor.update": 1.5,
        "memory/limit_gib": 8.0,
    }
    assert [s["step"] for s in got["steps"]] == [1, 2, 3]
    assert (run_dir / "metrics.jsonl").is_file()  # the full record stays in the run folder
    assert not (checkpoints / "metrics.jsonl").exists()

    run(cfg(str(checkpoints), str(run_dir)), run_dir, range(1, KEPT + 6), total=KEPT + 5)
    steps = [s["step"] for s in read(checkpoints)["steps"]]
    assert steps == list(range(6, KEPT + 6))  # the last KEPT, oldest first


def test_not_a_number_is_null_and_other_values_are_left_out(tmp_path):
    checkpoints, run_dir = tmp_path / "bucket", tmp_path / "run"
    with Tracker(cfg(str(checkpoints), str(run_dir)), run_dir, {}, 2) as tracker:
        tracker.log(1, {"critic/score/mean": math.nan, "timing_s/step": True, "memory/x": "a"})
    text = (checkpoints / PROGRESS_FILE).read_text()
    assert json.loads(text)["steps"] == [{"step": 1, "critic/score/mean": None}]
    assert "NaN" not in text


def test_a_resumed_run_keeps_the_steps_up_to_its_checkpoint(tmp_path):
    """A recovery on a new cluster starts with an empty run folder: the curve before the
    checkpoint comes from the file itself; the steps after it ran again."""
    checkpoints = tmp_path / "bucket"
    run(cfg(str(checkpoints), str(tmp_path / "run1")), tmp_path / "run1", range(1, 6), total=8)
    run(cfg(str(checkpoints), str(tmp_path / "run2")), tmp_path / "run2", range(4, 9), 8, 3)
    assert [s["step"] for s in read(checkpoints)["steps"]] == list(range(1, 9))
    # a fresh run (no checkpoint) starts the view anew
    run(cfg(str(checkpoints), str(tmp_path / "run3")), tmp_path / "run3", range(1, 3), total=8)
    assert [s["step"] for s in read(checkpoints)["steps"]] == [1, 2]


def test_a_write_that_fails_is_said_once_and_training_goes_on(tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    run_dir = tmp_path / "run"
    run(cfg(str(blocker / "sub"), str(run_dir)), run_dir, range(1, 4), total=3)
    err = capsys.readouterr().err
    assert err.count(f"warning: {PROGRESS_FILE} not written to {blocker / 'sub'}") == 1
    assert "training goes on" in err
    assert len((run_dir / "metrics.jsonl").read_text().splitlines()) == 3
