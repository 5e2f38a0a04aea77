"""Rollout-vs-training mismatch metrics, importance weights (TIS, IcePop, batch
normalisation), bypass mode's correction in the loss, and their config, by hand."""

import math

import pytest
import torch

from engine.algo.policy_loss import PolicyLossInputs, compute_policy_loss
from engine.algo.rollout_correction import (
    Correction,
    batch_normalize,
    bypass_loss_mode,
    bypass_policy_inputs,
    correct_rollout,
    is_weight_metrics,
    mismatch_metrics,
    ragged_to_padded,
    rollout_is_weights,
)
from engine.config import ActorConfig, RolloutCorrectionConfig, load_config
from engine.types import TokenBatch

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
    assert "rollout_is_threshold: the cap 0 must be > 0" in problems
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


# ---------------------------------------------------------------------------
# IcePop, batch normalisation (ratios ρ: row 0: 2, 0.5, 1; row 1: 4, 1, padding)


def test_icepop_zeroes_the_weights_outside_its_range():
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "token", threshold="0.6_3.0")
    # 2 kept; 0.5 < 0.6 -> 0; 1 kept; 4 > 3 -> 0; 1 kept (not capped: kept as it is)
    assert torch.allclose(w, torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "sequence", threshold="0.5_3.0")
    # products: row 0: 1 (kept), row 1: 4 (> 3: every token of the row 0)
    assert torch.allclose(w, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    m = is_weight_metrics(torch.tensor([[2.0, 0.0, 1.0], [0.0, 1.0, 0.0]]), MASK, "0.6_3.0")
    assert m["rollout_corr/rollout_is_oob_ratio"] == pytest.approx(2 / 5)
    assert m["training/rollout_is_weight_mean"] == pytest.approx(4 / 5)
    assert "training/rollout_is_capped_frac" not in m


def test_batch_normalisation_makes_the_weights_average_one():
    # token: TIS at 1.5 gives 1.5, 0.5, 1 | 1.5, 1: mean 5.5 / 5 = 1.1
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "token", threshold=1.5)
    normed, factor = batch_normalize(w, MASK, "token")
    assert factor == pytest.approx(1.1)
    assert torch.allclose(normed, w / 1.1)
    assert normed[MASK.bool()].mean() == pytest.approx(1.0)
    # sequence: weights 1 (3 tokens) and 2 (2 tokens): the mean over sequences is 1.5, not
    # the token mean (3 + 4) / 5 = 1.4
    w = rollout_is_weights(_log(P_OLD), _log(P_ROLLOUT), MASK, "sequence", threshold=2.0)
    normed, factor = batch_normalize(w, MASK, "sequence")
    assert factor == pytest.approx(1.5)
    assert torch.allclose(normed, torch.tensor([[2 / 3] * 3, [4 / 3, 4 / 3, 0.0]]))
    # all but zero: left as they are
    assert batch_normalize(torch.zeros(2, 3), MASK, "token")[1] == 1.0


