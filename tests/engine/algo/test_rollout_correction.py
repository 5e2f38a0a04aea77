"""Rollout-vs-training mismatch metrics and truncated importance sampling, by hand."""

import math

import pytest
import torch

from engine.algo.policy_loss import PolicyLossInputs, compute_policy_loss
from engine.algo.rollout_correction import (
    is_weight_metrics,
    mismatch_metrics,
    ragged_to_padded,
    rollout_is_weights,
)
from engine.config import ActorConfig, load_config

# Probabilities the training forward (π_old) and the engine (π_rollout) gave 3 tokens
# of one response, and a second row: 2 tokens, then padding.
P_OLD = [[0.5, 0.2, 0.9], [0.8, 0.4, 0.3]]
P_ROLLOUT = [[0.25, 0.4, 0.9], [0.2, 0.4, 0.6]]
MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])


def _log(p):
    return torch.tensor(p).log()


def test_token_level_weights_are_the_ratio_capped():
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "token", threshold=1.5)
    # ratios 0.5/0.25 = 2 -> capped at 1.5; 0.2/0.4 = 0.5; 1; 0.8/0.2 = 4 -> 1.5; 1; padding 0
    assert torch.allclose(w, torch.tensor([[1.5, 0.5, 1.0], [1.5, 1.0, 0.0]]))


def test_sequence_level_weights_are_the_row_product_capped():
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "sequence", threshold=2.0)
    # row 0: 2 x 0.5 x 1 = 1; row 1: 4 x 1 = 4 -> 2 (the padded token's ratio 0.5 is left out)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [2.0, 2.0, 0.0]]))


def test_weights_carry_no_gradient_and_survive_extreme_ratios():
    old = _log(P_OLD).requires_grad_()
    rollout = torch.full((2, 3), -200.0)  # the engine found these tokens all but impossible
    w = rollout_is_weights(old, rollout, MASK, "token", threshold=2.0)
    assert not w.requires_grad
    assert torch.equal(w, torch.tensor([[2.0, 2.0, 2.0], [2.0, 2.0, 0.0]]))
    with pytest.raises(ValueError, match="token, sequence"):
        rollout_is_weights(old, rollout, MASK, "geometric", threshold=2.0)


def test_is_weight_metrics():
    w = torch.tensor([[1.5, 0.5, 1.0], [1.5, 1.0, 0.0]])
    m = is_weight_metrics(w, MASK, threshold=1.5)
    assert m["training/rollout_is_weight_mean"] == pytest.approx(5.5 / 5)
    assert m["training/rollout_is_capped_frac"] == pytest.approx(2 / 5)


def test_mismatch_metrics_by_hand():
    m = mismatch_metrics(_log(P_OLD), _log(P_ROLLOUT), MASK)
    # |Δp| over the 5 valid tokens: 0.25, 0.2, 0, 0.6, 0 (the padded 0.3 vs 0.6 is left out)
    diffs = [0.25, 0.2, 0.0, 0.6, 0.0]
    mean = sum(diffs) / 5  # 0.21
    std = math.sqrt(sum((d - mean) ** 2 for d in diffs) / 5)  # population: 0.2200
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.6)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.21)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(std)
    assert m["training/rollout_probs_diff_std"] == pytest.approx(0.22, abs=1e-4)
    # log ratios log(π_old/π_rollout): ln 2, ln 0.5, 0, ln 4, 0 -> max |.| = ln 4; k3 = r − 1 − ln r
    # per token: (2 − 1 − ln 2) + (0.5 − 1 + ln 2) + 0 + (4 − 1 − ln 4) + 0 = 3.5 − ln 4
    assert m["training/rollout_log_ratio_abs_max"] == pytest.approx(math.log(4))
    assert m["training/rollout_k3_kl"] == pytest.approx((3.5 - math.log(4)) / 5)
    # Pearson over (0.5, 0.2, 0.9, 0.8, 0.4) and (0.25, 0.4, 0.9, 0.2, 0.4): hand-computed
    # a = p_old − 0.56 = (−0.06, −0.36, 0.34, 0.24, −0.16), b = p_rollout − 0.43 =
    # (−0.18, −0.03, 0.47, −0.23, −0.03): Σab = 0.131, Σa² = 0.332, Σb² = 0.308
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(
        0.131 / math.sqrt(0.332 * 0.308), abs=1e-6
    )


