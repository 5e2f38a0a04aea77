"""The trackers, each against its real library: what lands on disk, and reading it back."""

from __future__ import annotations

import io
import json
import math
import struct
import sys
import time
from pathlib import Path

import pytest

from engine.config import TrainerConfig
from engine.errors import EngineError
from engine.tracking import (
    INSTALL_HINT,
    Tracker,
    console_line,
    mlflow_metric_name,
    progress,
    redact,
    stable_run_id,
)

STEP = {
    "critic/score/mean": 0.123456,
    "actor/pg_loss": -0.5,
    "timing_s/step": 12.0,
    "val-core/gsm8k/reward/mean@4": 0.25,
}


def trainer_cfg(*loggers: str) -> TrainerConfig:
    return TrainerConfig(project_name="proj", experiment_name="exp", logger=list(loggers))


def read_jsonl(path: Path) -> list[dict]:
    def no_constants(name: str) -> None:
        raise AssertionError(f"not valid JSON: {name}")

    return [json.loads(line, parse_constant=no_constants) for line in path.read_text().splitlines()]


def log_steps(run_dir: Path, steps: range, resumed_from_step: int = 0, *loggers: str) -> None:
    with Tracker(trainer_cfg(*loggers), run_dir, {}, 10, resumed_from_step) as tracker:
        for step in steps:
            tracker.log(step, {"critic/score/mean": step / 10})


# ---------------------------------------------------------------------------
# console and jsonl


def test_console_line_keeps_the_headline_format():
    line = console_line(3, 40, {**STEP, "response_length/mean": 100.0, "other": 1.0})
    assert line == "step 3/40 | score 0.1235 | pg_loss -0.5 | resp_len 100 | step_s 12"
    assert console_line(0, 40, {}) == "step 0/40"


def test_console_logger_prints_one_line_per_step(tmp_path):
    out = io.StringIO()
    with Tracker(trainer_cfg("console"), tmp_path, {}, 40, stream=out) as tracker:
        tracker.log(1, STEP)
        tracker.log(2, {"critic/score/mean": float("nan")})
    assert out.getvalue().splitlines() == [
        "step 1/40 | score 0.1235 | pg_loss -0.5 | step_s 12",
        "step 2/40 | score nan",
    ]


def test_jsonl_is_always_written_and_readable_while_the_run_is_open(tmp_path):
    out = io.StringIO()
    tracker = Tracker(trainer_cfg(), tmp_path, {}, 40, stream=out)  # no logger named
    tracker.log(0, {"val/score/mean": 0.5})
    assert read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 0, "val/score/mean": 0.5}]
    tracker.log(1, STEP)
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert records[1] == {"step": 1, **STEP}
    assert list(records[1]) == ["step", *sorted(STEP)]
    tracker.close()
    tracker.close()  # twice is fine
    assert out.getvalue() == ""  # console was not asked for


def test_jsonl_named_explicitly_is_written_once(tmp_path):
    log_steps(tmp_path, range(1, 3), 0, "jsonl", "console", "jsonl")
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [1, 2]


def test_jsonl_non_finite_values_are_null_and_scalars_are_numbers(tmp_path):
    import numpy as np  # a numpy scalar and a 0-d tensor both have .item()

    with Tracker(trainer_cfg(), tmp_path, {}, 1) as tracker:
        tracker.log(
            1,
            {
                "a": float("nan"),
                "b": float("inf"),
                "c": -math.inf,
                "d": np.float32(2.5),
                "e": 3,
                "f": True,
            },
        )
    (record,) = read_jsonl(tmp_path / "metrics.jsonl")
    assert record == {"step": 1, "a": None, "b": None, "c": None, "d": 2.5, "e": 3.0, "f": 1.0}


def test_resume_drops_the_steps_after_the_checkpoint(tmp_path):
    log_steps(tmp_path, range(0, 7))
    with (tmp_path / "metrics.jsonl").open("a") as f:
        f.write('{"step": 2, "critic/sco')  # torn by the crash
    with Tracker(trainer_cfg(), tmp_path, {}, 10, resumed_from_step=4) as tracker:
        # Cleaned before the first new step: steps 5 and 6 ran after the checkpoint.
        assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3, 4]
        tracker.log(5, {"critic/score/mean": 0.9})
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert records[-1]["critic/score/mean"] == 0.9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]  # no temp file left


