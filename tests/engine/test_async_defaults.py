"""The asynchronous modes' off-policy defaults (engine/config/async_training.py,
``apply_defaults``): the rollout's own log-probs and a correction for the sampler are on
unless the run sets them otherwise, as verl's asynchronous trainers' configs have them."""

import pytest

from engine.config import load_config
from engine.config.notes import notes
from engine.errors import ConfigError

SEPARATE = [
    "actor_rollout_ref.model.path=/models/tiny",
    "data.train_files=train.parquet",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
]
RC = "algorithm.rollout_correction"
LOG_PROBS = "actor_rollout_ref.rollout.calculate_log_probs"
ASYNC = ["async_training.mode=one_step_off", "async_training.mode=fully_async"]


def _off_policy_notes(cfg) -> list[str]:
    return [n for n in notes(cfg) if "no off-policy correction" in n]


@pytest.mark.parametrize("mode", ASYNC)
def test_an_async_run_that_sets_nothing_gets_the_samplers_log_probs_and_bypass_mode(mode):
    cfg = load_config([*SEPARATE, mode])
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    rc = cfg.algorithm.rollout_correction
    # π_old is the sampler's: PPO's ratio is π_θ / π_rollout, its clip bounds the step
    assert rc.bypass_mode is True and rc.rollout_is is None
    assert _off_policy_notes(cfg) == []


def test_a_synchronous_run_keeps_verls_defaults():
    cfg = load_config(SEPARATE)
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is False
    assert cfg.algorithm.rollout_correction.bypass_mode is False
    assert _off_policy_notes(cfg) == []


@pytest.mark.parametrize("mode", ASYNC)
def test_turning_the_rollouts_log_probs_off_is_refused_with_the_key_and_the_fix(mode):
    with pytest.raises(ConfigError) as caught:
        load_config([*SEPARATE, mode, f"{LOG_PROBS}=false"])
    (problem,) = caught.value.problems  # one problem, not one per key it touches
    assert f"{LOG_PROBS}=true" in problem and mode in problem


def test_the_same_key_set_false_in_a_config_file_is_refused_too(tmp_path):
    config = tmp_path / "run.yaml"
    config.write_text("actor_rollout_ref:\n  rollout:\n    calculate_log_probs: false\n")
    with pytest.raises(ConfigError, match="calculate_log_probs=true"):
        load_config([*SEPARATE, ASYNC[0]], config_file=config)


def test_a_correction_the_run_names_is_kept_in_decoupled_mode():
    cfg = load_config([*SEPARATE, ASYNC[1], f"{RC}.rollout_is=token"])
    rc = cfg.algorithm.rollout_correction
    assert (rc.bypass_mode, rc.rollout_is) == (False, "token")  # its weights act
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    assert _off_policy_notes(cfg) == []


def test_bypass_mode_turned_off_knowingly_runs_and_is_told_there_is_no_correction():
    cfg = load_config([*SEPARATE, ASYNC[0], f"{RC}.bypass_mode=false"])
    assert cfg.algorithm.rollout_correction.bypass_mode is False
    (note,) = _off_policy_notes(cfg)
    assert f"{RC}.rollout_is=token" in note  # the fix


def test_bypass_modes_loss_alone_takes_bypass_mode_by_default():
    cfg = load_config([*SEPARATE, ASYNC[0], f"{RC}.loss_type=reinforce"])
    assert cfg.algorithm.rollout_correction.bypass_mode is True


def test_an_estimator_that_reads_pi_old_gets_importance_weights_instead_of_bypass():
    """The optimal token baseline reads Σπ_old² from the actor's π_old pass, which bypass
    mode skips: the default correction is then truncated importance sampling."""
    cfg = load_config(
        [*SEPARATE, ASYNC[0], "algorithm.adv_estimator=optimal_token_baseline",
         "actor_rollout_ref.rollout.n=4"]
    )  # fmt: skip
    rc = cfg.algorithm.rollout_correction
    assert (rc.bypass_mode, rc.rollout_is) == (False, "token")
