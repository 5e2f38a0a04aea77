"""The launcher API around the job store: what a crash or a failed submission leaves."""

import pytest

from rlctl import api
from rlctl.errors import RlctlError
from rlctl.store.jobs import SUBMISSION_INCOMPLETE, JobState, JobStore


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


MEGATRON_RECIPE = """\
name: megatron-sizes
algorithm: grpo
model: {model}
data:
  train: [/data/train.parquet]
hardware:
  accelerators: H100:8
  nodes: 1
trainer: megatron
engine:
  actor_rollout_ref.actor.megatron.tensor_model_parallel_size: {tp}
  actor_rollout_ref.ref.megatron.tensor_model_parallel_size: {tp}
"""


def test_megatron_sizes_the_model_cannot_take_are_refused_before_anything_runs(store, tmp_path):
    """What the Megatron engine would refuse once the cluster is up (here: TP 2 for a
    local checkpoint with 3 key/value heads) is refused by validate and launch, from the
    model's config.json, naming the key and the value; nothing is recorded."""
    import json

    model = tmp_path / "model"
    model.mkdir()
    config = dict(
        model_type="qwen2", vocab_size=1024, hidden_size=384, intermediate_size=1024,
        num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=3,
    )  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    recipe = tmp_path / "tp2.yaml"
    recipe.write_text(MEGATRON_RECIPE.format(model=model, tp=2))
    for attempt in (api.validate, lambda ref: api.launch(ref, store=store)):
        with pytest.raises(RlctlError) as err:
            attempt(str(recipe))
        message = str(err.value)
        assert (
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2 must divide the"
            " model's num_key_value_heads 3" in message
        )
        assert "actor_rollout_ref.ref.megatron.tensor_model_parallel_size 2" in message
    assert store.list() == []
    # A model the engine cannot convert at all, and sizes that fit.
    (model / "config.json").write_text(json.dumps({**config, "model_type": "phi3"}))
    recipe.write_text(MEGATRON_RECIPE.format(model=model, tp=1))
    with pytest.raises(RlctlError, match="no Megatron-core conversion for model_type 'phi3'"):
        api.validate(str(recipe))
    recipe.write_text(MEGATRON_RECIPE.format(model="Qwen/Qwen2.5-7B", tp=2))
    api.validate(str(recipe))


QUANTIZED_RECIPE = """\
name: quantized
algorithm: {algorithm}
model: {model}
data: {{train: train.parquet}}
hardware: {{accelerators: "H100:1"}}
rollout: hf
{lora}
"""


def test_a_quantized_checkpoint_trained_in_full_is_refused_before_anything_runs(store, tmp_path):
    """A local checkpoint whose config.json declares a quantization_config is not trained
    as if it were full precision: validate and launch refuse it, naming the key and the
    two fixes; an adapter over it (LoRA) is accepted; nothing is recorded."""
    import json

    model = tmp_path / "model"
    model.mkdir()
    config = dict(
        model_type="qwen2", vocab_size=1024, hidden_size=256, intermediate_size=512,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        quantization_config={"quant_method": "gptq", "bits": 4},
    )  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    recipe = tmp_path / "q.yaml"
    recipe.write_text(QUANTIZED_RECIPE.format(algorithm="grpo", model=model, lora=""))
    for attempt in (api.validate, lambda ref: api.launch(ref, store=store)):
        with pytest.raises(RlctlError) as err:
            attempt(str(recipe))
        message = str(err.value)
        assert f"actor_rollout_ref.model.path='{model}' is a gptq checkpoint" in message
        assert "set actor_rollout_ref.model.lora_rank" in message
        assert "at the full-precision model" in message
    assert store.list() == []
    recipe.write_text(
        QUANTIZED_RECIPE.format(algorithm="grpo", model=model, lora="lora: {rank: 32, alpha: 64}")
    )
    api.validate(str(recipe))  # an adapter over the frozen quantized base
    # PPO's critic trains every weight of the same checkpoint, LoRA or not
    recipe.write_text(
        QUANTIZED_RECIPE.format(algorithm="ppo", model=model, lora="lora: {rank: 32, alpha: 64}")
    )
    with pytest.raises(RlctlError, match="the critic trains every weight"):
        api.validate(str(recipe))
