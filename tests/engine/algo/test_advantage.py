"""Advantage estimators: hand-computed values, masking, group edge cases, the registry."""

from __future__ import annotations

import math

import pytest
import torch

from engine.algo import names
from engine.algo.advantage import (
    ADVANTAGE_ESTIMATORS,
    EPS,
    AdvantageInputs,
    compute_advantages,
    discounted_returns,
    gae_advantages_and_returns,
)
from engine.algo.masked import masked_whiten
from engine.algo.registry import UnknownNameError
from engine.config import AlgorithmConfig

ATOL = 1e-5


def t(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float32)


def ids(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.long)


def score_rows(scores, lengths, width=3):
    """Rewards and mask with score s_b on the last of L_b valid tokens."""
    rewards = torch.zeros(len(scores), width)
    mask = torch.zeros(len(scores), width)
    for b, (s, n) in enumerate(zip(scores, lengths, strict=True)):
        mask[b, :n] = 1.0
        if n:
            rewards[b, n - 1] = s
    return rewards, mask


def per_row(advantages_BT, mask_BT) -> torch.Tensor:
    """The (constant) value on each row's valid tokens; asserts it is constant."""
    out = []
    for adv, m in zip(advantages_BT, mask_BT.bool(), strict=True):
        vals = adv[m]
        if vals.numel() == 0:
            out.append(0.0)
            continue
        assert torch.allclose(vals, vals[0].expand_as(vals))
        out.append(float(vals[0]))
    return torch.tensor(out)


def full_inputs(rewards, mask, **kw) -> AdvantageInputs:
    """Inputs with every optional field filled, so any estimator runs."""
    batch = rewards.shape[0]
    kw.setdefault("group_ids_B", torch.zeros(batch, dtype=torch.long))
    kw.setdefault("values_BT", torch.full_like(rewards, 0.25))
    kw.setdefault("baseline_rewards_B", torch.full((batch,), 0.5))
    scores = rewards.nan_to_num().sum(-1)  # a sample's components are finite numbers
    kw.setdefault("reward_components_BK", torch.stack([scores, scores**2], 1))
    kw.setdefault("old_logprobs_BT", torch.full_like(rewards, math.log(0.5)))
    kw.setdefault("sum_pi_squared_BT", torch.full_like(rewards, 0.375))
    return AdvantageInputs(token_rewards_BT=rewards, response_mask_BT=mask, **kw)


# ---------------------------------------------------------------------------
# registry


def test_registry_matches_names():
    assert set(ADVANTAGE_ESTIMATORS.names()) == set(names.ADVANTAGE_ESTIMATORS)
    assert len(ADVANTAGE_ESTIMATORS.names()) == len(names.ADVANTAGE_ESTIMATORS)


@pytest.mark.parametrize("name", names.ADVANTAGE_ESTIMATORS)
def test_declared_needs_are_what_each_estimator_requires(name):
    """The trainer fetches values and a greedy baseline only where the declaration says:
    an estimator that needs one fails without it, one that does not runs without it."""
    rewards, mask = score_rows([1.0, 0.0, 0.5, 0.25], [1, 1, 1, 1])
    needs = names.estimator_needs(name)
    groups = torch.tensor([0, 0, 1, 1])
    for missing, needed in (
        ("values_BT", needs.values),
        ("baseline_rewards_B", needs.greedy_baseline),
        ("reward_components_BK", needs.reward_components),
        ("old_logprobs_BT", needs.sum_pi_squared),
        ("sum_pi_squared_BT", needs.sum_pi_squared),
    ):
        inputs = full_inputs(rewards, mask, group_ids_B=groups, **{missing: None})
        if needed:
            with pytest.raises(ValueError, match=missing):
                compute_advantages(name, inputs, AlgorithmConfig())
        else:
            compute_advantages(name, inputs, AlgorithmConfig())


def test_unknown_name_lists_valid_names():
    rewards, mask = score_rows([1.0], [1])
    with pytest.raises(UnknownNameError) as err:
        compute_advantages("nope", full_inputs(rewards, mask), AlgorithmConfig())
    message = str(err.value)
    assert "'nope'" in message
    for name in names.ADVANTAGE_ESTIMATORS:
        assert name in message


