"""The typed engine config: composition, overrides, and every cross-field rule."""

import subprocess
import sys

import pytest

from engine.algo import names
from engine.config import EngineConfig, config_keys, load_config, to_yaml
from engine.errors import ConfigError

REQUIRED = ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=train.parquet"]
# A small valid GRPO setup on 2 devices: 8 prompts × 4 samples, 2 mini-batches.
GRPO = [
    *REQUIRED,
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=2",
]


def problems(overrides: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides)
    return info.value.problems


def one_problem(overrides: list[str]) -> str:
    found = problems(overrides)
    assert len(found) == 1, found
    return found[0]


def test_config_imports_without_torch_or_ray():
    # Validating a Megatron config too: its rules (engine.config.megatron_parallel) are
    # pure python, so rlctl checks such a recipe on a laptop without torch.
    code = (
        "import sys, engine.config, engine.main; "
        "engine.config.load_config(['actor_rollout_ref.model.path=m', 'data.train_files=t',"
        " 'actor_rollout_ref.actor.strategy=megatron', 'critic.strategy=megatron',"
        " 'trainer.n_gpus_per_node=2']); "
        "bad = [m for m in ('torch', 'ray', 'transformers') if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_defaults_live_in_the_dataclasses():
    expected = EngineConfig()
    expected.actor_rollout_ref.model.path = "/models/tiny"
    expected.data.train_files = "train.parquet"
    expected.trainer.default_local_dir = "checkpoints/rlctl/run"  # the interpolation, resolved
    assert load_config(REQUIRED) == expected


def test_overrides_are_typed_and_nested():
    cfg = load_config(
        [
            *GRPO,
            "actor_rollout_ref.actor.optim.lr=3e-6",
            "actor_rollout_ref.actor.clip_ratio_high=0.28",
            "trainer.logger=[console,jsonl]",
            "data.val_batch_size=null",
            "trainer.experiment_name='my run'",
            "data.train_files=[a.parquet,b.jsonl]",
        ]
    )
    actor = cfg.actor_rollout_ref.actor
    assert actor.optim.lr == pytest.approx(3e-6)
    assert (actor.clip_low, actor.clip_high) == (0.2, 0.28)
    assert cfg.trainer.logger == ["console", "jsonl"]
    assert cfg.data.val_batch_size is None
    assert cfg.trainer.default_local_dir == "checkpoints/rlctl/my run"
    assert cfg.data.train_file_list == ["a.parquet", "b.jsonl"]


def test_a_single_train_file_is_a_list_of_one():
    assert load_config(REQUIRED).data.train_file_list == ["train.parquet"]


def test_unknown_key_suggests_the_right_one():
    message = one_problem([*REQUIRED, "data.train_batch_sise=8"])
    assert "unknown key 'data.train_batch_sise'" in message
    assert "did you mean 'data.train_batch_size'" in message


def test_wrong_type_names_the_key():
    message = one_problem([*REQUIRED, "data.train_batch_size=many"])
    assert "data.train_batch_size" in message and "many" in message


def test_sweeps_are_refused_and_a_deletion_restores_the_default():
    assert "sweep" in one_problem([*REQUIRED, "actor_rollout_ref.actor.optim.lr=1e-6,2e-6"])
    # Hydra's ~key: a schema key goes back to its default, a mapping's entry goes away
    cfg = load_config([*REQUIRED, "data.seed=7", "~data.seed"])
    assert cfg.data.seed == EngineConfig().data.seed
    kwargs = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    cfg = load_config([*REQUIRED, f"+{kwargs}.a=1", f"+{kwargs}.b=2", f"~{kwargs}.a"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {"b": 2}
    assert "no such key to delete" in one_problem([*REQUIRED, f"~{kwargs}.nope"])


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "algorithm:\n  adv_estimator: grpo\n  gamma: 0.9\n"
        "actor_rollout_ref:\n  rollout:\n    n: 4\n"
    )
    cfg = load_config([*GRPO, "algorithm.gamma=0.5"], config_file=path)
    assert cfg.algorithm.adv_estimator == "grpo"
    assert cfg.algorithm.gamma == 0.5  # the override wins over the file


def test_yaml_file_with_unknown_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  adv_estimater: grpo\n")
    with pytest.raises(ConfigError, match="adv_estimater"):
        load_config(REQUIRED, config_file=path)


def test_missing_yaml_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(REQUIRED, config_file=tmp_path / "nope.yaml")


def test_printed_yaml_round_trips(tmp_path):
    cfg = load_config([*GRPO, "actor_rollout_ref.actor.clip_ratio_high=0.28"])
    path = tmp_path / "printed.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(config_file=path) == cfg


def test_printed_yaml_is_omegaconfs_own_layout():
    """to_yaml walks the dataclasses itself (OmegaConf's structured copy was most of a
    render's time): the same YAML as OmegaConf's, a config changed after loading included
    (a whole number in a float key, a tuple)."""
    from omegaconf import OmegaConf

    from engine.config.dump import dump

    cfg = load_config([*GRPO, "actor_rollout_ref.rollout.name=vllm"])
    cfg.actor_rollout_ref.actor.optim.lr = 1
    cfg.data.train_files = ("a.parquet", "b.parquet")
    cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] = {"x": (1, 2)}
    theirs = OmegaConf.to_container(OmegaConf.structured(cfg), enum_to_str=True)
    assert to_yaml(cfg) == dump(theirs)
    assert "lr: 1.0\n" in to_yaml(cfg)


@pytest.mark.parametrize(
    "text", ["0\x85", "a\u2028b", "x\u2029", "日本語 run", "1", "true", " pad ", "a\nb", "a: b"]
)
def test_printed_yaml_keeps_every_string(text, tmp_path):
    """A string reads back as written, whatever line breaks it holds: YAML readers fold a
    NEL (U+0085) inside a quoted scalar into a space (found by the hypothesis tests)."""
    cfg = load_config(GRPO, base={"trainer": {"project_name": text}})
    path = tmp_path / "printed.yaml"
    path.write_text(to_yaml(cfg))
    assert load_config(config_file=path).trainer.project_name == text


# ---------------------------------------------------------------------------
# cross-field rules: each names the fields and the fix


def test_mini_batch_must_divide_train_batch():
    message = one_problem(
        [*REQUIRED, "data.train_batch_size=256", "actor_rollout_ref.actor.ppo_mini_batch_size=48"]
    )
    assert "ppo_mini_batch_size 48 must divide data.train_batch_size 256" in message
    assert "32" in message and "64" in message  # nearby divisors offered


def test_mini_batch_samples_must_split_over_devices():
    message = one_problem(
        [
            *REQUIRED,
            "data.train_batch_size=6",
            "actor_rollout_ref.actor.ppo_mini_batch_size=3",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "trainer.n_gpus_per_node=4",
            "critic.enable=false",
            "algorithm.adv_estimator=reinforce_plus_plus",
        ]
    )
    assert "3 × 1 = 3 samples must be divisible by the 4 devices" in message


def test_micro_batches_may_be_uneven_except_through_a_pipeline():
    # 4 prompts × 4 samples / 2 devices = 8 samples per device in micro-batches of 3, 3
    # and 2: the loss normalises over the mini-batch (as verl), so that runs ...
    load_config([*GRPO, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"])
    # ... and so does a micro-batch larger than a device's share (one micro-batch).
    load_config([*GRPO, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16"])
    # A Megatron pipeline's 1F1B schedule takes equal micro-batches.
    pipeline = [
        *GRPO,
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
    ]
    message = one_problem(pipeline)
    # 4 prompts × 4 samples over 1 data-parallel group (2 devices / PP 2) = 16; 3 ∤ 16
    assert "ppo_micro_batch_size_per_gpu 3 must divide the 16 samples" in message
    assert "use_dynamic_bsz" in message


def test_dynamic_batch_size_lifts_the_micro_batch_rule():
    load_config(
        [
            *GRPO,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3",
            "actor_rollout_ref.actor.use_dynamic_bsz=true",
        ]
    )


def test_token_budget_must_hold_one_whole_sequence():
    longest = ["data.max_prompt_length=100", "data.max_response_length=28"]
    dynamic = [*GRPO, *longest, "actor_rollout_ref.actor.use_dynamic_bsz=true"]
    message = one_problem([*dynamic, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=127"])
    assert message.startswith("actor_rollout_ref.actor.ppo_max_token_len_per_gpu is 127:")
    assert "raise it to at least 128" in message
    load_config([*dynamic, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=128"])
    # The log-prob pass inherits the actor's budget unless it has its own.
    message = one_problem([*dynamic, "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=64"])
    assert message.startswith("actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu is 64:")
    # Budgets are checked only where micro-batches are packed by tokens.
    load_config([*GRPO, *longest, "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8"])


def test_the_critic_can_pack_by_tokens_on_its_own():
    ppo = [*GRPO, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=3"]
    cfg = load_config(
        [*ppo, "critic.use_dynamic_bsz=true", "critic.ppo_max_token_len_per_gpu=4096"]
    )
    assert cfg.token_budget("critic") == 4096 and cfg.token_budget("actor") is None


def test_old_log_probs_get_their_own_pass_only_off_policy():
    assert load_config([*GRPO, "actor_rollout_ref.actor.ppo_mini_batch_size=8"]).update_is_on_policy
    for extra in (
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",  # two optimizer steps per batch
        "actor_rollout_ref.actor.ppo_epochs=2",
        "actor_rollout_ref.actor.recompute_old_log_prob=true",
        "algorithm.use_kl_in_reward=true",  # the reward needs π_old before the update
    ):
        overrides = [*GRPO, "actor_rollout_ref.actor.ppo_mini_batch_size=8", extra]
        assert not load_config(overrides).update_is_on_policy, extra


def test_critic_batch_rules_apply_when_the_critic_runs():
    ppo = [*GRPO, "algorithm.adv_estimator=gae", "critic.ppo_mini_batch_size=3"]
    assert one_problem(ppo).startswith("critic.ppo_mini_batch_size 3 must divide")
    load_config([*GRPO, "critic.ppo_mini_batch_size=3"])  # GRPO: no critic, no rule


def test_inherited_critic_mini_batch_is_reported_once():
    found = problems(
        [
            *REQUIRED,
            "algorithm.adv_estimator=gae",
            "data.train_batch_size=256",
            "actor_rollout_ref.actor.ppo_mini_batch_size=48",
        ]
    )
    assert len(found) == 1 and found[0].startswith("actor_rollout_ref.actor.ppo_mini_batch_size")


def estimator_overrides(estimator: str) -> list[str]:
    """The estimator, and the keys it cannot run without."""
    extra = ["algorithm.gdpo_reward_keys=[a]"]
    if not names.estimator_needs(estimator).reward_components:
        extra = []
    return [f"algorithm.adv_estimator={estimator}", *extra]


@pytest.mark.parametrize("estimator", names.GROUP_ADVANTAGE_ESTIMATORS)
def test_group_estimators_with_one_sample_run_with_a_note(estimator):
    # verl runs them (a singleton group's advantage is its own score): so does the
    # engine, and says so at start.
    from engine.config.notes import notes

    cfg = load_config([*GRPO, *estimator_overrides(estimator), "actor_rollout_ref.rollout.n=1"])
    (note,) = notes(cfg)
    assert f"adv_estimator={estimator}" in note and "rollout.n=1" in note
    assert not notes(load_config([*GRPO, *estimator_overrides(estimator)]))


@pytest.mark.parametrize("estimator", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_optimal_token_baselines_need_the_pi_old_pass(estimator):
    """Σπ² comes from the actor's π_old pass: forced on (an on-policy update would skip
    it), and bypass mode, which takes π_old from the sampler instead, is refused."""
    assert names.estimator_needs(estimator).sum_pi_squared
    on_policy = [
        *GRPO,
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        f"algorithm.adv_estimator={estimator}",
    ]
    assert not load_config(on_policy).update_is_on_policy
    on_policy[-1] = "algorithm.adv_estimator=grpo"
    assert load_config(on_policy).update_is_on_policy
    bypass = [
        "algorithm.rollout_correction.bypass_mode=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    ]
    message = one_problem([*GRPO, f"algorithm.adv_estimator={estimator}", *bypass])
    assert f"adv_estimator={estimator} reads Σ_v π_old(v)²" in message
    assert "set bypass_mode=false" in message


@pytest.mark.parametrize("estimator", ["remax", "reinforce_plus_plus", "gae"])
def test_single_sample_estimators_accept_n_1(estimator):
    load_config(
        [
            *GRPO,
            f"algorithm.adv_estimator={estimator}",
            "actor_rollout_ref.rollout.n=1",
            "critic.ppo_micro_batch_size_per_gpu=2",
        ]
    )


GDPO = [*GRPO, "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[accuracy,format]"]


def test_gdpo_takes_verl_keys():
    cfg = load_config([*GDPO, "+algorithm.gdpo_reward_weights=[1.0,0.5]"])
    assert cfg.algorithm.gdpo_reward_keys == ["accuracy", "format"]
    assert cfg.algorithm.gdpo_reward_weights == [1.0, 0.5]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            [*GRPO, "algorithm.adv_estimator=gdpo"],
            "list them in algorithm.gdpo_reward_keys",
        ),
        (
            [*GDPO, "algorithm.gdpo_reward_weights=[1.0]"],
            "has 1 weights for 2 algorithm.gdpo_reward_keys",
        ),
        ([*GDPO, "algorithm.gdpo_reward_weights=[1.0,nan]"], "must be finite"),
        ([*GDPO, "algorithm.gdpo_reward_keys=[a,a]"], "names a key twice"),
        ([*GDPO, "algorithm.use_kl_in_reward=true"], "use_kl_loss=true instead"),
    ],
)
def test_gdpo_rules(overrides, expected):
    assert expected in one_problem(overrides)


def test_gae_needs_the_critic():
    message = one_problem([*GRPO, "algorithm.adv_estimator=gae", "critic.enable=false"])
    assert "critic.enable" in message


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("algorithm.adv_estimator=grpoo", "did you mean 'grpo'"),
        ("actor_rollout_ref.actor.policy_loss.loss_mode=gpso", "valid: cispo, clip_cov"),
        ("actor_rollout_ref.actor.loss_agg_mode=token_mean", "did you mean 'token-mean'"),
        ("actor_rollout_ref.actor.kl_loss_type=k4", "straight-through"),
        ("algorithm.kl_ctrl.type=pid", "valid: adaptive, fixed"),
        ("actor_rollout_ref.rollout.name=trtllm", "valid: hf, sglang, vllm"),
        ("trainer.device=tpu", "valid: auto, cpu, cuda, npu"),
        ("trainer.logger=[console,tensorbord]", "did you mean 'tensorboard'"),
        ("data.truncation=both", "valid: error, left, middle, right"),
    ],
)
def test_unknown_names_list_the_valid_ones(override, expected):
    assert expected in one_problem([*GRPO, override])


def test_every_registered_name_is_accepted():
    for estimator in names.ADVANTAGE_ESTIMATORS:
        load_config([*GRPO, *estimator_overrides(estimator)])
    for loss in names.POLICY_LOSSES:
        load_config([*GRPO, f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}"])
    for mode in names.LOSS_AGG_MODES:
        load_config([*GRPO, f"actor_rollout_ref.actor.loss_agg_mode={mode}"])
    for kl in names.KL_ESTIMATORS:
        load_config([*GRPO, f"actor_rollout_ref.actor.kl_loss_type={kl}+"])
        load_config([*GRPO, f"algorithm.kl_penalty={kl}"])


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("actor_rollout_ref.actor.clip_ratio_low=1.2", "clip_ratio_low 1.2 must be in (0, 1)"),
        ("actor_rollout_ref.actor.clip_ratio=0", "clip_ratio_low 0.0 must be in (0, 1)"),
        ("actor_rollout_ref.actor.clip_ratio_high=-0.1", "clip_ratio_high must be > 0"),
        ("actor_rollout_ref.actor.clip_ratio_c=1.0", "clip_ratio_c 1.0 must be > 1"),
        ("actor_rollout_ref.actor.tau_pos=0", "actor.tau_pos must be a positive number"),
        ("actor_rollout_ref.actor.tau_neg=-1", "actor.tau_neg must be a positive number"),
        ("actor_rollout_ref.actor.tau_neg=inf", "tau_pos=1.0, tau_neg=1.05"),
        ("algorithm.gamma=1.5", "algorithm.gamma must be in [0, 1]"),
        ("algorithm.lam=-0.1", "algorithm.lam must be in [0, 1]"),
        ("actor_rollout_ref.rollout.top_p=0", "rollout.top_p must be in (0, 1]"),
        ("actor_rollout_ref.rollout.top_k=0", "top_k must be -1 (off)"),
        ("actor_rollout_ref.rollout.temperature=0", "set do_sample=false"),
        ("actor_rollout_ref.rollout.val_kwargs.do_sample=true", "val_kwargs.temperature"),
        ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "gpu_memory_utilization"),
        ("actor_rollout_ref.rollout.tensor_model_parallel_size=4", "must divide the 2 devices"),
        ("actor_rollout_ref.rollout.placement=separate", "separate_nnodes"),
        ("trainer.resume_mode=resume_path", "trainer.resume_from_path"),
        ("trainer.save_freq=0", "trainer.save_freq must be -1"),
        ("reward_model.overlong_buffer.enable=true", "overlong_buffer.len 0 must be in"),
        ("algorithm.kl_ctrl.kl_coef=-1", "must be >= 0"),
        ("reward_model.timeout_s=0", "timeout_s must be > 0"),
        ("data.train_batch_size=0", "data.train_batch_size must be a positive integer"),
        ("actor_rollout_ref.model.path=''", "actor_rollout_ref.model.path is required"),
    ],
)
def test_range_rules(override, expected):
    assert expected in "\n".join(problems([*GRPO, override]))


def test_all_problems_are_reported_at_once():
    found = problems(
        [
            "algorithm.adv_estimator=grpo",
            "algorithm.filter_groups.enable=true",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.actor.clip_ratio_c=0.5",
        ]
    )
    joined = "\n".join(found)
    for fragment in ("rollout.n >= 2", "clip_ratio_c", "model.path", "train_files"):
        assert fragment in joined
    assert len(found) == 4


def test_derived_roles():
    assert load_config([*GRPO, "algorithm.adv_estimator=gae"]).use_critic
    assert not load_config(GRPO).use_critic
    assert load_config([*GRPO, "critic.enable=true"]).use_critic  # e.g. a value baseline
    assert not load_config(GRPO).use_reference
    assert load_config([*GRPO, "actor_rollout_ref.actor.use_kl_loss=true"]).use_reference
    assert load_config([*GRPO, "algorithm.use_kl_in_reward=true"]).use_reference
    assert load_config(GRPO).world_size == 2


def test_config_keys_cover_the_schema():
    keys = config_keys()
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in keys
    assert "actor_rollout_ref.rollout.val_kwargs.temperature" in keys
    assert len(keys) == len(set(keys)) > 100


# ---------------------------------------------------------------------------
# the command line


def run_main(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "engine.main", *args], capture_output=True, text=True
    )


def test_main_check_prints_the_batch_arithmetic():
    result = run_main("--check", *GRPO)
    assert result.returncode == 0, result.stderr
    assert "8 prompts × 4 samples = 32 samples per step" in result.stdout
    assert "2 optimizer step(s) per PPO epoch" in result.stdout


def test_main_reports_every_problem_and_exits_2():
    result = run_main("data.train_batch_size=7", "algorithm.adv_estimator=nope")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "unknown advantage estimator 'nope'" in result.stderr
    assert "must divide data.train_batch_size 7" in result.stderr


def test_main_print_config_is_yaml_of_the_overrides():
    result = run_main("--print-config", *GRPO)
    assert result.returncode == 0, result.stderr
    assert "adv_estimator: grpo" in result.stdout


MEGATRON = [*GRPO, "actor_rollout_ref.actor.strategy=megatron"]


def test_megatron_sections_and_the_reference_following_the_actor():
    cfg = load_config(
        [
            *MEGATRON,
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false",
        ]
    )
    assert cfg.actor_rollout_ref.actor.megatron.tensor_model_parallel_size == 1
    assert not cfg.actor_rollout_ref.actor.megatron.use_distributed_optimizer
    assert cfg.actor_rollout_ref.ref.strategy is None and cfg.ref_strategy == "megatron"
    assert list(cfg.megatron_roles()) == ["actor", "reference"]  # no critic under GRPO
    own = load_config([*MEGATRON, "actor_rollout_ref.ref.strategy=fsdp2"])
    assert own.ref_strategy == "fsdp2"
    for key in (
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
        "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size",
        "critic.megatron.sequence_parallel",
    ):
        assert key in config_keys()
    (p,) = problems([*GRPO, "actor_rollout_ref.ref.strategy=megatrn"])
    assert p.startswith("actor_rollout_ref.ref.strategy:") and "megatron" in p


def test_megatron_tensor_parallel_must_fit_the_devices():
    tp2 = "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"
    assert (
        load_config([*MEGATRON, tp2]).megatron_roles()["actor"][1].tensor_model_parallel_size == 2
    )
    p = one_problem([*MEGATRON, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4"])
    assert p.startswith("the world size 2 (trainer.nnodes × trainer.n_gpus_per_node)")
    assert "actor_rollout_ref.actor.megatron.tensor_model_parallel_size" in p


def test_megatron_rules_report_every_problem_with_its_key():
    found = problems(
        [
            *MEGATRON,
            "trainer.device=npu",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.ref.megatron.pipeline_model_parallel_size=2",
            "actor_rollout_ref.ref.megatron.expert_model_parallel_size=2",
            "actor_rollout_ref.ref.megatron.context_parallel_size=1",
            "actor_rollout_ref.actor.megatron.context_parallel_size=0",
        ]
    )
    assert len(found) == 4, found
    assert "trainer.device=npu" in found[0] and "actor_rollout_ref.ref.strategy" in found[0]
    assert found[1] == (
        "actor_rollout_ref.actor.megatron.context_parallel_size must be >= 1, got 0"
    )
    # Expert parallelism with pipeline stages: ETP × EP × PP = 4 devices, the world is 2.
    assert found[2].startswith(
        "the world size 2 must be a multiple of actor_rollout_ref.ref.megatron"
        ".expert_tensor_parallel_size × expert_model_parallel_size × pipeline_model_parallel"
        "_size = 1 × 2 × 2 = 4"
    )
    # Pipeline stages and experts are allowed, but colocated roles must agree on them.
    assert "share their worker processes" in found[3]
    assert "pipeline_model_parallel_size=2" in found[3]
    assert "expert_model_parallel_size=2" in found[3]


def test_megatron_critic_is_checked_only_when_there_is_one():
    experts = "critic.megatron.expert_model_parallel_size=4"  # more than the 2 devices
    assert load_config([*GRPO, "critic.strategy=megatron", experts]).megatron_roles() == {}
    ppo = [*GRPO, "algorithm.adv_estimator=gae", "critic.strategy=megatron"]
    assert list(load_config(ppo).megatron_roles()) == ["critic"]
    p = one_problem([*ppo, experts])
    assert p.startswith("the world size 2 must be a multiple of critic.megatron.")
    assert "expert_model_parallel_size × pipeline_model_parallel_size = 1 × 4 × 1 = 4" in p
    # The critic shares the actor's processes: its sizes must fit the world and the actor's.
    world, shared = problems(
        [
            *ppo,
            "actor_rollout_ref.actor.strategy=megatron",
            "critic.megatron.tensor_model_parallel_size=3",
        ]
    )
    assert "world size 2" in world and "critic.megatron.tensor_model_parallel_size" in world
    assert "critic.megatron: tensor_model_parallel_size=3" in shared


def test_a_huge_batch_is_refused_with_divisors_at_once():
    """The nearby divisors offered in the message are found without counting to the batch
    size (10**12 prompts took minutes); and they are the right ones, by hand."""
    from engine.config.fields import divisors_near

    assert divisors_near(256, 48) == [16, 32, 64]  # 48 is no divisor: 32, 64 (16 off), 16
    assert divisors_near(10**12, 48) == [32, 40, 50]  # 50 (2 off), 40 (8), 32 (16)
    assert divisors_near(97, 10) == [1, 97]  # a prime has two


def test_multi_turn_rules_name_the_key_and_the_fix(tmp_path):
    """A multi-turn rollout needs its tools file, a known call format, and on SGLang TP 1."""
    key = "actor_rollout_ref.rollout.multi_turn"
    with pytest.raises(ConfigError) as err:
        load_config(
            [
                *REQUIRED,
                f"{key}.enable=true",
                f"{key}.max_assistant_turns=0",
                f"{key}.default_agent=react",
            ]
        )
    text = "\n".join(err.value.problems)
    assert f"{key}.tool_config_path: a multi-turn rollout needs its tools file" in text
    assert f"{key}.max_assistant_turns must be a positive integer, got 0" in text
    assert f"{key}.default_agent: unknown agent loop 'react'" in text
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    ok = [*REQUIRED, f"{key}.enable=true", f"{key}.tool_config_path={tools}"]
    assert load_config(ok).actor_rollout_ref.rollout.multi_turn.enable
    tp2 = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"]
    with pytest.raises(ConfigError, match=r"rollout\.name=sglang and tensor_model_parallel_size"):
        load_config([*ok, *tp2, "actor_rollout_ref.rollout.name=sglang"])
    # vLLM runs multi-turn with TP (the group's first member runs the loops)
    assert load_config([*ok, *tp2, "actor_rollout_ref.rollout.name=vllm"])
    # off: nothing is checked (the default config has no tools file)
    off = load_config([*REQUIRED, f"{key}.tool_config_path=/nope.yaml"])
    assert not off.actor_rollout_ref.rollout.multi_turn.enable


def test_async_training_needs_the_rollout_on_its_own_workers():
    """Overlapping generation with training needs rollout.placement=separate (named with
    its pool's keys); DAPO's dynamic sampling is refused with it, for now."""
    one_step = "async_training.mode=one_step_off"
    with pytest.raises(ConfigError) as err:
        load_config([*REQUIRED, one_step])
    assert "set actor_rollout_ref.rollout.placement=separate" in "\n".join(err.value.problems)
    separate = [
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.separate_nnodes=1",
        "actor_rollout_ref.rollout.separate_n_gpus_per_node=2",
    ]
    assert load_config([*REQUIRED, one_step, *separate]).async_training.mode == "one_step_off"
    with pytest.raises(ConfigError, match="filter_groups"):
        load_config([*REQUIRED, one_step, *separate, "algorithm.filter_groups.enable=true"])
    with pytest.raises(ConfigError, match="'fully'"):
        load_config([*REQUIRED, "async_training.mode=fully"])


def test_fully_async_keys_are_checked_before_start():
    from engine.config.async_training import admission_cap

    base = [
        *REQUIRED,
        "async_training.mode=fully_async",
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.separate_nnodes=1",
        "actor_rollout_ref.rollout.separate_n_gpus_per_node=2",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "trainer.n_gpus_per_node=2",
    ]
    cfg = load_config([*base, "async_training.trigger_parameter_sync_step=2"])
    assert admission_cap(cfg) == 70  # ⌊(1 + 0.1) × 2 × 32⌋
    assert admission_cap(load_config([*base, "async_training.staleness_threshold=0"])) == 32
    assert load_config([*base, "async_training.require_batches=4"]).async_training.mode
    cases = {
        "async_training.require_batches=3": "3 × actor.ppo_mini_batch_size=8 = 24 prompts",
        "async_training.staleness_threshold=-0.5": "must be 0 or more, got -0.5",
        "async_training.trigger_parameter_sync_step=0": "trigger_parameter_sync_step must be a",
        "async_training.stream_chunk_tokens=0": "stream_chunk_tokens must be a positive",
        "actor_rollout_ref.rollout.name=sglang": "the sglang rollout does not stream samples",
        "algorithm.adv_estimator=remax": "ReMax's greedy baseline generates inside the step",
    }
    for override, message in cases.items():
        with pytest.raises(ConfigError) as err:
            load_config([*base, override])
        assert message in "\n".join(err.value.problems), override


def test_bypass_mode_needs_the_engines_log_probs_and_says_what_its_weights_do():
    from engine.config.notes import notes

    bypass = "algorithm.rollout_correction.bypass_mode=true"
    with pytest.raises(ConfigError, match="calculate_log_probs=true"):
        load_config([*REQUIRED, bypass])
    logprobs = "actor_rollout_ref.rollout.calculate_log_probs=true"
    assert load_config([*REQUIRED, bypass, logprobs]).algorithm.rollout_correction.bypass_mode
    # verl accepts rollout_is under ppo_clip (no weights applied: PPO's ratio already is to
    # the sampler) and batch normalisation in bypass mode (per micro-batch): so does the
    # engine, with a note each.
    token = "algorithm.rollout_correction.rollout_is=token"
    (note,) = notes(load_config([*REQUIRED, bypass, logprobs, token]))
    assert "applies no weights under bypass_mode" in note
    reinforce = [bypass, logprobs, token, "algorithm.rollout_correction.loss_type=reinforce"]
    norm = "algorithm.rollout_correction.rollout_is_batch_normalize=true"
    (note,) = notes(load_config([*REQUIRED, *reinforce, norm]))
    assert "normalises the weights of each micro-batch" in note


def test_a_separate_rollout_pool_must_hold_its_tp_and_split_the_batch_evenly():
    separate = [
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.separate_nnodes=1",
        "actor_rollout_ref.rollout.separate_n_gpus_per_node=3",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ]
    with pytest.raises(ConfigError) as err:
        load_config(
            [*REQUIRED, *separate, "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
        )
    text = "\n".join(err.value.problems)
    assert "tensor_model_parallel_size 2 must divide the rollout's own 3 devices" in text
    assert "32 samples do not split evenly over the rollout's 3 devices" in text
    ok = [*separate[:2], "actor_rollout_ref.rollout.separate_n_gpus_per_node=2", *separate[3:]]
    assert load_config([*REQUIRED, *ok]).actor_rollout_ref.rollout.placement == "separate"


def test_key_problems_names_every_bad_key_among_good_ones():
    from engine.config import key_problems

    problems = key_problems(
        {
            "data.train_batch_size": 8,
            "trainer.total_epochs": "x",
            "data.train_batch_sise": 3,
            "data.max_prompt_length": "${data.nope}",
            "trainer.logger": 5,
        }
    )
    assert len(problems) == 4, problems
    text = "\n".join(problems)
    for key in ("trainer.total_epochs", "data.train_batch_sise", "data.nope", "trainer.logger"):
        assert key in text
    assert "data.train_batch_size:" not in text
    # all good: nothing, an interpolation to another given key included; one bad
    # interpolation alone is still resolved and refused
    assert key_problems({"data.train_batch_size": 8, "data.max_prompt_length": 16}) == []
    assert key_problems({"data.max_prompt_length": "${data.train_batch_size}"}) == []
    assert key_problems({"data.max_prompt_length": "${data.nope}"}) == [
        "base config: data.max_prompt_length: Interpolation key 'data.nope' not found"
    ]
