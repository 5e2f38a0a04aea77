"""SAPO's soft gate and DPPO's divergence masks: hand-computed values, gradients and
metrics. The edge cases every loss shares (extreme ratios, padding, all-masked batches,
micro-batches) are run for these too, in test_policy_loss.py."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.policy_loss import (
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    PPO_KL,
    compute_policy_loss,
)
from engine.algo.trust_region import binary_kl
from tests.engine.algo.test_policy_loss import make_cfg, make_inputs, run

ln = math.log
exp = math.exp


def sigmoid(x: float) -> float:
    return 1.0 / (1.0 + exp(-x))


def gate(r: float, tau: float) -> float:
    """SAPO's f_τ(r) = (4/τ) σ(τ(r − 1))."""
    return 4.0 / tau * sigmoid(tau * (r - 1.0))


def gate_slope(r: float, tau: float) -> float:
    """f'_τ(r) = 4 σ (1 − σ), σ = σ(τ(r − 1))."""
    s = sigmoid(tau * (r - 1.0))
    return 4.0 * s * (1.0 - s)


# ---------------------------------------------------------------------------
# SAPO


def test_sapo_hand_computed_and_gradient():
    # old = 0, so r = e^logp; τ_pos = 1, τ_neg = 1.05 (the defaults); one sequence of 3
    # valid tokens and a padding slot, aggregated seq-mean-token-mean: divide by 3.
    #   t0: r = 1,   A = +1, τ = 1:    f = 4·σ(0) = 2            L = −2
    #       ∂L/∂logp = −A·r·f'(r) = −1·1·4·σ(0)(1−σ(0)) = −1
    #   t1: r = 2,   A = +1, τ = 1:    f = 4·σ(1) = 4·0.731059 = 2.924234   L = −2.924234
    #       ∂L/∂logp = −1·2·4·0.731059·0.268941 = −1.572895
    #   t2: r = 0.5, A = −2, τ = 1.05: f = (4/1.05)·σ(−0.525) = 3.809524·0.371684 = 1.415938
    #       L = −(−2)·1.415938 = 2.831877
    #       ∂L/∂logp = 2·0.5·4·0.371684·0.628316 = 0.934140
    # loss = (−2 − 2.924234 + 2.831877) / 3 = −0.697452
    logp = [[0.0, ln(2.0), ln(0.5), 3.0]]
    inputs = make_inputs(logp, [[0.0] * 4], [[1.0, 1.0, -2.0, 5.0]], [[1, 1, 1, 0]])
    out, grad = run(inputs, make_cfg("sapo"))
    values = [-gate(1.0, 1.0), -gate(2.0, 1.0), 2.0 * gate(0.5, 1.05)]
    assert values == pytest.approx([-2.0, -2.924234, 2.831877], abs=1e-6)
    assert out.loss.item() == pytest.approx(sum(values) / 3)
    assert out.loss.item() == pytest.approx(-0.697452, abs=1e-6)
    slopes = [-1.0 * gate_slope(1.0, 1.0), -2.0 * gate_slope(2.0, 1.0)]
    slopes.append(2.0 * 0.5 * gate_slope(0.5, 1.05))
    assert slopes == pytest.approx([-1.0, -1.572895, 0.934140], abs=1e-6)
    torch.testing.assert_close(grad, torch.tensor([[s / 3 for s in slopes] + [0.0]]))
    assert out.metrics[PG_CLIPFRAC] == 0.0
    assert out.metrics[PPO_KL] == pytest.approx(-(ln(2.0) + ln(0.5)) / 3)