def test_compute_advantages_dispatches_by_name():
    rewards, mask = score_rows([1.0, 0.0], [1, 1])
    inputs = full_inputs(rewards, mask)
    out = compute_advantages("remax", inputs, AlgorithmConfig())
    # s - baseline = [1 - 0.5, 0 - 0.5]
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.5, -0.5]))


# ---------------------------------------------------------------------------
# missing or mis-shaped inputs


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("gae", "values_BT"),
        ("grpo", "group_ids_B"),
        ("grpo_passk", "group_ids_B"),
        ("rloo", "group_ids_B"),
        ("reinforce_plus_plus_baseline", "group_ids_B"),
        ("opo", "group_ids_B"),
        ("gpg", "group_ids_B"),
        ("remax", "baseline_rewards_B"),
        ("gdpo", "group_ids_B"),
        ("gdpo", "reward_components_BK"),
    ],
)
def test_missing_input_names_estimator_and_field(name, missing):
    rewards, mask = score_rows([1.0, 0.0], [1, 2])
    inputs = full_inputs(rewards, mask, **{missing: None})
    with pytest.raises(ValueError, match=rf"'{name}'.*{missing}"):
        compute_advantages(name, inputs, AlgorithmConfig())


def test_shape_mismatch_is_a_value_error():
    rewards, mask = score_rows([1.0, 0.0], [1, 2])
    with pytest.raises(ValueError, match="response_mask_BT"):
        compute_advantages("grpo", full_inputs(rewards, mask[:, :2]), AlgorithmConfig())
    with pytest.raises(ValueError, match="group_ids_B"):
        compute_advantages(
            "grpo", full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1])), AlgorithmConfig()
        )


# ---------------------------------------------------------------------------
# properties every estimator shares


@pytest.mark.parametrize("name", names.ADVANTAGE_ESTIMATORS)
def test_masked_tokens_and_empty_rows_are_zero_not_nan(name):
    # Row 2 has no valid token; row 1 has a masked token in the middle. Masked slots hold
    # junk (NaN rewards, NaN values) that must never be read.
    rewards = t([[0.0, 1.0, 0.0], [0.0, float("nan"), 0.5], [float("nan")] * 3])
    mask = t([[1, 1, 0], [1, 0, 1], [0, 0, 0]])
    values = t([[0.1, 0.2, float("nan")], [0.3, float("nan"), 0.4], [float("nan")] * 3])
    inputs = full_inputs(rewards, mask, values_BT=values, group_ids_B=ids([0, 0, 0]))
    out = compute_advantages(name, inputs, AlgorithmConfig(gamma=0.9, lam=0.8))
    for x in (out.advantages_BT, out.returns_BT):
        assert x.shape == rewards.shape
        assert torch.isfinite(x).all()
        assert (x[mask == 0] == 0).all()


@pytest.mark.parametrize("name", names.ADVANTAGE_ESTIMATORS)
def test_all_masked_batch_gives_zeros(name):
    rewards = torch.ones(2, 3)
    mask = torch.zeros(2, 3)
    out = compute_advantages(name, full_inputs(rewards, mask), AlgorithmConfig())
    assert (out.advantages_BT == 0).all()
    assert (out.returns_BT == 0).all()


@pytest.mark.parametrize("name", names.ADVANTAGE_ESTIMATORS)
def test_outputs_are_not_differentiated(name):
    rewards, mask = score_rows([1.0, 0.0], [2, 3])
    rewards.requires_grad_(True)
    values = torch.full_like(rewards, 0.25, requires_grad=True)
    inputs = full_inputs(rewards, mask.bool(), values_BT=values)  # bool masks work too
    out = compute_advantages(name, inputs, AlgorithmConfig())
    assert not out.advantages_BT.requires_grad
    assert not out.returns_BT.requires_grad


# ---------------------------------------------------------------------------
# GAE


