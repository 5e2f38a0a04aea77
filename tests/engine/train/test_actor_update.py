"""The actor on two real FSDP2 ranks (gloo): the on-policy shortcut for π_old, token-budget
micro-batches, and HF generation on the unwrapped twin of the sharded module."""

import socket

import torch
import torch.multiprocessing as mp
from torch.distributed.tensor import DTensor
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.config import load_config
from engine.rollout.hf import HFRollout
from engine.train.fsdp import full_parameters
from engine.types import ActorBatch, GenerationRequest, SamplingParams, TokenBatch
from engine.workers.host import WorkerHost

WORLD = 2


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
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            *extra,
        ],
        check=False,  # no data files: the workers alone are under test
    )


def _batch(rank):
    """This rank's 4 samples, of mixed lengths (so trimming and budgets matter)."""
    g = torch.Generator().manual_seed(rank)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (5, 16, 3, 9)]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in (12, 2, 7, 4)]
    tokens = TokenBatch.from_ragged(prompts, responses, pad_token_id=0)
    advantages = torch.randn(tokens.response_mask_BR.shape, generator=g)
    return tokens, advantages * tokens.response_mask_BR


def _full_weights(module):
    with full_parameters(module):
        return {n: p.detach().clone() for n, p in module.named_parameters()}


def _host(cfg, rank, port, roles):
    host = WorkerHost(rank, WORLD, rank, cfg, roles)
    host.init_distributed("127.0.0.1", port)
    return host


def _run(rank, model_dir, ports, out):
    tokens, adv = _batch(rank)
    results = {}
    for i, (name, extra, recompute) in enumerate(
        [
            ("recomputed", [], True),
            ("on_policy", [], False),
            (
                "dynamic",
                [
                    "actor_rollout_ref.actor.use_dynamic_bsz=true",
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30",
                ],
                False,
            ),
        ]
    ):
        host = _host(_config(model_dir, *extra), rank, ports[i], ["actor"])
        actor = host.roles["actor"]
        old = actor.log_probs(tokens) if recompute else None
        if recompute:  # the optimal token baseline's pass: the same log-probs, and Σπ²
            results["probs"] = (tokens, old, actor.log_probs_sum_pi_squared(tokens))
        metrics = actor.update(ActorBatch(tokens, old, adv))
        results[name] = (_full_weights(actor.module), metrics)
        del actor, host  # the host leaves the process group

    # Generation on the sharded module: through the twin, and resharded afterwards.
    host = _host(_config(model_dir), rank, ports[3], ["actor", "rollout"])
    actor, rollout = host.roles["actor"], host.roles["rollout"]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(t) for t in ("12 + 30 =", "Add 3 and 4, then double it.")]
    greedy = SamplingParams(do_sample=False, max_new_tokens=10, ignore_eos=True)
    generated = rollout.generate(GenerationRequest(prompts, greedy)).response_ids
    twin = rollout.engine.twin
    with full_parameters(actor.module):
        rollout.engine.model_for_generation()
        shared = all(
            twin.get_parameter(n).data_ptr() == p.data_ptr()
            for n, p in actor.module.named_parameters()
        )
    resharded = all(isinstance(p, DTensor) for p in actor.module.parameters())
    if rank == 0:
        out.update(results=results, generated=generated, shared=shared, resharded=resharded)


def test_actor_on_two_ranks(tiny_model_dir):
    ports = []
    for _ in range(4):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    out = mp.Manager().dict()
    mp.spawn(_run, args=(str(tiny_model_dir), ports, out), nprocs=WORLD)
    results = out["results"]
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    start = {n: p.detach() for n, p in initial.named_parameters()}

    # The π_old pass with Σπ²: the log-probs of the plain pass, and Σ_v π(v)² of the
    # unsharded model's softmax at each response token.
    tokens, old, probs = results["probs"]
    mask = tokens.response_mask_BR.bool()
    torch.testing.assert_close(probs.logprobs_BR, old)
    with torch.no_grad():
        logits = initial(
            input_ids=tokens.input_ids_BS,
            attention_mask=tokens.attention_mask_BS,
            position_ids=tokens.position_ids_BS,
        ).logits
    r = tokens.response_length
    want = torch.softmax(logits[:, -r - 1 : -1].float(), -1).square().sum(-1)
    torch.testing.assert_close(probs.sum_pi_squared_BR[mask], want[mask], atol=1e-6, rtol=1e-5)

    # The update moved the weights (so the comparisons below can fail)...
    recomputed, metrics = results["recomputed"]
    assert max(float((recomputed[n] - start[n]).abs().max()) for n in start) > 1e-3

    # ... and, on-policy, π_old from the update's own forward gives the same update as
    # a separate pass, with fixed or token-budget micro-batches: the same loss and
    # gradient norm to float rounding, and the same weights. (Weights compare in the
    # mean: AdamW's first step is lr·g/(|g|+ε), so an element whose gradient is ~0 may
    # move by ±lr on rounding alone.)
    def moved(a, b):
        return sum(float((a[n] - b[n]).abs().sum()) for n in start)

    step_size = moved(recomputed, start)
    for name in ("on_policy", "dynamic"):
        weights, m = results[name]
        assert moved(weights, recomputed) < 1e-3 * step_size, name
        for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
            assert abs(m[key] - metrics[key]) <= 1e-5 * abs(metrics[key]), (name, key)
        assert m["actor/ppo_kl"] == 0.0

    # Greedy generation on the twin equals HF generate on the plain model.
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    plain = HFRollout(initial.eval(), tokenizer, torch.device("cpu"))
    prompts = [tokenizer.encode(t) for t in ("12 + 30 =", "Add 3 and 4, then double it.")]
    greedy = SamplingParams(do_sample=False, max_new_tokens=10, ignore_eos=True)
    assert out["generated"] == plain.generate(GenerationRequest(prompts, greedy)).response_ids
    assert out["shared"], "the twin must use the gathered parameters, not copies"
    assert out["resharded"], "after generation the actor's parameters are shards again"
