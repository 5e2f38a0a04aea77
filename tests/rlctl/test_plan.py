"""rlctl.planner.plan: the memory formulas on a hand-computed case, the batch rules in the
engine's words, every kind of infeasible plan, published runs, and the engine keys."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.config import config_keys, load_config
from engine.errors import ConfigError
from rlctl.errors import RlctlError
from rlctl.planner.plan import (
    GIB,
    InfeasiblePlanError,
    MemoryEstimate,
    Plan,
    PlanRequest,
    make_plan,
)

ARR = "actor_rollout_ref"


def pin(keys: dict) -> dict:
    """PlanRequest's fields for engine keys a recipe pins (dotted or nested), as the
    recipe's path makes them: the engine's typed config, and the keys' names."""
    from rlctl.job.spec import nest

    def flat(tree: dict, prefix: str = "") -> dict:
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out.update(flat(value, f"{prefix}{key}."))
            else:
                out[f"{prefix}{key}"] = value
        return out

    dotted = flat(keys)
    return {"config": load_config(base=nest(dotted), check=False), "pinned": frozenset(dotted)}


def engine_config_for(plan: Plan, **extra):
    """Load the engine's config with the plan's overrides (and what every run needs)."""
    estimator = (
        "gae" if plan.use_critic else ("grpo" if plan.rollout_n > 1 else "reinforce_plus_plus")
    )
    values = {
        "actor_rollout_ref.model.path": "some/model",
        "data.train_files": "train.parquet",
        "algorithm.adv_estimator": estimator,
        f"{ARR}.actor.use_kl_loss": plan.use_reference,
        **plan.engine_overrides(),
        **extra,
    }
    lines = [f"{k}={json.dumps(v) if isinstance(v, bool) else v}" for k, v in values.items()]
    return load_config(lines)


def engine_problems(**overrides) -> list[str]:
    values = {
        "actor_rollout_ref.model.path": "some/model",
        "data.train_files": "train.parquet",
        "algorithm.adv_estimator": "grpo",
        **overrides,
    }
    try:
        load_config([f"{k}={v}" for k, v in values.items()])
    except ConfigError as exc:
        return exc.problems
    return []


# ---------------------------------------------------------------------------
# the memory model on a hand-computed case: Llama-3.2-1B on one H100


def test_memory_terms_by_hand_llama_1b_on_one_h100():
    # Llama-3.2-1B: h 2048, 16 layers, 32 heads × 64, 8 KV heads, MLP 8192,
    # vocab 128256, tied lm_head. N = 1,235,814,400.
    n = 1_235_814_400
    root = 128256 * 2048 + 2048  # embeddings (tied head) + final norm
    layer = (2048 * 2048 + 2 * 2048 * 512 + 2048 * 2048) + 3 * 2048 * 8192 + 2 * 2048
    assert (root, layer) == (262_670_336, 60_821_504)

    plan = make_plan(
        PlanRequest(
            "meta-llama/Llama-3.2-1B",
            "H100",
            1,
            train_batch_size=64,
            rollout_n=4,
            max_prompt_length=512,
            max_response_length=512,
            micro_batch_size_per_device=2,
        )
    )
    mem = plan.memory
    # FSDP over 1 device: fp32 weights 4 B, fp32 grads 4 B, Adam 8 B per parameter
    assert mem.train_weights_gib == pytest.approx(4 * n / GIB, abs=1e-3)
    assert mem.train_grads_gib == pytest.approx(4 * n / GIB, abs=1e-3)
    assert mem.train_optimizer_gib == pytest.approx(8 * n / GIB, abs=1e-3)
    # gathered: root unit and its gradient (4 B), two layers + grads (10 B)
    assert mem.train_gathered_gib == pytest.approx((4 * root + 10 * layer) / GIB, abs=1e-3)
    # activations, 2 samples × 1024 tokens = 2048 tokens:
    tokens = 2048
    kept = tokens * 2048 * 16 * 2  # checkpointed layer inputs, bf16
    per_token_layer = 2 * (4 * 2048 + 2 * 2048 + 2 * 512 + 4 * 8192)  # 92,160 B
    # the head sees the 2 × 512 response positions only, at the 20 B per vocabulary entry
    # the GPU proof measured (bf16 logits, fp32 copy, log-softmax, entropy, gradients)
    logits = 2 * 512 * 128256 * 20
    assert logits > 2 * tokens * per_token_layer  # the logits dominate: say so
    assert mem.train_logits_gib == pytest.approx(logits / GIB, abs=1e-3)
    assert mem.train_activations_gib == pytest.approx((kept + logits) / GIB, abs=1e-3)
    assert any("the largest term" in line for line in plan.reasoning)
    # budget: 80 GiB × (1 − 8 %) − 1 GiB
    assert mem.budget_gib == pytest.approx(72.6)
    # rollout: weights + Adam stay (12 B/param = 13.81 GiB); the fraction is what is left
    # of the budget, rounded down to 0.05: (72.6 − 13.81) / 80 = 0.7349 → 0.70
    assert mem.rollout_resident_gib == pytest.approx(12 * n / GIB, abs=1e-3)
    assert plan.rollout_memory_fraction == pytest.approx(0.70)
    assert mem.rollout_pool_gib == pytest.approx(56.0)
    assert plan.rollout_tp == 1
    assert mem.rollout_weights_gib == pytest.approx(2 * n / GIB, abs=1e-3)
    assert mem.rollout_kv_cache_gib == pytest.approx(56.0 - 2 * n / GIB - 2.0, abs=1e-3)
    # the sums: the peak is the larger of the forward/backward's and the optimizer step's,
    # whose temporaries (8 B per parameter, measured) are the larger here
    held = (4 + 4 + 8) * n
    assert mem.train_step_extra_gib == pytest.approx(8 * n / GIB, abs=1e-3)
    assert 8 * n > 4 * root + 10 * layer + kept + logits
    assert mem.train_peak_gib == pytest.approx((held + 8 * n) / GIB, abs=5e-3)
    assert mem.rollout_peak_gib == pytest.approx(12 * n / GIB + 56.0, abs=5e-3)
    assert mem.fits()
    # the mini-batch: 64 / 4 = 16 prompts × 4 samples = 64 per device; micro 2 divides
    assert (plan.ppo_mini_batch_size, plan.micro_batch_size_per_device) == (16, 2)
    assert plan.max_token_len_per_device == 2 * 1024
    assert not plan.use_dynamic_bsz