def test_correct_rollout_applies_what_the_config_asks():
    rc = RolloutCorrectionConfig(
        rollout_is="token",
        rollout_is_threshold=1.5,
        rollout_is_batch_normalize=True,
        rollout_rs="token_k1",
        rollout_rs_threshold="0.6_3.0",
    )
    c = correct_rollout(_log(P_OLD), _log(P_ROLLOUT), MASK, rc)
    tis = torch.tensor([[1.5, 0.5, 1.0], [1.5, 1.0, 0.0]])
    assert torch.allclose(c.is_weights_BT, tis / 1.1)
    # rejection leaves the weights alone and removes ρ = 0.5 and ρ = 4 from the mask
    assert torch.equal(c.loss_mask_BT, torch.tensor([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]]))
    assert c.metrics["training/rollout_is_weight_mean"] == pytest.approx(1.1)  # before the norm
    assert c.metrics["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.1)
    assert c.metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(2 / 5)
    assert "training/rollout_probs_diff_max" in c.metrics
    # the actor's tokens carry the narrowed mask; nothing else changes
    tokens = TokenBatch.from_ragged([[5], [6]], [[1, 2, 3], [4, 5]], pad_token_id=0)
    narrowed = c.actor_tokens(tokens)
    assert torch.equal(narrowed.response_mask_BR, c.loss_mask_BT)
    assert torch.equal(narrowed.input_ids_BS, tokens.input_ids_BS)
    assert Correction().actor_tokens(tokens) is tokens
    # metrics only: no weights, no mask
    off = correct_rollout(_log(P_OLD), _log(P_ROLLOUT), MASK, RolloutCorrectionConfig())
    assert off.is_weights_BT is None and off.loss_mask_BT is None and off.metrics


# ---------------------------------------------------------------------------
# bypass mode: ρ = π_θ / π_rollout inside the loss


def _bypass_inputs(**rc):
    """π_θ = P_OLD (the current policy), π_rollout = P_ROLLOUT, advantages 1."""
    logp = _log(P_OLD).requires_grad_()
    inputs = PolicyLossInputs(logp, _log(P_ROLLOUT), torch.ones(2, 3), MASK)
    return logp, *bypass_policy_inputs(inputs, RolloutCorrectionConfig(bypass_mode=True, **rc))


def test_bypass_reinforce_weighs_the_log_probs_by_the_truncated_ratio():
    """loss_type=reinforce is GPG's loss with the weights: L = −Σ w_t A_t log π_θ(o_t) / N,
    w = min(π_θ / π_rollout, 2), detached: d L / d log π_θ(o_t) = −w_t / 5 (A = 1).
    Weights 2, 0.5, 1 | 2 (4 capped), 1."""
    logp, inputs, metrics = _bypass_inputs(loss_type="reinforce", rollout_is="token")
    w = torch.tensor([[2.0, 0.5, 1.0], [2.0, 1.0, 0.0]])
    assert torch.allclose(inputs.is_weights_BT, w) and not inputs.is_weights_BT.requires_grad
    assert metrics["training/rollout_is_capped_frac"] == pytest.approx(2 / 5)
    cfg = ActorConfig(loss_agg_mode="token-mean")
    cfg.policy_loss.loss_mode = bypass_loss_mode(
        RolloutCorrectionConfig(bypass_mode=True, loss_type="reinforce"), "vanilla"
    )
    assert cfg.policy_loss.loss_mode == "gpg"
    out = compute_policy_loss(inputs, cfg)
    expected = -(w * _log(P_OLD) * MASK).sum() / 5
    assert float(out.loss.detach()) == pytest.approx(float(expected))
    out.loss.backward()
    assert torch.allclose(logp.grad, -w / 5)


def test_bypass_rejection_narrows_the_loss_mask_for_either_loss_type():
    for loss_type in ("ppo_clip", "reinforce"):
        _, inputs, metrics = _bypass_inputs(
            loss_type=loss_type, rollout_rs="seq_sum_k1", rollout_rs_threshold=2.0
        )
        # products 1 (kept) and 4 (outside [0.5, 2]: the row leaves the loss)
        assert torch.equal(inputs.response_mask_BT, torch.tensor([[1.0, 1.0, 1.0], [0.0] * 3]))
        assert inputs.is_weights_BT is None  # no rollout_is: no weights
        assert metrics["rollout_corr/rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)
    # under ppo_clip the ratio is already π_θ / π_rollout: no weights even if asked (the
    # config refuses rollout_is there)
    _, inputs, _ = _bypass_inputs(loss_type="ppo_clip", rollout_is="token")
    assert inputs.is_weights_BT is None and torch.equal(inputs.response_mask_BT, MASK)
    # ppo_clip runs the configured loss, reinforce GPG's
    plain = RolloutCorrectionConfig(bypass_mode=True)
    assert bypass_loss_mode(plain, "gspo") == "gspo"
    assert bypass_loss_mode(RolloutCorrectionConfig(loss_type="reinforce"), "vanilla") == "vanilla"


# ---------------------------------------------------------------------------
# the config's rules on the new keys

RC = "algorithm.rollout_correction"
LOGPROBS = "actor_rollout_ref.rollout.calculate_log_probs=true"


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ([f"{RC}.rollout_is_threshold=abc"], "rollout_is_threshold: 'abc' is not a number"),
        ([f"{RC}.rollout_is_threshold='5.0_0.5'"], "need 0 < lower <= upper"),
        ([f"{RC}.rollout_is_batch_normalize=true"], "set rollout_is=token or sequence"),
        ([f"{RC}.rollout_rs=token_k1"], "rollout_rs_threshold is null"),
        (
            [f"{RC}.rollout_rs=token_k9", f"{RC}.rollout_rs_threshold=2.0"],
            "unknown option 'token_k9'",
        ),
        (
            [f"{RC}.rollout_rs='token_k1,seq_mean_k3'", f"{RC}.rollout_rs_threshold='2.0,0.1,3.0'"],
            "3 thresholds for 2 options",
        ),
        ([f"{RC}.rollout_rs=token_k2", f"{RC}.rollout_rs_threshold='0.5_2.0'"], "upper bound only"),
        ([f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.5"], "so U >= 1"),
        ([f"{RC}.rollout_rs_threshold=2.0"], "has no effect without rejection sampling"),
        ([f"{RC}.loss_type=reinforce"], "set bypass_mode=true, or loss_type=ppo_clip"),
        ([f"{RC}.loss_type=pg"], "'pg' is not one; valid: ppo_clip, reinforce"),
        (
            [
                f"{RC}.bypass_mode=true",
                f"{RC}.loss_type=reinforce",
                "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
            ],
            "loss_mode=gspo would be ignored",
        ),
    ],
)
def test_inconsistent_rollout_correction_is_refused_with_the_key_and_the_fix(overrides, expected):
    problems = _problems(LOGPROBS, *overrides)
    assert expected in problems and "algorithm.rollout_correction." in problems


@pytest.mark.parametrize(
    "overrides,expected",
    [
        (
            [f"{RC}.bypass_mode=true", f"{RC}.rollout_is=token"],
            "applies no weights under bypass_mode with loss_type=ppo_clip",
        ),
        (
            [
                f"{RC}.bypass_mode=true",
                f"{RC}.loss_type=reinforce",
                f"{RC}.rollout_is=token",
                f"{RC}.rollout_is_batch_normalize=true",
            ],
            "normalises the weights of each micro-batch",
        ),
    ],
)
def test_settings_verl_accepts_that_act_otherwise_run_with_a_note(overrides, expected):
    """verl runs these; the engine does too, and says how they act instead of refusing."""
    from engine.config import validate
    from engine.config.notes import notes

    cfg = _cfg(LOGPROBS, *overrides)
    validate(cfg)
    assert any(expected in note for note in notes(cfg)), notes(cfg)
    assert not any(expected in note for note in notes(_cfg(LOGPROBS)))


def test_rejection_sampling_needs_the_rollout_log_probs():
    problems = _problems(f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=2.0")
    assert "rollout_rs=token_k1 need the rollout engine's own log-probs" in problems
    assert "calculate_log_probs=true" in problems


def test_verl_rollout_correction_configs_are_accepted():
    from engine.config import validate

    for overrides in (
        # decoupled: Seq-MIS, Geo-RS + token TIS, K3-RS, IcePop with batch normalisation
        [
            f"{RC}.rollout_is=sequence",
            f"{RC}.rollout_rs=seq_sum_k1",
            f"{RC}.rollout_rs_threshold='0.5_2.0'",
        ],
        [
            f"{RC}.rollout_is=token",
            f"{RC}.rollout_rs=seq_mean_k1",
            f"{RC}.rollout_rs_threshold='0.999_1.001'",
        ],
        [f"{RC}.rollout_rs='token_k1,seq_max_k2'", f"{RC}.rollout_rs_threshold='0.5_2.0,2.5'"],
        [
            f"{RC}.rollout_is=token",
            f"{RC}.rollout_is_threshold='0.5_5.0'",
            f"{RC}.rollout_is_batch_normalize=true",
        ],
        # bypass: PPO-clip + K3-RS, REINFORCE with sequence IS
        [
            f"{RC}.bypass_mode=true",
            f"{RC}.rollout_rs=seq_mean_k3",
            f"{RC}.rollout_rs_threshold=0.01",
        ],
        [f"{RC}.bypass_mode=true", f"{RC}.loss_type=reinforce", f"{RC}.rollout_is=sequence"],
    ):
        cfg = _cfg(LOGPROBS, *overrides)
        validate(cfg)
    assert cfg.algorithm.rollout_correction.loss_type == "reinforce"
    assert (
        _cfg(f"{RC}.rollout_is_threshold=3").algorithm.rollout_correction.rollout_is_threshold == 3
    )
