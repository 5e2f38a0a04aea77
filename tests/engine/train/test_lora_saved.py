"""``actor_rollout_ref.model.lora_adapter_path`` (verl's key): LoRA started from a saved
PEFT adapter. Its rank, alpha and targets become the run's (a different value set in the
config refused naming both); its weights are in the actor before the first step, so
π_old is the merged model's and the rollout is pushed the merged weights."""

import json
import shutil
import socket

import pytest
import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from engine.config import load_config
from engine.errors import ConfigError
from engine.train.lora import apply_lora
from engine.train.lora_saved import load_weights, resolve
from engine.types import GenerationRequest, SamplingParams, TokenBatch

RANK, ALPHA, TARGETS = 4, 8, ["q_proj", "v_proj"]
KEY = "actor_rollout_ref.model"


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A PEFT adapter of the tiny model with known, non-zero A and B."""
    from peft import LoraConfig, get_peft_model

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = get_peft_model(
        base, LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, lora_dropout=0.0)
    )
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if ".lora_" in name:  # B is zero when peft makes it: give it a value
                param.copy_(torch.randn(param.shape, generator=g) * 0.2)
    out = tmp_path_factory.mktemp("adapter")
    peft_model.save_pretrained(out)
    return out


def _config(model_dir, adapter, *extra, check=True):
    return load_config(
        [
            f"{KEY}.path={model_dir}",
            f"{KEY}.lora_adapter_path={adapter}",
            "data.train_files=t.parquet",
            *extra,
        ],
        check=check,
    )


def _merged(model_dir, adapter):
    """The base model with the adapter merged, by peft itself."""
    from peft import PeftModel

    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return PeftModel.from_pretrained(base, str(adapter)).merge_and_unload().eval()


def _tokens():
    g = torch.Generator().manual_seed(11)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 9)]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (6, 3)]
    return TokenBatch.from_ragged(prompts, responses, pad_token_id=0)


def _logprobs(model, tokens):
    from engine.train.forward import response_logprobs

    with torch.no_grad():
        return response_logprobs(model, tokens, torch.device("cpu"))[0]


def test_the_adapters_settings_become_the_runs(tiny_model_dir, adapter_dir):
    cfg = _config(tiny_model_dir, adapter_dir)
    assert cfg.actor_rollout_ref.model.uses_lora  # LoRA on, before the adapter is read
    model = resolve(cfg).actor_rollout_ref.model
    assert (model.lora_rank, model.lora_alpha, model.target_modules) == (RANK, 8.0, TARGETS)
    # the same values given explicitly agree
    same = _config(tiny_model_dir, adapter_dir, f"{KEY}.lora_rank=4", f"{KEY}.lora_alpha=8",
                   f"{KEY}.target_modules=[v_proj,q_proj]")  # fmt: skip
    assert resolve(same).actor_rollout_ref.model.lora_rank == RANK


def test_a_conflicting_setting_is_refused_naming_both(tiny_model_dir, adapter_dir):
    cfg = _config(tiny_model_dir, adapter_dir, f"{KEY}.lora_rank=8", f"{KEY}.lora_alpha=32",
                  f"{KEY}.target_modules=[q_proj]")  # fmt: skip
    with pytest.raises(ConfigError) as err:
        resolve(cfg)
    rank, alpha, targets = err.value.problems
    where = f"{KEY}.lora_adapter_path={str(adapter_dir)!r}"
    assert rank == (
        f"{KEY}.lora_rank=8 but {where} has r=4 in its adapter_config.json: leave lora_rank"
        " at its default (0) to take the adapter's, or set it to 4"
    )
    assert alpha.startswith(f"{KEY}.lora_alpha=32.0 but {where} has lora_alpha=8")
    assert targets.startswith(f"{KEY}.target_modules=['q_proj'] but {where} has target_modules")


def test_a_folder_without_an_adapter_or_with_what_lora_here_lacks(
    tiny_model_dir, adapter_dir, tmp_path
):
    with pytest.raises(ConfigError, match=r"no adapter_config\.json there"):
        resolve(_config(tiny_model_dir, tmp_path / "nothing"))
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(adapter_dir / "adapter_config.json", bare)
    with pytest.raises(ConfigError, match="no adapter weights there"):
        resolve(_config(tiny_model_dir, bare))
    dora = tmp_path / "dora"
    shutil.copytree(adapter_dir, dora)
    saved = json.loads((dora / "adapter_config.json").read_text())
    (dora / "adapter_config.json").write_text(json.dumps({**saved, "use_dora": True}))
    with pytest.raises(ConfigError, match=r"is an adapter with DoRA \(use_dora\)"):
        resolve(_config(tiny_model_dir, dora))


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (
            ["actor_rollout_ref.actor.strategy=megatron"],
            f"actor_rollout_ref.actor.strategy=megatron with {KEY}.lora_adapter_path='a':"
            " LoRA runs under FSDP2 only",
        ),
        (["critic.model.lora_adapter_path=a"], "critic.model.lora_adapter_path='a': LoRA is for"),
    ],
)
def test_where_lora_does_not_run_the_adapter_is_refused_up_front(extra, expected):
    with pytest.raises(ConfigError) as err:
        _config("m", "a", *extra)
    assert expected in str(err.value)


def test_the_saved_weights_load_into_the_engines_lora_layers(tiny_model_dir, adapter_dir):
    model_cfg = resolve(_config(tiny_model_dir, adapter_dir)).actor_rollout_ref.model
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    peft_model = apply_lora(model, model_cfg)
    tokens = _tokens()
    mask = tokens.response_mask_BR.bool()
    base = _logprobs(model, tokens)  # B = 0: the adapted model is the base model
    load_weights(peft_model, str(adapter_dir))
    loaded = _logprobs(model.eval(), tokens)
    expected = _logprobs(_merged(tiny_model_dir, adapter_dir), tokens)
    torch.testing.assert_close(loaded[mask], expected[mask], atol=1e-5, rtol=1e-5)
    assert (loaded - base)[mask].abs().max() > 1e-3  # the adapter moves the model


def test_an_adapter_of_other_modules_is_refused(tiny_model_dir, adapter_dir):
    model_cfg = resolve(_config(tiny_model_dir, adapter_dir)).actor_rollout_ref.model
    import dataclasses

    other = dataclasses.replace(model_cfg, target_modules=["q_proj", "k_proj"])
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"tensor\(s\) of the adapter matches no adapted module"):
        load_weights(apply_lora(model, other), str(adapter_dir))


# ---------------------------------------------------------------------------
# the worker path: one FSDP2 rank (gloo), the actor, its HF rollout and the reference


def _run(rank, model_dir, adapter, port, out):
    from engine.workers.host import WorkerHost

    cfg = _config(
        model_dir,
        adapter,
        "trainer.device=cpu",
        "trainer.n_gpus_per_node=1",
        "data.train_batch_size=2",
        "actor_rollout_ref.rollout.n=1",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
        check=False,
    )
    host = WorkerHost(rank, 1, rank, resolve(cfg), ["actor", "rollout", "ref"])
    host.init_distributed("127.0.0.1", port)
    actor, ref, rollout = host.roles["actor"], host.roles["ref"], host.roles["rollout"]
    tokens = _tokens()
    greedy = SamplingParams(do_sample=False, max_new_tokens=5, ignore_eos=True)
    prompts = [[5, 17, 33, 90], [7, 8]]
    generated = rollout.generate(GenerationRequest(prompts, greedy))

    class Recorder:  # what a vLLM or SGLang engine is pushed at its first sync
        def sync_weights(self, pairs):
            self.pushed = {name: tensor.clone() for name, tensor in pairs}

    rollout.engine = Recorder()
    rollout.sync_weights()
    out.update(
        tokens=tokens,
        old_logp=actor.log_probs(tokens),  # π_old of the first step
        ref_logp=ref.log_probs(tokens),
        prompts=prompts,
        response_ids=generated.response_ids,
        rollout_logp=generated.logprobs,
        pushed=rollout.engine.pushed,
    )


@pytest.fixture(scope="module")
def worker_run(tiny_model_dir, adapter_dir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_run, args=(str(tiny_model_dir), str(adapter_dir), port, out), nprocs=1)
    return dict(out)


@pytest.mark.slow
def test_the_first_step_runs_the_merged_model(worker_run, tiny_model_dir, adapter_dir):
    out = worker_run
    merged = _merged(tiny_model_dir, adapter_dir)
    tokens = out["tokens"]
    mask = tokens.response_mask_BR.bool()
    torch.testing.assert_close(
        out["old_logp"][mask], _logprobs(merged, tokens)[mask], atol=1e-5, rtol=1e-5
    )
    # the HF rollout samples from it too: its log-probs are the merged model's
    generated = TokenBatch.from_ragged(out["prompts"], out["response_ids"], pad_token_id=0)
    expected = _logprobs(merged, generated)
    for row, logps in enumerate(out["rollout_logp"]):
        torch.testing.assert_close(
            torch.tensor(logps), expected[row, : len(logps)], atol=1e-5, rtol=1e-5
        )
    # the reference is the base model (verl's: the adapter switched off)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    torch.testing.assert_close(
        out["ref_logp"][mask], _logprobs(base, tokens)[mask], atol=1e-5, rtol=1e-5
    )


@pytest.mark.slow
def test_the_rollout_is_pushed_the_merged_weights(worker_run, tiny_model_dir, adapter_dir):
    pushed = worker_run["pushed"]
    merged = _merged(tiny_model_dir, adapter_dir).state_dict()
    assert set(pushed) == set(merged) - {"lm_head.weight"}  # tied: the engine ties it
    for name, tensor in pushed.items():
        torch.testing.assert_close(tensor, merged[name], atol=1e-6, rtol=1e-6)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert (pushed[q] - base.state_dict()[q]).abs().max() > 1e-3  # W + (α/r)·B·A, not W


def test_a_run_reads_the_adapter_before_ray_starts(tiny_model_dir, adapter_dir, tmp_path):
    """``run_training`` resolves the adapter's settings up front: a conflict stops it
    before any cluster or worker (and the workers get the adapter's rank)."""
    from engine.data.synthetic import write_synthetic_dataset
    from engine.runtime import run_training

    train, _ = write_synthetic_dataset(tmp_path, n_train=4, n_val=1)
    cfg = _config(tiny_model_dir, adapter_dir, f"data.train_files={train}",
                  "data.train_batch_size=2", f"{KEY}.lora_rank=8", check=False)  # fmt: skip
    with pytest.raises(ConfigError, match=f"{KEY}.lora_rank=8 but {KEY}.lora_adapter_path="):
        run_training(cfg)
    import ray

    assert not ray.is_initialized()  # on the driver, before the data thread and Ray
