"""Whole engine runs on CPU: a real Ray cluster, two workers in one FSDP (gloo) group,
HF rollout, rule rewards, and the algorithms of the loop.

The runs go in this process (tests/e2e/conftest.py: ``run_engine``); the algorithm
variants that place the same roles the same way run one after another on one kept
worker group, each host building its roles again, and
``test_a_kept_group_runs_as_a_fresh_one`` shows that leaves nothing behind."""

import importlib.util
import json
import math
import os

import pytest

from engine.algo.names import estimator_needs
from engine.loop.metrics import MACHINE_METRICS  # times, throughput, memory

pytestmark = pytest.mark.slow


def _has_megatron() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


# megatron-core lives beside the venv in .megatron-core (scripts/setup.sh; its numpy<2
# pin); the Megatron variant is in the suite's smoke subset (tests/conftest.py).
MEGATRON_MISSING = pytest.mark.skipif(not _has_megatron(), reason="megatron-core is not installed")

# The rollout on a real vLLM engine (its CPU build), its log-probs compared with the
# training forward's at every step.
VLLM_ROLLOUT = [
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
]
VLLM = pytest.param(VLLM_ROLLOUT, marks=pytest.mark.vllm, id="vllm")


@pytest.mark.parametrize("rollout", [pytest.param([], id="hf"), VLLM])
def test_grpo_learns_the_synthetic_task(
    rollout, tiny_model_dir, synthetic_data, tmp_path, run_engine, capsys
):
    """The learning proofs of the synchronous loop, with the Hugging Face rollout and
    with vLLM. A zero learning rate or a flipped gradient sign leaves the score at its
    random-policy level (about 0.01) and fails the margin. With vLLM generating, the same
    margin, and at every step the engine's log-probs are the training forward's: a
    weight push that did not land (stale, half-applied) breaks that on the step after it.
    (Megatron's learning: its update is FSDP's, step by step, tests/e2e/test_megatron_cpu.py.)"""
    train, val = synthetic_data
    run = run_engine(
        *rollout,
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        f"data.val_files={val}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "trainer.total_training_steps=24",
        "trainer.test_freq=12",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.logger=[console]",
        "trainer.save_freq=100",  # only the last step: what the export reads
        f"trainer.export_hf_dir={tmp_path / 'hf'}",
    )
    assert "step 24/24 | score" in capsys.readouterr().out  # the console line per step
    records = run.steps
    assert [r["step"] for r in records] == list(range(1, 25))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:5]) / 5, sum(scores[-5:]) / 5
    assert last > first + 0.04, f"score did not rise: {scores}"
    # On-policy (one mini-batch, one epoch): the ratio starts at 1, and π_old comes from
    # the update's own forward, with no pass of its own, unless the engine's log-probs
    # are to be compared with it.
    assert all(abs(r["actor/ppo_kl"]) < 1e-6 for r in records)
    if rollout:
        assert all("timing_s/old_log_prob" in r for r in records)
        assert max(r["training/rollout_log_ratio_abs_max"] for r in records) < 1e-3
        assert max(r["training/rollout_probs_diff_max"] for r in records) < 1e-4
    else:
        assert not any("timing_s/old_log_prob" in r for r in records)
    assert any("val/score/mean" in r for r in records)  # validation ran at test_freq
    # The trained policy, exported at the end, loads as a plain Hugging Face model.
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert exported.num_parameters() == initial.num_parameters()
    assert not exported.model.norm.weight.equal(initial.model.norm.weight)  # it trained


@pytest.fixture(scope="module")
def tiny_moe_dir(tiny_model_dir, tmp_path_factory):
    """A random Qwen3-MoE (4 experts, 2 a token) with the tiny model's tokenizer."""
    import shutil

    from engine.models.tiny import random_model, tiny_config

    out = tmp_path_factory.mktemp("tiny_moe")
    for file in tiny_model_dir.iterdir():
        if file.name.startswith(("tokenizer", "chat_template", "special_tokens", "generation_")):
            shutil.copy(file, out / file.name)
    dense = json.loads((tiny_model_dir / "config.json").read_text())
    ids = {k: dense[k] for k in ("vocab_size", "eos_token_id", "pad_token_id", "bos_token_id")}
    random_model(tiny_config("qwen3_moe", num_layers=2, **ids), seed=0).save_pretrained(out)
    return out