def test_without_checkpointing_every_layer_keeps_its_activations():
    plan = make_plan(
        PlanRequest(
            "meta-llama/Llama-3.2-1B",
            "H100",
            1,
            train_batch_size=64,
            rollout_n=4,
            max_prompt_length=512,
            max_response_length=512,
            micro_batch_size_per_device=2,
            **pin({f"{ARR}.model.enable_gradient_checkpointing": False}),
        )
    )
    tokens, per_token_layer = 2048, 2 * (4 * 2048 + 2 * 2048 + 2 * 512 + 4 * 8192)
    logits = tokens * 128256 * 10
    expected = 16 * tokens * per_token_layer + max(logits, tokens * per_token_layer)
    assert not plan.gradient_checkpointing
    assert plan.memory.train_activations_gib == pytest.approx(expected / GIB, abs=1e-3)
    assert plan.engine_overrides()[f"{ARR}.model.enable_gradient_checkpointing"] is False


def test_reference_and_critic_add_their_state():
    base = dict(train_batch_size=64, rollout_n=4, max_prompt_length=512, max_response_length=512)
    alone = make_plan(PlanRequest("meta-llama/Llama-3.2-1B", "H100", 1, **base)).memory
    ref = make_plan(
        PlanRequest("meta-llama/Llama-3.2-1B", "H100", 1, algorithm_needs_reference=True, **base)
    ).memory
    critic = make_plan(
        PlanRequest("meta-llama/Llama-3.2-1B", "H100", 1, algorithm_needs_critic=True, **base)
    ).memory
    n = 1_235_814_400
    nc = n + 2048 + 1  # the value head (2048 → 1, with bias) on the same tied body
    assert ref.train_weights_gib - alone.train_weights_gib == pytest.approx(4 * n / GIB, abs=2e-3)
    assert ref.train_optimizer_gib == alone.train_optimizer_gib  # the reference is frozen
    assert critic.train_weights_gib - alone.train_weights_gib == pytest.approx(
        4 * nc / GIB, abs=2e-3
    )
    assert critic.train_optimizer_gib - alone.train_optimizer_gib == pytest.approx(
        8 * nc / GIB, abs=2e-3
    )
    # one model's gradients at a time
    assert critic.train_grads_gib == pytest.approx(4 * nc / GIB, abs=2e-3)


def test_sharding_divides_the_state_but_not_the_activations():
    kw = dict(train_batch_size=64, rollout_n=8, micro_batch_size_per_device=1)
    one = make_plan(PlanRequest("Qwen/Qwen2.5-1.5B", "H100", 1, **kw)).memory
    eight = make_plan(PlanRequest("Qwen/Qwen2.5-1.5B", "H100", 8, **kw)).memory
    for term in ("train_weights_gib", "train_grads_gib", "train_optimizer_gib"):
        assert getattr(eight, term) == pytest.approx(getattr(one, term) / 8, abs=2e-3)
    assert eight.train_gathered_gib == one.train_gathered_gib
    assert eight.train_activations_gib == one.train_activations_gib


def test_offload_moves_state_to_the_host_and_says_how_much():
    plan = make_plan(
        PlanRequest(
            "Qwen/Qwen2.5-7B",
            "H100",
            8,
            **pin({f"{ARR}.actor.fsdp_config.optimizer_offload": True}),
        )
    )
    assert plan.optimizer_offload and not plan.param_offload
    assert plan.memory.train_optimizer_gib == 0
    adam = 8 * plan.model.num_params / 8 / GIB
    assert plan.memory.train_step_extra_gib == pytest.approx(adam, abs=2e-3)
    assert plan.memory.host_gib_per_node == pytest.approx(8 * adam, abs=1e-2)
    assert any(line.startswith("host RAM") for line in plan.reasoning)


# ---------------------------------------------------------------------------
# batch sizes: the engine's rules, in the engine's words


@pytest.mark.parametrize(
    "model,acc,train_batch,n",
    [
        ("Qwen/Qwen2.5-0.5B", "H100", 256, 8),
        ("Qwen/Qwen2.5-7B", "H100", 1024, 5),
        ("Qwen/Qwen2.5-7B", "A100-80GB", 96, 6),
        ("Qwen/Qwen3-8B", "H200", 120, 16),
        ("Qwen/Qwen2.5-32B", "H100", 512, 16),
        ("meta-llama/Llama-3.1-70B", "MI300X", 128, 8),
    ],
)
def test_chosen_batch_sizes_follow_the_engine_rules(model, acc, train_batch, n):
    plan = make_plan(PlanRequest(model, acc, None, train_batch_size=train_batch, rollout_n=n))
    mini, micro, d = plan.ppo_mini_batch_size, plan.micro_batch_size_per_device, plan.num_devices
    assert train_batch % mini == 0
    assert (mini * n) % d == 0
    assert ((mini * n) // d) % micro == 0
    assert plan.memory.fits()
    engine_config_for(plan)  # the engine's own validation passes


def _engine_batch_message(**overrides) -> str:
    (problem,) = [p for p in engine_problems(**overrides) if "ppo_" in p]
    return problem


def test_mini_batch_not_dividing_the_train_batch_in_engine_words():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8, ppo_mini_batch_size=48))
    expected = _engine_batch_message(
        **{
            f"{ARR}.actor.ppo_mini_batch_size": 48,
            f"{ARR}.rollout.n": 8,
            "data.train_batch_size": 256,
        }
    )
    assert expected in str(info.value)
    assert "use a divisor such as 16, 32, 64" in str(info.value)


def test_mini_batch_samples_not_splitting_over_devices_in_engine_words():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8, ppo_mini_batch_size=1, rollout_n=4))
    expected = _engine_batch_message(
        **{
            f"{ARR}.actor.ppo_mini_batch_size": 1,
            f"{ARR}.rollout.n": 4,
            "data.train_batch_size": 256,
            "trainer.n_gpus_per_node": 8,
        }
    )
    assert expected in str(info.value)
    # 16 B per parameter of state and the optimizer step's 8 B of temporaries (measured)
    assert "needs ~4 × H100 on 1 node" in info.value.hint


def test_micro_batch_not_dividing_per_device_samples_in_engine_words():
    # The engine runs uneven micro-batches (as verl); the plan sizes memory for even ones.
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8, micro_batch_size_per_device=3))
    assert (
        "ppo_micro_batch_size_per_gpu 3 must divide the 64 samples each device gets per"
        " mini-batch (64 prompts × 8 samples / 8 devices) for the plan's even micro-batches"
    ) in str(info.value)
    assert "unpin ppo_micro_batch_size_per_gpu" in info.value.hint


def test_auto_search_skips_layouts_the_pinned_mini_batch_cannot_split_over():
    # 96 prompts × 3 = 288 samples per mini-batch: 1, 2, 4, 8, 16, 32 devices divide it
    plan = make_plan(
        PlanRequest(
            "Qwen/Qwen2.5-7B",
            "H100",
            None,
            train_batch_size=96,
            rollout_n=3,
            ppo_mini_batch_size=96,
        )
    )
    assert 288 % plan.num_devices == 0


# ---------------------------------------------------------------------------
# pinned overrides are respected and checked


