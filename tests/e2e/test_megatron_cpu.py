"""Whole engine runs with the Megatron-core training backend on CPU (gloo, 2 workers:
TP=1 × DP=2, TP=2 × DP=1, and two pipeline stages, PP=2 × DP=1):
``actor_rollout_ref.actor.strategy=megatron`` (the reference follows it) and
``critic.strategy=megatron``, HF rollout on its own model synced from the actor.

Needs megatron-core: ``scripts/setup.sh`` installs it with ``--no-deps`` (its numpy<2
pin) into ``.megatron-core``, which ``scripts/test.sh`` puts on PYTHONPATH; the local Ray
cluster's workers inherit it. Skipped otherwise. The suite runs the DeepSeek-V3 case;
``RLCTL_TEST_MEGATRON=all`` runs all (tests/conftest.py).
Megatron's learning is FSDP's: its update is, step by step, and FSDP's learning proof is
``tests/e2e/test_engine_cpu.py::test_grpo_learns_the_synthetic_task``.
"""

import importlib.util
import json
import math
from pathlib import Path

import pytest

from engine.loop.metrics import MACHINE_METRICS  # times, throughput, memory


def _has_megatron() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not _has_megatron(),
        reason="megatron-core is not installed (pip install 'rlctl[megatron]'); see module doc",
    ),
]

MEGATRON = ["actor_rollout_ref.actor.strategy=megatron"]
# Metrics that measure the machine, not the run.


@pytest.fixture(scope="module")
def run(run_engine):
    """``run(model, train, run_dir, *extra) -> list[dict]``: a run in this process (no
    loggers) and its metrics."""

    def run(model: Path, train: Path, run_dir: Path, *extra: str) -> list[dict]:
        return run_engine(
            "trainer.logger=[]",
            f"actor_rollout_ref.model.path={model}",
            f"data.train_files={train}",
            f"trainer.default_local_dir={run_dir}",
            *extra,
        ).records

    return run


GRPO_KL = [
    "algorithm.adv_estimator=grpo",
    "actor_rollout_ref.rollout.n=4",
    "data.train_batch_size=8",
    # One mini-batch (the same rows whatever the data-parallel size), two epochs: two
    # optimizer steps a step, π_old from its own pass, and gradient accumulation.
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_epochs=2",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.use_kl_loss=true",  # a reference, Megatron too (the actor's)
    "trainer.total_training_steps=2",
]


@pytest.fixture(scope="module")
def fsdp_grpo(run, tiny_model_dir, synthetic_data, tmp_path_factory):
    train, _ = synthetic_data
    return run(tiny_model_dir, train, tmp_path_factory.mktemp("fsdp"), *GRPO_KL)


def _sizes(roles: tuple[str, ...], tp: int, pp: int, sp: bool = False, cp: int = 1) -> list[str]:
    return [
        f"{role}.megatron.{name}={size}"
        for role in roles
        for name, size in (
            ("tensor_model_parallel_size", tp),
            ("pipeline_model_parallel_size", pp),
            ("context_parallel_size", cp),
            ("sequence_parallel", str(sp).lower()),
        )
    ]


