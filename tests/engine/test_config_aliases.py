"""verl's newer spellings of the Ulysses size (``engine.config.aliases``): each sets the
schema's key, from an override, a YAML file or a base mapping; two spellings of one key
with different values are refused naming both."""

import pytest

from engine.config import key_problems, load_config
from engine.config.aliases import ALIASES
from engine.errors import ConfigError

REQUIRED = [
    "actor_rollout_ref.model.path=/models/tiny",
    "data.train_files=train.parquet",
    "trainer.n_gpus_per_node=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.model.use_remove_padding=true",
    "algorithm.adv_estimator=gae",
]
ACTOR = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"


@pytest.mark.parametrize(("alias", "key"), sorted(ALIASES.items()))
def test_an_alias_sets_the_schema_key(alias, key):
    cfg = load_config([*REQUIRED, f"{alias}=2"])
    role = {"actor_rollout_ref.actor": "actor", "actor_rollout_ref.ref": "reference"}
    role = role.get(key.rsplit(".", 1)[0], "critic")
    assert cfg.ulysses_size(role) == 2
    # the same value under both spellings is no conflict
    assert cfg == load_config([*REQUIRED, f"{alias}=2", f"{key}=2"])


def test_both_spellings_with_different_values_are_refused_naming_both():
    alias = "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size"
    with pytest.raises(ConfigError) as info:
        load_config([*REQUIRED, f"{ACTOR}=2", f"{alias}=4"])
    (problem,) = info.value.problems
    assert problem.startswith(f"overrides: {ACTOR}=2 and {alias}=4 set the same value")
    # the critic's two aliases against each other, as key_problems (rlctl) words it
    found = key_problems(
        {
            "critic.fsdp.ulysses_sequence_parallel_size": 2,
            "critic.model.fsdp_config.ulysses_sequence_parallel_size": 1,
        }
    )
    assert len(found) == 1
    assert "critic.fsdp.ulysses_sequence_parallel_size=2 and" in found[0]
    assert "critic.model.fsdp_config.ulysses_sequence_parallel_size=1" in found[0]


def test_a_yaml_file_may_use_the_alias_and_later_sources_override_it(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "actor_rollout_ref:\n"
        "  actor:\n"
        "    fsdp_config:\n"
        "      ulysses_sequence_parallel_size: 2\n"
        "      param_offload: true\n"
        "critic:\n"
        "  fsdp:\n"
        "    ulysses_sequence_parallel_size: 4\n"
    )
    cfg = load_config(REQUIRED, config_file=path)
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 2
    assert cfg.actor_rollout_ref.actor.fsdp_config.param_offload  # the block's other keys
    assert cfg.critic.ulysses_sequence_parallel_size == 4
    # a later source (an override) wins over a file's alias, as for any key
    cfg = load_config([*REQUIRED, f"{ACTOR}=1"], config_file=path)
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 1
    # within the file, two spellings that disagree are refused
    path.write_text(
        "critic:\n  ulysses_sequence_parallel_size: 2\n  fsdp:\n"
        "    ulysses_sequence_parallel_size: 4\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(REQUIRED, config_file=path)
    (problem,) = info.value.problems
    assert "critic.ulysses_sequence_parallel_size=2 and" in problem
    assert "critic.fsdp.ulysses_sequence_parallel_size=4" in problem


def test_a_base_mapping_may_use_the_alias():
    base = {"critic": {"model": {"fsdp_config": {"ulysses_sequence_parallel_size": 2}}}}
    cfg = load_config(REQUIRED, base=base)
    assert cfg.critic.ulysses_sequence_parallel_size == 2
    assert (
        key_problems({"actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size": 2}) == []
    )
