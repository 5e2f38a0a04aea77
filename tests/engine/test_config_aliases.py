"""verl's other spellings of keys (``engine.config.aliases``, the table in
``engine.config.verl_names``): each sets the schema's key, from an override, a YAML file or
a base mapping; two spellings of one key with different values are refused naming both;
verl's names of values (bf16) are read as the schema's."""

import pytest

from engine.config import key_problems, load_config
from engine.config.aliases import ALIASES, PREFIX_ALIASES, schema_key
from engine.config.fields import selected
from engine.config.keys import leaf
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


ULYSSES = sorted((a, k) for a, k in ALIASES.items() if a.endswith("ulysses_sequence_parallel_size"))


@pytest.mark.parametrize(("alias", "key"), ULYSSES)
def test_a_ulysses_alias_sets_the_schema_key(alias, key):
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


# A value of each alias's target type that differs from its default.
def _other_value(key: str):
    found = leaf(key)
    assert found is not None, key
    default = found.default
    if default is None and "int" in found.type_name:
        return 3
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return default + 0.5
    if key.endswith("dtype"):
        return "float32" if default != "float32" else "bfloat16"
    if key.endswith("lr_scheduler_type"):
        return "cosine"
    if key.endswith("default_agent"):
        return "single_turn"
    if found.type_name.startswith("dict") or found.type_name == "mapping":
        return None
    return "some/path"


@pytest.mark.parametrize("alias", sorted(ALIASES))
def test_every_alias_names_a_schema_key_and_sets_it(alias):
    key = schema_key(alias)
    assert leaf(key) is not None, f"{alias} -> {key}: not a key of the schema"
    value = _other_value(key)
    if value is None:  # a mapping: set one of its entries through the alias
        entry = next((k for k, v in leaf(key).default.items() if isinstance(v, bool)), "x")
        cfg = load_config([*REQUIRED, f"+{alias}.{entry}=true"], check=False)
        assert selected(cfg, key)[entry] is True
        return
    written = str(value).lower() if isinstance(value, bool) else value
    cfg = load_config([*REQUIRED, f"{alias}={written}"], check=False)
    assert selected(cfg, key) == value


def test_prefix_aliases_rename_whole_sections():
    cfg = load_config(
        [
            *REQUIRED,
            "critic.fsdp.param_offload=true",
            "critic.model.fsdp_config.optimizer_offload=true",
            "reward.custom_reward_function.path=/r.py",
            "sandbox_fusion.max_concurrent=3",
        ],
        check=False,
    )
    assert cfg.critic.fsdp_config.param_offload and cfg.critic.fsdp_config.optimizer_offload
    assert cfg.custom_reward_function.path == "/r.py"
    assert cfg.reward.sandbox_fusion["max_concurrent"] == 3
    for prefix, target in PREFIX_ALIASES.items():
        assert schema_key(f"{prefix}x") == f"{target}x"
    # an alias inside a renamed section: both renamings apply
    assert schema_key("critic.fsdp.dtype") == "critic.fsdp_config.mixed_precision.param_dtype"


def test_verls_newer_reward_section_sets_the_engines_keys():
    cfg = load_config(
        [
            *REQUIRED,
            "reward.num_workers=2",
            "reward.reward_manager.name=dapo",
            "reward.reward_model.enable=true",
            "reward.reward_model.model_path=/rm",
            "+reward.reward_kwargs.overlong_buffer_cfg.enable=true",
            "+reward.reward_kwargs.overlong_buffer_cfg.len=64",
            "+reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
        ],
        check=False,
    )
    rm = cfg.reward_model
    assert (rm.num_workers, rm.reward_manager, rm.enable, rm.model.path) == (2, "dapo", True, "/rm")
    assert (rm.overlong_buffer.enable, rm.overlong_buffer.len) == (True, 64)
    assert rm.overlong_buffer.penalty_factor == 0.5


def test_verls_value_names_are_read_as_the_schemas():
    cfg = load_config(
        [
            *REQUIRED,
            "actor_rollout_ref.model.dtype=bf16",
            "actor_rollout_ref.rollout.dtype=fp16",
            "actor_rollout_ref.actor.fsdp_config.dtype=fp32",
            "actor_rollout_ref.actor.strategy=veomni",
            "critic.strategy=fsdp_turbo",
        ]
    )
    arr = cfg.actor_rollout_ref
    assert (arr.model.dtype, arr.rollout.dtype) == ("bfloat16", "float16")
    assert arr.actor.fsdp_config.mixed_precision.param_dtype == "float32"
    assert (arr.actor.strategy, cfg.critic.strategy) == ("fsdp2", "fsdp2")
    # an unknown name is still refused, naming the valid ones
    with pytest.raises(ConfigError, match="bfloat16"):
        load_config([*REQUIRED, "actor_rollout_ref.model.dtype=bf8"])
