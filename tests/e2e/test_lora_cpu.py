"""A GRPO run with a LoRA actor on CPU (in this process: tests/e2e/conftest.py): it
learns, its checkpoint is the adapter alone, and it exports merged or as the adapter;
vLLM samples with the adapted policy; a run starts from a saved adapter; bad LoRA
settings are refused before anything starts."""

import pytest
import torch


def _lora_overrides(model, train, *extra):
    return [
        f"actor_rollout_ref.model.path={model}",
        f"data.train_files={train}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=8",
        "data.train_batch_size=32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
        "actor_rollout_ref.actor.use_kl_loss=true",  # the reference: the adapter disabled
        "actor_rollout_ref.model.lora_rank=16",
        "actor_rollout_ref.model.lora_alpha=32",
        *extra,
    ]


@pytest.fixture(scope="module")
def untied_model_dir(tmp_path_factory):
    """The tiny model with an output layer of its own: on this task most of what the
    policy learns is in that layer (which an adapter may not take while it is tied)."""
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("untied"), tie_word_embeddings=False)


# Every linear layer of the tiny Qwen2, and its output layer.
ALL_AND_HEAD = "[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head]"


@pytest.mark.slow
def test_grpo_with_lora_learns_and_exports(
    untied_model_dir, synthetic_data, tmp_path, run_engine, capsys
):
    """A zero learning rate, a gradient that does not reach the adapter, or a rollout that
    does not see it leave the score at its random-policy level (about 0.01)."""
    tiny_model_dir = untied_model_dir
    train, _val = synthetic_data
    run_dir = tmp_path / "run"
    steps = 12
    run = run_engine(
        *_lora_overrides(
            tiny_model_dir,
            train,
            "actor_rollout_ref.actor.optim.lr=2e-2",  # LoRA's usual lr: 10× full tuning's
            f"actor_rollout_ref.model.target_modules={ALL_AND_HEAD}",
            f"trainer.total_training_steps={steps}",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[console]",
            "trainer.save_freq=100",  # only the last step
            f"trainer.export_hf_dir={tmp_path / 'merged'}",
        )
    )
    records = run.steps
    assert [r["step"] for r in records] == list(range(1, steps + 1))
    scores = [r["critic/score/mean"] for r in records]
    first, last = sum(scores[:3]) / 3, sum(scores[-3:]) / 3
    assert last > first + 0.04, f"score did not rise: {scores}"
    assert any(r["actor/kl_loss"] > 0 for r in records)  # the reference is not the actor

    # The checkpoint: the adapter and its optimizer state, nothing of the base model.
    from torch.distributed.checkpoint import FileSystemReader

    actor = run_dir / f"global_step_{steps}" / "actor"
    saved = FileSystemReader(str(actor / "model")).read_metadata().state_dict_metadata
    assert saved and all(".lora_A." in k or ".lora_B." in k for k in saved)

    # Merged export: a plain HF model, its adapted weights moved, the others untouched.
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert merged.num_parameters() == initial.num_parameters()
    assert not merged.model.layers[0].self_attn.q_proj.weight.equal(
        initial.model.layers[0].self_attn.q_proj.weight
    )
    assert not merged.lm_head.weight.equal(initial.lm_head.weight)
    assert merged.model.embed_tokens.weight.equal(initial.model.embed_tokens.weight)
    assert merged.model.norm.weight.equal(initial.model.norm.weight)  # not a LoRA target
    assert not (tmp_path / "merged" / "adapter_config.json").exists()

    # The adapter alone (the export's command, here): peft loads it beside the base
    # model, and it is the merged model.
    from peft import PeftModel

    from engine.export import main as export

    adapter_dir = tmp_path / "adapter"
    capsys.readouterr()
    export([str(run_dir), str(adapter_dir), "--adapter-only"])
    assert f"exported actor (float32) to {adapter_dir}" in capsys.readouterr().out

    adapted = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir), adapter_dir
    )
    ids = torch.tensor([[5, 17, 33, 90, 11, 4]])
    with torch.no_grad():
        torch.testing.assert_close(
            adapted(input_ids=ids).logits, merged(input_ids=ids).logits, atol=1e-4, rtol=1e-4
        )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["actor_rollout_ref.model.target_modules=[qkv,gate_up]"],
            "actor_rollout_ref.model.target_modules=['qkv', 'gate_up'] matches no module",
        ),
        (
            ["actor_rollout_ref.model.target_modules=[q_proj,lm_head]"],
            "adapts lm_head, which shares its weight with the input embeddings",
        ),
        (["actor_rollout_ref.model.lora_rank=-4"], "lora_rank must be >= 0, got -4"),
        (
            ["actor_rollout_ref.actor.strategy=megatron"],
            "actor_rollout_ref.actor.strategy=megatron with actor_rollout_ref.model.lora_rank=16",
        ),
    ],
    ids=["targets_match_nothing", "tied_output_layer", "negative_rank", "megatron"],
)
def test_bad_lora_settings_are_refused_before_start(
    extra, expected, tiny_model_dir, synthetic_data, tmp_path, base_overrides, engine_main,
    kept_workers, capsys,
):  # fmt: skip
    """Through the engine's command (in this process): exit code 2 and the fix, before
    any worker builds a model."""
    train, _val = synthetic_data
    overrides = _lora_overrides(tiny_model_dir, train, *extra)
    builds = kept_workers.builds
    code = engine_main(*base_overrides, *overrides, f"trainer.default_local_dir={tmp_path}")
    err = capsys.readouterr().err
    assert code == 2, err[-2000:]
    assert expected in err
    # the targets are checked against the model on the driver while the workers' processes
    # start (engine.runtime.read_data): refused before any of them built a model
    assert kept_workers.builds == builds
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.slow
@pytest.mark.vllm
@pytest.mark.parametrize(
    ("model", "extra"),
    [
        # merged weights, the output layer's adapter among them
        ("untied_model_dir", [f"actor_rollout_ref.model.target_modules={ALL_AND_HEAD}"]),
        # vLLM's own LoRA: the base weights once, then the adapter at each version
        ("tiny_model_dir", ["actor_rollout_ref.rollout.lora_as_adapter=true"]),
    ],
    ids=["merged", "adapter"],
)
def test_vllm_generates_with_the_adapted_policy(
    model, extra, request, synthetic_data, tmp_path, run_engine
):
    """vLLM (its CPU build) generates with W + scaling·B·A after each push, merged or as
    its own LoRA: its sampling log-probs are the LoRA actor's at every step. The base
    model alone (a push that left the adapter out) would be off by the adapter's change,
    which the learning rate makes large from step 2 on."""
    train, _val = synthetic_data
    run_dir = tmp_path / "run"
    run = run_engine(
        *_lora_overrides(
            request.getfixturevalue(model),
            train,
            "actor_rollout_ref.actor.optim.lr=2e-2",
            *extra,
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "trainer.total_training_steps=4",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[console]",
            "trainer.save_freq=100",
        )
    )
    records = run.steps
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert max(r["training/rollout_log_ratio_abs_max"] for r in records) < 1e-3
    assert records[-1]["actor/kl_loss"] > 1e-3  # the adapter had moved the policy


