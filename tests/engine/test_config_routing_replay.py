"""MoE routing replay's keys (engine.config.routing_replay): verl's spellings of the mode
read as one, what each pass does with the routing, and the combinations refused with
the key and the fix."""

import pytest

from engine.config import load_config
from engine.config.routing_replay import NATIVE, RECORD, REPLAY, model_problems
from tests.engine.test_config import GRPO, one_problem, problems

MODE = "actor_rollout_ref.actor.router_replay.mode"
RECORDING = "actor_rollout_ref.rollout.enable_rollout_routing_replay"
R3 = [f"{MODE}=R3", f"{RECORDING}=true"]


@pytest.mark.parametrize(
    "key",
    [MODE, "actor_rollout_ref.actor.megatron.router_replay.mode",
     "actor_rollout_ref.actor.veomni.router_replay.mode"],
)  # fmt: skip
def test_each_of_verls_spellings_sets_the_actors_mode(key):
    r2 = load_config([*GRPO, f"{key}=R2"]).routing_replay
    assert (r2.old_pass, r2.update, r2.rollout_records) == (RECORD, REPLAY, False)
    r3 = load_config([*GRPO, f"{key}=R3", f"{RECORDING}=true"]).routing_replay
    assert (r3.old_pass, r3.update, r3.rollout_records) == (REPLAY, REPLAY, True)
    off = load_config(GRPO).routing_replay
    assert (off.on, off.old_pass, off.update) == (False, NATIVE, NATIVE)


def test_r2_records_in_a_pi_old_pass_of_its_own():
    """On-policy the update's own log-probs are π_old (no pass); R2 records in that pass."""
    on_policy = [*GRPO, "actor_rollout_ref.actor.ppo_mini_batch_size=8"]
    assert load_config(on_policy).update_is_on_policy
    assert not load_config([*on_policy, f"{MODE}=R2"]).update_is_on_policy


def test_wrong_combinations_name_the_key_and_the_fix():
    p = one_problem([*GRPO, f"{MODE}=R3"])
    assert p.startswith(f"{MODE}=R3 ") and f"set {RECORDING}=true" in p
    p = one_problem([*GRPO, f"{MODE}=R2", f"{RECORDING}=true"])
    assert p.startswith(f"{RECORDING}=true") and f"set {MODE}=R3, or {RECORDING}=false" in p
    assert f"{RECORDING}=true" in one_problem([*GRPO, f"{RECORDING}=true"])
    assert "unknown router replay mode 'R4'" in one_problem([*GRPO, f"{MODE}=R4"])
    bypass = [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    ]
    p = one_problem([*GRPO, f"{MODE}=R2", *bypass])
    assert "bypass_mode" in p and "use mode R3" in p
    # verl's two spellings of one mode, disagreeing
    found = problems(
        [*GRPO, f"{MODE}=R2", "actor_rollout_ref.actor.megatron.router_replay.mode=R3"]
    )
    assert "give one of them" in found[0]


@pytest.mark.parametrize(
    "extra,words",
    [
        (["actor_rollout_ref.rollout.name=sglang"], "SGLang's routed-experts output"),
        (["actor_rollout_ref.rollout.name=vllm", "trainer.device=cpu"], "rollout.name=hf on CPU"),
        (
            [
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.enable_prefix_caching=false",
            ],
            "enable_prefix_caching=true",
        ),
        (["actor_rollout_ref.rollout.multi_turn.enable=true"], "single-turn generation only"),
    ],
)
def test_r3_where_the_rollout_records_nothing_is_refused(extra, words):
    assert any(
        p.startswith(f"{MODE}=R3 with") and words in p for p in problems([*GRPO, *R3, *extra])
    )


@pytest.mark.parametrize(
    "key", ["actor_rollout_ref.ref.megatron.router_replay.mode", "critic.veomni.router_replay.mode"]
)
def test_the_reference_and_the_critic_route_freely(key):
    p = one_problem([*GRPO, f"{key}=R2"])
    assert p.startswith(f"{key}=R2: the reference and the critic route freely") and MODE in p


def test_replay_of_a_dense_model_is_refused():
    cfg = load_config([*GRPO, f"{MODE}=R2"])
    dense = {"model_type": "qwen2", "num_attention_heads": 4}
    (p,) = model_problems(cfg, lambda model: dense)
    assert p.startswith(
        f"{MODE}=R2 replays mixture-of-experts routing, but /models/tiny is a dense"
    )
    assert p.endswith(f"set {MODE}=disabled")
    assert model_problems(cfg, lambda model: {**dense, "num_experts": 8}) == []
    assert model_problems(cfg, lambda model: {"n_routed_experts": 256}) == []
    assert model_problems(load_config(GRPO), lambda model: dense) == []
    # the same through the launcher's recipe check, from its table of models
    from rlctl.job.spec import model_problems as launcher_problems

    for model, dense in (("Qwen/Qwen2.5-7B", True), ("Qwen/Qwen3-30B-A3B", False)):
        cfg = load_config([*GRPO, f"{MODE}=R2", f"actor_rollout_ref.model.path={model}"])
        assert any(MODE in p for p in launcher_problems(cfg, model)) == dense