@pytest.mark.parametrize(
    "tp,pp,sp,cp",
    [(1, 1, False, 1), (2, 1, False, 1), (1, 2, False, 1), (2, 1, True, 1), (1, 1, False, 2)],
    ids=["dp2", "tp2", "pp2", "tp2-sp", "cp2"],
)
def test_megatron_grpo_takes_the_fsdp_update(
    tp, pp, sp, cp, fsdp_grpo, run, tiny_model_dir, synthetic_data, tmp_path
):
    """Same config and seed, FSDP2 then Megatron (TP 1: DP 2; TP 2 or PP 2: both ranks
    hold the same rows; with PP the stages run 1F1B and the last one answers; with SP the
    TP ranks split the sequence; with CP both ranks run halves of every sequence). Both
    backends start from the same HF weights in float32 and the rollout samples the same
    responses, so every metric of the update agrees to float32 rounding (measured: ≤ 4e-6
    relative). Step 2 samples again after the weight sync into the rollout's own model
    (with PP, each stage's layers broadcast to the other): equal scores and equal losses
    show the push carried the updated weights. A wrong loss scale, a missing DP average,
    ranks of one replica given different rows, metrics read from a stage that holds
    placeholders or a stale rollout model each move these by far more."""
    train, _ = synthetic_data
    fsdp = fsdp_grpo
    sizes = _sizes(("actor_rollout_ref.actor", "actor_rollout_ref.ref"), tp, pp, sp, cp)
    megatron = run(
        tiny_model_dir,
        train,
        tmp_path / "megatron",
        *GRPO_KL,
        *MEGATRON,
        *sizes,
        "trainer.save_freq=2",
        f"trainer.export_hf_dir={tmp_path / 'hf'}",
    )
    _assert_same_update(fsdp, megatron)
    # The export read the Megatron checkpoint (per-rank files, no model/ folder).
    ckpt = tmp_path / "megatron" / "global_step_2" / "actor"
    assert (ckpt / "meta.json").is_file() and not (ckpt / "model").exists()
    layouts = json.loads((ckpt / "meta.json").read_text())["ranks"]
    # (tp_rank, dp_rank, pp_rank, cp_rank) of ranks 0 and 1
    expected = {
        (1, 1, 1): [(0, 0, 0, 0), (0, 1, 0, 0)],
        (2, 1, 1): [(0, 0, 0, 0), (1, 0, 0, 0)],
        (1, 2, 1): [(0, 0, 0, 0), (0, 0, 1, 0)],
        (1, 1, 2): [(0, 0, 0, 0), (0, 0, 0, 1)],
    }[(tp, pp, cp)]
    keys = ("tp_rank", "dp_rank", "pp_rank", "cp_rank")
    assert [tuple(r[k] for k in keys) for r in layouts] == expected
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    before = initial.state_dict()
    moved = max((t - before[n]).abs().max().item() for n, t in exported.state_dict().items())
    assert moved > 1e-3  # it trained (lr 2e-3, 4 AdamW steps)


def _assert_same_update(fsdp: list[dict], megatron: list[dict]) -> None:
    """Both runs sampled the same responses and logged the same update, step by step."""
    assert [r["step"] for r in megatron] == [1, 2]
    keys = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/kl_loss")
    for step, (f, m) in enumerate(zip(fsdp, megatron, strict=True), start=1):
        assert m["critic/score/mean"] == f["critic/score/mean"], step
        assert m["response_length/mean"] == f["response_length/mean"], step
        assert m["actor/skipped_updates"] == 0
        assert m["actor/lr"] == pytest.approx(2e-3)
        for key in keys:
            assert math.isfinite(m[key]), (key, m)
            assert m[key] == pytest.approx(f[key], rel=1e-4, abs=1e-8), (step, key)
        assert m["actor/ppo_kl"] == pytest.approx(f["actor/ppo_kl"], rel=1e-3, abs=1e-8)
    assert "timing_s/old_log_prob" in megatron[0] and "timing_s/ref" in megatron[0]