def test_a_fresh_run_starts_an_empty_file(tmp_path):
    log_steps(tmp_path, range(0, 3))
    log_steps(tmp_path, range(0, 2))
    assert [r["step"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [0, 1]


def test_unknown_logger_and_bucket_run_dir_are_refused(tmp_path):
    with pytest.raises(EngineError, match="choose from console, jsonl"):
        Tracker(trainer_cfg("neptune"), tmp_path, {}, 1)
    with pytest.raises(EngineError, match="local directory"):
        Tracker(trainer_cfg(), "s3://bucket/run", {}, 1)


# ---------------------------------------------------------------------------
# optional backends: the error when the package is missing


@pytest.mark.parametrize("logger", ["tensorboard", "wandb", "mlflow"])
def test_missing_package_names_the_extra(tmp_path, monkeypatch, logger):
    monkeypatch.setitem(sys.modules, logger, None)  # makes `import <logger>` fail
    with pytest.raises(EngineError) as info:
        Tracker(trainer_cfg("console", logger), tmp_path, {}, 1)
    message = str(info.value)
    assert f"trainer.logger={logger}" in message
    assert INSTALL_HINT in message


# ---------------------------------------------------------------------------
# tensorboard


def tensorboard_scalars(log_dir: Path, tag: str) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return [(e.step, e.value) for e in events.Scalars(tag)]


def test_tensorboard_writes_scalars_readable_while_open(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'rlctl[trackers]'")
    tracker = Tracker(trainer_cfg("tensorboard"), tmp_path, {}, 3)
    tracker.log(1, STEP)
    tracker.log(2, {"critic/score/mean": float("nan")})
    assert tensorboard_scalars(tmp_path / "tensorboard", "actor/pg_loss") == [(1, -0.5)]
    tracker.close()
    scores = tensorboard_scalars(tmp_path / "tensorboard", "critic/score/mean")
    assert [s for s, _ in scores] == [1, 2]
    assert scores[0][1] == pytest.approx(0.123456)
    assert math.isnan(scores[1][1])


def test_tensorboard_resume_hides_the_steps_after_the_checkpoint(tmp_path):
    pytest.importorskip("tensorboard", reason="pip install 'rlctl[trackers]'")
    log_steps(tmp_path, range(1, 6), 0, "tensorboard")
    with Tracker(trainer_cfg("tensorboard"), tmp_path, {}, 10, 3) as tracker:
        tracker.log(4, {"critic/score/mean": 4.0})
    scores = tensorboard_scalars(tmp_path / "tensorboard", "critic/score/mean")
    assert [(s, round(v, 3)) for s, v in scores] == [(1, 0.1), (2, 0.2), (3, 0.3), (4, 4.0)]


# ---------------------------------------------------------------------------
# wandb (offline)


def wandb_records(path: Path) -> list:
    """The records of a ``.wandb`` transaction log: a 7-byte file header, then
    LevelDB-log style 32 KiB blocks of chunks (crc32, length, type), each record a
    ``wandb_internal_pb2.Record``, split over chunks when it crosses a block."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, header = 32768, 7
    pos, pending, records = 7, b"", []
    while pos + header <= len(data):
        room = block - pos % block
        if room < header:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + header])
        if pos + header + length > len(data):  # still being written
            break
        pending += data[pos + header : pos + header + length]
        pos += header + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def wandb_finished_records(path: Path, timeout: float = 15.0) -> list:
    """The records once the run's ``exit`` record is on disk: wandb's service may still
    be writing the file for a moment after ``finish()`` returns."""
    deadline = time.monotonic() + timeout
    while True:
        records = wandb_records(path) if path.exists() else []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            return records
        assert time.monotonic() < deadline, f"no exit record in {path}"
        time.sleep(0.1)


def wandb_history(records: list) -> list[dict]:
    rows = []
    for record in records:
        if record.WhichOneof("record_type") == "history":
            row = {
                i.key or "/".join(i.nested_key): json.loads(i.value_json)
                for i in record.history.item
            }
            rows.append({k: v for k, v in row.items() if not k.startswith("_") or k == "_step"})
    return rows


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="pip install 'rlctl[trackers]'")
    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_DIR": str(wandb_dir),
        "WANDB_SILENT": "true",
        "WANDB_CONSOLE": "off",
        "WANDB_DISABLE_GIT": "true",
        "WANDB_DISABLE_CODE": "true",
    }.items():
        monkeypatch.setenv(name, value)
    return wandb_dir


def test_wandb_offline_run_holds_the_history(tmp_path, wandb_offline):
    run_dir = tmp_path / "run"
    config = {"trainer": {"project_name": "proj"}, "secrets": {"wandb_api_key": "hunter2"}}
    with Tracker(trainer_cfg("wandb"), run_dir, config, 2) as tracker:
        tracker.log(1, STEP)
        tracker.log(2, {"critic/score/mean": float("nan")})
    run_id = stable_run_id(run_dir, "exp")
    (offline,) = (wandb_offline / "wandb").glob(f"offline-run-*-{run_id}")
    records = wandb_finished_records(offline / f"run-{run_id}.wandb")
    history = wandb_history(records)
    assert history[0] == {"_step": 1, **STEP}
    assert history[1]["_step"] == 2 and math.isnan(history[1]["critic/score/mean"])
    runs = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert runs[0].project == "proj" and runs[0].display_name == "exp"
    config_text = str(runs[0].config)
    assert "project_name" in config_text and "hunter2" not in config_text

    # A restart logs into the same run id (W&B joins the two when synced). Its offline
    # folder is named by the start time, to the second: start it in the next second.
    time.sleep(1.05 - time.time() % 1)
    with Tracker(trainer_cfg("wandb"), run_dir, config, 3, resumed_from_step=2) as tracker:
        tracker.log(3, {"critic/score/mean": 0.75})
    offline_dirs = sorted((wandb_offline / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(offline_dirs) == 2  # one per start (their names differ by the start time)
    (resumed,) = set(offline_dirs) - {offline}
    records = wandb_finished_records(resumed / f"run-{run_id}.wandb")
    assert wandb_history(records) == [{"_step": 3, "critic/score/mean": 0.75}]


# ---------------------------------------------------------------------------
# mlflow (a local file store)


@pytest.fixture
def mlflow_env(monkeypatch):
    pytest.importorskip("mlflow", reason="pip install 'rlctl[trackers]'")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # The tracker sets MLFLOW_ALLOW_FILE_STORE itself; setenv first so that monkeypatch
    # restores the variable's original state (absent, usually) after the test.
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "false")
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE")
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")  # no network here


def mlflow_runs(store: Path) -> list:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    experiment = client.get_experiment_by_name("proj")
    return client, client.search_runs([experiment.experiment_id])


def test_mlflow_logs_to_a_file_store_and_resumes_the_same_run(tmp_path, mlflow_env):
    config = {"trainer": {"project_name": "proj", "total_epochs": 1}}
    with Tracker(trainer_cfg("mlflow"), tmp_path, config, 4) as tracker:
        tracker.log(1, STEP)
        tracker.log(2, {"critic/score/mean": float("nan")})
    with Tracker(trainer_cfg("mlflow"), tmp_path, config, 4, resumed_from_step=2) as tracker:
        tracker.log(3, {"critic/score/mean": 0.75})

    client, runs = mlflow_runs(tmp_path / "mlruns")
    (run,) = runs  # the restart reattached to the first run
    assert run.info.run_name == "exp" and run.info.status == "FINISHED"
    assert run.data.tags["rlctl.run_id"] == stable_run_id(tmp_path, "exp")
    assert run.data.params["trainer.total_epochs"] == "1"
    history = client.get_metric_history(run.info.run_id, "critic/score/mean")
    values = {m.step: m.value for m in history}
    assert sorted(values) == [1, 2, 3]
    assert values[1] == pytest.approx(0.123456) and math.isnan(values[2]) and values[3] == 0.75
    at = client.get_metric_history(run.info.run_id, "val-core/gsm8k/reward/mean_at_4")
    assert [(m.step, m.value) for m in at] == [(1, 0.25)]


def test_mlflow_honours_the_tracking_uri_and_marks_a_failed_run(tmp_path, mlflow_env, monkeypatch):
    store = tmp_path / "elsewhere"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.resolve().as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    with (
        pytest.raises(RuntimeError),
        Tracker(trainer_cfg("mlflow"), tmp_path / "run", {}, 1) as tracker,
    ):
        tracker.log(1, {"x": 1.0})
        raise RuntimeError("the step failed")
    assert not (tmp_path / "run" / "mlruns").exists()
    _, (run,) = mlflow_runs(store)
    assert run.info.status == "FAILED"


def test_mlflow_metric_names_are_sanitised():
    assert mlflow_metric_name("val-core/gsm8k/reward/mean@4") == "val-core/gsm8k/reward/mean_at_4"
    assert mlflow_metric_name("timing_s/gen") == "timing_s/gen"
    assert mlflow_metric_name("a(b)+c") == "a_b__c"
    assert mlflow_metric_name("/a//./b/../c/") == "a/b/__/c"
    assert mlflow_metric_name("") == "_"


# ---------------------------------------------------------------------------
# helpers


def test_stable_run_id_follows_the_run_dir(tmp_path):
    first = stable_run_id(tmp_path / "a", "GRPO qwen/7b")
    assert first == stable_run_id(tmp_path / "a", "GRPO qwen/7b")
    assert first != stable_run_id(tmp_path / "b", "GRPO qwen/7b")
    assert first.startswith("GRPO-qwen-7b-")
    assert all(c.isalnum() or c in "-_" for c in first)


def test_redact_hides_secret_looking_keys():
    config = {"a": {"api_key": "k", "hf_token": "t", "max_num_batched_tokens": 8}, "b": [1]}
    assert redact(config) == {
        "a": {"api_key": "<redacted>", "hf_token": "<redacted>", "max_num_batched_tokens": 8},
        "b": [1],
    }


# ---------------------------------------------------------------------------
# progress


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_is_a_no_op_off_a_terminal(monkeypatch):
    monkeypatch.delenv("RLCTL_NO_PROGRESS", raising=False)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with progress(3, "validation") as bar:
        bar.update(3)
        assert not bar.drawn
    assert sys.stderr.getvalue() == ""


def test_progress_draws_on_a_terminal_unless_disabled(monkeypatch):
    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.delenv("RLCTL_NO_PROGRESS", raising=False)
    with progress(3, "validation") as bar:
        assert bar.drawn
        bar.update(2)
        bar.update()
    drawn = terminal.getvalue()
    assert "validation:" in drawn and "0/3" in drawn
    assert drawn.endswith("\r")  # the bar is cleared when done: step lines stay clean

    monkeypatch.setenv("RLCTL_NO_PROGRESS", "1")
    with progress(3, "scoring") as bar:
        bar.update(3)
        assert not bar.drawn
    assert "scoring" not in terminal.getvalue()


def test_validation_samples_go_to_the_loggers_that_show_them(tmp_path):
    # trainer.log_val_generations: lines beside the metrics, and on the console
    from engine.loop.generations import pick_samples

    rows = [{"input": f"q{i}", "output": f"a{i}", "score": float(i)} for i in range(10)]
    picked = pick_samples(rows, 3, seed=1)
    assert len(picked) == 3 and pick_samples(list(reversed(rows)), 3, seed=1) == picked
    out = io.StringIO()
    with Tracker(trainer_cfg("console"), tmp_path, {}, 4, stream=out) as tracker:
        tracker.log_samples(2, picked)
        tracker.log_samples(4, picked)
    lines = read_jsonl(tmp_path / "val_generations.jsonl")
    assert [line["step"] for line in lines] == [2, 2, 2, 4, 4, 4]
    assert lines[0] == {"step": 2, **picked[0]}
    printed = out.getvalue().splitlines()
    assert printed[0].startswith("val sample, step 2: [0] ")
    assert f"{picked[0]['input']!r} -> {picked[0]['output']!r}" in printed[0]
    # a resumed run keeps the samples of the steps it keeps
    with Tracker(trainer_cfg(), tmp_path, {}, 4, resumed_from_step=2):
        pass
    assert [line["step"] for line in read_jsonl(tmp_path / "val_generations.jsonl")] == [2] * 3