# The variants, grouped by the roles they place (a critic and a reference, a reference,
# the actor alone): each group's runs share one kept worker group (conftest.py's
# ``reuse_key``); vLLM and Megatron runs start their own.
ALGORITHMS = {
    "ppo_gae_kl_in_reward": [
        "algorithm.adv_estimator=gae",
        "algorithm.use_kl_in_reward=true",
        "algorithm.kl_ctrl.type=adaptive",
        "actor_rollout_ref.rollout.n=2",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-3",
        # Token-budget micro-batches for the actor, critic and reference passes.
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200",
        # Packed sequences (engine.train.packing) for the actor, reference and critic.
        "actor_rollout_ref.model.use_remove_padding=true",
        "critic.model.use_remove_padding=true",
    ],
    # Ulysses sequence parallelism (engine.train.ulysses) over both workers for the actor,
    # the reference (the actor's size) and the critic; the HF rollout generates with the
    # same module, its attention passing straight through.
    "ppo_kl_loss_ulysses2": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-3",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
    ],
    # MoE routing replay (a Qwen3-MoE, tiny_moe_dir) on the same placement: R2 as verl's
    # VeOmni example runs it, with Ulysses 2 (each rank of the pair routes half of every
    # packed row; the recording is completed over the pair), the critic and the
    # reference routing freely.
    "ppo_kl_loss_ulysses2_moe_r2": [
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "critic.ppo_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-3",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.veomni.router_replay.mode=R2",
    ],
    "grpo_kl_loss": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
    ],
    # Log-probs, entropy (a loss term here) and the reference's KL without the whole
    # logits (engine.train.fused_head), 7 tokens' logits at a time.
    "grpo_kl_loss_fused_head": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01",
        "actor_rollout_ref.model.use_fused_kernels=true",
        "actor_rollout_ref.model.fused_kernel_options.chunk_size=7",
    ],
    "dr_grpo": [
        "algorithm.adv_estimator=grpo",
        "algorithm.norm_adv_by_std_in_grpo=false",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
    ],
    "dapo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "reward_model.reward_manager=dapo",
        "reward_model.overlong_buffer.enable=true",
        "reward_model.overlong_buffer.len=4",
    ],
    "rloo": ["algorithm.adv_estimator=rloo"],
    # Offload flags are accepted on CPU (a no-op there: memory is host memory); they are
    # exercised for real only on an accelerator.
    "grpo_offload_flags_cosine": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
    ],
    "remax": ["algorithm.adv_estimator=remax", "actor_rollout_ref.rollout.n=2"],
    "reinforce_pp": [
        "algorithm.adv_estimator=reinforce_plus_plus",
        "actor_rollout_ref.rollout.n=2",
    ],
    "gspo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
        "actor_rollout_ref.actor.clip_ratio_low=3e-4",
        "actor_rollout_ref.actor.clip_ratio_high=4e-4",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ],
    # The trust-region losses, with two epochs so that the ratio leaves 1.
    "sapo": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
        "actor_rollout_ref.actor.tau_pos=1.0",
        "actor_rollout_ref.actor.tau_neg=1.05",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ],
    "dppo_tv": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_tv",
        "actor_rollout_ref.actor.clip_ratio=0.15",
        "actor_rollout_ref.actor.clip_ratio_c=10000.0",
        "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ],
    "dppo_kl": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
        "actor_rollout_ref.actor.clip_ratio=0.05",
        "actor_rollout_ref.actor.ppo_epochs=2",
    ],
    # MoE routing replay R3 as verl's Megatron example spells it: the HF rollout records
    # the routing while it generates (on the twin of the sharded module), the π_old pass
    # and the update replay it; π_old is then the engine's log-probs.
    "grpo_moe_r3": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "actor_rollout_ref.actor.megatron.router_replay.mode=R3",
        "actor_rollout_ref.rollout.enable_rollout_routing_replay=true",
    ],
    # The optimal token baseline: Σπ² from the actor's π_old pass, which runs although
    # one mini-batch would otherwise be on-policy without it.
    "optimal_token_baseline": [
        "algorithm.adv_estimator=optimal_token_baseline",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    ],
    # Its multi-turn form, with the rollout's TIS weights (HF's own log-probs) in W.
    "tir_optimal_token_baseline_tis": [
        "algorithm.adv_estimator=tir_optimal_token_baseline",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
    ],
    # verl 0.9's rollout correction against the HF rollout's own log-probs: IcePop bounds,
    # batch-normalised weights and two rejection options (decoupled mode) ...
    "grpo_icepop_rejection": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.rollout_is=token",
        "algorithm.rollout_correction.rollout_is_threshold='0.5_5.0'",
        "algorithm.rollout_correction.rollout_is_batch_normalize=true",
        "algorithm.rollout_correction.rollout_rs='token_k1,seq_mean_k3'",
        "algorithm.rollout_correction.rollout_rs_threshold='0.5_2.0,0.01'",
    ],
    # ... and bypass mode's REINFORCE with sequence weights and rejection, in the loss.
    "bypass_reinforce_rejection": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "algorithm.rollout_correction.bypass_mode=true",
        "algorithm.rollout_correction.loss_type=reinforce",
        "algorithm.rollout_correction.rollout_is=sequence",
        "algorithm.rollout_correction.rollout_rs=seq_mean_k3",
        "algorithm.rollout_correction.rollout_rs_threshold=0.01",
    ],
    # Two of the synthetic scorer's numbers as separately normalised rewards.
    "gdpo": [
        "algorithm.adv_estimator=gdpo",
        "algorithm.gdpo_reward_keys=[close,leading]",
        "+algorithm.gdpo_reward_weights=[1.0,0.5]",
    ],
    # DAPO's dynamic sampling on vLLM, with truncated importance sampling against it.
    "dapo_vllm_tis": [
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=score",
        "algorithm.filter_groups.max_num_gen_batches=3",
        "reward_model.reward_manager=dapo",
        *VLLM_ROLLOUT,
        "algorithm.rollout_correction.rollout_is=token",
    ],
    # vLLM with tensor parallelism 2 over the two CPU workers (one engine, SPMD).
    "grpo_vllm_tp2": [
        "algorithm.adv_estimator=grpo",
        *VLLM_ROLLOUT,
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    ],
    # A Megatron actor (TP 2 with sequence parallelism) pushing its HF-named tensors to vLLM.
    "grpo_megatron_tp2_vllm": [
        "algorithm.adv_estimator=grpo",
        *VLLM_ROLLOUT,
        "actor_rollout_ref.actor.strategy=megatron",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
        "actor_rollout_ref.actor.megatron.sequence_parallel=true",
    ],
}