def test_identical_probabilities_give_zero_mismatch():
    m = mismatch_metrics(_log(P_OLD), _log(P_OLD), MASK)
    assert m["training/rollout_probs_diff_max"] == 0.0
    assert m["training/rollout_log_ratio_abs_max"] == 0.0
    assert m["training/rollout_k3_kl"] == 0.0
    assert m["training/rollout_actor_probs_pearson_corr"] == pytest.approx(1.0)
    assert mismatch_metrics(_log(P_OLD), _log(P_OLD), torch.zeros(2, 3)) == {}


def test_ragged_log_probs_are_aligned_with_the_padded_responses():
    out = ragged_to_padded([[-0.5, -1.0], [-2.0], []], width=3)
    assert torch.equal(out, torch.tensor([[-0.5, -1.0, 0.0], [-2.0, 0.0, 0.0], [0.0, 0.0, 0.0]]))
    with pytest.raises(ValueError, match="row 0 has 2 log-probs for 1"):
        ragged_to_padded([[-0.5, -1.0]], width=1)


def test_tis_weights_scale_each_tokens_policy_gradient_term():
    """On-policy (ratio 1), advantages 1 and −2, weights 0.5 and 1.5, token-mean:
    loss = −(0.5·1 + 1.5·(−2)) / 2 = 1.25 (1.0 unweighted would be −(1 − 2)/2 = 0.5), and
    d loss / d log π(o_t) = −w_t A_t / 2: −0.25 and 1.5."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    inputs = PolicyLossInputs(
        logprobs_BT=logp,
        old_logprobs_BT=logp.detach(),
        advantages_BT=torch.tensor([[1.0, -2.0]]),
        response_mask_BT=torch.ones(1, 2),
        is_weights_BT=torch.tensor([[0.5, 1.5]]),
    )
    out = compute_policy_loss(inputs, ActorConfig(loss_agg_mode="token-mean"))
    assert float(out.loss.detach()) == pytest.approx(1.25)
    out.loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-0.25, 1.5]]))
    unweighted = PolicyLossInputs(
        logp.detach(), logp.detach(), inputs.advantages_BT, torch.ones(1, 2)
    )
    assert float(compute_policy_loss(unweighted, ActorConfig()).loss) == pytest.approx(0.5)


def _cfg(*overrides):
    base = ["actor_rollout_ref.model.path=m", "data.train_files=t"]
    return load_config([*base, *overrides], check=False)


def _problems(*overrides) -> str:
    from engine.config import ConfigError, validate

    with pytest.raises(ConfigError) as caught:
        validate(_cfg(*overrides))
    return str(caught.value)


def test_rollout_is_needs_the_rollout_log_probs_and_a_valid_level():
    assert "actor_rollout_ref.rollout.calculate_log_probs=true" in _problems(
        "algorithm.rollout_correction.rollout_is=token"
    )
    problems = _problems(
        "algorithm.rollout_correction.rollout_is=geometric",
        "algorithm.rollout_correction.rollout_is_threshold=0",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    assert "'geometric' is not a level" in problems
    assert "rollout_is_threshold must be > 0" in problems
    from engine.config import validate

    accepted = _cfg(
        "algorithm.rollout_correction.rollout_is=sequence",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    validate(accepted)  # no problem left
    assert accepted.algorithm.rollout_correction.rollout_is == "sequence"


def test_asking_for_the_rollout_log_probs_brings_back_the_old_log_prob_pass():
    """Without a π_old of its own the trainer has nothing to compare them with."""
    on = _cfg("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    assert on.update_is_on_policy
    off = _cfg(
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    )
    assert not off.update_is_on_policy
