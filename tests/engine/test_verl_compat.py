"""A verl launch script runs unchanged (issue 29): every key of verl's trainer schema is
known here (tests/engine/verl_keys.txt, made by scripts/verl_schema_keys.py), Hydra's
command line works as in verl, messages name what a verl key is, and the rules follow
verl's semantics."""

import re
from pathlib import Path

import pytest
import yaml

from engine.config import load, load_config
from engine.config.aliases import schema_key
from engine.config.given import field_at, start_note
from engine.config.keys import leaf
from engine.errors import ConfigError
from engine.main import main

VERL_KEYS = [
    line.strip()
    for line in (Path(__file__).parent / "verl_keys.txt").read_text().splitlines()
    if line.strip() and not line.startswith("#")
]
REQUIRED = ["actor_rollout_ref.model.path=/models/tiny", "data.train_files=train.parquet"]
GRPO = [
    *REQUIRED,
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "trainer.n_gpus_per_node=2",
]


def flat_keys(node: dict, prefix: str = "") -> set[str]:
    out = set()
    for key, value in node.items():
        out.add(f"{prefix}{key}")
        if isinstance(value, dict):
            out |= flat_keys(value, f"{prefix}{key}.")
    return out


def printed(capsys, *args: str) -> set[str]:
    main([*args, *REQUIRED])
    return flat_keys(yaml.safe_load(capsys.readouterr().out))


def test_the_key_list_is_verls_whole_schema():
    assert len(VERL_KEYS) > 950  # both generated schemas, v0.9.0 and main
    for key in ("trainer.balance_batch", "ray_kwargs.ray_init.num_cpus", "distillation.enabled"):
        assert key in VERL_KEYS


@pytest.mark.parametrize("key", VERL_KEYS)
def test_every_verl_key_is_known(key):
    """A schema key under its own name or verl's other spelling, or a key inside one of
    the mappings that hold verl's subtrees (with its shape's key there)."""
    target = schema_key(key)
    if leaf(target) is not None:
        return
    found = field_at(target)
    assert found is not None and found[1] != target, f"{key}: unknown to the engine"


def test_print_config_covers_every_verl_key(capsys):
    keys = printed(capsys, "--print-config")
    missing = [k for k in VERL_KEYS if schema_key(k) not in keys]
    assert not missing, missing[:10]


def test_cfg_job_prints_every_verl_key_under_verls_spelling(capsys):
    keys = printed(capsys, "--cfg", "job")
    missing = [k for k in VERL_KEYS if k not in keys]
    assert not missing, missing[:10]


def test_cfg_job_shows_one_value_under_both_spellings(capsys):
    main(["--cfg", "job", *REQUIRED, "critic.fsdp.param_offload=true"])
    out = yaml.safe_load(capsys.readouterr().out)
    assert out["critic"]["fsdp"]["param_offload"] is True
    assert out["critic"]["fsdp_config"]["param_offload"] is True


def test_a_run_is_told_which_keys_it_set_change_nothing_here():
    loaded = load(
        [
            *GRPO,
            "actor_rollout_ref.rollout.mode=async",
            "actor_rollout_ref.actor.megatron.param_offload=true",
            "+actor_rollout_ref.actor.profiler.tool_config.npu.level=level1",
            "trainer.balance_batch=true",  # implemented: not listed
            "hydra.run.dir=/tmp/x",
        ]
    )
    note = start_note(loaded)
    assert note is not None and note.startswith("note: 4 key(s) set change nothing")
    for key in (
        "actor_rollout_ref.rollout.mode",
        "actor_rollout_ref.actor.megatron.param_offload",
        "actor_rollout_ref.actor.profiler.tool_config.npu.level",
        "hydra.run.dir",
    ):
        assert key in note
    assert "balance_batch" not in note
    assert start_note(load(GRPO)) is None


def test_the_note_is_printed_at_start(capsys):
    main(["--check", *GRPO, "actor_rollout_ref.rollout.mode=async"])
    err = capsys.readouterr().err.splitlines()
    assert [line for line in err if line.startswith("note:")] == [
        "note: 1 key(s) set change nothing in this engine (verl's, accepted so that its"
        " command lines run; `python -m engine.main --help KEY` says why):"
        " actor_rollout_ref.rollout.mode"
    ]


# ---------------------------------------------------------------------------
# Hydra's command line


