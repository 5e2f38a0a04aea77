"""Ulysses sequence parallelism (``engine.train.ulysses``) on two gloo ranks in float64:
log-probs, entropy, Σπ², values and the gradients summed over the group equal one rank's
packed forward of the whole batch, with each rank's model seeing half the tokens and the
heads exchanged all-to-all in every layer."""

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from engine.config import load_config
from engine.errors import ConfigError
from engine.train.forward import (
    response_logprobs,
    response_logprobs_sum_pi_squared,
    response_values,
)
from engine.train.fused_head import HeadOptions
from engine.train.packing import model_call
from engine.train.ulysses import UlyssesGroup, check_heads, enable
from engine.types import TokenBatch
from tests.engine.train import varlen_reference

CPU = torch.device("cpu")
SP = 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ragged(prompt_lens, response_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in response_lens]
    return TokenBatch.from_ragged(prompts, responses, 0)


# mixed lengths; an empty response; a long row whose prompt fills rank 0's slice alone
BATCH = ([9, 4, 6, 25, 3], [3, 11, 0, 2, 1])


def _loss(logp, ent, mask):
    return (logp * mask).sum() + 0.1 * (ent * mask).sum()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _counting_exchanges():
    """Wrap ``all_to_all_single`` to count the exchanges (the SP group really exchanges)."""
    calls = []
    original = dist.all_to_all_single

    def counted(output, input, *args, **kwargs):
        calls.append(input.numel())
        return original(output, input, *args, **kwargs)

    dist.all_to_all_single = counted
    return calls