def test_pinned_keys_are_respected():
    plan = make_plan(
        PlanRequest(
            "Qwen/Qwen2.5-7B",
            "H100",
            None,
            **pin(
                {
                    "trainer": {"nnodes": 2, "n_gpus_per_node": 8},  # nested form
                    f"{ARR}.rollout.tensor_model_parallel_size": 2,
                    f"{ARR}.rollout.gpu_memory_utilization": "0.5",  # strings are coerced
                    f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 4,
                    "data.train_batch_size": 512,
                }
            ),
        )
    )
    assert (plan.nodes, plan.devices_per_node) == (2, 8)
    assert plan.rollout_tp == 2
    assert plan.rollout_memory_fraction == 0.5
    assert plan.micro_batch_size_per_device == 4
    assert plan.train_batch_size == 512
    assert any("data.train_batch_size=512 pinned by the recipe" in line for line in plan.reasoning)


def test_pinned_memory_fraction_too_high_is_refused():
    with pytest.raises(InfeasiblePlanError, match=r"at most 0\.7"):
        make_plan(
            PlanRequest(
                "Qwen/Qwen2.5-7B",
                "H100",
                8,
                **pin(
                    {
                        f"{ARR}.rollout.gpu_memory_utilization": 0.9,
                        f"{ARR}.actor.fsdp_config.param_offload": False,
                        f"{ARR}.actor.fsdp_config.optimizer_offload": False,
                    }
                ),
            )
        )


def test_pinned_micro_batch_too_big_is_refused_with_what_fits():
    with pytest.raises(InfeasiblePlanError, match=r"at most \d+ fits"):
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8, micro_batch_size_per_device=64))


def test_bad_override_values_are_refused():
    # a value of the wrong type never reaches the planner: the engine's schema refuses it
    with pytest.raises(ConfigError, match=r"trainer\.nnodes"):
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8, **pin({"trainer.nnodes": "two"})))
    with pytest.raises(InfeasiblePlanError, match=r"in \(0, 1\]"):
        make_plan(
            PlanRequest(
                "Qwen/Qwen2.5-7B", "H100", 8, **pin({f"{ARR}.rollout.gpu_memory_utilization": 2})
            )
        )


# ---------------------------------------------------------------------------
# every kind of infeasible plan says why and what would fit


def test_too_small_a_fixed_layout_names_what_would_fit():
    no_offload = {
        f"{ARR}.actor.fsdp_config.param_offload": False,
        f"{ARR}.actor.fsdp_config.optimizer_offload": False,
    }
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-72B", "H100", 8, **pin(no_offload)))
    assert "Qwen/Qwen2.5-72B does not fit on 8 × H100 on 1 node" in str(info.value)
    assert "budget 72.6 GiB" in str(info.value)
    assert "needs ~4 nodes × H100:8" in info.value.hint
    assert isinstance(info.value, RlctlError)


def test_a_fixed_small_layout_falls_back_to_offload_within_host_ram():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-72B", "H100", 8))
    assert plan.param_offload and plan.optimizer_offload
    assert plan.memory.train_weights_gib == plan.memory.train_optimizer_gib == 0
    assert 0 < plan.memory.host_gib_per_node <= 0.8 * 1024
    assert any("optimizer steps on the CPU (slow)" in line for line in plan.reasoning)
    # 405B would need ~6 TiB of host RAM per node: refused, not planned
    with pytest.raises(InfeasiblePlanError, match="host RAM"):
        make_plan(PlanRequest("meta-llama/Llama-3.1-405B", "H100", 8))


def test_nothing_fits_at_the_largest_size_suggests_megatron():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("meta-llama/Llama-3.1-405B", "L4", None))
    assert "does not fit on up to 64 nodes of L4" in str(info.value)
    assert "set train_backend=megatron" in info.value.hint


def test_one_sample_too_long_for_any_layout():
    # (60000 tokens fit 32 nodes at Ulysses SP 8: tests/rlctl/test_plan_ulysses.py)
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-32B", "L40S", None, max_response_length=200000))
    assert "training one 201024-token sample at SP 8 needs" in str(info.value)
    assert (
        "shorten the sequences (now data.max_prompt_length 1024 + data.max_response_length 200000"
        in info.value.hint
    )  # the keys to change


def test_rollout_tp_must_divide_the_heads():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(
            PlanRequest(
                "Qwen/Qwen2.5-0.5B",
                "H100",
                None,
                **pin({f"{ARR}.rollout.tensor_model_parallel_size": 4}),
            )
        )
    assert "must divide the model's 14 attention heads" in str(info.value)
    assert info.value.hint.endswith("1, 2")


def test_weights_needing_a_tp_the_heads_forbid(tmp_path):
    # 14 heads (TP 1 or 2 only) and ~30B parameters: 2-way TP cannot hold the weights
    (tmp_path / "config.json").write_text(
        json.dumps(
            dict(
                model_type="qwen2",
                hidden_size=3584,
                intermediate_size=18944,
                num_hidden_layers=120,
                num_attention_heads=14,
                num_key_value_heads=2,
                vocab_size=32000,
            )
        )
    )
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest(str(tmp_path), "L4", None))
    assert "must divide the model's 14 attention heads" in str(info.value)


def test_unsupported_rollout_backend_on_rocm():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "MI250X", None, rollout_backend="sglang"))
    assert "'sglang' does not run on MI250X" in str(info.value)
    assert "set rollout=vllm" in info.value.hint


def test_megatron_where_unsupported():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "Ascend910B", None, train_backend="megatron"))
    assert "'megatron' does not run on Ascend910B" in str(info.value)
    assert "set train_backend=fsdp2" in info.value.hint
    with pytest.raises(InfeasiblePlanError, match="megatron needs GPUs"):
        make_plan(PlanRequest("Qwen/Qwen2.5-0.5B", None, None, train_backend="megatron"))


def test_device_counts_that_do_not_split_into_nodes():
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 12))
    assert "12 devices do not split into nodes of 8" in str(info.value)
    assert "use 8 or 16 devices" in info.value.hint


def test_unknown_names_are_user_errors():
    with pytest.raises(RlctlError):
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H1000", None))
    with pytest.raises(RlctlError, match="unknown model"):
        make_plan(PlanRequest("nobody/nothing-1B", "H100", None))
    with pytest.raises(InfeasiblePlanError, match="unknown rollout backend"):
        make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", None, rollout_backend="trtllm"))


# ---------------------------------------------------------------------------
# published runs: the planner lands within 0.5×–2× of the devices used, and fits


