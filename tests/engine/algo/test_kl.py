import math

import pytest
import torch

from engine.algo import names
from engine.algo.aggregate import LossScale
from engine.algo.kl import (
    K3_VALUE_CLAMP,
    KL_CONTROLLERS,
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_loss,
    kl_penalty,
    make_kl_controller,
)
from engine.algo.registry import UnknownNameError
from engine.config import ActorConfig, KLControlConfig

# d = logp − ref = [0.5, −1.0, 0.0]
LOGP = torch.tensor([[-1.0, -2.0, -0.5]])
REF = torch.tensor([[-1.5, -1.0, -0.5]])


def close(actual: torch.Tensor, expected: list) -> bool:
    return torch.allclose(actual, torch.tensor(expected, dtype=actual.dtype), atol=1e-6)


# ---------------------------------------------------------------------------
# estimators


def test_registry_matches_names():
    assert KL_ESTIMATORS.names() == names.KL_ESTIMATORS
    assert KL_CONTROLLERS.names() == names.KL_CONTROLLERS


def test_k1():
    # d
    assert close(kl_penalty("k1", LOGP, REF), [[0.5, -1.0, 0.0]])


def test_abs():
    # |d|
    assert close(kl_penalty("abs", LOGP, REF), [[0.5, 1.0, 0.0]])


def test_k2():
    # ½·0.5² = 0.125, ½·(−1)² = 0.5, 0
    assert close(kl_penalty("k2", LOGP, REF), [[0.125, 0.5, 0.0]])


def test_k3():
    # exp(−0.5) − 1 + 0.5 = 0.60653066 − 0.5 = 0.10653066
    # exp(1) − 1 − 1 = 2.71828183 − 2 = 0.71828183
    # exp(0) − 1 + 0 = 0
    assert close(kl_penalty("k3", LOGP, REF), [[0.10653066, 0.71828183, 0.0]])


@pytest.mark.parametrize(("alias", "name"), [("kl", "k1"), ("mse", "k2"), ("low_var_kl", "k3")])
def test_aliases(alias, name):
    assert KL_ESTIMATORS.get(alias) is KL_ESTIMATORS.get(name)
    assert torch.equal(kl_penalty(alias, LOGP, REF), kl_penalty(name, LOGP, REF))


def test_k3_nonnegative_on_random_log_ratios():
    torch.manual_seed(0)
    logp, ref = torch.randn(64, 32) * 3, torch.randn(64, 32) * 3
    assert (kl_penalty("k3", logp, ref) >= 0).all()


def test_k3_clamps_extreme_log_ratios():
    # d = ±1000 would give exp(1000) = inf unclamped; d = ±100 clamps to ±20:
    # exp(−20) − 1 + 20 ≈ 19.0 and exp(20) − 1 − 20 ≈ 4.85e8, both clamped to 10.
    logp = torch.tensor([1000.0, 100.0, -100.0, -1000.0], requires_grad=True)
    ref = torch.zeros(4)
    kl = kl_penalty("low_var_kl", logp, ref)
    assert torch.isfinite(kl).all()
    assert close(kl, [K3_VALUE_CLAMP] * 4)
    kl.sum().backward()
    assert torch.isfinite(logp.grad).all()


@pytest.mark.parametrize(("name", "base"), [("k1+", "k1"), ("low_var_kl+", "low_var_kl")])
def test_straight_through_value_of_estimator_gradient_of_k2(name, base):
    logp = LOGP.clone().requires_grad_(True)
    kl = kl_penalty(name, logp, REF)
    assert torch.allclose(kl, kl_penalty(base, LOGP, REF))
    kl.sum().backward()
    # ∂(½ d²)/∂logp = d
    assert close(logp.grad, [[0.5, -1.0, 0.0]])

    # and not the named estimator's own gradient (k1: 1; k3: 1 − exp(−d))
    plain = LOGP.clone().requires_grad_(True)
    kl_penalty(base, plain, REF).sum().backward()
    assert not torch.allclose(plain.grad, logp.grad)


