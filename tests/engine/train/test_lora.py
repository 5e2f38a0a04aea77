"""LoRA on two real FSDP2 ranks (gloo) with real peft: what would break if the engine fell
back to full fine-tuning, to a second reference model, or to unmerged rollout weights."""

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.checkpoint import FileSystemReader
from transformers import AutoModelForCausalLM

from engine.config import load_config
from engine.errors import ConfigError
from engine.train.fsdp import full_parameters
from engine.train.lora import check_targets
from engine.types import ActorBatch, GenerationRequest, SamplingParams, TokenBatch
from engine.workers.host import WorkerHost

WORLD = 2
RANK, ALPHA = 4, 16.0


def _config(model_dir, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "trainer.device=cpu",
            f"trainer.n_gpus_per_node={WORLD}",
            "data.train_batch_size=4",
            "data.max_prompt_length=16",
            "data.max_response_length=12",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.actor.optim.lr=5e-2",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            f"actor_rollout_ref.model.lora_rank={RANK}",
            f"actor_rollout_ref.model.lora_alpha={ALPHA}",
            "actor_rollout_ref.model.target_modules=[q_proj,v_proj,down_proj]",
            *extra,
        ],
        check=False,  # no data files: the workers alone are under test
    )


def _batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 16, 3, 9)]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (12, 2, 7, 4)]
    tokens = TokenBatch.from_ragged(prompts, responses, pad_token_id=0)
    advantages = torch.randn(tokens.response_mask_BR.shape, generator=g)
    return tokens, advantages * tokens.response_mask_BR


def _full_weights(module):
    with full_parameters(module):
        return {n: p.detach().clone() for n, p in module.named_parameters()}


def _host(cfg, rank, port):
    host = WorkerHost(rank, WORLD, rank, cfg, ["actor", "rollout", "ref"])
    host.init_distributed("127.0.0.1", port)
    return host


def _step(actor, ref, step, rank):
    tokens, adv = _batch(rank, step)
    old = actor.log_probs(tokens)
    return actor.update(ActorBatch(tokens, old, adv, ref_logprobs_BR=ref.log_probs(tokens)))


def _run(rank, model_dir, ckpt, ports, out):
    cfg = _config(model_dir)
    host = _host(cfg, rank, ports[0])
    actor, ref, rollout = host.roles["actor"], host.roles["ref"], host.roles["rollout"]
    before = _full_weights(actor.module)
    for step in range(2):
        _step(actor, ref, step, rank)
    tokens, _ = _batch(rank, 7)
    result = {
        "before": before,
        "after": _full_weights(actor.module),
        "ref_is_actor": ref.module is actor.module,
        "tokens": tokens,
        "actor_logp": actor.log_probs(tokens),
        "ref_logp": ref.log_probs(tokens),
        "merged": {n: t.clone() for n, t in actor.engine.hf_named_tensors()},
    }
    # The HF rollout generates on the actor's module: its sampling log-probs are the
    # actor's forward on what it sampled.
    greedy = SamplingParams(do_sample=False, max_new_tokens=6, ignore_eos=True)
    prompts = [[5, 17, 33, 90], [7, 8]]
    generated = rollout.generate(GenerationRequest(prompts, greedy))
    gen_tokens = TokenBatch.from_ragged(prompts, generated.response_ids, pad_token_id=0)
    result["rollout_logp"] = generated.logprobs
    result["actor_on_generated"] = actor.log_probs(gen_tokens)
    # Save after step 2, take step 3; a fresh host resumed from the save takes step 3 too.
    host.save_checkpoint(ckpt)
    _step(actor, ref, 2, rank)
    result["continued"] = _full_weights(actor.module)
    del actor, ref, rollout, host
    host = _host(cfg, rank, ports[1])
    host.load_checkpoint(ckpt)
    _step(host.roles["actor"], host.roles["ref"], 2, rank)
    result["resumed"] = _full_weights(host.roles["actor"].module)
    if rank == 0:
        out.update(result)


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    ckpt = tmp_path_factory.mktemp("lora") / "global_step_2"
    out = mp.Manager().dict()
    mp.spawn(_run, args=(str(tiny_model_dir), str(ckpt), ports, out), nprocs=WORLD)
    return dict(out), ckpt