PUBLISHED_RUNS = {
    # verl quickstart (docs/start/quickstart.rst): PPO on GSM8K, one GPU
    "verl quickstart PPO Qwen2.5-0.5B": dict(
        published_devices=1,
        request=dict(model="Qwen/Qwen2.5-0.5B-Instruct", accelerator="H100",
                     algorithm_needs_critic=True, train_batch_size=256, rollout_n=1,
                     max_prompt_length=512, max_response_length=256,
                     ppo_mini_batch_size=64),
    ),
    # verl examples/grpo_trainer/run_qwen2-7b_seq_balance.sh: GRPO on GSM8K, 8 GPUs
    "verl GRPO Qwen2-7B GSM8K": dict(
        published_devices=8,
        request=dict(model="Qwen/Qwen2-7B-Instruct", accelerator="H100",
                     algorithm_needs_reference=True, train_batch_size=1024, rollout_n=5,
                     max_prompt_length=512, max_response_length=1024,
                     ppo_mini_batch_size=256),
    ),
    # verl examples/ppo_trainer/run_qwen2-7b_seq_balance.sh: PPO with a 7B critic, 8 GPUs
    "verl PPO Qwen2-7B seq-balance": dict(
        published_devices=8,
        request=dict(model="Qwen/Qwen2-7B-Instruct", accelerator="H100",
                     algorithm_needs_critic=True, algorithm_needs_reference=True,
                     train_batch_size=4096, rollout_n=1, max_prompt_length=4096,
                     max_response_length=4096, ppo_mini_batch_size=512),
    ),
    # verl examples/ppo_trainer/run_qwen2.5-32b.sh: PPO, 4 nodes × 8 GPUs
    "verl PPO Qwen2.5-32B": dict(
        published_devices=32,
        request=dict(model="Qwen/Qwen2.5-32B-Instruct", accelerator="H100",
                     algorithm_needs_critic=True, algorithm_needs_reference=True,
                     train_batch_size=1024, rollout_n=1, max_prompt_length=1024,
                     max_response_length=1024, ppo_mini_batch_size=256),
    ),
    # DAPO paper / verl recipe/dapo/run_dapo_qwen2.5_32b.sh: 16 nodes × 8 H800 (80 GB)
    "DAPO Qwen2.5-32B": dict(
        published_devices=128,
        request=dict(model="Qwen/Qwen2.5-32B", accelerator="H100", train_batch_size=512,
                     rollout_n=16, max_prompt_length=2048, max_response_length=20480,
                     ppo_mini_batch_size=32),
        rollout_tp=4,
    ),
    # verl examples/grpo_trainer/run_deepseek671b_math_megatron_80gb.sh: 32 nodes × 8 H100
    "verl GRPO DeepSeek-V3 671B Megatron": dict(
        published_devices=256,
        request=dict(model="deepseek-ai/DeepSeek-V3", accelerator="H100",
                     train_backend="megatron", algorithm_needs_reference=True,
                     train_batch_size=512, rollout_n=4, max_prompt_length=2048,
                     max_response_length=4096, ppo_mini_batch_size=128),
        rollout_tp=32,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(PUBLISHED_RUNS))
def test_published_runs(name):
    run = PUBLISHED_RUNS[name]
    plan = make_plan(PlanRequest(num_devices=None, **run["request"]))
    ratio = plan.num_devices / run["published_devices"]
    assert 0.5 <= ratio <= 2.0, (name, plan.num_devices, plan.reasoning)
    assert plan.memory.fits()
    budget = plan.memory.budget_gib
    assert plan.memory.train_peak_gib <= budget + 0.01
    assert plan.memory.rollout_peak_gib <= budget + 0.01
    if "rollout_tp" in run:
        assert plan.rollout_tp == run["rollout_tp"]
    engine_config_for(plan)  # the engine's config check takes the plan, MoE sizes too


@pytest.mark.parametrize(
    "model,accelerator",
    [
        ("Qwen/Qwen3-30B-A3B", "H100"),
        ("Qwen/Qwen3-235B-A22B", "H200"),
        ("deepseek-ai/DeepSeek-V3", "H200"),
    ],
)
def test_moe_megatron_plans_pass_the_engine_checks(model, accelerator):
    """Qwen3-MoE and DeepSeek-V3 on Megatron: the plan's EP divides the experts and, with
    TP and PP, the world (experts are TP-sliced too); the engine's config and model checks
    accept it (DeepSeek's multi-latent attention with TP needs sequence parallelism,
    which the plan turns on with TP)."""
    import transformers

    from engine.config.megatron_parallel import MegatronParallel
    from rlctl.model_table import table_config

    plan = make_plan(PlanRequest(model, accelerator, None, train_backend="megatron"))
    assert plan.train_ep > 1 and plan.memory.fits()
    assert not any("no conversion" in line for line in plan.reasoning)
    cfg = engine_config_for(plan)
    hf_config = transformers.AutoConfig.for_model(**table_config(model))
    for key, section in cfg.megatron_roles().values():
        parallel = MegatronParallel.of(section)
        assert parallel.expert_model_parallel_size == plan.train_ep
        assert parallel.problems(cfg.world_size, key) == []
        assert parallel.model_problems(hf_config, key) == []


def test_a_pinned_expert_tensor_parallel_size_splits_the_experts():
    """expert_tensor_parallel_size pinned: each routed expert is split over ETP ranks in
    place of TP, so with ETP 1 under TP 2 the plan doubles EP to keep the experts' share
    per device (it counted them split by TP before, half their real size), the experts'
    grid ETP × EP × PP divides the world, and the engine accepts the layout."""
    import transformers

    from engine.config.megatron_parallel import MegatronParallel
    from rlctl.api import plan_recipe
    from rlctl.model_table import table_config
    from rlctl.recipe.load import parse_recipe

    model = "Qwen/Qwen3-235B-A22B"
    recipe = {
        "name": "moe",
        "algorithm": "grpo",
        "model": model,
        "data": {"prepare": "gsm8k"},
        "hardware": {"accelerators": "H200:8"},
        "trainer": "megatron",
    }
    default = plan_recipe(parse_recipe(recipe))
    key = "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size"
    pinned = plan_recipe(parse_recipe({**recipe, "engine": {key: 1}}))
    assert default.train_tp == pinned.train_tp == 2
    assert pinned.train_ep == 2 * default.train_ep
    assert pinned.memory.train_weights_gib == pytest.approx(default.memory.train_weights_gib)
    assert "(experts split over ETP 1)" in "\n".join(pinned.reasoning)
    hf_config = transformers.AutoConfig.for_model(**table_config(model))
    parallel = MegatronParallel(
        tensor_model_parallel_size=pinned.train_tp,
        pipeline_model_parallel_size=pinned.train_pp,
        expert_model_parallel_size=pinned.train_ep,
        expert_tensor_parallel_size=1,
        sequence_parallel=True,  # the plan's with TP > 1
    )
    assert parallel.problems(pinned.num_devices, "actor") == []
    assert parallel.model_problems(hf_config, "actor") == []


def test_an_unconverted_moe_is_sized_and_named(tmp_path):
    """A mixture of experts the Megatron engine has no conversion for (Mixtral here) is
    still sized; the plan says that validate and launch will refuse it."""
    import json

    config = dict(
        model_type="mixtral", vocab_size=32000, hidden_size=4096, intermediate_size=14336,
        num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
        num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False,
    )  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = make_plan(PlanRequest(str(tmp_path), "H100", None, train_backend="megatron"))
    (line,) = [line for line in plan.reasoning if "no conversion" in line]
    assert "'mixtral'" in line and "refuse it; use trainer: fsdp2" in line


def test_published_run_at_its_published_size_fits():
    """The planner accepts each published layout as given (fixed device count)."""
    for name, run in PUBLISHED_RUNS.items():
        plan = make_plan(PlanRequest(num_devices=run["published_devices"], **run["request"]))
        assert plan.num_devices == run["published_devices"], name
        assert plan.memory.fits(), name


def test_a_longer_step_target_needs_fewer_devices():
    dapo = PUBLISHED_RUNS["DAPO Qwen2.5-32B"]["request"]
    fast = make_plan(PlanRequest(num_devices=None, **dapo))
    slow = make_plan(PlanRequest(num_devices=None, target_step_minutes=600, **dapo))
    assert slow.num_devices < fast.num_devices
    assert slow.memory.fits()


# ---------------------------------------------------------------------------
# rollout details


def test_rollout_tp_grows_with_the_weights_and_stays_in_a_node():
    small = make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", 8))
    big = make_plan(PlanRequest("Qwen/Qwen2.5-72B", "H100", None))
    assert small.rollout_tp == 1
    assert big.rollout_tp in (4, 8)
    assert big.memory.rollout_weights_gib <= 0.5 * big.memory.rollout_pool_gib
    assert 64 % big.rollout_tp == 0 and 8 % big.rollout_tp == 0


def test_pcie_only_accelerators_note_tensor_parallel_cost():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-32B", "L40S", None))
    if plan.rollout_tp > 1:
        assert any("runs over PCIe" in line for line in plan.reasoning)


def test_hf_rollout_on_gpu():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-1.5B", "H100", None, rollout_backend="hf"))
    assert plan.rollout_tp == 1 and plan.rollout_memory_fraction == 0.0
    assert plan.hf_rollout_micro_batch_size >= 1
    overrides = plan.engine_overrides()
    assert f"{ARR}.rollout.gpu_memory_utilization" not in overrides
    assert overrides[f"{ARR}.rollout.micro_batch_size"] == plan.hf_rollout_micro_batch_size
    engine_config_for(plan)


def test_long_sequences_use_dynamic_batch_size():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-7B", "H100", None, max_response_length=16384))
    assert plan.use_dynamic_bsz
    assert plan.max_token_len_per_device >= 1024 + 16384
    assert plan.max_token_len_per_device % 1024 == 0


# ---------------------------------------------------------------------------
# context parallelism (Megatron, long samples)

LONG_CONTEXT = dict(
    model="Qwen/Qwen2.5-7B",
    accelerator="H100",
    num_devices=8,
    train_backend="megatron",
    train_batch_size=64,
    rollout_n=8,
    max_prompt_length=2048,
    max_response_length=63488,  # 65536 tokens per sample
)


def test_long_context_megatron_plan_splits_each_sample_over_cp_ranks():
    plan = make_plan(PlanRequest(**LONG_CONTEXT))
    n = plan.model.num_params
    assert n == 7_615_616_512
    # Qwen2.5-7B: h 3584, 28 layers, 28 heads × 128 (q 3584), 4 KV heads (k + v 1024),
    # MLP 18944, vocab 152064. TP ≤ 4 (the KV heads), and the search goes by the number
    # of devices a replica spans (TP × PP × CP), the larger CP first at the same number:
    #   TP 1 holds 2 + 4 B/param (bf16 weights, fp32 grads) + 12 B/param over 8 (optimizer)
    #   = 7.5·N = 53.19 GiB before activations: at CP 2 one sample's logits alone are
    #   32768 × 152064 × 10 B = 46.4 GiB, at CP 4 the activations are 27.3 GiB (80.5 in all);
    #   TP 2 × CP 1 needs 88.4 GiB (below); TP 2 × CP 2 fits. (TP 1 × CP 8 would fit too,
    #   53.19 + 13.63 GiB, but spans 8 devices: no data parallelism.)
    assert (plan.train_tp, plan.train_pp, plan.train_cp) == (2, 1, 2)
    assert plan.num_devices // (plan.train_tp * plan.train_pp * plan.train_cp) == 2  # DP
    mem = plan.memory
    # state at TP 2: weights 2·N/2, gradient buffer 4·N/2, optimizer 12·N/8 — CP splits none
    assert mem.train_weights_gib == pytest.approx(n / GIB, abs=1e-3)  # 7.093
    assert mem.train_grads_gib == pytest.approx(2 * n / GIB, abs=1e-3)  # 14.185
    assert mem.train_optimizer_gib == pytest.approx(1.5 * n / GIB, abs=1e-3)  # 10.639
    held = 4.5 * n  # 31.92 GiB
    # one 65536-token sample (a multiple of TP × 2·CP = 8: no padding), 32768 per rank:
    local = 65536 // 2
    kept = local * 3584 * 2 / 2 * 28  # checkpointed layer inputs, / TP: 3.0625 GiB
    logits = local * 152064 * 10 / 2  # / TP: 23.203 GiB, the largest term
    mask = 65536 * 65536 / 2  # this rank's rows of the S × S boolean mask: 2 GiB
    # building them (only this rank's S/CP rows): a causal and an identity (S/2, S) bool,
    # the (1, 1, S/2, S) mask and its inverse, (2 + 2)·S²/2: 8 GiB
    build = 4 * 65536**2 / 2
    layer = local * 2 * (4 * 3584 + 2 * 3584 + 1024 + 4 * 18944) / 2  # 3 GiB
    # the other rank's keys and values, repeated to all 28 query heads (2·q per token), / TP
    gathered = (65536 - local) * 2 * 3584 * 2 / 2
    recompute = 2 * layer + 2 * gathered + 4 * mask  # 14.44 GiB < the logits
    assert recompute < logits and build < kept + mask + logits
    activations = kept + mask + logits  # 28.266 GiB
    assert mem.train_logits_gib == pytest.approx(logits / GIB, abs=1e-3)
    # the mask at its largest: kept + attention's four copies, 5 × 2 GiB > the 8 GiB build
    assert mem.train_mask_gib == pytest.approx(5 * mask / GIB, abs=1e-3)
    assert 5 * mask > build
    assert mem.train_activations_gib == pytest.approx(activations / GIB, abs=1e-3)
    assert mem.train_peak_gib == pytest.approx((held + activations) / GIB, abs=5e-3)  # 60.18
    assert mem.fits() and mem.train_peak_gib <= mem.budget_gib
    # at CP 1 the same TP 2 needs 31.92 + 6.125 + 4 (mask) + 46.41 = 88.44 GiB > 72.6
    at_cp_1 = (held + 2 * kept + 2 * mask + 2 * logits) / GIB
    assert at_cp_1 == pytest.approx(88.44, abs=0.01)
    text = "\n".join(plan.reasoning)
    assert "TP 2 within a node × PP 1 × CP 2, data parallel 2" in text
    assert "at CP 1 one sample needs 88.4 GiB > budget 72.6 GiB" in text
    assert "/ (TP 2 × CP 2)" in text
    # every role's megatron section gets the same sizes, as TP and PP
    overrides = plan.engine_overrides()
    assert overrides[f"{ARR}.actor.megatron.context_parallel_size"] == 2
    assert overrides[f"{ARR}.actor.megatron.tensor_model_parallel_size"] == 2
    assert overrides[f"{ARR}.actor.megatron.sequence_parallel"] is True
    # dynamic batch size: a micro-batch of one 65536-token sample, split over CP 2; the
    # key counts a device's share, 65536 / 2 (the engine multiplies it by CP, as verl's)
    assert plan.use_dynamic_bsz
    assert overrides[f"{ARR}.actor.ppo_max_token_len_per_gpu"] == 32768
    assert engine_config_for(plan).token_budget("actor") == 65536
    assert "32768 on each of the CP 2 ranks (ppo_max_token_len_per_gpu counts those" in text
    assert Plan.from_json(json.loads(json.dumps(plan.to_json()))) == plan


def test_short_samples_keep_cp_1():
    short = dict(LONG_CONTEXT, max_prompt_length=1024, max_response_length=2048)
    plan = make_plan(PlanRequest(**short))
    assert plan.train_cp == 1
    assert plan.engine_overrides()[f"{ARR}.actor.megatron.context_parallel_size"] == 1
    assert plan.memory.train_mask_gib == 0  # below 8192 tokens the mask is not counted
    assert not any(line.startswith("context parallel") for line in plan.reasoning)
    # CP 2 would leave each rank under 4096 tokens of an 8190-token sample: not tried
    plan = make_plan(PlanRequest(**dict(LONG_CONTEXT, max_response_length=6142)))
    assert plan.train_cp == 1


def test_pinned_context_parallel_size_is_kept():
    pinned = {f"{ARR}.actor.megatron.context_parallel_size": 4}
    plan = make_plan(PlanRequest(**LONG_CONTEXT, **pin(pinned)))
    assert plan.train_cp == 4  # the planner alone picks 2
    assert plan.num_devices % (plan.train_tp * plan.train_pp * 4) == 0
    assert any("CP 4 (pinned by the recipe)" in line for line in plan.reasoning)
    # nested and as a string, on a short sample too
    short = dict(LONG_CONTEXT, max_prompt_length=1024, max_response_length=2048)
    nested = {"actor_rollout_ref": {"actor": {"megatron": {"context_parallel_size": "2"}}}}
    plan = make_plan(PlanRequest(**short, **pin(nested)))
    assert plan.train_cp == 2
    assert plan.engine_overrides()[f"{ARR}.actor.megatron.context_parallel_size"] == 2
    engine_config_for(plan)
    # the roles share one parallel layout: pins that disagree are refused
    with pytest.raises(InfeasiblePlanError, match="share one parallel layout"):
        make_plan(
            PlanRequest(
                **LONG_CONTEXT,
                **pin(
                    {
                        f"{ARR}.actor.megatron.context_parallel_size": 2,
                        "critic.megatron.context_parallel_size": 4,
                    }
                ),
            )
        )
    # a CP that no TP × PP leaves room for on 8 devices is refused, with the way out
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(
            PlanRequest(**LONG_CONTEXT, **pin({f"{ARR}.actor.megatron.context_parallel_size": 3}))
        )
    assert "context_parallel_size 3 does not divide 8 / (TP × PP)" in str(info.value)
    assert "unpin context_parallel_size" in info.value.hint


@pytest.mark.parametrize(
    "request_kwargs",
    [
        dict(LONG_CONTEXT, algorithm_needs_reference=True),
        dict(LONG_CONTEXT, algorithm_needs_critic=True, algorithm_needs_reference=True,
             rollout_n=1, train_batch_size=256),
        dict(LONG_CONTEXT, model="Qwen/Qwen3-8B", max_response_length=62999),
        dict(LONG_CONTEXT, model="meta-llama/Llama-3.1-70B", num_devices=None),
    ],
)  # fmt: skip
def test_context_parallel_plans_pass_engine_validation(request_kwargs):
    """Dense Megatron plans with CP > 1: every role's section carries the plan's sizes, the
    engine's config check accepts them, its data-parallel size is D / (TP × PP × CP), the
    batch splits evenly over it, and the model-level rules (TP divides the heads, the MLP
    and the vocabulary; PP forms the stages) hold on the model's own config."""
    import transformers

    from engine.config.megatron_parallel import MegatronParallel
    from rlctl.model_table import table_config

    plan = make_plan(PlanRequest(**request_kwargs))
    assert plan.train_cp > 1 and plan.memory.fits()
    cfg = engine_config_for(plan)
    roles = cfg.megatron_roles()
    expected = {"actor", "reference", "critic"}
    expected -= set() if plan.use_reference else {"reference"}
    expected -= set() if plan.use_critic else {"critic"}
    assert set(roles) == expected
    hf_config = transformers.AutoConfig.for_model(**table_config(request_kwargs["model"]))
    dp = plan.num_devices // (plan.train_tp * plan.train_pp * plan.train_cp)
    for key, section in roles.values():
        assert section.context_parallel_size == plan.train_cp
        assert section.tensor_model_parallel_size == plan.train_tp
        assert section.pipeline_model_parallel_size == plan.train_pp
        parallel = MegatronParallel.of(section)
        assert parallel.problems(cfg.world_size, key) == []
        assert parallel.model_problems(hf_config, key) == []
        assert parallel.data_parallel_size(cfg.world_size) == dp
    # each data-parallel replica gets a whole share of every mini-batch
    assert (plan.ppo_mini_batch_size * plan.rollout_n) % dp == 0


def test_cp_shrinks_the_mask_build_so_a_128k_sample_fits_8_h100():
    """The engine builds only this CP rank's S/CP query rows of each sample's S × S mask
    ((2 + 2·B)·S²/CP bytes at its peak; the whole mask, 64 GiB at 131072 tokens, only at
    CP 1), so CP shrinks the build as well: a 128k-token sample fits 8 × H100."""
    long = dict(LONG_CONTEXT, max_response_length=131072 - 2048)
    plan = make_plan(PlanRequest(**long))
    n = plan.model.num_params
    # By devices per replica, the larger CP first: 2 and 4 devices leave 81 GiB or more of
    # activations (TP 2 × CP 2: 92.4 GiB in all); of the 8-device splits TP 1 × CP 8 needs
    # 53.19 (7.5·N) + 3.06 (checkpoints) + 2 (mask) + 23.2 (logits, 16384 tokens × V × 10)
    # = 81.5 GiB > 72.6; TP 2 × CP 4 fits, data parallel 1.
    assert (plan.train_tp, plan.train_pp, plan.train_cp) == (2, 1, 4)
    assert plan.num_devices // (plan.train_tp * plan.train_pp * plan.train_cp) == 1
    mem = plan.memory
    held = 4.5 * n  # TP 2: weights N, gradient buffer 2·N, optimizer 12·N/8: 31.92 GiB
    s = 131072  # a multiple of TP × 2·CP = 16: no padding
    local = s // 4  # 32768 tokens per rank
    kept = local * 3584 * 2 / 2 * 28  # checkpointed layer inputs, / TP: 3.0625 GiB
    logits = local * 152064 * 10 / 2  # / TP: 23.203 GiB
    mask = s * s / 4  # this rank's rows of the boolean mask: 4 GiB
    build = (2 * s + 2 * s) * s / 4  # building them: 16 GiB (64 GiB at CP 1)
    layer = local * 2 * (4 * 3584 + 2 * 3584 + 1024 + 4 * 18944) / 2  # 3 GiB
    gathered = (s - local) * 2 * 3584 * 2 / 2  # the other ranks' keys and values: 0.656 GiB
    # the recomputed layer with the mask's working set in attention, 6 + 1.3125 + 16 =
    # 23.3125 GiB, outgrows the logits
    recompute = 2 * layer + 2 * gathered + 4 * mask
    assert recompute > logits and build < kept + mask + recompute
    activations = kept + mask + recompute  # 30.375 GiB
    assert mem.train_activations_gib == pytest.approx(activations / GIB, abs=1e-3)
    assert mem.train_logits_gib == pytest.approx(logits / GIB, abs=1e-3)
    assert mem.train_mask_gib == pytest.approx(5 * mask / GIB, abs=1e-3)  # 20 GiB
    assert mem.train_peak_gib == pytest.approx((held + activations) / GIB, abs=5e-3)  # 62.29
    assert mem.fits()
    # Offloading the state between phases lets the rollout run at TP 2 (without it, TP 4).
    assert plan.param_offload and plan.rollout_tp == 2 and mem.rollout_resident_gib == 0
    text = "\n".join(plan.reasoning)
    assert "at CP 2 one sample needs 92.4 GiB > budget 72.6 GiB" in text
    assert "each rank building only its S/CP rows) 20.0 GiB at its largest" in text
    assert "before the CP split" not in text
    assert plan.engine_overrides()[f"{ARR}.actor.megatron.context_parallel_size"] == 4
    engine_config_for(plan)
    # on an H200 (budget 128.7 GiB) TP 1 × CP 4 fits: 53.19 + 6.125 + 4 + 46.41 = 109.7 GiB
    plan = make_plan(PlanRequest(**dict(long, accelerator="H200")))
    assert (plan.train_tp, plan.train_pp, plan.train_cp) == (1, 1, 4)
    assert plan.memory.train_peak_gib == pytest.approx(
        (7.5 * n + (2 * kept + 2 * logits + mask)) / GIB, abs=5e-3
    )


def test_a_sample_too_long_for_megatron_at_any_cp():
    """The mask still grows with S²: per rank S²/CP booleans kept and 4 B more per
    query-key pair in attention, 5·S²/CP for one sample. The error gives it at the largest
    CP tried."""
    # 262144 tokens on 8 × H100: at CP 8, 5 × 262144² / 8 = 40 GiB of mask alone, next to
    # 53.19 GiB of state (TP 1) and 46.4 GiB of logits (32768 tokens × V × 10): 117.4 GiB.
    # 32 devices fit it.
    long = dict(LONG_CONTEXT, max_response_length=262144 - 2048)
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest(**long))
    message = str(info.value)
    assert "at the largest split tried, TP 1 × PP 1 × CP 8" in message
    assert "at CP 8 needs 117.4 GiB" in message
    assert "40.0 GiB per device for one 262144-token sample at CP 8, the largest tried" in message
    assert "more CP ranks (more devices) or shorter samples shrink it" in message
    assert "no CP size shrinks" not in message
    assert "needs ~4 nodes × H100:8 = 32 devices" in info.value.hint
    # 2097152 tokens fit nowhere (up to 64 nodes × 8 = 512 H100): CP goes up to 512 (each
    # rank keeping 4096 tokens), where one sample's mask is 5 × 2097152² / 512 = 40 GiB per
    # device; with TP 1 the state is 6·N + 12·N/512 = 42.7 GiB, already 82.7 > 72.6 GiB.
    # TP t or PP p leave 512/(t·p) CP ranks, (p + 4)·t·p·8 GiB of mask: more still.
    n = 7_615_616_512
    assert (6 * n + 12 * n / 512 + 5 * 2097152**2 / 512) / GIB == pytest.approx(82.7, abs=0.05)
    huge = dict(LONG_CONTEXT, max_response_length=2097152 - 2048, num_devices=None)
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(PlanRequest(**huge))
    message = str(info.value)
    assert "does not fit on up to 64 nodes of H100" in message
    assert "40.0 GiB per device for one 2097152-token sample at CP 512, the largest tried" in (
        message
    )
    assert "CP goes no further (each rank keeps at least 4096 tokens" in message
    assert "only shorter samples shrink it" in message
    assert "shorten the sequences" in info.value.hint