def test_verls_bundled_configs_by_name(capsys):
    for name in ("ppo_megatron_trainer", "ppo_megatron_trainer.yaml"):
        cfg = load_config(GRPO, config_path="config", config_name=name)
        assert cfg.actor_rollout_ref.actor.strategy == "megatron"
        assert cfg.critic.strategy == "megatron" and cfg.model_engine == "megatron"
    assert load_config(GRPO, config_path="config", config_name="ppo_trainer").model_engine is None
    with pytest.raises(ConfigError, match="none of verl's bundled configs"):
        load_config(GRPO, config_path="config", config_name="my_trainer")
    # the command line's spelling, = or not, -cp and -cn
    main(["--check", *GRPO, "--config-path=config", "--config-name=ppo_megatron_trainer.yaml"])
    main(["--check", *GRPO, "-cp", "config", "-cn", "ppo_trainer"])
    assert "config ok" in capsys.readouterr().out


def test_a_users_config_file_on_verls_layout(tmp_path):
    (tmp_path / "base.yaml").write_text("data:\n  max_prompt_length: 300\n")
    (tmp_path / "run.yaml").write_text(
        "hydra:\n  searchpath: [file://verl/trainer/config]\n"
        "defaults:\n  - ppo_megatron_trainer\n  - base\n"
        "  - override ref@actor_rollout_ref.ref: dp_ref\n  - _self_\n"
        "data:\n  max_response_length: 200\n"
        "actor_rollout_ref:\n  rollout:\n    checkpoint_engine:\n"
        "      update_weights_bucket_megabytes: 64\n"
    )
    cfg = load_config(GRPO, config_path=str(tmp_path), config_name="run")
    assert cfg.actor_rollout_ref.actor.strategy == "megatron"  # the bundled config
    assert cfg.actor_rollout_ref.ref.strategy == "fsdp"  # the group choice over it
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (300, 200)
    assert cfg.actor_rollout_ref.rollout.update_weights_bucket_megabytes == 64  # an alias
    # the command line wins over the file
    cfg = load_config(
        [*GRPO, "data.max_response_length=50"], config_path=str(tmp_path), config_name="run"
    )
    assert cfg.data.max_response_length == 50


def test_group_choices():
    cfg = load_config([*GRPO, "model_engine=megatron"])
    assert cfg.actor_rollout_ref.actor.strategy == cfg.critic.strategy == "megatron"
    # a role's choice, and a role's own key over the family's choice
    cfg = load_config(
        [
            *GRPO,
            "model_engine=megatron",
            "ref@actor_rollout_ref.ref=dp_ref",
            "actor_rollout_ref.actor.strategy=fsdp2",
        ]
    )
    arr = cfg.actor_rollout_ref
    assert (arr.actor.strategy, arr.ref.strategy) == ("fsdp2", "fsdp")
    assert load_config([*GRPO, "model_engine=veomni"]).actor_rollout_ref.actor.strategy == "fsdp2"
    for choice in ("rollout@actor_rollout_ref.rollout=rollout", "model@critic.model=hf_model"):
        assert load_config([*GRPO, choice]) == load_config(GRPO)  # verl's only choice


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ("actor@actor_rollout_ref.actor=mlite_actor", "Megatron-lite plugin engine"),
        ("model_engine=torchtitan", "TorchTitan engine is not in this engine"),
        ("critic@critic=megatron_critc", "not one of verl's choices here: critic, dp_critic"),
    ],
)
def test_a_choice_this_engine_lacks_is_named(choice, expected):
    with pytest.raises(ConfigError, match=expected):
        load_config([*GRPO, choice])


