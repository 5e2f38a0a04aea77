"""GDPO's reward components: read from what each sample's reward function returned."""

from types import SimpleNamespace

import pytest
import torch

from engine.errors import EngineError
from engine.loop.scoring import reward_components


def rollout(extras):
    sources = ["synthetic"] * len(extras)
    return SimpleNamespace(reward_extras=extras, meta=SimpleNamespace(data_source=sources))


def test_components_in_key_order_with_their_metrics():
    extras = [
        {"format": 1.0, "accuracy": 0.0, "overlong_penalty": -0.5},
        {"accuracy": 1.0, "format": 1.0},
        None,  # the scorer failed: 0 on every key, as its score
    ]
    metrics = {}
    got = reward_components(rollout(extras), ["accuracy", "format"], metrics)
    assert torch.equal(got, torch.tensor([[0.0, 1.0], [1.0, 1.0], [0.0, 0.0]]))
    assert metrics["gdpo/accuracy/mean"] == pytest.approx(1 / 3)
    assert metrics["gdpo/format/max"] == 1.0 and metrics["gdpo/format/min"] == 0.0
    # unbiased std of (1, 1, 0): sqrt(((1/3)² · 2 + (2/3)²) / 2) = sqrt(1/3)
    assert metrics["gdpo/format/std"] == pytest.approx((1 / 3) ** 0.5)


def test_a_key_the_reward_function_did_not_return_is_an_error():
    with pytest.raises(EngineError) as info:
        reward_components(rollout([{"accuracy": 1.0}]), ["accuracy", "format"], {})
    message = str(info.value)
    assert "['format']" in message and "['accuracy']" in message
    assert "algorithm.gdpo_reward_keys" in message and "'synthetic'" in message