def test_gae_core_hand_computed():
    # γ = 0.5, λ = 0.5, r = [0, 0, 1], V = [0.5, 0.5, 0.5], V after the end = 0.
    # t=2: δ = 1 + 0.5·0 − 0.5 = 0.5;         A = 0.5
    # t=1: δ = 0 + 0.5·0.5 − 0.5 = −0.25;     A = −0.25 + 0.25·0.5 = −0.125
    # t=0: δ = −0.25;                         A = −0.25 + 0.25·(−0.125) = −0.28125
    # R = A + V = [0.21875, 0.375, 1.0]
    adv, ret = gae_advantages_and_returns(
        t([[0.0, 0.0, 1.0]]), t([[0.5, 0.5, 0.5]]), t([[1, 1, 1]]), gamma=0.5, lam=0.5
    )
    assert torch.allclose(adv, t([[-0.28125, -0.125, 0.5]]), atol=ATOL)
    assert torch.allclose(ret, t([[0.21875, 0.375, 1.0]]), atol=ATOL)


def test_gae_gamma_lam_one_is_return_minus_value():
    torch.manual_seed(0)
    rewards = torch.randn(3, 6)
    values = torch.randn(3, 6)
    mask = t([[1] * 6, [1, 1, 1, 1, 0, 0], [1, 0, 0, 0, 0, 0]])
    adv, ret = gae_advantages_and_returns(rewards, values, mask, gamma=1.0, lam=1.0)
    # Undiscounted reward-to-go over each row's valid tokens.
    reward_to_go = torch.flip(torch.cumsum(torch.flip(rewards * mask, [1]), 1), [1]) * mask
    assert torch.allclose(adv, (reward_to_go - values) * mask, atol=ATOL)
    assert torch.allclose(ret, reward_to_go, atol=ATOL)


def test_gae_multi_turn_mask_is_invariant_to_removed_tokens():
    # A valid sequence of 4 tokens, then the same with a 2-token tool segment inserted
    # after token 1 (with junk rewards/values the recursion must not read).
    gamma, lam = 0.9, 0.7
    r = t([[0.1, -0.2, 0.3, 1.0]])
    v = t([[0.4, 0.2, -0.1, 0.5]])
    adv, ret = gae_advantages_and_returns(r, v, torch.ones(1, 4), gamma, lam)

    r_mt = t([[0.1, -0.2, 5.0, -7.0, 0.3, 1.0]])
    v_mt = t([[0.4, 0.2, 9.0, 3.0, -0.1, 0.5]])
    m_mt = t([[1, 1, 0, 0, 1, 1]])
    adv_mt, ret_mt = gae_advantages_and_returns(r_mt, v_mt, m_mt, gamma, lam)

    keep = m_mt[0].bool()
    assert torch.allclose(adv_mt[0, keep], adv[0], atol=ATOL)
    assert torch.allclose(ret_mt[0, keep], ret[0], atol=ATOL)
    assert (adv_mt[0, ~keep] == 0).all() and (ret_mt[0, ~keep] == 0).all()
    # Zeroing the tool segment instead of skipping it would give something else:
    adv_zeroed, _ = gae_advantages_and_returns(
        r_mt * m_mt, v_mt * m_mt, torch.ones(1, 6), gamma, lam
    )
    assert not torch.allclose(adv_zeroed[0, keep], adv[0], atol=ATOL)


