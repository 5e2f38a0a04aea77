"""The token budget of a packed micro-batch (``EngineConfig.token_budget``):
``*_max_token_len_per_gpu`` counts tokens per device, and the ranks that split each
sequence (a Ulysses group under FSDP, the CP group under Megatron) hold one micro-batch
together, so the budget is the key × that group's size, under both backends (verl's
``prepare_micro_batches``: ``max_token_len_per_gpu * sp_size``, with ``sp_size`` the
Ulysses size or ``context_parallel_size``)."""

import pytest

from engine.config import load_config
from engine.errors import ConfigError

BASE = [
    "actor_rollout_ref.model.path=/models/tiny",
    "data.train_files=train.parquet",
    "trainer.n_gpus_per_node=8",
    "data.train_batch_size=8",
    "data.max_prompt_length=1000",
    "data.max_response_length=2000",  # 3000 tokens at most per sequence
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
    "critic.ppo_micro_batch_size_per_gpu=1",
    "actor_rollout_ref.model.use_remove_padding=true",
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000",
    "critic.use_dynamic_bsz=true",
    "critic.ppo_max_token_len_per_gpu=1500",
]
ARR = "actor_rollout_ref"


def budgets(cfg):
    roles = ("actor", "actor_log_prob", "ref_log_prob", "critic")
    return {role: cfg.token_budget(role) for role in roles}


def test_ulysses_multiplies_each_roles_budget_by_its_sp_size():
    cfg = load_config(
        [
            *BASE,
            f"{ARR}.actor.ulysses_sequence_parallel_size=4",
            f"{ARR}.ref.ulysses_sequence_parallel_size=8",
            f"{ARR}.ref.log_prob_max_token_len_per_gpu=500",
            "critic.ulysses_sequence_parallel_size=2",
        ]
    )
    # actor 1000 × 4; its log-prob pass inherits 1000, × 4; the reference 500 × 8;
    # the critic 1500 × 2
    assert budgets(cfg) == {
        "actor": 4000,
        "actor_log_prob": 4000,
        "ref_log_prob": 4000,
        "critic": 3000,
    }


def test_megatron_multiplies_each_roles_budget_by_its_cp_size():
    cfg = load_config(
        [
            *BASE,
            f"{ARR}.actor.strategy=megatron",
            "critic.strategy=megatron",
            f"{ARR}.actor.megatron.context_parallel_size=4",
            f"{ARR}.ref.megatron.context_parallel_size=4",  # one layout for all roles
            f"{ARR}.ref.log_prob_max_token_len_per_gpu=800",
            "critic.megatron.context_parallel_size=4",
            # Ulysses keys are FSDP's: under Megatron they split nothing
            f"{ARR}.actor.ulysses_sequence_parallel_size=1",
        ]
    )
    # actor 1000 × CP 4 (it used to be 1000: the key then counted a CP group's tokens);
    # the reference 800 × CP 4; the critic 1500 × CP 4
    assert budgets(cfg) == {
        "actor": 4000,
        "actor_log_prob": 4000,
        "ref_log_prob": 3200,
        "critic": 6000,
    }
    assert cfg.sequence_split("actor") == 4 and cfg.ulysses_size("actor") == 1


def test_one_sequence_must_fit_the_group_not_one_device():
    """The 3000-token sequence fits 750 per device at CP 4 (750 × 4 = 3000); 749 is
    refused, naming the key's value, the product, and the smallest key that fits."""
    megatron = [
        *BASE,
        f"{ARR}.actor.strategy=megatron",
        f"{ARR}.actor.megatron.context_parallel_size=4",
        f"{ARR}.ref.megatron.context_parallel_size=4",
        "critic.ulysses_sequence_parallel_size=2",
    ]
    load_config([*megatron, f"{ARR}.actor.ppo_max_token_len_per_gpu=750"])
    with pytest.raises(ConfigError) as info:
        load_config([*megatron, f"{ARR}.actor.ppo_max_token_len_per_gpu=749"])
    (problem,) = info.value.problems
    assert problem == (
        f"{ARR}.actor.ppo_max_token_len_per_gpu is 749 × 4 ranks splitting each sequence"
        " = 2996: less than one sequence of data.max_prompt_length +"
        " data.max_response_length = 3000 tokens; raise it to at least 750"
    )
    # the critic: 1500 × SP 2 = 3000 fits; 1499 does not
    with pytest.raises(ConfigError) as info:
        load_config([*megatron, "critic.ppo_max_token_len_per_gpu=1499"])
    (problem,) = info.value.problems
    assert problem.startswith("critic.ppo_max_token_len_per_gpu is 1499 × 2 ranks")
    assert problem.endswith("raise it to at least 1500")
