"""How a run ended and whether a restart may cure it (engine.exits): the engine's own
errors name their reason, Ray's word for a dead process is a dead worker, a code without a
record is read by the code, and the record on disk is whole or absent."""

from __future__ import annotations

import json

import pytest

from engine.controller.worker_group import WorkerFailure
from engine.errors import ConfigError, EngineError
from engine.exits import (
    EXIT_RECORD_ENV,
    ExitRecord,
    by_code,
    classify,
    exit_recorded,
    exit_words,
    read_exit_record,
    record_of,
    write_json_atomically,
)
from engine.loop.trainer import Preempted, UpdatesDiverged
from engine.watchdog import Hung


class RayActorError(Exception):
    """Stands for ray.exceptions.RayActorError: matched by name, not imported."""


class ActorDiedError(RayActorError):
    pass


def died_in_ray() -> Exception:
    try:
        try:
            raise ActorDiedError("the actor died unexpectedly")
        except ActorDiedError as exc:
            raise RuntimeError("waiting on the rollout") from exc
    except RuntimeError as exc:
        return exc


@pytest.mark.parametrize(
    ("exc", "code", "reason", "retry"),
    [
        (Preempted(4), 75, "preempted", True),
        (Hung("the run hung at step 3"), 76, "hung", True),
        (WorkerFailure(1, "its process died (ActorDiedError)", died=True), 1, "worker_died", True),
        (WorkerFailure(1, "ValueError: bad shape"), 1, "worker_error", False),
        (ConfigError(["data.train_batch_size: must be positive"]), 2, "config", False),
        (EngineError("no training steps"), 2, "config", False),
        (UpdatesDiverged("5 actor updates in a row had a NaN/inf loss"), 2, "nan_updates", False),
        (ValueError("a bug"), 1, "error", False),
        (died_in_ray(), 1, "worker_died", True),
        (SystemExit(2), 2, "config", False),
        (KeyboardInterrupt(), 130, "interrupted", False),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_each_ending_has_its_reason_and_retry(exc, code, reason, retry):
    record = record_of(exc)
    assert (record.exit_code, record.reason, record.retry) == (code, reason, retry)


def test_the_message_says_what_happened():
    assert record_of(ValueError("a bug")).message == "ValueError: a bug"
    assert "worker rank 1 failed" in record_of(WorkerFailure(1, "x", died=True)).message
    assert len(record_of(ValueError("x" * 5000)).message) <= 600


@pytest.mark.parametrize(
    ("code", "reason", "message"),
    [
        (0, "finished", ""),
        (2, "config", ""),
        (75, "preempted", ""),
        (76, "hung", ""),
        (1, "error", ""),
        (137, "killed", "SIGKILL: out of memory, or killed by hand"),
        (-9, "killed", "SIGKILL: out of memory, or killed by hand"),
        (143, "killed", "SIGTERM"),
        (130, "interrupted", "SIGINT"),
        (3, "error", "exit code 3"),
    ],
)
def test_a_code_without_a_record(code, reason, message):
    assert by_code(code) == ExitRecord(code, reason, message)


def test_exit_codes_in_words():
    assert exit_words(76) == "hung: see the log for every worker's stacks"
    assert exit_words(75).startswith("preempted")
    assert exit_words(2).startswith("configuration or usage error")
    assert "a worker died or raised" in exit_words(1)
    assert (
        exit_words(137)
        == "killed by a signal it could not handle (SIGKILL: out of memory, or killed by hand)"
    )
    assert exit_words(0) == "finished"
    assert exit_words(3) == "failed"
    assert exit_words(None) == "no exit code"


def test_a_record_counts_only_for_its_own_code():
    died = ExitRecord(1, "worker_died", "worker rank 1 failed")
    assert classify(1, died) is died
    assert classify(137, died).reason == "killed"  # killed after writing it
    assert classify(1, None).reason == "error"
    assert classify(1, ExitRecord(1, "no-such-reason")).reason == "error"


def test_the_engines_command_writes_its_record(tmp_path, monkeypatch):
    path = tmp_path / "exit_reason.json"
    monkeypatch.setenv(EXIT_RECORD_ENV, str(path))
    with pytest.raises(Hung), exit_recorded():
        raise Hung("the run hung at step 3: rollout.generate ran 16 s")
    record = read_exit_record(path)
    assert record is not None and (record.exit_code, record.reason) == (76, "hung")
    assert record.message.startswith("the run hung at step 3")
    with exit_recorded():
        pass
    assert read_exit_record(path) == ExitRecord(0, "finished")


def test_no_record_without_the_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(EXIT_RECORD_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError), exit_recorded():
        raise ValueError("x")
    assert list(tmp_path.iterdir()) == []


def test_a_record_is_written_whole_or_not_at_all(tmp_path):
    path = tmp_path / "restarts.json"
    write_json_atomically(path, {"attempts": [1]})
    with pytest.raises(TypeError):
        write_json_atomically(path, {"attempts": [object()]})  # fails halfway through
    assert json.loads(path.read_text()) == {"attempts": [1]}
    assert [p.name for p in tmp_path.iterdir()] == ["restarts.json"]  # no temp file left


@pytest.mark.parametrize("text", ["", "{", '{"exit_code": "x"}', "[]", '{"reason": "hung"}'])
def test_an_unreadable_record_is_none(tmp_path, text):
    path = tmp_path / "exit_reason.json"
    path.write_text(text)
    assert read_exit_record(path) is None
    assert read_exit_record(tmp_path / "missing.json") is None