def test_gae_estimator_whitens_advantages_and_keeps_raw_returns():
    rewards = t([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = t([[0.5, 0.5, 0.5], [0.2, 0.1, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    cfg = AlgorithmConfig(gamma=0.5, lam=0.5)
    out = compute_advantages("gae", full_inputs(rewards, mask, values_BT=values), cfg)

    raw_adv, raw_ret = gae_advantages_and_returns(rewards, values, mask, 0.5, 0.5)
    assert torch.allclose(out.returns_BT, raw_ret, atol=ATOL)
    assert torch.allclose(out.advantages_BT, masked_whiten(raw_adv, mask), atol=ATOL)
    valid = out.advantages_BT[mask.bool()]
    assert abs(float(valid.mean())) < ATOL
    assert abs(float(valid.std(unbiased=True)) - 1.0) < 1e-4
    # Row 0 is the hand-computed case above.
    assert torch.allclose(raw_adv[0], t([-0.28125, -0.125, 0.5]), atol=ATOL)


# ---------------------------------------------------------------------------
# GRPO and Dr.GRPO


def test_grpo_hand_computed_unbiased_std_and_singleton():
    # Group 0 scores [1, 0, 0]: mean 1/3; unbiased var = ((2/3)² + 2·(1/3)²)/2 = 1/3,
    # std = 0.57735 → A = [0.6667/0.57735, −0.3333/0.57735] = [1.15470, −0.57735].
    # (A biased std, sqrt(2/9) = 0.4714, would give [1.41421, −0.70711].)
    # Group 1 is a singleton with score 0.5: mean 0, std 1 → A = 0.5.
    # The score is a sum of token rewards: row 0 is 1.2 − 0.1 − 0.1 (a spread KL penalty).
    rewards = t([[-0.1, -0.1, 1.2], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [0.0, 0.5, 0.0]])
    mask = t([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 0]])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([7, 7, 7, 3]))
    out = compute_advantages("grpo", inputs, AlgorithmConfig())
    expected = t([1.1547005, -0.5773503, -0.5773503, 0.5])
    assert torch.allclose(per_row(out.advantages_BT, mask), expected, atol=ATOL)
    assert torch.allclose(out.returns_BT, out.advantages_BT)


def test_grpo_two_samples_distinguishes_unbiased_std():
    # [1, 0]: mean 0.5, unbiased std sqrt(0.5) = 0.70711 → A = ±0.70711 (biased: ±1).
    rewards, mask = score_rows([1.0, 0.0], [1, 1])
    out = compute_advantages(
        "grpo", full_inputs(rewards, mask, group_ids_B=ids([0, 0])), AlgorithmConfig()
    )
    expected = t([0.5 / (math.sqrt(0.5) + EPS), -0.5 / (math.sqrt(0.5) + EPS)])
    assert torch.allclose(per_row(out.advantages_BT, mask), expected, atol=1e-6)


def test_dr_grpo_switch_drops_std():
    # Dr.GRPO: A = s − mean_g. Group [1, 0, 0] → [2/3, −1/3, −1/3].
    rewards, mask = score_rows([1.0, 0.0, 0.0], [3, 2, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 0]))
    out = compute_advantages("grpo", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.allclose(per_row(out.advantages_BT, mask), t([2 / 3, -1 / 3, -1 / 3]))


def test_grpo_equal_rewards_give_zero_not_nan():
    rewards, mask = score_rows([1.0, 1.0, 0.0, 0.0], [1, 2, 3, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1, 1]))
    out = compute_advantages("grpo", inputs, AlgorithmConfig())
    assert torch.isfinite(out.advantages_BT).all()
    assert (out.advantages_BT == 0).all()


def test_grpo_padding_rows_do_not_enter_group_statistics():
    # [1, 0] plus an all-masked row in the same group: same as [1, 0] alone, A = ±0.70711.
    rewards, mask = score_rows([1.0, 0.0, 0.0], [1, 1, 0])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 0]))
    out = compute_advantages("grpo", inputs, AlgorithmConfig())
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.70711, -0.70711, 0.0]), atol=ATOL)


# ---------------------------------------------------------------------------
# grpo_passk


def test_grpo_passk_hand_computed():
    # Group 0: [0.5, 1, 0] → best is row 1, margin 1 − 0.5 = 0.5; unbiased std of
    #   {0.5, 1, 0}: mean 0.5, var (0 + 0.25 + 0.25)/2 = 0.25, std 0.5 → A = 0.5/0.5 = 1.
    # Group 1: [1, 1]: tie for the best → margin 0 for everyone.
    # Group 2: singleton [0.75]: runner-up 0, scale 1 → A = 0.75.
    rewards, mask = score_rows([0.5, 1.0, 0.0, 1.0, 1.0, 0.75], [1, 2, 3, 1, 2, 3])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 0, 1, 1, 2]))
    out = compute_advantages("grpo_passk", inputs, AlgorithmConfig())
    expected = t([0.0, 0.5 / (0.5 + EPS), 0.0, 0.0, 0.0, 0.75])
    assert torch.allclose(per_row(out.advantages_BT, mask), expected, atol=ATOL)

    no_std = compute_advantages(
        "grpo_passk", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False)
    )
    assert torch.allclose(
        per_row(no_std.advantages_BT, mask), t([0.0, 0.5, 0.0, 0.0, 0.0, 0.75]), atol=ATOL
    )


