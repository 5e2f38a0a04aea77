"""The optimal token baseline: hand-computed baselines, the zero tail, the multi-turn
alignment, TIS weights. Masking, empty rows and the registry are covered for every
estimator in test_advantage.py."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo.advantage import AdvantageInputs, compute_advantages
from engine.config import AlgorithmConfig

OTB = "optimal_token_baseline"
TIR = "tir_optimal_token_baseline"
CFG = AlgorithmConfig()


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def otb_inputs(rewards, mask, pi, sum_sq, groups, is_weights=None) -> AdvantageInputs:
    """π_old(o_t) and Σπ² given directly, so that w_t = 1 − 2π_t + Σπ²_t is chosen."""
    pi_t = t(pi)
    return AdvantageInputs(
        token_rewards_BT=t(rewards),
        response_mask_BT=t(mask),
        group_ids_B=torch.tensor(groups),
        old_logprobs_BT=torch.log(pi_t),
        sum_pi_squared_BT=t(sum_sq),
        is_weights_BT=None if is_weights is None else t(is_weights),
    )


def test_hand_computed_with_the_zero_tail():
    # One group. Row 0: 3 tokens, π = 0.5, Σπ² = 0.5 → w = 1 − 1 + 0.5 = 0.5, W = (0.5, 1, 1.5),
    # score 1 on its last token, so G = (1, 1, 1). Row 1: 2 tokens, π = 0.25, Σπ² = 0.25 →
    # w = 1 − 0.5 + 0.25 = 0.75, W = (0.75, 1.5), score 0, G = (0, 0).
    #   B_0 = (0.5·1 + 0.75·0) / (0.5 + 0.75) = 0.4
    #   B_1 = (1·1 + 1.5·0) / (1 + 1.5) = 0.4
    #   B_2: row 0 alone, past the second-longest length 2: the zero tail, B = 0
    # A = (0.6, 0.6, 1.0 | −0.4, −0.4); returns = G.
    inputs = otb_inputs(
        rewards=[[0, 0, 1], [0, 0, 0]],
        mask=[[1, 1, 1], [1, 1, 0]],
        pi=[[0.5] * 3, [0.25, 0.25, 0.9]],
        sum_sq=[[0.5] * 3, [0.25, 0.25, 0.9]],
        groups=[0, 0],
    )
    out = compute_advantages(OTB, inputs, CFG)
    torch.testing.assert_close(out.advantages_BT, t([[0.6, 0.6, 1.0], [-0.4, -0.4, 0.0]]))
    torch.testing.assert_close(out.returns_BT, t([[1, 1, 1], [0, 0, 0]]))


def test_baseline_changes_along_the_sequence_and_with_tis_weights():
    # One group of three 2-token samples, scores 1, 0, 0 on the last token: G_a = (1, 1),
    # G_b = G_c = (0, 0).
    #   a: π = (0.5, 0.8), Σπ² = (0.5, 0.7)  → w = (0.5, 0.1),  W = (0.5, 0.6)
    #   b: π = (0.1, 0.2), Σπ² = (0.3, 0.3)  → w = (1.1, 0.9),  W = (1.1, 2.0)
    #   c: π = (0.9, 0.6), Σπ² = (0.82, 0.4) → w = (0.02, 0.2), W = (0.02, 0.22)
    #   B_0 = 0.5 / (0.5 + 1.1 + 0.02) = 0.5 / 1.62 = 0.308642
    #   B_1 = 0.6 / (0.6 + 2.0 + 0.22) = 0.6 / 2.82 = 0.212766
    # A_a = (0.691358, 0.787234), A_b = A_c = (−0.308642, −0.212766).
    kwargs = dict(
        rewards=[[0, 1], [0, 0], [0, 0]],
        mask=[[1, 1]] * 3,
        pi=[[0.5, 0.8], [0.1, 0.2], [0.9, 0.6]],
        sum_sq=[[0.5, 0.7], [0.3, 0.3], [0.82, 0.4]],
        groups=[0, 0, 0],
    )
    out = compute_advantages(OTB, otb_inputs(**kwargs), CFG)
    b0, b1 = 0.5 / 1.62, 0.6 / 2.82
    assert (b0, b1) == pytest.approx((0.308642, 0.212766), abs=1e-6)
    expected = t([[1 - b0, 1 - b1], [-b0, -b1], [-b0, -b1]])
    torch.testing.assert_close(out.advantages_BT, expected)
    # TIS weights ρ_b = (2, 1) scale b's w by ρ²: w_b = (4.4, 0.9), W_b = (4.4, 5.3):
    #   B_0 = 0.5 / (0.5 + 4.4 + 0.02) = 0.101626,  B_1 = 0.6 / (0.6 + 5.3 + 0.22) = 0.098039
    rho = [[1.0, 1.0], [2.0, 1.0], [1.0, 1.0]]
    out = compute_advantages(OTB, otb_inputs(**kwargs, is_weights=rho), CFG)
    b0, b1 = 0.5 / 4.92, 0.6 / 6.12
    assert (b0, b1) == pytest.approx((0.101626, 0.098039), abs=1e-6)
    torch.testing.assert_close(out.advantages_BT[:, 1], t([1 - b1, -b1, -b1]))
    torch.testing.assert_close(out.advantages_BT[:, 0], t([1 - b0, -b0, -b0]))


@pytest.mark.parametrize("name", [OTB, TIR])
def test_equal_weights_give_the_group_mean(name):
    # Equal lengths and the same w everywhere: B_t is the plain mean of G_t, so A = s − mean
    # (Dr.GRPO's advantage) on every token. Scores 3, 1, 2 → mean 2 → A = (1, −1, 0).
    inputs = otb_inputs(
        rewards=[[0, 3], [0, 1], [0, 2]],
        mask=[[1, 1]] * 3,
        pi=[[0.3, 0.6]] * 3,
        sum_sq=[[0.4, 0.5]] * 3,
        groups=[0, 0, 0],
    )
    out = compute_advantages(name, inputs, CFG)
    torch.testing.assert_close(out.advantages_BT, t([[1, 1], [-1, -1], [0, 0]]))
    grpo = compute_advantages("grpo", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    torch.testing.assert_close(out.advantages_BT, grpo.advantages_BT)


def test_multi_turn_alignment():
    # Row 0 has a tool token at t = 1 (masked); its valid tokens t = 0, 2, 3 carry
    # π = Σπ² = 0.5 (w = 0.5, W = 0.5, 1.0, 1.5) and score 1 on t = 3, so G = 1 on each.
    # Row 1: 2 tokens with w = 0.75 (W = 0.75, 1.5), score 0.
    #
    # tir_optimal_token_baseline compares the k-th valid tokens: exactly the first test
    # with the tool token removed: A_0 = (0.6, ·, 0.6, 1.0), A_1 = (−0.4, −0.4).
    #
    # optimal_token_baseline compares positions:
    #   t = 0: rows 0 and 1 → B = 0.5 / 1.25 = 0.4
    #   t = 1: only row 1 (row 0's token is masked) → B = 1.5·0 / 1.5 = 0, A_1 = 0
    #   t ≥ 2: row 0's positions past the second-longest length 2: zero tail, B = 0, A = 1
    mask = [[1, 0, 1, 1], [1, 1, 0, 0]]
    kwargs = dict(
        rewards=[[0, 0, 0, 1], [0, 0, 0, 0]],
        mask=mask,
        pi=[[0.5] * 4, [0.25] * 4],
        sum_sq=[[0.5] * 4, [0.25] * 4],
        groups=[7, 7],
    )
    tir = compute_advantages(TIR, otb_inputs(**kwargs), CFG)
    torch.testing.assert_close(tir.advantages_BT, t([[0.6, 0, 0.6, 1.0], [-0.4, -0.4, 0, 0]]))
    flat = compute_advantages(OTB, otb_inputs(**kwargs), CFG)
    torch.testing.assert_close(flat.advantages_BT, t([[0.6, 0, 1.0, 1.0], [-0.4, 0.0, 0, 0]]))
    for out in (tir, flat):
        torch.testing.assert_close(out.returns_BT, t([[1, 0, 1, 1], [0, 0, 0, 0]]))


@pytest.mark.parametrize("name", [OTB, TIR])
def test_singletons_ties_and_separate_groups(name):
    # Group 0: two samples of the same (longest) length: no zero tail, B = the W-weighted
    # mean at each position (equal w here: the mean, 0.5). Group 5: one sample: no
    # baseline, A = G = 2. Group 9: a padding row only: zeros. Groups do not mix.
    inputs = otb_inputs(
        rewards=[[0, 1], [0, 0], [0, 2], [0, 0]],
        mask=[[1, 1], [1, 1], [1, 1], [0, 0]],
        pi=[[0.5, 0.5]] * 4,
        sum_sq=[[0.5, 0.5]] * 4,
        groups=[0, 0, 5, 9],
    )
    out = compute_advantages(name, inputs, CFG)
    expected = t([[0.5, 0.5], [-0.5, -0.5], [2, 2], [0, 0]])
    torch.testing.assert_close(out.advantages_BT, expected)


@pytest.mark.parametrize("name", [OTB, TIR])
def test_zero_weights_stay_finite(name):
    # A certain token (π = 1, Σπ² = 1) has w = 0; a group whose W is 0 everywhere divides
    # 0 by 1e-8: B = 0, A = G.
    inputs = otb_inputs(
        rewards=[[0, 1], [0, 0]],
        mask=[[1, 1], [1, 1]],
        pi=[[1.0, 1.0]] * 2,
        sum_sq=[[1.0, 1.0]] * 2,
        groups=[0, 0],
    )
    out = compute_advantages(name, inputs, CFG)
    assert torch.isfinite(out.advantages_BT).all()
    torch.testing.assert_close(out.advantages_BT, t([[1, 1], [0, 0]]))


@pytest.mark.parametrize("name", [OTB, TIR])
@pytest.mark.parametrize("missing", ["group_ids_B", "old_logprobs_BT", "sum_pi_squared_BT"])
def test_missing_input_names_the_field(name, missing):
    inputs = otb_inputs([[0, 1]], [[1, 1]], [[0.5, 0.5]], [[0.5, 0.5]], [0])
    setattr(inputs, missing, None)
    with pytest.raises(ValueError, match=rf"'{name}'.*{missing}"):
        compute_advantages(name, inputs, CFG)


def test_the_weight_reads_pi_from_the_old_log_probs():
    # w = 1 − 2·exp(old_logprob) + Σπ²:
    #   a: log π = −1, Σπ² = 0.2: w = 1 − 2·0.367879 + 0.2 = 0.464241, score 1
    #   b: log π = ln 0.5, Σπ² = 0.5: w = 0.5,                         score 0
    # B = 0.464241 / 0.964241 = 0.481457 → A = (0.518543, −0.481457)
    inputs = AdvantageInputs(
        token_rewards_BT=t([[1.0], [0.0]]),
        response_mask_BT=t([[1], [1]]),
        group_ids_B=torch.tensor([0, 0]),
        old_logprobs_BT=t([[-1.0], [math.log(0.5)]]),
        sum_pi_squared_BT=t([[0.2], [0.5]]),
    )
    out = compute_advantages(OTB, inputs, CFG)
    w_a = 1 - 2 * math.exp(-1) + 0.2
    b = w_a / (w_a + 0.5)
    assert (w_a, b) == pytest.approx((0.464241, 0.481457), abs=1e-6)
    torch.testing.assert_close(out.advantages_BT, t([[1 - b], [-b]]))