@pytest.mark.parametrize("tau", [0.5, 1.0, 4.0])
def test_sapo_gate_slope_is_one_on_policy_and_sech_squared_off_policy(tau):
    # ∂L/∂logp = −A · r · sech²(τ(r − 1)/2) (= −A r · 4σ(1−σ)): −A at r = 1 whatever τ
    # (the first update is the plain policy gradient), and falling smoothly away from 1.
    ratios = [1.0, 0.5, 0.9, 1.1, 1.5, 3.0]
    inputs = make_inputs([[ln(r) for r in ratios]], [[0.0] * 6], [[1.0] * 6])
    _, grad = run(inputs, make_cfg("sapo", tau_pos=tau))
    n = len(ratios)  # one sequence: seq-mean-token-mean divides by its 6 tokens
    expected = [-r / math.cosh(tau * (r - 1.0) / 2) ** 2 / n for r in ratios]
    torch.testing.assert_close(grad, torch.tensor([expected]))
    assert grad[0, 0].item() == pytest.approx(-1.0 / n)
    # The weight per unit of ratio, |∂L/∂logp| / r, is largest on-policy.
    weight = (grad[0].abs() / torch.tensor(ratios)).tolist()
    assert max(weight) == pytest.approx(weight[0])


def test_sapo_larger_tau_narrows_the_trust_region():
    # At r = 1.5 the slope sech²(τ·0.25) is 0.940 for τ = 1 and 0.419 for τ = 4.
    slopes = []
    for tau in (1.0, 4.0):
        _, grad = run(make_inputs([[ln(1.5)]], [[0.0]], [[1.0]]), make_cfg("sapo", tau_pos=tau))
        slopes.append(-grad.item() / 1.5)
    assert slopes == pytest.approx([1 / math.cosh(0.25) ** 2, 1 / math.cosh(1.0) ** 2])
    assert slopes[1] < slopes[0]


def test_sapo_temperature_follows_the_advantage_sign():
    # τ_pos = 2 for A > 0, τ_neg = 0.5 for A ≤ 0; r = 1.5 on both tokens, two sequences.
    #   A = +1: L = −(4/2)·σ(2·0.5)    = −2·0.731059  = −1.462117
    #   A = −1: L =  (4/0.5)·σ(0.5·0.5) =  8·0.562177  =  4.497412
    # seq-mean-token-mean over two one-token sequences: (−1.462117 + 4.497412) / 2
    inputs = make_inputs([[ln(1.5)], [ln(1.5)]], [[0.0], [0.0]], [[1.0], [-1.0]])
    out, _ = run(inputs, make_cfg("sapo", tau_pos=2.0, tau_neg=0.5))
    assert out.loss.item() == pytest.approx((-gate(1.5, 2.0) + gate(1.5, 0.5)) / 2)
    assert out.loss.item() == pytest.approx((-1.462117 + 4.497412) / 2, abs=1e-6)