def test_grpo_passk_groups_need_not_be_contiguous():
    # Rows 0 and 2 are group 5 ([0, 3] → best row 2, margin 3); rows 1, 3 group 9 ([2, 1]).
    rewards, mask = score_rows([0.0, 2.0, 3.0, 1.0], [1, 1, 1, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([5, 9, 5, 9]))
    out = compute_advantages("grpo_passk", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.0, 1.0, 3.0, 0.0]))


# ---------------------------------------------------------------------------
# RLOO


def test_rloo_hand_computed():
    # Group 0: [1, 0, 0, 1]: A_0 = 1 − mean(0, 0, 1) = 2/3; A_1 = 0 − mean(0, 1, 1) = −2/3
    #   (= 4/3 · (s − 0.5)).
    # Group 1: singleton [0.25] → no baseline, A = 0.25.
    rewards, mask = score_rows([1.0, 0.0, 0.0, 1.0, 0.25], [1, 2, 3, 3, 2])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 0, 0, 1]))
    # The std switch has no effect on RLOO.
    out = compute_advantages("rloo", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=True))
    expected = t([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.25])
    assert torch.allclose(per_row(out.advantages_BT, mask), expected, atol=ATOL)


# ---------------------------------------------------------------------------
# ReMax


def test_remax_hand_computed():
    # s = [1, 0.5 + 0.25 = 0.75]; greedy baseline [0.5, 1] → A = [0.5, −0.25].
    rewards = t([[0.0, 1.0, 0.0], [0.5, 0.0, 0.25]])
    mask = t([[1, 1, 0], [1, 1, 1]])
    inputs = AdvantageInputs(rewards, mask, baseline_rewards_B=t([0.5, 1.0]))
    out = compute_advantages("remax", inputs, AlgorithmConfig())
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.5, -0.25]))
    assert torch.allclose(out.returns_BT, out.advantages_BT)


# ---------------------------------------------------------------------------
# REINFORCE++


def test_discounted_returns_hand_computed_and_skip_masked():
    # γ = 0.5, r = [0, 2] → G = [0 + 0.5·2, 2] = [1, 2]; a masked token in between
    # (reward 9) is skipped, not counted and not discounted over.
    ret = discounted_returns(t([[0.0, 9.0, 2.0]]), t([[1, 0, 1]]), gamma=0.5)
    assert torch.allclose(ret, t([[1.0, 0.0, 2.0]]))


def test_reinforce_plus_plus_hand_computed():
    # γ = 0.5. Row 0: r = [0, 2] → G = [1, 2]. Row 1: r = [0] → G = [0].
    # Valid G = {1, 2, 0}: mean 1, unbiased var (0 + 1 + 1)/2 = 1 → A = [[0, 1], [−1]].
    rewards = t([[0.0, 2.0], [0.0, 0.0]])
    mask = t([[1, 1], [1, 0]])
    out = compute_advantages(
        "reinforce_plus_plus", AdvantageInputs(rewards, mask), AlgorithmConfig(gamma=0.5)
    )
    assert torch.allclose(out.returns_BT, t([[1.0, 2.0], [0.0, 0.0]]))
    assert torch.allclose(out.advantages_BT, t([[0.0, 1.0], [-1.0, 0.0]]), atol=ATOL)


def test_reinforce_plus_plus_baseline_hand_computed():
    # Group 0 [1, 0] → s − mean = [0.5, −0.5]; group 1 [1, 1] → [0, 0].
    # Row 0 has 2 tokens, the others 1: tokens {0.5, 0.5, −0.5, 0, 0}, mean 0.1,
    # deviations {0.4, 0.4, −0.6, −0.1, −0.1}, squares sum 0.70, unbiased var 0.70/4 = 0.175,
    # std 0.418330 → A = [0.956183, −1.434274, −0.239046, −0.239046].
    rewards, mask = score_rows([1.0, 0.0, 1.0, 1.0], [2, 1, 1, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1, 1]))
    out = compute_advantages("reinforce_plus_plus_baseline", inputs, AlgorithmConfig())
    expected = t([0.956183, -1.434274, -0.239046, -0.239046])
    assert torch.allclose(per_row(out.advantages_BT, mask), expected, atol=ATOL)


