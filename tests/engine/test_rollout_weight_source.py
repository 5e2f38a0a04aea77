"""Where the rollout's weights come from, one value decided from the config: it says
whether the rollout syncs from the actor beside it, waits for the controller's pushes,
or generates with the actor's own module."""

from types import SimpleNamespace

import pytest

from engine.workers.rollout_engine import WeightSource, weight_source


@pytest.mark.parametrize(
    ("name", "strategy", "colocated", "expected"),
    [
        ("hf", "fsdp2", True, "ACTOR_MODULE"),  # generates with the actor's own module
        ("hf", "megatron", True, "ACTOR_BESIDE"),  # Megatron's layout cannot generate
        ("vllm", "fsdp2", True, "ACTOR_BESIDE"),
        ("sglang", "fsdp2", True, "ACTOR_BESIDE"),
        ("hf", "fsdp2", False, "BRIDGE"),  # placement=separate: pushed by the controller
        ("vllm", "megatron", False, "BRIDGE"),
    ],
)
def test_the_rollout_knows_where_its_weights_come_from(name, strategy, colocated, expected):
    cfg = SimpleNamespace(
        actor_rollout_ref=SimpleNamespace(
            rollout=SimpleNamespace(name=name), actor=SimpleNamespace(strategy=strategy)
        )
    )
    assert weight_source(cfg, colocated) is WeightSource[expected]
