"""A recipe with ``algorithm: sft``: its engine keys are engine.sft's, the job runs
``python -m engine.sft``, and the plan sizes the training alone (rlctl/planner/sft.py)."""

import pytest
import yaml

from rlctl import api
from rlctl.recipe.load import RecipeError, parse_recipe

SFT = {
    "name": "sft-test",
    "algorithm": "sft",
    "model": "Qwen/Qwen2.5-7B-Instruct",
    "data": {"prepare": "gsm8k_sft"},
    "hardware": {"accelerators": "H100:8", "nodes": 1},
    "trainer": "fsdp2",
}


def prepared(**changes):
    return api.prepare(parse_recipe({**SFT, **changes}), backend="local", job_id="job")


def test_the_job_runs_engine_sft_with_its_own_keys():
    p = prepared(lora={"rank": 16}, engine={"optim.lr": 1e-5, "data.max_length": 2048})
    assert p.spec.engine_command[:3] == ("python", "-m", "engine.sft")
    # under the supervisor, which runs engine.sft (SFT has no restarts of its own)
    assert "-m engine.supervisor --max-restarts 0" in p.files["run.sh"]
    assert "--module engine.sft -- --config" in p.files["run.sh"]
    from engine.schema import SFT as SCHEMA
    from engine.schema import load

    cfg = load(base=yaml.safe_load(p.spec.engine_yaml), schema=SCHEMA).config
    assert cfg.model.path == "Qwen/Qwen2.5-7B-Instruct" and cfg.model.lora_rank == 16
    assert cfg.optim.lr == 1e-5 and cfg.data.max_length == 2048
    assert cfg.trainer.n_gpus_per_node == 8 and cfg.engine.strategy == "fsdp2"
    assert cfg.data.train_files[0].endswith("/data/train.parquet")


def test_seven_billion_fits_one_node_without_offload():
    plan = prepared().plan
    assert (plan.nodes, plan.devices_per_node, plan.accelerator) == (1, 8, "H100")
    assert not plan.param_offload and not plan.optimizer_offload
    assert plan.memory.train_peak_gib < plan.memory.budget_gib
    # 7.6B in fp32 over 8 devices: weights 3.5, gradients 3.5, AdamW 7.1 GiB each
    assert plan.memory.train_optimizer_gib == pytest.approx(7.09, abs=0.05)


def test_seventy_billion_on_one_node_offloads():
    plan = prepared(model="Qwen/Qwen2.5-72B-Instruct").plan
    assert plan.nodes == 1 and plan.param_offload
    assert plan.engine_overrides()["engine.param_offload"] is True


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"rollout": "vllm"}, "rollout: algorithm: sft generates nothing"),
        ({"reward": {"custom": {"path": "r.py"}}}, "reward: algorithm: sft"),
        ({"data": {"prepare": "gsm8k"}}, "unknown preparation 'gsm8k' for this algorithm"),
        ({"engine": {"actor_rollout_ref.actor.optim.lr": 1e-5}}, "unknown engine key"),
        ({"engine": {"optim.lr": "fast"}}, "engine.optim.lr"),
    ],
)
def test_what_an_sft_run_has_no_use_for_is_refused(changes, expected):
    with pytest.raises(RecipeError, match=expected):
        parse_recipe({**SFT, **changes})