def test_sapo_always_aggregates_seq_mean_token_mean():
    # Rows of 2 and 1 valid tokens at r = 1 (f = 2 with τ_pos = 1), A = 1:
    # per-token losses −2, −2 | −2; sequence means −2 and −2 → −2, whatever loss_agg_mode.
    inputs = make_inputs(
        [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 2, [[1.0, 1.0], [1.0, 1.0]], [[1, 1], [1, 0]]
    )
    for agg in ("token-sum", "token-mean", "seq-mean-token-sum"):
        out = compute_policy_loss(inputs, make_cfg("sapo", loss_agg_mode=agg))
        assert out.loss.item() == pytest.approx(-2.0)


def test_sapo_far_off_policy_token_has_no_gradient_and_a_finite_loss():
    # r = e^20 (the clamp): σ saturates, so f = 4/τ and the slope is 0.
    out, grad = run(make_inputs([[30.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]]), make_cfg("sapo"))
    assert math.isfinite(out.loss.item())
    assert grad[0, 0].item() == 0.0
    assert grad[0, 1].item() == pytest.approx(-0.5)  # r = 1: −A / 2 tokens


# ---------------------------------------------------------------------------
# DPPO


def _probs_inputs(new, old, adv, mask=None):
    return make_inputs([[ln(p) for p in new]], [[ln(p) for p in old]], [adv], mask)


def test_dppo_tv_hand_computed():
    # δ = clip_ratio = 0.15 on both sides, C = clip_ratio_c = 3; token-mean over 6 tokens.
    # L_t = −A · min(r, C) · log π · M_t, ∂L/∂logπ = −A · min(r, C) on kept tokens.
    #   t0: A=+1, π 0.5 → 0.6,  Δ = +0.1 ≤ 0.15 kept,   r = 1.2:    L = −1.2·ln 0.6
    #   t1: A=+1, π 0.5 → 0.7,  Δ = +0.2 > 0.15  masked
    #   t2: A=+1, π 0.01 → 0.05, Δ = +0.04 kept (PPO would clip r = 5), w = min(5, 3) = 3:
    #       L = −3·ln 0.05
    #   t3: A=−1, π 0.9 → 0.7,  Δ = −0.2 < −0.15 masked
    #   t4: A=−1, π 0.9 → 0.8,  Δ = −0.1 kept,   r = 8/9:    L = (8/9)·ln 0.8
    #   t5: A=−1, π 0.5 → 0.9,  Δ = +0.4: moved against the advantage's push, kept, r = 1.8:
    #       L = 1.8·ln 0.9
    #   t6: padding
    new = [0.6, 0.7, 0.05, 0.7, 0.8, 0.9, 0.3]
    old = [0.5, 0.5, 0.01, 0.9, 0.9, 0.5, 0.3]
    adv = [1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 4.0]
    inputs = _probs_inputs(new, old, adv, [[1, 1, 1, 1, 1, 1, 0]])
    out, grad = run(inputs, make_cfg("dppo_tv", clip_ratio=0.15, clip_ratio_c=3.0))
    losses = [-1.2 * ln(0.6), 0.0, -3.0 * ln(0.05), 0.0, 8 / 9 * ln(0.8), 1.8 * ln(0.9)]
    assert out.loss.item() == pytest.approx(sum(losses) / 6)
    expected_grad = [-1.2, 0.0, -3.0, 0.0, 8 / 9, 1.8, 0.0]
    torch.testing.assert_close(grad, torch.tensor([[g / 6 for g in expected_grad]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(2 / 6)  # t1, t3
    assert out.metrics[PG_CLIPFRAC_LOWER] == pytest.approx(1 / 6)  # t2: r = 5 > C


def test_dppo_tv_thresholds_are_separate():
    # π 0.5 → 0.7 with A > 0 (Δ = +0.2) is kept with δ_high = 0.25 even though δ_low = 0.1;
    # π 0.5 → 0.35 with A < 0 (Δ = −0.15) is masked by δ_low = 0.1.
    inputs = _probs_inputs([0.7, 0.35], [0.5, 0.5], [1.0, -1.0])
    cfg = make_cfg("dppo_tv", clip_ratio_low=0.1, clip_ratio_high=0.25)
    out, grad = run(inputs, cfg)
    torch.testing.assert_close(grad, torch.tensor([[-1.4 / 2, 0.0]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(0.5)


def test_binary_kl_hand_computed():
    # KL(Bern(0.5) ‖ Bern(0.6)) = 0.5 ln(0.5/0.6) + 0.5 ln(0.5/0.4)
    #                           = 0.5·(−0.182322) + 0.5·(0.223144) = 0.020411
    # KL(Bern(0.01) ‖ Bern(0.1)) = 0.01 ln(0.1) + 0.99 ln(0.99/0.9)
    #                            = −0.023026 + 0.99·0.095310 = 0.071331
    p = torch.tensor([0.6, 0.1, 0.5])
    p_old = torch.tensor([0.5, 0.01, 0.5])
    kl = binary_kl(p, p_old, p.log(), p_old.log())
    torch.testing.assert_close(kl, torch.tensor([0.020411, 0.071331, 0.0]), atol=1e-6, rtol=0)
    # π = 1 or π_old = 1 stays finite (the 1e-8 in both 1 − π).
    one = torch.tensor([1.0, 0.3])
    edge = binary_kl(one, one.flip(0), one.log(), one.flip(0).log())
    assert torch.isfinite(edge).all()


def test_dppo_kl_hand_computed():
    # δ = 0.05 both sides, C = 3; token-mean over 5 tokens.
    #   t0: A=+1, π 0.5 → 0.6:   D = 0.020411 ≤ 0.05 kept,  r = 1.2:  L = −1.2·ln 0.6
    #   t1: A=+1, π 0.5 → 0.7:   D = 0.5 ln(5/7) + 0.5 ln(5/3) = 0.087177 > 0.05, π rose: masked
    #   t2: A=+1, π 0.5 → 0.2:   D = 0.5 ln 2.5 + 0.5 ln(0.625) = 0.223144 > 0.05, but π fell
    #       (against the push): kept, r = 0.4:  L = −0.4·ln 0.2
    #   t3: A=−1, π 0.5 → 0.3:   D = 0.087177 > 0.05, π fell: masked
    #   t4: A=+1, π 0.01 → 0.1:  D = 0.071331 > 0.05, π rose: masked (TV: Δ = 0.09, kept)
    new = [0.6, 0.7, 0.2, 0.3, 0.1]
    old = [0.5, 0.5, 0.5, 0.5, 0.01]
    adv = [1.0, 1.0, 1.0, -1.0, 1.0]
    out, grad = run(_probs_inputs(new, old, adv), make_cfg("dppo_kl", clip_ratio=0.05))
    assert out.loss.item() == pytest.approx((-1.2 * ln(0.6) - 0.4 * ln(0.2)) / 5)
    torch.testing.assert_close(grad, torch.tensor([[-1.2 / 5, 0.0, -0.4 / 5, 0.0, 0.0]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(3 / 5)
    assert out.metrics[PG_CLIPFRAC_LOWER] == 0.0
    # The same rare token under TV with δ = 0.15 is kept.
    tv, _ = run(_probs_inputs([0.1], [0.01], [1.0]), make_cfg("dppo_tv", clip_ratio=0.15))
    assert tv.metrics[PG_CLIPFRAC] == 0.0


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
def test_dppo_kept_tokens_get_ppo_unclipped_gradient(mode):
    # Inside the divergence region and below C, DPPO's gradient is PPO's unclipped one,
    # −A·r·∇log π: compare with vanilla whose clip range is too wide to bind.
    new = [0.52, 0.48, 0.3, 0.31]
    old = [0.5, 0.5, 0.3, 0.3]
    adv = [1.0, -0.5, 2.0, -1.5]
    dppo_cfg = make_cfg(mode, clip_ratio=0.1, clip_ratio_c=10.0)
    _, dppo_grad = run(_probs_inputs(new, old, adv), dppo_cfg)
    wide = make_cfg("vanilla", clip_ratio_low=0.99, clip_ratio_high=100.0, clip_ratio_c=10.0)
    _, ppo_grad = run(_probs_inputs(new, old, adv), wide)
    torch.testing.assert_close(dppo_grad, ppo_grad)


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
def test_dppo_ratio_is_truncated_at_clip_ratio_c(mode):
    # π 0.001 → 0.1 with A < 0 (π rose, against the push: kept by both masks); r = 100,
    # truncated at C = 3 (no dual-clip): ∂L/∂logπ = −A·3 = 3, L = 3·ln 0.1.
    out, grad = run(_probs_inputs([0.1], [0.001], [-1.0]), make_cfg(mode, clip_ratio_c=3.0))
    assert out.loss.item() == pytest.approx(3.0 * ln(0.1))
    assert grad.item() == pytest.approx(3.0)
    assert out.metrics[PG_CLIPFRAC_LOWER] == 1.0


@pytest.mark.parametrize("mode", ["dppo_tv", "dppo_kl"])
def test_dppo_certain_tokens_stay_finite(mode):
    # π_old = 1 or π = 1 (log-prob 0) and log-probs above 0 (not probabilities, read as
    # π = 1): the masks and the loss stay finite.
    logp = [[0.0, -1e-9, ln(0.5), 0.5]]
    old = [[ln(0.5), 0.0, 0.0, 0.0]]
    out, grad = run(make_inputs(logp, old, [[1.0, -1.0, 1.0, -1.0]]), make_cfg(mode))
    assert math.isfinite(out.loss.item())
    assert torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