def _base_logprobs(model, tokens):
    from engine.train.forward import response_logprobs

    with torch.no_grad():
        return response_logprobs(model, tokens, torch.device("cpu"))[0]


def test_only_the_adapter_trains(lora_run):
    out, _ = lora_run
    before, after = out["before"], out["after"]
    adapter = [n for n in before if ".lora_A." in n or ".lora_B." in n]
    # q_proj, v_proj and down_proj of 4 layers, A and B each.
    assert len(adapter) == 4 * 3 * 2
    assert all(not after[n].equal(before[n]) for n in adapter if ".lora_B." in n)
    assert all(after[n].equal(before[n]) for n in before if n not in adapter)  # bit-identical


def test_reference_is_the_base_model_without_a_copy(lora_run, tiny_model_dir):
    out, _ = lora_run
    assert out["ref_is_actor"]  # the reference loaded no model of its own
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    expected = _base_logprobs(base, out["tokens"])
    mask = out["tokens"].response_mask_BR.bool()
    torch.testing.assert_close(out["ref_logp"][mask], expected[mask], atol=1e-5, rtol=1e-5)
    # ... and the trained actor is not: the adapter moved it away from the base
    assert (out["actor_logp"] - out["ref_logp"])[mask].abs().max() > 1e-3


def test_rollout_sees_the_merged_weights(lora_run, tiny_model_dir):
    out, _ = lora_run
    merged = out["merged"]
    assert not any("lora" in n or "base_layer" in n for n in merged)  # plain HF names
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    delta = (
        merged["model.layers.0.self_attn.q_proj.weight"]
        - base.model.layers[0].self_attn.q_proj.weight
    )
    assert delta.abs().max() > 1e-4  # W + scaling·B·A, not W
    assert merged["model.layers.0.self_attn.k_proj.weight"].equal(
        base.model.layers[0].self_attn.k_proj.weight
    )  # not a target: untouched
    missing, unexpected = base.load_state_dict(merged, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    mask = out["tokens"].response_mask_BR.bool()
    torch.testing.assert_close(
        _base_logprobs(base, out["tokens"])[mask], out["actor_logp"][mask], atol=1e-4, rtol=1e-4
    )
    # The HF rollout's own sampling log-probs are the adapted actor's.
    actor = out["actor_on_generated"]
    for row, logps in enumerate(out["rollout_logp"]):
        torch.testing.assert_close(
            torch.tensor(logps), actor[row, : len(logps)], atol=1e-4, rtol=1e-4
        )


def test_checkpoint_holds_the_adapter_and_resumes_exactly(lora_run):
    out, ckpt = lora_run
    actor = ckpt / "actor"
    model_keys = set(FileSystemReader(str(actor / "model")).read_metadata().state_dict_metadata)
    assert model_keys and all(".lora_A." in k or ".lora_B." in k for k in model_keys)
    optim_keys = FileSystemReader(str(actor / "optim")).read_metadata().state_dict_metadata
    params = {k.split(".", 2)[2] for k in optim_keys if k.startswith("state.")}
    assert params and all(".lora_A." in k or ".lora_B." in k for k in params)
    config = json.loads((actor / "hf" / "adapter_config.json").read_text())
    assert config["r"] == RANK and config["lora_alpha"] == ALPHA
    continued, resumed = out["continued"], out["resumed"]
    assert all(resumed[n].equal(continued[n]) for n in continued)
    assert any(not continued[n].equal(out["after"][n]) for n in continued)  # step 3 moved it


def test_targets_that_match_nothing_are_refused(tiny_model_dir):
    cfg = _config(tiny_model_dir, "actor_rollout_ref.model.target_modules=[qkv_proj]")
    with pytest.raises(ConfigError) as err:
        check_targets(cfg.actor_rollout_ref.model)
    message = str(err.value)
    assert "actor_rollout_ref.model.target_modules" in message and "qkv_proj" in message
    assert "q_proj" in message and "all-linear" in message  # the names there are, the fix


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["actor_rollout_ref.model.lora_rank=-1"], "lora_rank must be >= 0, got -1"),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.lora_alpha=0"],
            "lora_alpha must be > 0, got 0.0",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[]"],
            "target_modules must be all-linear or a non-empty list of module names",
        ),
        (
            ["actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.ref.strategy=megatron"],
            "actor_rollout_ref.ref.strategy=megatron with actor_rollout_ref.model.lora_rank=8",
        ),
        (["critic.model.lora_rank=8"], "critic.model.lora_rank=8: LoRA is for the actor only"),
        (
            ["actor_rollout_ref.rollout.lora_as_adapter=true"],
            "lora_as_adapter=true needs a LoRA actor",
        ),
        (
            [
                "actor_rollout_ref.model.lora_rank=8",
                "actor_rollout_ref.rollout.lora_as_adapter=true",
            ],
            "lora_as_adapter=true needs the vLLM or SGLang rollout (got actor_rollout_ref.rollout.name=hf)",
        ),
    ],
)
def test_lora_settings_are_checked_up_front(overrides, expected):
    with pytest.raises(ConfigError) as err:
        load_config(["actor_rollout_ref.model.path=m", "data.train_files=t", *overrides])
    assert expected in str(err.value)