# ---------------------------------------------------------------------------
# CPU (the local quickstart)


def test_cpu_plan_for_the_quickstart():
    plan = make_plan(
        PlanRequest(
            "Qwen/Qwen2.5-0.5B",
            None,
            None,
            train_batch_size=32,
            rollout_n=8,
            max_prompt_length=64,
            max_response_length=8,
        )
    )
    assert (plan.nodes, plan.devices_per_node, plan.accelerator) == (1, 2, None)
    assert plan.rollout_backend == "hf" and plan.rollout_tp == 1
    assert plan.image is None and plan.memory.budget_gib is None and plan.memory.fits()
    assert any("rollout: hf on CPU (vllm wants a GPU" in line for line in plan.reasoning)
    assert not any(line.startswith("warning") for line in plan.reasoning)
    overrides = plan.engine_overrides()
    assert overrides["trainer.device"] == "cpu"
    assert overrides[f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype"] == "float32"
    assert f"{ARR}.rollout.gpu_memory_utilization" not in overrides
    # fp32 everywhere: 4 B weights, and the activations in fp32
    assert plan.memory.train_weights_gib == pytest.approx(
        4 * plan.model.num_params / 2 / GIB, abs=1e-3
    )
    engine_config_for(plan)


def test_cpu_plan_keeps_vllm_when_the_recipe_pins_it():
    """vLLM's CPU build runs the rollout on CPU; a plan keeps it when the engine key asks."""
    plan = make_plan(
        PlanRequest(
            "Qwen/Qwen2.5-0.5B",
            None,
            None,
            train_batch_size=32,
            rollout_n=8,
            max_prompt_length=64,
            max_response_length=8,
            **pin({f"{ARR}.rollout.name": "vllm"}),
        )
    )
    assert plan.rollout_backend == "vllm"
    assert plan.engine_overrides()[f"{ARR}.rollout.name"] == "vllm"
    assert any("vLLM's CPU build" in line for line in plan.reasoning)
    engine_config_for(plan)


def test_cpu_warns_above_a_billion_parameters():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-1.5B", None, 2))
    assert any(line.startswith("warning") and "1.54B" in line for line in plan.reasoning)


# ---------------------------------------------------------------------------
# output: engine keys, JSON, no heavy imports


@pytest.mark.parametrize(
    "request_kwargs",
    [
        dict(model="Qwen/Qwen2.5-7B", accelerator="H100", num_devices=None),
        dict(model="Qwen/Qwen2.5-7B", accelerator="H100", num_devices=None,
             algorithm_needs_critic=True, algorithm_needs_reference=True, rollout_n=1),
        dict(model="Qwen/Qwen2.5-72B", accelerator="A100-80GB", num_devices=None),
        dict(model="Qwen/Qwen3-30B-A3B", accelerator="MI300X", num_devices=None),
        dict(model="Qwen/Qwen2.5-0.5B", accelerator=None, num_devices=None),
        dict(model="deepseek-ai/DeepSeek-V3", accelerator="H200", num_devices=None,
             train_backend="megatron", train_batch_size=128, rollout_n=8),
        dict(model="Qwen/Qwen2.5-72B", accelerator="H100", num_devices=None,
             train_backend="megatron"),
        dict(model="meta-llama/Llama-3.1-405B", accelerator="H100", num_devices=None,
             train_backend="megatron", algorithm_needs_reference=True),
    ],
)  # fmt: skip
def test_engine_overrides_are_engine_keys_and_round_trip(request_kwargs):
    plan = make_plan(PlanRequest(**request_kwargs))
    keys = set(config_keys())
    overrides = plan.engine_overrides()
    assert set(overrides) <= keys, set(overrides) - keys
    for key in (
        "trainer.nnodes",
        "trainer.n_gpus_per_node",
        f"{ARR}.rollout.tensor_model_parallel_size",
        f"{ARR}.actor.ppo_mini_batch_size",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
        f"{ARR}.actor.strategy",
    ):
        assert key in overrides
    if plan.train_backend != "megatron":
        assert f"{ARR}.actor.fsdp_config.param_offload" in overrides
    if plan.train_ep == 1:  # the engine takes every dense plan; MoE (EP) is not converted yet
        cfg = engine_config_for(plan)
        assert cfg.world_size == plan.num_devices
        assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == plan.ppo_mini_batch_size
        for _role, (_key, section) in cfg.megatron_roles().items():
            assert section.tensor_model_parallel_size == plan.train_tp
            assert section.pipeline_model_parallel_size == plan.train_pp
            # The plan's activation memory assumes the sequence split over TP ranks.
            assert section.sequence_parallel == (plan.train_tp > 1)
    assert plan.memory.fits()

    data = json.loads(json.dumps(plan.to_json()))
    assert Plan.from_json(data) == plan
    assert data["engine_overrides"] == overrides
    assert data["memory"]["train_peak_gib"] == plan.memory.train_peak_gib
    assert MemoryEstimate.from_json(data["memory"]) == plan.memory


def test_every_decision_is_explained():
    plan = make_plan(PlanRequest("Qwen/Qwen2.5-32B", "H100", None))
    text = "\n".join(plan.reasoning)
    for word in ("model:", "budget:", "step compute:", "devices:", "training (", "activations",
                 "offload:", "batch:", "gpu_memory_utilization", "rollout TP", "KV cache",
                 "image:"):  # fmt: skip
        assert word in text, word


def test_planning_imports_neither_torch_nor_ray():
    """Of the engine, planning reads only its torch-free schema (the model families'
    shape rules: engine.schema.family_rules), never the training code."""
    code = (
        "import sys; from rlctl.planner.plan import PlanRequest, make_plan; "
        "make_plan(PlanRequest('Qwen/Qwen2.5-7B', 'H100', None)); "
        "make_plan(PlanRequest('Qwen/Qwen2.5-0.5B', None, None)); "
        "bad = [m for m in ('torch', 'ray', 'transformers', 'engine.train.megatron',"
        " 'engine.loop.trainer') if m in sys.modules]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------
# counts that cannot be a run (issue 15)


@pytest.mark.parametrize("nodes", [1_000_000_000, 1000])
def test_too_many_nodes_blame_the_node_count_once(nodes):
    request = PlanRequest(
        model="rlctl:tiny",
        accelerator="H100",
        num_devices=8 * nodes,
        train_batch_size=32,
        rollout_n=8,
        ppo_mini_batch_size=32,
    )
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(request)
    message = str(info.value)
    assert message.startswith(f"hardware.nodes: {nodes} nodes × 8 devices")
    assert "more than the 256 samples of a step" in message
    assert "mini_batch" not in message  # not the batch sizes' fault
    assert "at most 32 nodes" in info.value.hint


def test_a_layout_that_fails_the_same_way_at_every_offload_level_says_it_once():
    request = PlanRequest(
        model="rlctl:tiny", accelerator="H100", num_devices=24, train_batch_size=32, rollout_n=8,
        ppo_mini_batch_size=32,
    )  # fmt: skip
    with pytest.raises(InfeasiblePlanError) as info:
        make_plan(request)
    message = str(info.value)
    assert message.count("must be divisible by the 24 devices") == 1, message
    assert message.count("3 nodes × H100:8 = 24 devices") == 1, message
    assert "no offload / optimizer offload / parameter offload" in message


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"train_batch_size": 10**30}, "data.train_batch_size"),
        ({"rollout_n": 10**9}, "actor_rollout_ref.rollout.n"),
        ({"max_response_length": 10**12}, "data.max_response_length"),
        (
            pin({f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 10**12}),
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
        ),
    ],
)
def test_absurd_sizes_are_refused_at_once_naming_the_key(changes, field):
    """Not searched for (the divisor search was linear in the batch size: 10**30 hung)."""
    request = PlanRequest(model="rlctl:tiny", accelerator="H100", num_devices=8, **changes)
    with pytest.raises(InfeasiblePlanError, match=f"^{field} [0-9]+ is more than"):
        make_plan(request)