@pytest.mark.parametrize("name", ["k4", "low_var", "k1++", "+", ""])
def test_unknown_estimator_lists_valid_names_and_suffix(name):
    with pytest.raises(UnknownNameError) as info:
        kl_penalty(name, LOGP, REF)
    message = str(info.value)
    assert repr(name) in message
    assert "low_var_kl" in message and "k2" in message
    assert "'+'" in message


def test_every_name_and_its_straight_through_variant_works():
    for name in names.KL_ESTIMATORS:
        assert names.is_valid_kl_estimator(name + "+")
        assert kl_penalty(name + "+", LOGP, REF).shape == LOGP.shape


# ---------------------------------------------------------------------------
# controllers


def test_fixed_controller_is_constant():
    ctrl = make_kl_controller(KLControlConfig(type="fixed", kl_coef=0.05))
    assert isinstance(ctrl, FixedKLController)
    for kl in (0.0, 10.0, 1e6):
        ctrl.update(kl, n_steps=1000)
    assert ctrl.value == 0.05


def adaptive(kl_coef=0.1, target_kl=0.1, horizon=100) -> AdaptiveKLController:
    cfg = KLControlConfig(type="adaptive", kl_coef=kl_coef, target_kl=target_kl, horizon=horizon)
    ctrl = make_kl_controller(cfg)
    assert isinstance(ctrl, AdaptiveKLController)
    return ctrl


@pytest.mark.parametrize(
    ("current_kl", "expected"),
    [
        # e = 0.11/0.1 − 1 = 0.1;       β = 0.1·(1 + 0.1·10/100) = 0.101
        (0.11, 0.101),
        # e = 0.5/0.1 − 1 = 4 → 0.2;    β = 0.1·(1 + 0.2·10/100) = 0.102
        (0.5, 0.102),
        # e = 0.09/0.1 − 1 = −0.1;      β = 0.1·(1 − 0.1·10/100) = 0.099
        (0.09, 0.099),
        # e = 0/0.1 − 1 = −1 → −0.2;    β = 0.1·(1 − 0.2·10/100) = 0.098
        (0.0, 0.098),
        # e = 0;                        β unchanged
        (0.1, 0.1),
    ],
)
def test_adaptive_controller_hand_numbers(current_kl, expected):
    ctrl = adaptive()
    ctrl.update(current_kl, n_steps=10)
    assert ctrl.value == pytest.approx(expected, rel=1e-12)


def test_adaptive_controller_needs_positive_target_and_horizon():
    with pytest.raises(ValueError, match="target_kl"):
        AdaptiveKLController(0.1, target_kl=0.0, horizon=10)
    with pytest.raises(ValueError, match="horizon"):
        AdaptiveKLController(0.1, target_kl=0.1, horizon=0)


def test_unknown_controller():
    with pytest.raises(UnknownNameError, match="adaptive"):
        make_kl_controller(KLControlConfig(type="adaptiv"))


@pytest.mark.parametrize("kind", ["fixed", "adaptive"])
def test_controller_state_dict_round_trip(kind):
    cfg = KLControlConfig(type=kind, kl_coef=0.2, target_kl=0.05, horizon=50)
    ctrl = make_kl_controller(cfg)
    ctrl.update(1.0, n_steps=8)
    ctrl.update(0.3, n_steps=8)
    state = ctrl.state_dict()

    resumed = make_kl_controller(cfg)
    resumed.load_state_dict(state)
    assert resumed.value == ctrl.value
    ctrl.update(0.01, n_steps=8)
    resumed.update(0.01, n_steps=8)
    assert resumed.value == ctrl.value
    if kind == "adaptive":  # the round trip restored something that had moved
        assert state["value"] != cfg.kl_coef


# ---------------------------------------------------------------------------
# KL in the reward


