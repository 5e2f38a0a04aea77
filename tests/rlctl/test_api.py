"""The launcher API around the job store: what a crash or a failed submission leaves."""

import pytest

from rlctl import api
from rlctl.errors import RlctlError
from rlctl.jobs import SUBMISSION_INCOMPLETE, JobState, JobStore


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_HOME", str(tmp_path))
    return JobStore(tmp_path / "jobs.db")


def test_a_launch_that_died_before_submitting_is_visible_then_failed(store, monkeypatch):
    # What the CLI leaves if it dies between recording the job and submitting it.
    job = store.create(
        name="demo", recipe_path="r.yaml", recipe_yaml="", plan_json="{}", backend="local"
    )
    assert [j.state for j in api.status(store=store)] == [JobState.PENDING]  # visible
    monkeypatch.setattr(api, "STALE_SUBMISSION_S", 0.0)
    (refreshed,) = api.status(job.id, store=store)
    assert refreshed.state is JobState.FAILED
    assert refreshed.reason == SUBMISSION_INCOMPLETE


def test_a_rejected_submission_is_recorded_as_failed_with_the_reason(store, monkeypatch):
    from rlctl.backends.local import LocalBackend

    def reject(self, job, spec, secrets):
        raise RlctlError("sbatch: error: invalid partition specified: nope")

    monkeypatch.setattr(LocalBackend, "submit", reject)
    with pytest.raises(RlctlError, match="invalid partition"):
        api.launch("quickstart", store=store)
    (job,) = store.list()
    assert job.state is JobState.FAILED
    assert "invalid partition" in job.reason


def test_a_bad_recipe_records_nothing(store, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nalgorithm: grpo\nmodel: m\n")  # no data
    with pytest.raises(RlctlError, match="data: required"):
        api.launch(str(bad), store=store)
    assert store.list() == []


def test_stop_of_a_finished_job_changes_nothing(store):
    job = store.create(
        name="demo", recipe_path="r.yaml", recipe_yaml="", plan_json="{}", backend="local"
    )
    store.transition(job.id, JobState.SUCCEEDED, exit_code=0)
    assert api.stop(job.id, store=store).state is JobState.SUCCEEDED