def _on_rank(rank, port, model_dir, critic_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SP)
    torch.manual_seed(0)
    group = UlyssesGroup.create(SP)
    tokens = ragged(*BATCH)
    mask = tokens.response_mask_BR
    exchanges = _counting_exchanges()
    models = {}
    # the fused head needs no second attention to show it takes the split
    for attn, head in (("sdpa", None), ("sdpa", HeadOptions(chunk_size=4)), ("eager", None)):
        if attn not in models:
            models[attn] = AutoModelForCausalLM.from_pretrained(
                model_dir, dtype=torch.float64, attn_implementation=attn
            )
            # recomputed in the backward: the SP state must reach the recomputation
            models[attn].gradient_checkpointing_enable({"use_reentrant": False})
            models[attn].train()
        model = models[attn]
        layers = model.config.num_hidden_layers
        want = {}
        for sp in (None, group):
            if sp is not None:
                enable(model)
            model.zero_grad(set_to_none=True)
            seen = []
            hook = model.model.embed_tokens.register_forward_hook(
                lambda module, args, out, seen=seen: seen.append(args[0].shape)
            )
            before = len(exchanges)
            logp, ent = response_logprobs(
                model, tokens, CPU, temperature=0.7, with_entropy=True, entropy_grad=True,
                head=head, packed=True, ulysses=sp,
            )  # fmt: skip
            forward_exchanges = len(exchanges) - before
            _loss(logp, ent, mask).backward()
            hook.remove()
            grads = _grads(model)
            if sp is None:
                want = dict(logp=logp.detach(), ent=ent.detach(), grads=grads, shape=seen[0])
                continue
            # each rank's model saw half of each bin; 4 exchanges a layer (q, k, v, out)
            bins, length = want["shape"]
            padded = -(-length // SP) * SP
            assert seen[0] == (bins, padded // SP), (seen, want["shape"])
            assert forward_exchanges == 4 * layers, forward_exchanges
            torch.testing.assert_close(logp, want["logp"], rtol=0, atol=1e-10)
            torch.testing.assert_close(ent, want["ent"], rtol=0, atol=1e-10)
            assert (logp * (1 - mask) == 0).all()
            for g in grads.values():
                dist.all_reduce(g)  # what FSDP's reduce-scatter sums over the group
            tol = 1e-10 if head is None else 1e-6  # the fused head's fp32 accumulation
            for name, g in want["grads"].items():
                torch.testing.assert_close(grads[name], g, rtol=tol, atol=tol, msg=name)
    # Σπ², without gradients
    model = models["sdpa"]
    with torch.no_grad():
        one = response_logprobs_sum_pi_squared(model, tokens, CPU, 1.3, packed=True)
        split = response_logprobs_sum_pi_squared(
            model, tokens, CPU, 1.3, packed=True, ulysses=group
        )
    for a, b in zip(one, split, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-10)
    # the critic's values (a token-classification head: no logits_to_keep)
    critic = AutoModelForTokenClassification.from_pretrained(critic_dir, dtype=torch.float64)
    values = response_values(critic, tokens, CPU, packed=True)
    values.sum().backward()
    want_v, want_g = values.detach(), _grads(critic)
    critic.zero_grad(set_to_none=True)
    enable(critic)
    split = response_values(critic, tokens, CPU, packed=True, ulysses=group)
    split.sum().backward()
    torch.testing.assert_close(split, want_v, rtol=0, atol=1e-10)
    for name, g in _grads(critic).items():
        dist.all_reduce(g)
        torch.testing.assert_close(g, want_g[name], rtol=1e-10, atol=1e-10, msg=name)
    dist.destroy_process_group()


def test_ulysses_equals_one_rank_in_float64(tiny_model_dir, tmp_path):
    torch.manual_seed(0)
    critic = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1)
    critic.save_pretrained(tmp_path / "critic")
    mp.spawn(
        _on_rank,
        args=(_free_port(), str(tiny_model_dir), str(tmp_path / "critic")),
        nprocs=SP,
        join=True,
    )


def _flash_on_rank(rank, port, model_dir):
    """Ulysses around a flash-attention model (its kernel: the CPU reference): each rank
    packs its slice of the one row, the exchanges give each its heads over the whole
    row, and the kernel cuts the rows from the whole row's positions."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=SP)
    seen: list = []
    varlen_reference.register("flash_attention_2", seen)  # this process's flash-attention
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    varlen_reference.use(model, "flash_attention_2")
    tokens = ragged(*BATCH)
    mask = tokens.response_mask_BR
    exchanges = _counting_exchanges()
    results = {}
    for sp in (None, UlyssesGroup.create(SP)):
        if sp is not None:
            enable(model)
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, tokens, CPU, packed=True, ulysses=sp)
        forward_exchanges = len(exchanges)
        (logp * mask).sum().backward()
        results[sp is not None] = (logp.detach(), _grads(model), list(seen))
        seen.clear()
    (lp1, g1, cuts1), (lp2, g2, cuts2) = results[False], results[True]
    assert model.config._attn_implementation == "rlctl_ulysses|flash_attention_2"
    assert forward_exchanges == 4 * model.config.num_hidden_layers  # q, k, v, out per layer
    lengths = tokens.attention_mask_BS.sum(dim=1).sort(descending=True).values.tolist()
    whole = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert cuts1[0] == whole  # one rank: the rows end to end
    # under SP the row is padded to a multiple of 2 (a tail segment of its own)
    assert cuts2[0][: len(whole)] == whole and cuts2[0][-1] % SP == 0
    torch.testing.assert_close(lp2, lp1, rtol=0, atol=1e-10)
    for name, g in g2.items():
        dist.all_reduce(g)  # what FSDP's reduce-scatter sums over the group
        torch.testing.assert_close(g, g1[name], rtol=1e-10, atol=1e-10, msg=name)
    dist.destroy_process_group()


@pytest.mark.slow  # two processes importing torch and transformers
def test_ulysses_around_flash_attention_equals_one_rank(tiny_model_dir):
    mp.spawn(_flash_on_rank, args=(_free_port(), str(tiny_model_dir)), nprocs=SP, join=True)


def test_the_split_call_holds_a_slice_and_its_head_positions():
    """Without a process group: rank 1 of 2 gets the second half of each bin and the
    targets of the head positions that fall in it."""
    tokens = ragged([3, 2], [2, 1])  # rows of 5 and 3 tokens: bins of 5, padded to 6
    whole = model_call(torch.nn.Linear(1, 1), tokens, CPU, packed=True)
    group = UlyssesGroup(size=2, rank=1, group=None)
    call = model_call(torch.nn.Linear(1, 1), tokens, CPU, packed=True, ulysses=group)
    # whole: columns 1, 2, 3 predict responses (and one more); padded to 6 wide
    assert whole.select.tolist() == [1, 2, 3, 4]
    ids, pos = (tokens.input_ids_BS, call.inputs["position_ids"])
    assert call.inputs["input_ids"].shape == (2, 3)
    assert pos.tolist() == [[3, 4, 0], [0, 1, 2]]  # the tail of bin 0 is a row of its own
    assert call.select.tolist() == [0, 2]  # column 3 (local 0), and the padding entry
    assert call.targets.tolist() == [[int(ids[0, -1])], [0]]


def _config(*extra):
    return load_config(
        [
            "actor_rollout_ref.model.path=x",
            "data.train_files=x",
            "trainer.n_gpus_per_node=4",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "critic.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.model.use_remove_padding=true",
            *extra,
        ]
    )


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["actor_rollout_ref.actor.ulysses_sequence_parallel_size=3"], "divide the world size 4"),
        (
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.model.use_remove_padding=false",
            ],
            "needs actor_rollout_ref.model.use_remove_padding=true",
        ),
        (
            [
                "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                "actor_rollout_ref.actor.strategy=megatron",
            ],
            "set actor_rollout_ref.actor.megatron.context_parallel_size=2 instead",
        ),
        (["critic.ulysses_sequence_parallel_size=0"], "critic.ulysses_sequence_parallel_size"),
    ],
    ids=["world", "padding", "megatron", "positive"],
)
def test_bad_sizes_are_refused_naming_the_key(extra, named):
    with pytest.raises(ConfigError, match="ulysses_sequence_parallel_size") as info:
        _config("algorithm.adv_estimator=gae", *extra)
    assert named in str(info.value)


def test_sizes_the_heads_cannot_take_are_refused_naming_the_key(tiny_model_dir):
    from transformers import AutoConfig

    hf = AutoConfig.from_pretrained(tiny_model_dir)  # 4 heads, 2 KV heads
    key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size"
    model = AutoModelForCausalLM.from_config(hf)
    check_heads(model, 2, key)
    with pytest.raises(ConfigError) as info:
        check_heads(model, 4, key)
    (problem,) = info.value.problems
    assert problem.startswith(f"{key} 4 must divide the model's num_key_value_heads 2")
    assert "use one of 1, 2" in problem


def test_the_token_budget_is_per_device():
    cfg = _config(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1000",
    )
    assert cfg.token_budget("actor") == 2000  # the SP group's micro-batch, as verl's
    assert cfg.ulysses_size("reference") == 2  # null: the actor's


# --- the engine: an SP-2 actor and critic update as a DP-2 one does -------------------


def _engine_config(model_dir, sp, *extra):
    return load_config(
        [
            f"actor_rollout_ref.model.path={model_dir}",
            "actor_rollout_ref.model.use_remove_padding=true",
            "trainer.device=cpu",
            f"trainer.n_gpus_per_node={SP}",
            "data.train_batch_size=4",
            "data.max_prompt_length=16",
            "data.max_response_length=12",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.entropy_coeff=0.01",
            "algorithm.adv_estimator=gae",
            "critic.optim.lr=1e-2",
            "critic.ppo_micro_batch_size_per_gpu=2",
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
            f"critic.ulysses_sequence_parallel_size={sp}",
            *extra,
        ],
        check=False,  # no data files: the workers alone are under test
    )


def _engine_batch():
    """8 samples of mixed lengths; a DP-2 rank takes 4 of them, an SP-2 rank all 8."""
    g = torch.Generator().manual_seed(1)
    prompt_lens, response_lens = (5, 16, 3, 9, 7, 2, 11, 4), (12, 2, 7, 4, 1, 9, 5, 12)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in response_lens]
    tokens = TokenBatch.from_ragged(prompts, responses, pad_token_id=0)
    mask = tokens.response_mask_BR
    advantages = torch.randn(mask.shape, generator=g) * mask
    returns = torch.randn(mask.shape, generator=g) * mask
    return tokens, advantages, returns


def _engine_run(rank, model_dir, ports, out):
    from engine.controller.dispatch import take
    from engine.train.fsdp import full_parameters
    from engine.types import ActorBatch, CriticBatch
    from engine.workers.host import WorkerHost

    tokens, adv, returns = _engine_batch()
    for i, (sp, extra) in enumerate(
        [
            (1, []),
            # token-budget micro-batches: 40 per device, 80 for the SP group's
            (
                SP,
                [
                    "actor_rollout_ref.actor.use_dynamic_bsz=true",
                    "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=40",
                ],
            ),
        ]
    ):
        rows = slice(None) if sp == SP else slice(4 * rank, 4 * rank + 4)
        mine = take(tokens, rows)
        host = WorkerHost(
            rank, SP, rank, _engine_config(model_dir, sp, *extra), ["actor", "critic"]
        )
        host.init_distributed("127.0.0.1", ports[i])
        actor, critic = host.roles["actor"], host.roles["critic"]
        old = actor.log_probs(mine)
        values = critic.values(mine)
        metrics = actor.update(ActorBatch(mine, old, adv[rows]))
        metrics.update(critic.update(CriticBatch(mine, values, returns[rows])))
        with full_parameters(actor.module), full_parameters(critic.module):
            weights = {
                **{f"actor.{n}": p.detach().clone() for n, p in actor.module.named_parameters()},
                **{f"critic.{n}": p.detach().clone() for n, p in critic.module.named_parameters()},
            }
        out[(sp, rank)] = (old, values, metrics, weights if rank == 0 else None)
        del actor, critic, host


@pytest.mark.slow
def test_an_sp_update_equals_the_data_parallel_one(tiny_model_dir):
    """World 2: SP 2 (both ranks hold all 8 rows, each half of every sequence) against
    DP 2 (each rank 4 whole rows): the same log-probs, values, losses, gradient norms and
    weights after one actor and one critic step."""
    ports = [_free_port() for _ in range(2)]
    out = mp.Manager().dict()
    mp.spawn(_engine_run, args=(str(tiny_model_dir), ports, out), nprocs=SP, join=True)
    dp = [out[(1, r)] for r in range(SP)]
    sp = [out[(SP, r)] for r in range(SP)]
    for i in (0, 1):  # log-probs, values: the SP ranks agree, and equal DP's rows
        torch.testing.assert_close(sp[1][i], sp[0][i], rtol=0, atol=0)
        torch.testing.assert_close(sp[0][i], torch.cat([dp[0][i], dp[1][i]]), atol=1e-5, rtol=0)
    for key in ("actor/pg_loss", "actor/entropy", "critic/vf_loss"):
        want = (dp[0][2][key] + dp[1][2][key]) / 2  # the controller's mean over DP ranks
        assert abs(sp[0][2][key] - want) <= 1e-5 * abs(want), (key, sp[0][2][key], want)
    for key in ("actor/grad_norm", "critic/grad_norm"):
        assert abs(sp[0][2][key] - dp[0][2][key]) <= 1e-5 * dp[0][2][key], key
    start = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    initial = {f"actor.{n}": p.detach() for n, p in start.named_parameters()}
    w_dp, w_sp = dp[0][3], sp[0][3]
    step = sum(float((w_dp[n] - initial[n]).abs().sum()) for n in initial)
    assert step > 1e-3
    # (in the mean: AdamW's first step is lr·g/(|g|+ε), ±lr for a gradient that is ~0)
    moved = sum(float((w_sp[n] - w_dp[n]).abs().sum()) for n in w_dp)
    assert moved < 1e-3 * step, (moved, step)


def test_the_ranks_of_a_group_receive_the_same_rows():
    from engine.workers.spawn import role_layouts

    cfg = _config(
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "critic.ulysses_sequence_parallel_size=4",
    )
    layouts = role_layouts(cfg)
    assert set(layouts) == {"actor", "ref", "critic"}  # the reference: the actor's size
    actor, critic = layouts["actor"], layouts["critic"]
    assert [actor.shard(r, 4) for r in range(4)] == [0, 0, 1, 1]
    assert actor.output_ranks(4) == [0, 2]  # one result per group
    assert [critic.shard(r, 4) for r in range(4)] == [0, 0, 0, 0]
    assert role_layouts(_config()) == {}


def test_heads_the_size_does_not_divide_are_refused_before_start(tiny_model_dir):
    """At the engine's start (before Ray) and in ``rlctl validate``/``plan``: the key and
    the sizes that would work."""
    from engine.runtime import _check_model_configs
    from rlctl.job.spec import model_problems

    cfg = _config(
        f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=4",  # 4 heads, 2 KV heads
    )
    with pytest.raises(ConfigError) as info:
        _check_model_configs(cfg)
    (problem,) = info.value.problems
    assert problem.startswith(
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size 4 must divide the model's"
        " num_key_value_heads 2"
    )
    assert model_problems(cfg, str(tiny_model_dir)) == [problem]
    _check_model_configs(_config(f"actor_rollout_ref.model.path={tiny_model_dir}",
                                 "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"))  # fmt: skip


def _counting_new_groups():
    """Wrap ``new_group`` to record the ranks of every group made."""
    made = []
    original = dist.new_group

    def counted(ranks=None, *args, **kwargs):
        made.append(list(ranks))
        return original(ranks, *args, **kwargs)

    dist.new_group = counted
    return made


def _groups_on_rank(rank, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    made = _counting_new_groups()
    group = UlyssesGroup.create(2)
    assert (group.size, group.rank) == (2, rank % 2)
    # made once per size on every rank, in the same order; a second role's call reuses them
    assert UlyssesGroup.create(2) is group
    whole = UlyssesGroup.create(4)
    assert UlyssesGroup.create(2) is group and UlyssesGroup.create(4) is whole
    assert made == [[0, 1], [2, 3], [0, 1, 2, 3]], made
    # (1, heads 4, local seq 3, 1) -> (1, heads 2, seq 6, 1): the group's two slices, in
    # order, of this rank's half of the heads; values say (rank, head, position)
    from engine.train.ulysses import all_to_all

    heads = torch.arange(4.0)[None, :, None, None]
    x = (100 * rank + 10 * heads + torch.arange(3.0)[None, None, :, None]).requires_grad_()
    y = all_to_all(x, 1, 2, group.group)
    first = rank - rank % 2  # the group's first rank
    for h in range(2):
        want = [100 * (first + s) + 10 * (2 * (rank % 2) + h) + p for s in (0, 1) for p in range(3)]
        assert y[0, h, :, 0].tolist() == want
    y.sum().backward()  # the exchange back: each input element's gradient is 1
    assert (x.grad == 1).all()
    dist.destroy_process_group()


@pytest.mark.slow  # ~20 s: four processes importing torch and transformers on 2 cores
def test_groups_are_consecutive_ranks_at_world_4():
    mp.spawn(_groups_on_rank, args=(_free_port(),), nprocs=4, join=True)


def _roles_share_groups(rank, model_dir, ports):
    from engine.workers.host import WorkerHost

    made = _counting_new_groups()
    cfg = _engine_config(model_dir, SP, "actor_rollout_ref.actor.use_kl_loss=true")
    host = WorkerHost(rank, SP, rank, cfg, ["actor", "ref", "critic"])
    host.init_distributed("127.0.0.1", ports[0])
    engines = [host.roles[r].engine for r in ("actor", "ref", "critic")]
    assert [e.sp_size for e in engines] == [SP] * 3
    assert engines[0].ulysses is engines[1].ulysses is engines[2].ulysses
    assert made.count([0, 1]) == 1, made  # one group for the three roles
    # a new default group (a restarted host) makes its own: the old one went with it
    dist.destroy_process_group()
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{ports[1]}", rank=rank, world_size=SP
    )
    again = UlyssesGroup.create(SP)
    assert again is not engines[0].ulysses and made.count([0, 1]) == 2
    dist.destroy_process_group()


@pytest.mark.slow  # two processes building three tiny models each
def test_the_roles_of_a_worker_share_one_set_of_groups(tiny_model_dir):
    """Actor, reference and critic at SP 2 in one worker: one ``new_group`` for the three
    (each made its own before), and the same group object in each engine."""
    mp.spawn(
        _roles_share_groups,
        args=(str(tiny_model_dir), [_free_port(), _free_port()]),
        nprocs=SP,
        join=True,
    )