# One actor worker and a vLLM rollout on a worker of its own, serving the adapter, its
# log-probs compared with the actor's.
SEPARATE_VLLM_ADAPTER = (
    "trainer.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.placement=separate",
    "actor_rollout_ref.rollout.separate_nnodes=1",
    "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.lora_as_adapter=true",
    "actor_rollout_ref.rollout.calculate_log_probs=true",
)


@pytest.mark.slow
@pytest.mark.vllm
def test_separate_vllm_is_pushed_the_adapter_alone(
    tiny_model_dir, synthetic_data, tmp_path, run_engine
):
    """vLLM on a worker of its own (placement=separate) serving the adapter: the first
    push carries the base weights and the adapter, each later one the adapter alone, and
    after each its log-probs are the actor's (a push that did not land, or a base the
    adapter was not applied to, would be off by the adapter's change)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    train, _val = synthetic_data
    run_dir = tmp_path / "run"
    run = run_engine(
        *_lora_overrides(
            tiny_model_dir,
            train,
            "actor_rollout_ref.actor.optim.lr=2e-2",
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            *SEPARATE_VLLM_ADAPTER,
            "trainer.total_training_steps=4",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[console]",
            "trainer.save_freq=100",
        )
    )
    records = run.steps
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert max(r["training/rollout_log_ratio_abs_max"] for r in records) < 1e-3
    assert records[-1]["actor/kl_loss"] > 1e-3  # the adapter had moved the policy

    # The adapter's tensors: A and B of every linear layer (all-linear, the default).
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir))
        adapted = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    adapter = sum(1 for name, _ in adapted.named_parameters() if ".lora_" in name)
    pushed = [r["rollout/weights_pushed_tensors"] for r in records]
    megabytes = [r["rollout/weights_pushed_mb"] for r in records]
    assert pushed[0] > adapter and pushed[1:] == [adapter] * 3
    assert max(megabytes[1:]) < megabytes[0] / 4


@pytest.mark.slow
@pytest.mark.vllm
def test_fully_async_vllm_samples_with_the_current_adapter(
    tiny_model_dir, synthetic_data, tmp_path, run_engine
):
    """The fully asynchronous mode with vLLM serving the adapter: the sample stream
    generates under the adapter of the weights the trainer holds (staleness 0), so its
    log-probs are the actor's at every step. A stream that passed no adapter samples
    from the base model, off by the adapter's change from step 2 on. (Samples in flight
    across a swap: tests/engine/rollout/test_vllm_engine.py.)"""
    train, _val = synthetic_data
    run_dir = tmp_path / "run"
    run = run_engine(
        *_lora_overrides(
            tiny_model_dir,
            train,
            "actor_rollout_ref.actor.optim.lr=2e-2",
            "actor_rollout_ref.rollout.n=4",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            *SEPARATE_VLLM_ADAPTER,
            "async_training.mode=fully_async",
            "async_training.staleness_threshold=0",
            # decoupled: π_old's own pass, to compare the sampler's log-probs with
            "algorithm.rollout_correction.bypass_mode=false",
            "trainer.total_training_steps=3",
            f"trainer.default_local_dir={run_dir}",
            "trainer.logger=[console]",
            "trainer.save_freq=100",
        )
    )
    records = run.steps
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["training/staleness_max"] == 0 for r in records)
    assert max(r["training/rollout_log_ratio_abs_max"] for r in records) < 1e-3
    assert records[-1]["actor/kl_loss"] > 1e-3  # the adapter had moved the policy


@pytest.fixture(scope="module")
def saved_adapter(tiny_model_dir, tmp_path_factory):
    """A PEFT adapter of the tiny model (rank 4 on q_proj and v_proj) with non-zero B."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    peft_model = get_peft_model(base, config)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=g) * 0.3)
    out = tmp_path_factory.mktemp("saved_adapter")
    peft_model.save_pretrained(out)
    return out


@pytest.mark.slow
@pytest.mark.vllm
def test_a_run_starts_from_a_saved_adapter(
    tiny_model_dir, saved_adapter, synthetic_data, tmp_path, run_engine
):
    """verl's lora_adapter_path, no lora_rank: at the first step vLLM samples with the
    merged model (its log-probs equal the actor's π_old) and the actor is already away
    from the reference (the base model): an adapter not loaded would give a KL of 0."""
    train, _val = synthetic_data
    run = run_engine(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        f"data.train_files={train}",
        f"actor_rollout_ref.model.lora_adapter_path={saved_adapter}",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=4",
        "data.train_batch_size=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        "trainer.total_training_steps=1",
        f"trainer.default_local_dir={tmp_path / 'run'}",
        "trainer.logger=[console]",
        "trainer.save_freq=100",
    )
    (first,) = run.steps
    assert first["training/rollout_log_ratio_abs_max"] < 1e-3
    assert first["actor/kl_loss"] > 1e-3
