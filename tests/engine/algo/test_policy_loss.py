"""Policy losses: hand-computed values, gradients, metrics and edge cases."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo import names
from engine.algo.aggregate import LossScale
from engine.algo.policy_loss import (
    CLIP_COV_FRAC,
    KL_COV_FRAC,
    MAX_LOG_RATIO,
    PG_CLIPFRAC,
    PG_CLIPFRAC_LOWER,
    POLICY_LOSSES,
    PPO_KL,
    PolicyLossInputs,
    compute_policy_loss,
)
from engine.algo.registry import UnknownNameError
from engine.config import ActorConfig, PolicyLossConfig

ln = math.log
exp = math.exp


def make_cfg(mode: str, **actor) -> ActorConfig:
    policy = {k: actor.pop(k) for k in list(actor) if hasattr(PolicyLossConfig, k)}
    return ActorConfig(policy_loss=PolicyLossConfig(loss_mode=mode, **policy), **actor)


def make_inputs(logp, old, adv, mask=None) -> PolicyLossInputs:
    logp_t = torch.tensor(logp, dtype=torch.float32).requires_grad_()
    mask_t = torch.ones_like(logp_t) if mask is None else torch.tensor(mask, dtype=torch.float32)
    return PolicyLossInputs(
        logprobs_BT=logp_t,
        old_logprobs_BT=torch.tensor(old, dtype=torch.float32),
        advantages_BT=torch.tensor(adv, dtype=torch.float32),
        response_mask_BT=mask_t,
    )


def run(inputs, cfg, scale=None):
    out = compute_policy_loss(inputs, cfg, scale)
    out.loss.backward()
    return out, inputs.logprobs_BT.grad


def random_inputs(seed=0, B=4, T=6) -> PolicyLossInputs:
    g = torch.Generator().manual_seed(seed)
    lengths = [T, 3, 1, 5][:B]
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in lengths])
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + 0.3 * torch.randn(B, T, generator=g)).requires_grad_()
    adv = torch.randn(B, T, generator=g)
    return PolicyLossInputs(logp, old, adv, mask)


# ---------------------------------------------------------------------------
# registry


def test_registry_matches_names():
    assert set(POLICY_LOSSES.names()) == set(names.POLICY_LOSSES)


def test_unknown_loss_lists_valid_names():
    with pytest.raises(UnknownNameError) as info:
        compute_policy_loss(make_inputs([[0.0]], [[0.0]], [[1.0]]), make_cfg("ppo"))
    for name in names.POLICY_LOSSES:
        assert name in str(info.value)


def test_mismatched_shapes_are_rejected():
    inputs = make_inputs([[0.0, 0.0]], [[0.0, 0.0]], [[1.0, 1.0]])
    inputs.advantages_BT = torch.ones(1, 3)
    with pytest.raises(ValueError, match="shape"):
        compute_policy_loss(inputs, make_cfg("vanilla"))


# ---------------------------------------------------------------------------
# vanilla PPO


def test_vanilla_hand_computed():
    # old = 0, so log-ratio = logp and r = e^logp; ε = 0.2, c = 3; token-mean over 4 tokens.
    #   t0: r = 1.5, A = +1: max(-1.5, -1.2) = -1.2  (clipped, no gradient)
    #   t1: r = 0.5, A = +1: max(-0.5, -0.8) = -0.5  (unclipped)
    #   t2: r = 0.5, A = -1: max( 0.5,  0.8) =  0.8  (clipped); dual bound 3 not active
    #   t3: r = 1.1, A = +2: max(-2.2, -2.2) = -2.2  (unclipped: inside the range)
    #   t4: padding
    # loss = (-1.2 - 0.5 + 0.8 - 2.2) / 4 = -0.775
    logp = [[ln(1.5), ln(0.5), ln(0.5), ln(1.1), 5.0]]
    inputs = make_inputs(logp, [[0.0] * 5], [[1.0, 1.0, -1.0, 2.0, 7.0]], [[1, 1, 1, 1, 0]])
    out, grad = run(inputs, make_cfg("vanilla", clip_ratio=0.2))
    assert out.loss.item() == pytest.approx(-0.775)
    # ∂L/∂logp_t = -A r / 4 for unclipped tokens: t1 -0.5/4, t3 -2.2/4
    torch.testing.assert_close(grad, torch.tensor([[0.0, -0.125, 0.0, -0.55, 0.0]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(0.5)  # t0, t2
    assert out.metrics[PG_CLIPFRAC_LOWER] == 0.0
    # ppo_kl = mean(old - logp) = -(ln 1.5 + 2 ln 0.5 + ln 1.1) / 4
    assert out.metrics[PPO_KL] == pytest.approx(-(ln(1.5) + 2 * ln(0.5) + ln(1.1)) / 4)


@pytest.mark.parametrize(
    ("clip_high", "loss", "grad", "clipfrac"),
    [
        (0.2, -1.2, 0.0, 1.0),  # 1.25 > 1.2: clipped, loss -A·1.2, no gradient
        (0.28, -1.25, -1.25, 0.0),  # 1.25 < 1.28: inside, loss -A·r, gradient -A·r
    ],
)
def test_vanilla_clip_higher_asymmetry(clip_high, loss, grad, clipfrac):
    cfg = make_cfg("vanilla", clip_ratio=0.2, clip_ratio_high=clip_high)
    out, g = run(make_inputs([[ln(1.25)]], [[0.0]], [[1.0]]), cfg)
    assert out.loss.item() == pytest.approx(loss)
    assert g.item() == pytest.approx(grad)
    assert out.metrics[PG_CLIPFRAC] == clipfrac


def test_vanilla_clip_low_is_separate_from_clip_high():
    # r = 0.75, A = -1: with ε_low = 0.2 the ratio is clipped at 0.8 (loss 0.8); with
    # ε_low = 0.3 it is inside (loss 0.75) even though ε_high stays 0.2.
    clipped, _ = run(make_inputs([[ln(0.75)]], [[0.0]], [[-1.0]]), make_cfg("vanilla"))
    assert clipped.loss.item() == pytest.approx(0.8)
    cfg = make_cfg("vanilla", clip_ratio_low=0.3)
    inside, _ = run(make_inputs([[ln(0.75)]], [[0.0]], [[-1.0]]), cfg)
    assert inside.loss.item() == pytest.approx(0.75)


def test_vanilla_dual_clip_bounds_negative_advantages():
    # A = -2, c = 3:
    #   t0: r = 5:   max(-A r, -A·1.2) = 10, dual bound -A c = 6 → 6, no gradient
    #   t1: r = 2.5: max(5, 2.4) = 5 < 6 → 5, gradient -A r / 2 = 2.5
    # loss = (6 + 5) / 2 = 5.5
    inputs = make_inputs([[ln(5.0), ln(2.5)]], [[0.0, 0.0]], [[-2.0, -2.0]])
    out, grad = run(inputs, make_cfg("vanilla", clip_ratio_c=3.0))
    assert out.loss.item() == pytest.approx(5.5)
    torch.testing.assert_close(grad, torch.tensor([[0.0, 2.5]]))
    assert out.metrics[PG_CLIPFRAC_LOWER] == pytest.approx(0.5)
    assert out.metrics[PG_CLIPFRAC] == 0.0  # the unclipped term was the larger one


def test_vanilla_dual_clip_leaves_positive_advantages_alone():
    # A = +1, r = 5: clipped at 1.2 → loss -1.2; dual-clip is only for A < 0.
    out, _ = run(make_inputs([[ln(5.0)]], [[0.0]], [[1.0]]), make_cfg("vanilla"))
    assert out.loss.item() == pytest.approx(-1.2)
    assert out.metrics[PG_CLIPFRAC_LOWER] == 0.0


def test_vanilla_uses_loss_agg_mode():
    # rows of 2 and 1 tokens at r = 1, A = 1 and 4: per-token losses -1, -1 | -4.
    inputs = make_inputs(
        [[0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0]] * 2, [[1.0, 1.0], [4.0, 9.0]], [[1, 1], [1, 0]]
    )
    out, _ = run(inputs, make_cfg("vanilla", loss_agg_mode="seq-mean-token-sum"))
    assert out.loss.item() == pytest.approx((-2 - 4) / 2)  # row sums over |S| = 2


# ---------------------------------------------------------------------------
# GSPO


def test_gspo_hand_computed_and_gradient():
    # ε = 0.3 both sides; loss_agg_mode is ignored (always seq-mean-token-mean).
    #   row 0: l = (0.1, 0.3), A = 1:  s = e^0.2 ≈ 1.2214 inside → per token -s
    #   row 1: l = (0.0, 0.6), A = 1:  s = e^0.3 ≈ 1.3499 > 1.3 → clipped, per token -1.3
    #   row 2: l = (-0.4),     A = -1: s = e^-0.4 ≈ 0.6703 < 0.7 → clipped, max(0.67, 0.7) = 0.7
    # loss = (-e^0.2 - 1.3 + 0.7) / 3
    logp = [[0.1, 0.3], [0.0, 0.6], [-0.4, 9.0]]
    inputs = make_inputs(
        logp, [[0.0, 0.0]] * 3, [[1.0, 1.0], [1.0, 1.0], [-1.0, 0.0]], [[1, 1], [1, 1], [1, 0]]
    )
    out, grad = run(inputs, make_cfg("gspo", clip_ratio=0.3, loss_agg_mode="token-sum"))
    assert out.loss.item() == pytest.approx((-exp(0.2) - 1.3 + 0.7) / 3)
    # Unclipped token t of sequence i: ∂/∂logp_t [ -A s_i / (|o_i| · |S|) ] summed over the
    # sequence's tokens gives -A s_i / (|o_i| · |S|) = -e^0.2 / (2·3) for row 0; 0 elsewhere.
    g = -exp(0.2) / 6
    torch.testing.assert_close(grad, torch.tensor([[g, g], [0.0, 0.0], [0.0, 0.0]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(3 / 5)  # rows 1 and 2: 3 of 5 tokens


def test_gspo_gradient_per_token_with_token_advantages():
    # One sequence, |o| = 3, l = (0.2, -0.1, 0.5) → s = e^{0.6/3} = e^0.2; wide clip.
    # GSPO-token: ∂L/∂logp_t = -A_t s / |o| (one sequence, |S| = 1).
    # A token-level ratio would give -A_t e^{l_t} / 3 instead.
    adv = [2.0, -1.0, 0.5]
    inputs = make_inputs([[0.2, -0.1, 0.5]], [[0.0, 0.0, 0.0]], [adv])
    out, grad = run(inputs, make_cfg("gspo", clip_ratio=0.9, clip_ratio_high=5.0))
    s = exp(0.2)
    assert out.loss.item() == pytest.approx(-sum(adv) * s / 3)
    torch.testing.assert_close(grad, torch.tensor([[-a * s / 3 for a in adv]]))


def test_gspo_sequence_ratio_is_clipped_with_tiny_ranges():
    # The paper's ranges: 3e-4 / 4e-4. l = (0.001, 0.001) → s = e^0.001 > 1 + 4e-4: clipped.
    cfg = make_cfg("gspo", clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    out, grad = run(make_inputs([[0.001, 0.001]], [[0.0, 0.0]], [[1.0, 1.0]]), cfg)
    assert out.loss.item() == pytest.approx(-(1 + 4e-4))
    assert torch.equal(grad, torch.zeros(1, 2))
    assert out.metrics[PG_CLIPFRAC] == 1.0


# ---------------------------------------------------------------------------
# GPG and CISPO


def test_gpg_hand_computed():
    # L = -A logp: (-2·-1, -(-1)·-2, -1·-0.5) = (2, -2, 0.5); token-mean = 0.5 / 3.
    # ∂L/∂logp = -A / 3. The old log-probs play no part in the loss.
    adv = [2.0, -1.0, 1.0]
    inputs = make_inputs([[-1.0, -2.0, -0.5]], [[-9.0, 3.0, 0.0]], [adv])
    out, grad = run(inputs, make_cfg("gpg"))
    assert out.loss.item() == pytest.approx(0.5 / 3)
    torch.testing.assert_close(grad, torch.tensor([[-a / 3 for a in adv]]))
    assert out.metrics[PG_CLIPFRAC] == 0.0
    assert out.metrics[PPO_KL] == pytest.approx(((-9 + 1) + (3 + 2) + (0 + 0.5)) / 3)


def test_cispo_hand_computed_and_gradient():
    # logp = (-1, -2, -0.5); r = (1.5, 0.5, 1.0) so old = logp - ln r; ε = 0.2.
    # ŵ = clip(r, 0.8, 1.2) = (1.2, 0.8, 1.0), detached; A = (1, 1, -2).
    # L = -ŵ A logp = (1.2, 1.6, -1.0); token-mean = 1.8 / 3 = 0.6.
    # ∂L/∂logp = -ŵ A / 3 = (-0.4, -0.8/3, 2/3): the clipped tokens keep their gradient.
    logp = [-1.0, -2.0, -0.5]
    ratios = [1.5, 0.5, 1.0]
    old = [lp - ln(r) for lp, r in zip(logp, ratios, strict=True)]
    inputs = make_inputs([logp], [old], [[1.0, 1.0, -2.0]])
    out, grad = run(inputs, make_cfg("cispo", clip_ratio=0.2))
    assert out.loss.item() == pytest.approx(0.6)
    torch.testing.assert_close(grad, torch.tensor([[-0.4, -0.8 / 3, 2 / 3]]))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(2 / 3)


def test_cispo_range_comes_from_clip_ratio_low_and_high():
    # r = 1.5 with ε_high = 0.6 is inside: weight 1.5, gradient -1.5 · A.
    cfg = make_cfg("cispo", clip_ratio_high=0.6)
    out, grad = run(make_inputs([[-1.0]], [[-1.0 - ln(1.5)]], [[1.0]]), cfg)
    assert grad.item() == pytest.approx(-1.5)
    assert out.metrics[PG_CLIPFRAC] == 0.0


# ---------------------------------------------------------------------------
# Clip-Cov and KL-Cov
#
# Four tokens: logp = (-1, -3, -3, -1), mean -2 → centred (1, -1, -1, 1);
# A = (3, -1, 1, -3), mean 0 → cov = A · centred logp = (3, 1, -1, -3).

COV_LOGP = [[-1.0, -3.0, -3.0, -1.0]]
COV_ADV = [[3.0, -1.0, 1.0, -3.0]]


def test_clip_cov_detaches_tokens_in_the_window():
    # Window [1, 5] holds t0 (cov 3) and t1 (cov 1, on the bound); ratio 0.5 · 4 = 2 tokens.
    # r = 1 everywhere: the vanilla loss is -A / 4 per token, gradient -A / 4 where kept.
    cfg = make_cfg("clip_cov", clip_cov_ratio=0.5, clip_cov_lb=1.0, clip_cov_ub=5.0)
    out, grad = run(make_inputs(COV_LOGP, COV_LOGP, COV_ADV), cfg)
    assert out.loss.item() == pytest.approx(0.0)  # value unchanged: (-3 + 1 - 1 + 3) / 4
    torch.testing.assert_close(grad, torch.tensor([[0.0, 0.0, -0.25, 0.75]]))
    assert out.metrics[CLIP_COV_FRAC] == 0.5
    assert out.metrics[PG_CLIPFRAC_LOWER] == 0.0


def test_clip_cov_picks_at_random_within_the_window_only():
    # ratio 0.25 · 4 = 1 token, drawn from {t0, t1}; seeded draws are reproducible.
    cfg = make_cfg("clip_cov", clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
    picked = []
    for seed in range(20):
        torch.manual_seed(seed)
        _, grad = run(make_inputs(COV_LOGP, COV_LOGP, COV_ADV), cfg)
        zero = (grad[0] == 0).nonzero().flatten().tolist()
        assert len(zero) == 1
        picked.append(zero[0])
        torch.manual_seed(seed)
        _, again = run(make_inputs(COV_LOGP, COV_LOGP, COV_ADV), cfg)
        assert torch.equal(grad, again)
    assert set(picked) == {0, 1}


def test_clip_cov_rounds_the_count_stochastically():
    # ratio 0.125 · 4 = 0.5 token: one token half the time, so small micro-batches still
    # detach the configured fraction on average.
    cfg = make_cfg("clip_cov", clip_cov_ratio=0.125, clip_cov_lb=1.0, clip_cov_ub=5.0)
    torch.manual_seed(0)
    fracs = [
        compute_policy_loss(make_inputs(COV_LOGP, COV_LOGP, COV_ADV), cfg).metrics[CLIP_COV_FRAC]
        for _ in range(200)
    ]
    assert set(fracs) == {0.0, 0.25}
    assert 0.35 < sum(f > 0 for f in fracs) / 200 < 0.65


def test_clip_cov_empty_window_is_vanilla():
    cfg = make_cfg("clip_cov", clip_cov_ratio=1.0, clip_cov_lb=4.0, clip_cov_ub=5.0)
    inputs = random_inputs()
    out, grad = run(inputs, cfg)
    ref_inputs = random_inputs()
    ref, ref_grad = run(ref_inputs, make_cfg("vanilla"))
    assert out.loss.item() == pytest.approx(ref.loss.item())
    torch.testing.assert_close(grad, ref_grad)
    assert out.metrics[CLIP_COV_FRAC] == 0.0


def test_kl_cov_penalises_the_top_covariance_tokens():
    # Top 0.25 · 4 = 1 token by cov: t0. l = (0.1, 0, 0, 0), β = 2.
    #   pg   = -A e^l = (-3 e^0.1, 1, -1, 3)
    #   t0  += β |l| = 0.2
    # loss = (-3 e^0.1 + 0.2 + 1 - 1 + 3) / 4
    # ∂/∂logp: t0 (-3 e^0.1 + β) / 4, then -A / 4 = (1/4, -1/4, 3/4)
    old = [[-1.1, -3.0, -3.0, -1.0]]
    cfg = make_cfg("kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=2.0)
    out, grad = run(make_inputs(COV_LOGP, old, COV_ADV), cfg)
    assert out.loss.item() == pytest.approx((-3 * exp(0.1) + 0.2 + 3) / 4)
    torch.testing.assert_close(grad, torch.tensor([[(-3 * exp(0.1) + 2) / 4, 0.25, -0.25, 0.75]]))
    assert out.metrics[KL_COV_FRAC] == 0.25
    assert out.metrics[PG_CLIPFRAC] == 0.0


def test_kl_cov_penalty_pulls_back_a_token_below_the_old_policy():
    # Same tokens, t0 now at l = -0.1: |l| has gradient -β there, pg -A e^-0.1.
    old = [[-0.9, -3.0, -3.0, -1.0]]
    cfg = make_cfg("kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=2.0)
    _, grad = run(make_inputs(COV_LOGP, old, COV_ADV), cfg)
    assert grad[0, 0].item() == pytest.approx((-3 * exp(-0.1) - 2) / 4)


def test_kl_cov_without_selection_is_the_unclipped_policy_gradient():
    # ratio 0: L = -A r, never clipped: r = 2 with A = 1 gives -2, gradient -2.
    cfg = make_cfg("kl_cov", kl_cov_ratio=0.0)
    out, grad = run(make_inputs([[ln(2.0)]], [[0.0]], [[1.0]]), cfg)
    assert out.loss.item() == pytest.approx(-2.0)
    assert grad.item() == pytest.approx(-2.0)


# ---------------------------------------------------------------------------
# GMPO (geo_mean)


def test_geo_mean_hand_computed_and_gradient():
    # ε = 0.4 in log space both sides.
    #   row 0: A = +1, l = (0.1, 0.5): l' = (0.1, 0.4)  (t1 capped) → L0 = -e^0.25
    #   row 1: A = -1, l = (-0.6, 0.2): l' = (-0.4, 0.2) (t0 floored) → L1 = e^-0.1
    #   row 2: A = -1, l = (0.3): a growing ratio is the pessimistic side for A < 0,
    #          not clipped → L2 = e^0.3
    # loss = (L0 + L1 + L2) / 3 (seq-mean, whatever loss_agg_mode is)
    logp = [[0.1, 0.5], [-0.6, 0.2], [0.3, 0.0]]
    adv = [[1.0, 1.0], [-1.0, -1.0], [-1.0, 0.0]]
    inputs = make_inputs(logp, [[0.0, 0.0]] * 3, adv, [[1, 1], [1, 1], [1, 0]])
    out, grad = run(inputs, make_cfg("geo_mean", clip_ratio=0.4, loss_agg_mode="token-sum"))
    assert out.loss.item() == pytest.approx((-exp(0.25) + exp(-0.1) + exp(0.3)) / 3)
    # unclipped token: ∂/∂logp_t [-A e^{mean l'}] / |S| = -A e^{mean l'} / (|o_i| · 3)
    expected = [
        [-exp(0.25) / 6, 0.0],
        [0.0, exp(-0.1) / 6],
        [exp(0.3) / 3, 0.0],
    ]
    torch.testing.assert_close(grad, torch.tensor(expected))
    assert out.metrics[PG_CLIPFRAC] == pytest.approx(2 / 5)


def test_geo_mean_asymmetric_bounds():
    # ε_low = 0.1 bounds shrinking (A < 0), ε_high = 0.4 bounds growing (A > 0).
    cfg = make_cfg("geo_mean", clip_ratio_low=0.1, clip_ratio_high=0.4)
    neg, _ = run(make_inputs([[-0.3]], [[0.0]], [[-1.0]]), cfg)
    assert neg.loss.item() == pytest.approx(exp(-0.1))
    pos, grad = run(make_inputs([[0.3]], [[0.0]], [[1.0]]), cfg)
    assert pos.loss.item() == pytest.approx(-exp(0.3))
    assert grad.item() == pytest.approx(-exp(0.3))


# ---------------------------------------------------------------------------
# every loss: edge cases and micro-batching


ALL = sorted(names.POLICY_LOSSES)


@pytest.mark.parametrize("mode", ALL)
def test_extreme_log_ratios_stay_finite(mode):
    logp = [[1000.0, -1000.0, 1000.0, -1000.0]]
    inputs = make_inputs(logp, [[0.0] * 4], [[1.0, 1.0, -1.0, -1.0]])
    out, grad = run(inputs, make_cfg(mode, kl_cov_ratio=0.5, clip_cov_ratio=0.5))
    assert math.isfinite(out.loss.item())
    assert torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in out.metrics.values())
    assert abs(out.loss.item()) <= 4 * exp(MAX_LOG_RATIO) + 4 * 1000 * 1.0


@pytest.mark.parametrize("mode", ALL)
def test_garbage_in_padding_is_ignored(mode):
    clean = random_inputs()
    dirty = random_inputs()
    pad = ~dirty.response_mask_BT.bool()
    with torch.no_grad():
        dirty.logprobs_BT[pad] = -math.inf
    dirty.old_logprobs_BT[pad] = math.nan
    dirty.advantages_BT[pad] = math.nan
    cfg = make_cfg(mode)
    torch.manual_seed(0)
    out, grad = run(dirty, cfg)
    torch.manual_seed(0)
    ref, ref_grad = run(clean, cfg)
    assert out.loss.item() == pytest.approx(ref.loss.item())
    torch.testing.assert_close(grad, ref_grad)
    assert out.metrics == pytest.approx(ref.metrics)


@pytest.mark.parametrize("mode", ALL)
def test_all_masked_batch(mode):
    inputs = make_inputs(
        [[0.5, -0.5], [1.0, 2.0]], [[0.0, 0.0]] * 2, [[1.0, -1.0]] * 2, [[0, 0], [0, 0]]
    )
    out, grad = run(inputs, make_cfg(mode))
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros(2, 2))
    assert PG_CLIPFRAC in out.metrics and PPO_KL in out.metrics
    assert all(v == 0.0 for v in out.metrics.values())


@pytest.mark.parametrize("mode", ALL)
def test_all_masked_row_changes_nothing(mode):
    cfg = make_cfg(mode)
    base = random_inputs()
    torch.manual_seed(0)
    ref = compute_policy_loss(base, cfg)
    padded = PolicyLossInputs(
        torch.cat([base.logprobs_BT.detach(), torch.full((1, 6), 3.0)]).requires_grad_(),
        torch.cat([base.old_logprobs_BT, torch.zeros(1, 6)]),
        torch.cat([base.advantages_BT, torch.ones(1, 6)]),
        torch.cat([base.response_mask_BT, torch.zeros(1, 6)]),
    )
    torch.manual_seed(0)
    out, grad = run(padded, cfg)
    assert out.loss.item() == pytest.approx(ref.loss.item())
    assert torch.equal(grad[-1], torch.zeros(6))
    assert out.metrics == pytest.approx(ref.metrics)


@pytest.mark.parametrize("mode", ALL)
def test_zero_advantages_give_zero_loss_and_gradient(mode):
    inputs = random_inputs()
    inputs.advantages_BT = torch.zeros_like(inputs.advantages_BT)
    out, grad = run(inputs, make_cfg(mode, kl_cov_ratio=0.0, clip_cov_ratio=0.0))
    assert out.loss.item() == 0.0
    assert torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize(
    "mode", ["vanilla", "gspo", "gpg", "cispo", "geo_mean", "sapo", "dppo_tv", "dppo_kl"]
)
@pytest.mark.parametrize("agg", sorted(names.LOSS_AGG_MODES))
def test_micro_batches_add_up_to_the_mini_batch(mode, agg):
    # Clip-Cov / KL-Cov select tokens per micro-batch, so only the others are exact.
    cfg = make_cfg(mode, loss_agg_mode=agg)
    full, full_grad = run(random_inputs(), cfg)
    whole = random_inputs()
    scale = LossScale.of(whole.response_mask_BT)
    total = 0.0
    for rows in (slice(0, 1), slice(1, 4)):
        part = PolicyLossInputs(
            whole.logprobs_BT[rows],
            whole.old_logprobs_BT[rows],
            whole.advantages_BT[rows],
            whole.response_mask_BT[rows],
        )
        out = compute_policy_loss(part, cfg, scale)
        out.loss.backward()
        total += out.loss.item()
    assert total == pytest.approx(full.loss.item(), rel=1e-5)
    torch.testing.assert_close(whole.logprobs_BT.grad, full_grad)


@pytest.mark.parametrize("mode", ALL)
def test_ppo_kl_is_mean_old_minus_new(mode):
    # logp = old - 0.1 on every valid token → ppo_kl = 0.1
    inputs = random_inputs()
    with torch.no_grad():
        inputs.logprobs_BT.copy_(inputs.old_logprobs_BT - 0.1)
    out = compute_policy_loss(inputs, make_cfg(mode))
    assert out.metrics[PPO_KL] == pytest.approx(0.1, abs=1e-6)