def test_apply_kl_in_reward_hand_numbers():
    # d per token (k1); the last row has no valid token.
    d = torch.tensor([[0.1, 0.2, 0.3], [0.4, -0.2, 5.0], [9.0, 9.0, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 7.0], [3.0, 3.0, 3.0]])
    ref = torch.full((3, 3), -2.0)
    ctrl = make_kl_controller(
        KLControlConfig(type="adaptive", kl_coef=0.5, target_kl=0.1, horizon=10)
    )

    rewards, metrics = apply_kl_in_reward(scores, ref + d, ref, mask, ctrl, "k1")

    # β·d = 0.5·d; padding keeps its score
    expected = [[-0.05, -0.1, 0.85], [-0.2, 2.1, 7.0], [3.0, 3.0, 3.0]]
    assert torch.allclose(rewards, torch.tensor(expected), atol=1e-6)
    # per-sequence means: (0.1+0.2+0.3)/3 = 0.2, (0.4−0.2)/2 = 0.1; over the two
    # sequences with tokens: 0.15 (a token mean would be 0.8/5 = 0.16)
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.15, abs=1e-6)
    assert metrics["actor/reward_kl_penalty_coeff"] == 0.5
    assert ctrl.value == 0.5  # the trainer updates the controller, not this function


def test_apply_kl_in_reward_uses_the_named_estimator():
    d = torch.tensor([[0.4, -0.2]])
    mask = torch.ones(1, 2)
    ctrl = FixedKLController(1.0)
    rewards, metrics = apply_kl_in_reward(
        torch.zeros(1, 2), d, torch.zeros(1, 2), mask, ctrl, "abs"
    )
    assert close(rewards, [[-0.4, -0.2]])  # −|d|
    assert metrics["actor/reward_kl_penalty"] == pytest.approx(0.3)


# ---------------------------------------------------------------------------
# KL as a loss


def uneven_batch():
    # k1 per token: row 0 has 4 valid tokens of KL 1, row 1 one valid token of KL 3;
    # the padding holds garbage that must not count.
    ref = torch.zeros(2, 4)
    logp = torch.tensor([[1.0, 1.0, 1.0, 1.0], [3.0, 100.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    return logp, ref, mask


@pytest.mark.parametrize(
    ("mode", "kl"),
    [
        ("token-mean", 1.4),  # (1+1+1+1+3)/5
        ("seq-mean-token-mean", 2.0),  # (4/4 + 3/1)/2
    ],
)
def test_kl_loss_aggregation(mode, kl):
    logp, ref, mask = uneven_batch()
    cfg = ActorConfig(kl_loss_type="k1", kl_loss_coef=0.1, loss_agg_mode=mode)
    loss, metrics = kl_loss(logp, ref, mask, cfg, None)
    assert loss.item() == pytest.approx(0.1 * kl)
    assert metrics["actor/kl_loss"] == pytest.approx(kl)
    assert metrics["actor/kl_coef"] == 0.1


def test_kl_loss_uses_the_mini_batch_scale_and_is_differentiable():
    logp, ref, mask = uneven_batch()
    logp.requires_grad_(True)
    cfg = ActorConfig(kl_loss_type="k2+", kl_loss_coef=0.5, loss_agg_mode="token-mean")
    # As if this micro-batch were half of a mini-batch of 10 tokens:
    # k2 values ½·1 (×4) and ½·9 → Σ = 6.5; /10 = 0.65; × 0.5 = 0.325
    loss, metrics = kl_loss(logp, ref, mask, cfg, LossScale(num_tokens=10, num_seqs=4))
    assert loss.item() == pytest.approx(0.325)
    assert metrics["actor/kl_loss"] == pytest.approx(0.65)
    loss.backward()
    # ∂/∂logp = 0.5 · d / 10 on valid tokens, 0 on padding
    assert close(logp.grad, [[0.05, 0.05, 0.05, 0.05], [0.15, 0.0, 0.0, 0.0]])


def test_kl_loss_default_type_is_finite_at_extreme_ratios():
    logp = torch.tensor([[-60.0, 0.0]], requires_grad=True)
    ref = torch.tensor([[0.0, -60.0]])
    loss, _ = kl_loss(logp, ref, torch.ones(1, 2), ActorConfig(), None)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(logp.grad).all()