def _algorithm_marks(name: str) -> list:
    marks = [pytest.mark.vllm] if "vllm" in name else []
    if "megatron" in name:
        marks.append(MEGATRON_MISSING)
    return marks


def _tp_segments() -> set[str]:
    """The shared-memory segments of vLLM's CPU TP groups (named ...-cpushm_<rank>; the
    engine prefixes them with a token of its own, engine/rollout/vllm_cpu.py)."""
    return {name for name in os.listdir("/dev/shm") if "cpushm" in name}


def variant(name: str, tiny_model_dir, train, run_dir) -> list[str]:
    """The overrides of a two-step run of the variant ``name``."""
    return [
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[]",
        *ALGORITHMS[name],
    ]


@pytest.mark.parametrize("name", [pytest.param(n, marks=_algorithm_marks(n)) for n in ALGORITHMS])
def test_algorithm_runs(name, tiny_model_dir, synthetic_data, tmp_path, run_engine, request):
    train, _ = synthetic_data
    tp = any(
        o.startswith("actor_rollout_ref.rollout.tensor_model_parallel_size=") and o[-2:] != "=1"
        for o in ALGORITHMS[name]
    )
    if tp:  # the segments checked below are then this run's alone
        request.getfixturevalue("vllm_tp_alone")
    segments = _tp_segments()
    # the MoE variants' model (routing replay); a replaying pass whose batch lacks the
    # routing, or holds it in another shape than its routers', raises
    model = request.getfixturevalue("tiny_moe_dir") if "_moe" in name else tiny_model_dir
    run = run_engine(*variant(name, model, train, tmp_path))
    cfg, records = run.cfg, run.records
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean"):
            assert math.isfinite(record[key]), (key, record)
        assert record["actor/skipped_updates"] == 0
        if cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "constant":
            assert record["actor/lr"] == pytest.approx(2e-3)
    last = records[-1]
    if cfg.use_critic:
        assert math.isfinite(last["critic/vf_loss"]) and "critic/values/mean" in last
    if cfg.algorithm.use_kl_in_reward:
        assert last["actor/reward_kl_penalty_coeff"] > 0
    if cfg.actor_rollout_ref.actor.use_kl_loss:
        assert last["actor/kl_loss"] >= 0  # k3 is non-negative
    if estimator_needs(cfg.algorithm.adv_estimator).sum_pi_squared or cfg.routing_replay.on:
        assert all("timing_s/old_log_prob" in r for r in records)
    for key in cfg.algorithm.gdpo_reward_keys or []:
        assert 0.0 <= last[f"gdpo/{key}/mean"] <= 1.0
    if cfg.algorithm.filter_groups.enable:
        assert 1 <= last["training/gen_batches"] <= 3
    bypass = cfg.algorithm.rollout_correction.bypass_mode  # no π_old to compare with
    if cfg.actor_rollout_ref.rollout.calculate_log_probs and not bypass:
        # The engine's probabilities are the training forward's, at TP 2 too: its members
        # sample in step (were they not, a member's rows would be another engine's draw:
        # 4e-4 in probability was seen so).
        assert max(r["training/rollout_log_ratio_abs_max"] for r in records) < 1e-3
    rc = cfg.algorithm.rollout_correction
    if rc.rollout_is and not rc.bypass_mode:  # against π_old: the engine's own numbers
        assert last["training/rollout_is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    if rc.rollout_is and rc.bypass_mode:  # against π_θ, which the first update moved
        assert 0.0 < last["training/rollout_is_weight_mean"] < 5.0
    if rc.rollout_rs:
        # the bounds hold the engine's probabilities (decoupled: nothing rejected), and
        # every option reports
        for option in rc.rollout_rs.split(","):
            assert f"rollout_corr/rollout_rs_{option}_masked_fraction" in last
        rejected = last["rollout_corr/rollout_rs_masked_fraction"]
        assert rejected == 0.0 if not rc.bypass_mode else 0.0 <= rejected <= 1.0
    if cfg.actor_rollout_ref.rollout.tensor_model_parallel_size > 1:
        # vLLM's CPU all-reduce and broadcast segments go with the run (a second TP run
        # on the machine would otherwise fail to create them, and they hold memory).
        assert _tp_segments() <= segments


# A run that changes what it can in the processes it runs in, for the run after it: its
# own reward function, seed, schedule, batching and forward.
LEAVES_STATE = [
    "actor_rollout_ref.actor.use_dynamic_bsz=true",
    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=200",
    "actor_rollout_ref.model.use_remove_padding=true",
    "actor_rollout_ref.actor.optim.lr_scheduler_type=cosine",
    "actor_rollout_ref.actor.optim.lr_warmup_steps=1",
    "trainer.seed=7",
]
LENGTH_REWARD = """\
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(solution_str) % 3 / 2
"""


def test_a_kept_group_runs_as_a_fresh_one(
    tiny_model_dir, synthetic_data, tmp_path, run_engine, kept_workers
):
    """A variant on workers of its own, then another run on those workers, then the
    variant again on them: the same numbers, step by step, as the first time. Whatever
    a run leaves in this process (its reward function, seeds, the scorer's processes) or
    in the kept workers (models, optimizer and schedule, patched forwards, random state)
    would show in the second run of the variant. (A run here against the same run as a
    process of its own: tests/e2e/test_resume.py, the killed run's first steps.)"""
    train, _ = synthetic_data
    reward = tmp_path / "reward.py"
    reward.write_text(LENGTH_REWARD)
    kept_workers.release()
    reused = kept_workers.reused
    fused = "grpo_kl_loss_fused_head"
    first = run_engine(*variant(fused, tiny_model_dir, train, tmp_path / "first"))
    run_engine(*variant("grpo_kl_loss", tiny_model_dir, train, tmp_path / "between"),
               *LEAVES_STATE, f"custom_reward_function.path={reward}")  # fmt: skip
    again = run_engine(*variant(fused, tiny_model_dir, train, tmp_path / "again"))
    assert kept_workers.reused == reused + 2  # both later runs on the first run's workers

    def run_metrics(record: dict) -> dict:
        return {k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)}

    assert [run_metrics(r) for r in again.records] == [run_metrics(r) for r in first.records]