# ---------------------------------------------------------------------------
# OPO


def test_opo_hand_computed():
    # Group 0: scores [1, 0], lengths [2, 4] → b = (2·1 + 4·0)/6 = 1/3 → A = [2/3, −1/3].
    #   (An unweighted mean, 0.5, would give ±0.5.)
    # Group 1: singleton [0.5] → b = 0 → A = 0.5.
    rewards, mask = score_rows([1.0, 0.0, 0.5], [2, 4, 1], width=4)
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1]))
    out = compute_advantages("opo", inputs, AlgorithmConfig())
    assert torch.allclose(per_row(out.advantages_BT, mask), t([2 / 3, -1 / 3, 0.5]), atol=ATOL)


# ---------------------------------------------------------------------------
# GPG


def test_gpg_hand_computed():
    # Group 0 [1, 0] (informative), group 1 [1, 1] (all equal): B = 4, M = 2, α = 2.
    # No std: A = 2·(s − mean) = [1, −1, 0, 0].
    # With std: group 0 std = sqrt(0.5) → A = 2·(±0.5)/0.70711 = ±1.41421.
    rewards, mask = score_rows([1.0, 0.0, 1.0, 1.0], [1, 2, 3, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1, 1]))
    out = compute_advantages("gpg", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.allclose(per_row(out.advantages_BT, mask), t([1.0, -1.0, 0.0, 0.0]), atol=ATOL)

    out_std = compute_advantages("gpg", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=True))
    s = 2 * 0.5 / (math.sqrt(0.5) + EPS)
    assert torch.allclose(per_row(out_std.advantages_BT, mask), t([s, -s, 0.0, 0.0]), atol=ATOL)


def test_gpg_alpha_is_one_when_no_group_is_informative():
    # All groups equal (M = 0): α = 1; a singleton counts as all-equal, A = α·s = 0.5.
    rewards, mask = score_rows([1.0, 1.0, 0.5], [1, 1, 1])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1]))
    out = compute_advantages("gpg", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.0, 0.0, 0.5]))


def test_gpg_alpha_counts_singletons_and_ignores_padding_rows():
    # Group 0 [1, 0] informative (M = 2); group 1 singleton [0.5] (not informative);
    # row 3 is padding (not a sample). B = 3 → α = 3/2.
    # A = 1.5·[0.5, −0.5, 0.5] = [0.75, −0.75, 0.75].
    rewards, mask = score_rows([1.0, 0.0, 0.5, 0.0], [1, 1, 1, 0])
    inputs = full_inputs(rewards, mask, group_ids_B=ids([0, 0, 1, 2]))
    out = compute_advantages("gpg", inputs, AlgorithmConfig(norm_adv_by_std_in_grpo=False))
    assert torch.allclose(per_row(out.advantages_BT, mask), t([0.75, -0.75, 0.75, 0.0]))


# ---------------------------------------------------------------------------
# GDPO


def gdpo_inputs(components, lengths, groups):
    rewards, mask = score_rows([0.0] * len(lengths), lengths)
    return AdvantageInputs(
        token_rewards_BT=rewards,
        response_mask_BT=mask,
        group_ids_B=ids(groups),
        reward_components_BK=t(components),
    )