@pytest.mark.parametrize("mode", ["sync", "one_step_off", "fully_async"])
def test_vllm_serves_the_adapter_on_workers_of_its_own(mode):
    """A separate vLLM rollout takes the base weights once and the adapter after; in
    the fully asynchronous mode samples in flight go on under each new adapter."""
    cfg = load_config(
        [
            "actor_rollout_ref.model.path=m",
            "data.train_files=t",
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.lora_as_adapter=true",
            "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.placement=separate",
            "actor_rollout_ref.rollout.separate_nnodes=1",
            "actor_rollout_ref.rollout.separate_n_gpus_per_node=1",
            f"async_training.mode={mode}",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.lora_as_adapter


def test_sglang_serves_the_adapter_of_any_rank():
    """SGLang takes lora_as_adapter (written against its API, not run here); the rank
    bound is vLLM's alone."""
    cfg = load_config(
        [
            "actor_rollout_ref.model.path=m",
            "data.train_files=t",
            "actor_rollout_ref.model.lora_rank=1024",
            "actor_rollout_ref.rollout.name=sglang",
            "actor_rollout_ref.rollout.lora_as_adapter=true",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.lora_as_adapter
    with pytest.raises(ConfigError, match="vLLM serves adapters of rank <= 512"):
        load_config(
            [
                "actor_rollout_ref.model.path=m",
                "data.train_files=t",
                "actor_rollout_ref.model.lora_rank=1024",
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.rollout.lora_as_adapter=true",
            ]
        )


def test_excluded_modules_get_no_adapter(tiny_model_dir):
    # verl's model.exclude_modules: a regular expression over the module paths
    from engine.train.lora import apply_lora, lora_layers

    def adapted(*extra):
        cfg = _config(tiny_model_dir, *extra)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        return set(lora_layers(apply_lora(model, cfg.actor_rollout_ref.model)))

    every = adapted()
    kept = adapted("actor_rollout_ref.model.exclude_modules=.*\\.mlp\\..*")
    assert any(".mlp." in name for name in every)
    assert kept and not any(".mlp." in name for name in kept)
    assert kept == {name for name in every if ".mlp." not in name}
