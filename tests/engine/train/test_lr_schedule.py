"""The learning-rate schedule and AdamW's settings (engine.train.fsdp), hand-computed."""

import math

import pytest
import torch

from engine.config.train import OptimConfig
from engine.train import fsdp


@pytest.mark.parametrize(
    ("init", "expected"),
    [
        # warmup of 4 steps from 0: 1/4, 2/4, 3/4, 4/4 of lr, then constant
        (0.0, [0.25, 0.5, 0.75, 1.0, 1.0]),
        # from 0.1 (verl's optim=automodel default): 0.1 + 0.9 × (k+1)/4
        (0.1, [0.325, 0.55, 0.775, 1.0, 1.0]),
    ],
)
def test_warmup_rises_linearly_from_init_lr_ratio(init, expected):
    cfg = OptimConfig(lr_warmup_steps=4, init_lr_ratio=init)
    got = [fsdp.lr_multiplier(step, cfg, total_steps=10) for step in range(5)]
    assert got == pytest.approx(expected)


def test_cosine_after_warmup_reaches_the_floor():
    cfg = OptimConfig(
        lr_warmup_steps=2, init_lr_ratio=0.5, lr_scheduler_type="cosine", min_lr_ratio=0.1
    )
    # decay over 8 steps after the warmup: at step 2+4, half-way, 0.1 + 0.9 × 0.5
    assert fsdp.lr_multiplier(6, cfg, total_steps=10) == pytest.approx(0.55)
    assert fsdp.lr_multiplier(10, cfg, total_steps=10) == pytest.approx(0.1)
    assert fsdp.lr_multiplier(0, cfg, total_steps=10) == pytest.approx(0.75)
    assert not math.isnan(fsdp.lr_multiplier(3, cfg, total_steps=10))


def test_adamw_takes_the_configured_eps():
    model = torch.nn.Linear(2, 2)
    optimizer = fsdp.build_optimizer(model, OptimConfig(eps=1e-6, betas=[0.8, 0.9]))
    group = optimizer.param_groups[0]
    assert group["eps"] == 1e-6 and group["betas"] == (0.8, 0.9)