@pytest.mark.parametrize(
    "model_type,experts,tp",
    [("qwen3_moe", 4, 1), ("deepseek_v3", 8, 1), ("qwen3_moe", 4, 2)],
    ids=["qwen3_moe-4", "deepseek_v3-8", "qwen3_moe-4-tp2-etp1"],
)
def test_megatron_moe_grpo_takes_the_fsdp_update(
    model_type, experts, tp, run, synthetic_data, tmp_path
):
    """Mixture-of-experts models (Qwen3-MoE: 4 experts, 2 per token; DeepSeek-V3:
    multi-latent attention, 8 experts in 4 groups, 4 per token, a shared expert and a
    routing bias), FSDP2 then Megatron with expert parallelism 2: each worker holds half
    the experts and the tokens of both data-parallel ranks meet in them (padded to one
    shape per micro-batch); with TP 2 and expert tensor parallelism 1 (verl's MoE
    scripts' layout) both workers hold the same rows, split by sequence, and whole
    experts. The same update as FSDP's, step by step; step 2 samples from the rollout's
    HF model after the experts (and the routing bias, a buffer) were synced into it by
    their checkpoint names; the export merges both ranks' experts."""
    from transformers import AutoModelForCausalLM

    from engine.models.tiny import build_tiny_model
    from engine.rollout.weights import as_checkpoint, checkpoint_reverter

    model = build_tiny_model(
        tmp_path / "model", seed=0, num_layers=2, num_experts=experts, model_type=model_type
    )
    train, _ = synthetic_data
    fsdp = run(model, train, tmp_path / "fsdp", *GRPO_KL)
    sizes = ["expert_model_parallel_size=2"]
    if tp > 1:
        sizes += [
            f"tensor_model_parallel_size={tp}",
            "sequence_parallel=true",
            "expert_tensor_parallel_size=1",
        ]
    megatron = run(
        model,
        train,
        tmp_path / "megatron",
        *GRPO_KL,
        *MEGATRON,
        *[f"actor_rollout_ref.actor.megatron.{size}" for size in sizes],
        "trainer.save_freq=2",
        f"trainer.export_hf_dir={tmp_path / 'hf'}",
    )
    _assert_same_update(fsdp, megatron)
    layouts = json.loads((tmp_path / "megatron/global_step_2/actor/meta.json").read_text())
    keys = ("dp_rank", "tp_rank", "ep_rank", "etp_rank")
    expected = [(0, 0, 0, 0), (1, 0, 1, 0)] if tp == 1 else [(0, 0, 0, 0), (0, 1, 1, 0)]
    assert [tuple(r[k] for k in keys) for r in layouts["ranks"]] == expected

    def checkpoint(path):
        m = AutoModelForCausalLM.from_pretrained(path)
        return dict(as_checkpoint(m.state_dict().items(), checkpoint_reverter(m)))

    exported, initial = checkpoint(tmp_path / "hf"), checkpoint(model)
    assert set(exported) == set(initial)
    for j in range(experts):  # every expert, from either rank, trained
        name = f"model.layers.1.mlp.experts.{j}.down_proj.weight"
        assert (exported[name] - initial[name]).abs().max() > 1e-3, name


PPO_BASE = [
    *MEGATRON,
    "critic.strategy=megatron",
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.rollout.n=2",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",
    "critic.optim.lr=1e-3",
    "trainer.save_freq=2",
]


@pytest.mark.parametrize("pp", [1, 2], ids=["dp2", "pp2"])
def test_megatron_ppo_with_a_megatron_critic_resumes_exactly(
    pp, run, tiny_model_dir, synthetic_data, tmp_path
):
    """PPO with GAE: Megatron actor and critic (with PP 2, each over two stages). A run
    saved at step 2 and resumed to step 3 logs the same step 3 as a run that went
    straight to step 3 (the critic's value head, both optimizers' state, the schedule,
    counters and the random state restored)."""
    train, _ = synthetic_data
    roles = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic")
    ppo = [*PPO_BASE, *_sizes(roles, 1, pp)]
    straight = run(
        tiny_model_dir, train, tmp_path / "straight", *ppo, "trainer.total_training_steps=3"
    )
    assert [r["step"] for r in straight] == [1, 2, 3]
    for record in straight:
        for key in ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm"):
            assert math.isfinite(record[key]), (key, record)
        assert "critic/values/mean" in record
    assert straight[-1]["critic/lr"] == pytest.approx(1e-3)

    run_dir = tmp_path / "resumed"
    first = run(tiny_model_dir, train, run_dir, *ppo, "trainer.total_training_steps=2")
    critic = run_dir / "global_step_2" / "critic"
    assert (critic / "meta.json").is_file() and (critic / "rank_1.pt").is_file()
    assert (run_dir / "global_step_2" / "COMPLETE").is_file()
    resumed = run(tiny_model_dir, train, run_dir, *ppo, "trainer.total_training_steps=3")
    assert [r["step"] for r in resumed] == [1, 2, 3]
    for a, b in zip(first, straight[:2], strict=True):
        assert _run_metrics(a) == _run_metrics(b)
    assert _run_metrics(resumed[-1]) == _run_metrics(straight[-1])


def _run_metrics(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(MACHINE_METRICS)}