def test_plus_and_tilde():
    kwargs = "actor_rollout_ref.rollout.engine_kwargs.vllm"
    cfg = load_config([*GRPO, f"+{kwargs}.kv_cache_dtype=fp8", f"++{kwargs}.seed=3"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["vllm"] == {
        "kv_cache_dtype": "fp8",
        "seed": 3,
    }
    # + on a key the schema has sets it; on one it lacks, the schema refuses it
    assert load_config([*GRPO, "+trainer.seed=5"]).trainer.seed == 5
    with pytest.raises(ConfigError, match=re.escape("unknown key 'trainer.sed'")):
        load_config([*GRPO, "+trainer.sed=5"])
    assert load_config([*GRPO, "trainer.seed=5", "~trainer.seed"]).trainer.seed == 1


# ---------------------------------------------------------------------------
# messages


def unknown(key: str) -> str:
    with pytest.raises(ConfigError) as info:
        load_config([*GRPO, f"{key}=1"])
    (problem,) = info.value.problems
    return problem


def test_did_you_mean_only_for_a_near_miss_of_the_same_section():
    assert "did you mean 'data.train_batch_size'" in unknown("data.train_batch_sise")
    # looks alike, means something else: no suggestion (the old message offered
    # trainer.total_epochs for trainer.balance_batchh)
    assert "did you mean" not in unknown("trainer.some_other_thing")
    assert "did you mean 'trainer.balance_batch'" in unknown("trainer.balance_batchh")


def test_a_key_of_another_section_is_named():
    message = unknown("trainer.train_batch_size")
    assert "the key of that name here is 'data.train_batch_size'" in message


def test_a_verl_section_the_engine_lacks_names_the_feature():
    assert "mlite (Megatron-lite) plugin engine" in unknown("actor_rollout_ref.actor.engine.tp")
    message = unknown("teacher.model")
    assert "no section 'teacher' here nor in verl's schema" in message


def test_turning_on_a_verl_feature_the_engine_lacks_is_refused_by_name():
    with pytest.raises(ConfigError) as info:
        load_config([*GRPO, "skip.rollout.enable=true", "transfer_queue.enable=true"])
    first, second = sorted(info.value.problems)
    assert first.startswith("skip.rollout.enable=true turns on verl's rollout dump and replay")
    assert "leave it at false" in first and "TransferQueue" in second
    # a subtree's typo is refused with its keys
    with pytest.raises(
        ConfigError, match=re.escape("did you mean actor_rollout_ref.actor.profiler.enable")
    ):
        load_config([*GRPO, "+actor_rollout_ref.actor.profiler.enabel=true"])


def test_help_of_a_verl_key_says_what_it_is(capsys):
    main(
        [
            "--help",
            "critic.fsdp.param_offload",
            "actor_rollout_ref.actor.profiler.tool_config.npu.level",
            "actor_rollout_ref.rollout.mode",
        ]
    )
    out = capsys.readouterr().out
    assert "critic.fsdp.param_offload\n  verl's spelling of critic.fsdp_config.param_offload" in out
    assert "part of actor_rollout_ref.actor.profiler (changes nothing here)" in out
    assert "changes nothing here" in out.split("actor_rollout_ref.rollout.mode")[-1]


# ---------------------------------------------------------------------------
# rules, on verl's semantics


def test_megatron_batches_split_over_the_data_parallel_groups():
    # 16 devices, TP 4 × PP 2: 2 data-parallel groups; 2 prompts × 3 samples = 6 samples
    # split over 2 groups (verl's rule), not over the 16 devices.
    megatron = [
        *REQUIRED,
        "trainer.n_gpus_per_node=16",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
    ]
    cfg = load_config(megatron)
    assert cfg.data_parallel_size("actor") == 2
    with pytest.raises(ConfigError, match="divisible by the 4 data-parallel groups"):
        load_config([*megatron, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1"])


def test_the_megatron_reference_follows_the_actors_sizes():
    cfg = load_config(
        [
            *GRPO,
            "actor_rollout_ref.actor.strategy=megatron",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        ]
    )
    _, ref = cfg.megatron_roles()["reference"]
    assert ref.tensor_model_parallel_size == 2  # verl's default: the actor's


def test_dtypes_and_loggers_in_verls_spellings():
    cfg = load_config([*GRPO, "actor_rollout_ref.model.dtype=bf16", "trainer.logger=console"])
    assert cfg.actor_rollout_ref.model.dtype == "bfloat16"
    assert cfg.trainer.loggers == ["console"]
    assert load_config([*GRPO, "trainer.logger=[console,file]"]).trainer.loggers == [
        "console",
        "jsonl",
    ]


def test_cispos_open_lower_side():
    cispo = [*GRPO, "actor_rollout_ref.actor.policy_loss.loss_mode=cispo"]
    assert load_config([*cispo, "actor_rollout_ref.actor.clip_ratio_low=10"])
    with pytest.raises(ConfigError, match=re.escape("clip_ratio_low 10.0 must be in")):
        load_config([*GRPO, "actor_rollout_ref.actor.clip_ratio_low=10"])  # PPO's clip


def test_the_fully_async_trainers_zero_batch_size():
    fully = [
        *REQUIRED,
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "async_training.mode=fully_async",
        "actor_rollout_ref.rollout.placement=separate",
        "actor_rollout_ref.rollout.separate_nnodes=1",
        "actor_rollout_ref.rollout.separate_n_gpus_per_node=2",
        "trainer.n_gpus_per_node=2",
        "data.train_batch_size=0",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "async_training.require_batches=2",
    ]
    cfg = load_config(fully)
    assert cfg.data.train_batch_size == 8  # require_batches × ppo_mini_batch_size
    with pytest.raises(
        ConfigError, match=re.escape("data.train_batch_size must be a positive integer")
    ):
        load_config([*GRPO, "data.train_batch_size=0"])


# ---------------------------------------------------------------------------
# verl's keys passed on


def test_ray_kwargs_reach_ray_init_over_the_engines_own():
    from engine.config.verl_sections import ray_init_args

    own = {"num_cpus": 4, "include_dashboard": False, "runtime_env": {"env_vars": {"A": "1"}}}
    cfg = load_config(
        [
            *GRPO,
            "ray_kwargs.ray_init.num_cpus=16",
            "+ray_kwargs.ray_init.runtime_env.env_vars.B=2",
            "ray_kwargs.ray_init.runtime_env.py_executable=/venv/bin/python",
        ]
    )
    assert ray_init_args(cfg, own) == {
        "num_cpus": 16,
        "include_dashboard": False,
        "runtime_env": {"env_vars": {"A": "1", "B": "2"}, "py_executable": "/venv/bin/python"},
    }
    # verl's defaults (nulls) leave the engine's choices; joining a cluster takes only the env
    assert ray_init_args(load_config(GRPO), own) == own
    joined = ray_init_args(cfg, {"address": "ray://x", "runtime_env": {}}, joining=True)
    assert "num_cpus" not in joined and joined["runtime_env"]["env_vars"] == {"B": "2"}


def test_engine_kwargs_and_the_context_length_are_checked_up_front():
    with pytest.raises(ConfigError, match="the engine sets it itself"):
        load_config([*GRPO, "+actor_rollout_ref.rollout.engine_kwargs.vllm.model=/x"])
    with pytest.raises(ConfigError, match="max_model_len=100 cannot hold a prompt"):
        load_config([*GRPO, "actor_rollout_ref.rollout.max_model_len=100"])
    assert load_config([*GRPO, "actor_rollout_ref.rollout.max_model_len=4096"])


def test_verls_expert_tensor_parallel_size():
    """verl's MoE scripts' expert tensor parallelism (ETP 1 with TP 2): the experts' grid
    is laid out apart from the dense one, on as few devices as ETP × EP × PP; the
    reference follows the actor's size unless it sets its own, and every colocated role
    must agree on it."""
    from engine.config.notes import notes

    actor = "actor_rollout_ref.actor.megatron"
    moe = [
        *REQUIRED,
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.use_kl_loss=true",  # a Megatron reference too
        f"{actor}.tensor_model_parallel_size=2",
        f"{actor}.expert_model_parallel_size=4",
        f"{actor}.expert_tensor_parallel_size=1",
    ]
    for devices in (4, 8):  # 4: dense TP 2 × DP 2, experts EP 4 × ETP 1
        cfg = load_config([*moe, f"trainer.n_gpus_per_node={devices}"])
        assert notes(cfg) == []
        roles = cfg.megatron_roles()
        assert [roles[r][1].expert_tensor_parallel_size for r in ("actor", "reference")] == [1, 1]
    # 2 devices hold TP 2 but not EP 4: refused at the actor's key, with the sizes
    with pytest.raises(ConfigError) as info:
        load_config([*moe, "trainer.n_gpus_per_node=2"])
    (p,) = info.value.problems
    assert p.startswith(f"the world size 2 must be a multiple of {actor}.expert_tensor_parallel")
    assert "= 1 × 4 × 1 = 4" in p
    # a reference with its own ETP would need a second parallel state in the same process
    with pytest.raises(ConfigError) as info:
        load_config(
            [
                *moe,
                "trainer.n_gpus_per_node=8",
                "actor_rollout_ref.ref.megatron.expert_tensor_parallel_size=2",
            ]
        )
    (p,) = info.value.problems
    assert "share their worker processes" in p
    assert "expert_tensor_parallel_size=1; actor_rollout_ref.ref.megatron" in p