def test_gdpo_hand_computed_keeps_reward_combinations_apart():
    # Two groups of two one-token samples, two 0/1 rewards:
    #   group 0: (0,1), (1,1)    group 1: (0,0), (1,1)
    # GRPO on the sums (1, 2 | 0, 2) gives both groups ±0.7071. Per component (n = 2,
    # unbiased std of {0, 1} = 0.7071, so a 0/1 pair normalises to ∓0.7071):
    #   group 0: c1 → (−0.7071, +0.7071), c2 equal → 0;       A' = (−0.7071, +0.7071)
    #   group 1: c1 → (−0.7071, +0.7071), c2 → (−0.7071, +0.7071); A' = (−1.4142, +1.4142)
    # Whitened over the 4 tokens: mean 0, unbiased var = (2·0.5 + 2·2) / 3 = 5/3,
    # std = 1.290994 → (∓0.547723 | ∓1.095445).
    inputs = gdpo_inputs([[0, 1], [1, 1], [0, 0], [1, 1]], [1, 1, 1, 1], [0, 0, 1, 1])
    out = compute_advantages("gdpo", inputs, AlgorithmConfig())
    expected = t([-0.547723, 0.547723, -1.095445, 1.095445])
    assert torch.allclose(per_row(out.advantages_BT, inputs.response_mask_BT), expected, atol=ATOL)
    assert torch.equal(out.returns_BT, out.advantages_BT)
    grpo_inputs = AdvantageInputs(
        token_rewards_BT=score_rows([1.0, 2.0, 0.0, 2.0], [1] * 4)[0],
        response_mask_BT=inputs.response_mask_BT,
        group_ids_B=ids([0, 0, 1, 1]),
    )
    grpo_adv = per_row(
        compute_advantages("grpo", grpo_inputs, AlgorithmConfig()).advantages_BT,
        inputs.response_mask_BT,
    )
    assert torch.allclose(grpo_adv[:2], grpo_adv[2:])  # GRPO cannot tell the groups apart


def test_gdpo_weights_and_dr_grpo_switch():
    # One group of three one-token samples, components (c1, c2), weights (2, 0.5), no std:
    #   c1 = (1, 0, 2): mean 1 → (0, −1, 1)       c2 = (0, 4, 2): mean 2 → (−2, 2, 0)
    #   A' = 2·(0, −1, 1) + 0.5·(−2, 2, 0) = (−1, −1, 2)
    # Whitened: mean 0, unbiased var = (1 + 1 + 4) / 2 = 3, std = 1.732051
    #   → (−0.577350, −0.577350, 1.154701)
    inputs = gdpo_inputs([[1, 0], [0, 4], [2, 2]], [1, 1, 1], [0, 0, 0])
    cfg = AlgorithmConfig(norm_adv_by_std_in_grpo=False, gdpo_reward_weights=[2.0, 0.5])
    out = compute_advantages("gdpo", inputs, cfg)
    expected = t([-0.577350, -0.577350, 1.154701])
    assert torch.allclose(per_row(out.advantages_BT, inputs.response_mask_BT), expected, atol=ATOL)


def test_gdpo_whitening_weighs_tokens():
    # One component; group 0 = rows 0, 1 (c = 1, 0), row 2 a singleton with c = 0.
    # A' = (0.7071, −0.7071 | 0) before whitening; row 0 has 2 tokens, rows 1, 2 one each.
    # Tokens: (0.7071, 0.7071, −0.7071, 0): mean 0.176777, unbiased var = Σ(x − m)² / 3
    #   = (2·0.530330² + 0.883883² + 0.176777²) / 3 = (0.5625 + 0.78125 + 0.03125) / 3 = 0.458333
    #   std = 0.677003 → row 0: 0.783349, row 1: −1.305582, row 2: −0.261116
    inputs = gdpo_inputs([[1.0], [0.0], [0.0]], [2, 1, 1], [0, 0, 1])
    out = compute_advantages("gdpo", inputs, AlgorithmConfig())
    expected = t([0.783349, -1.305582, -0.261116])
    assert torch.allclose(per_row(out.advantages_BT, inputs.response_mask_BT), expected, atol=ATOL)


def test_gdpo_equal_components_give_zero_and_padding_rows_are_ignored():
    # Every component equal within its group: all advantages 0 (not NaN). Row 2 has no
    # valid token and NaN components: it counts in no group and gets 0.
    inputs = gdpo_inputs([[1, 3], [1, 3], [float("nan"), float("nan")]], [1, 2, 0], [0, 0, 0])
    out = compute_advantages("gdpo", inputs, AlgorithmConfig())
    assert torch.equal(out.advantages_BT, torch.zeros_like(out.advantages_BT))


def test_gdpo_weights_must_match_the_components():
    inputs = gdpo_inputs([[1, 0], [0, 1]], [1, 1], [0, 0])
    with pytest.raises(ValueError, match="3 gdpo_reward_weights for 2 reward components"):
        compute_advantages("gdpo", inputs, AlgorithmConfig(gdpo_reward_weights=[1.0, 1.0, 1.0]))
