"""Every config key explains itself: help text on each field."""

from engine.config import config_keys, schema_leaf
from engine.config.keys import leaf, leaves, sections


def test_every_key_has_help():
    missing = [key for key in config_keys() if not leaf(key).help.strip()]
    assert not missing, f"give these fields help text (setting(default, help)): {missing}"


def test_every_section_describes_itself():
    # A dataclass without a docstring gets its signature as one: a section needs its own.
    missing = [section or "EngineConfig" for section, text in sections().items() if not text]
    assert not missing, f"give these sections' classes a docstring: {missing}"


def test_defaults_are_the_whole_configs():
    # The critic's optimizer is the shared OptimConfig with its own learning rate.
    assert schema_leaf("critic.optim.lr") == (float, 1e-5)
    assert schema_leaf("actor_rollout_ref.actor.optim.lr") == (float, 1e-6)
    assert schema_leaf("critic.optim") is None and schema_leaf("nope") is None


def test_a_section_lists_its_keys_nested_ones_included():
    keys = [item.key for item in leaves("actor_rollout_ref.rollout")]
    assert keys[0] == "actor_rollout_ref.rollout.name"
    assert "actor_rollout_ref.rollout.val_kwargs.top_p" in keys
    assert all(k.startswith("actor_rollout_ref.rollout.") for k in keys)
