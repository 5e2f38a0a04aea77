"""The Megatron-core training backend (engine.train.megatron).

Always run: the parallel-size rules, the install error, the attention mask and the
SDPA core attention (pure torch). With megatron-core importable (``scripts/setup.sh``
installs it with ``--no-deps`` into ``.megatron-core``, which ``scripts/test.sh`` puts on
PYTHONPATH; the suite runs a smoke subset, ``RLCTL_TEST_MEGATRON=all`` every layout:
see tests/conftest.py), real ``GPTModel`` engines run under
torch.distributed with gloo on CPU, in spawned processes: world size 1 (TP=1), 2 (TP=1,
DP=2) and 2 (TP=2), each checked against Hugging Face models trained with the same
AdamW settings on the same batch.
"""

from __future__ import annotations

import importlib.util
import math
import socket

import pytest
import torch

from engine.errors import ConfigError, EngineError
from engine.train.megatron import (
    MegatronParallel,
    SDPAttention,
    attention_mask_B1SS,
    check_consecutive_positions,
)


def _has_megatron() -> bool:
    try:
        return importlib.util.find_spec("megatron.core") is not None
    except ModuleNotFoundError:
        return False


needs_megatron = pytest.mark.skipif(
    not _has_megatron(),
    reason="megatron-core is not installed (pip install 'rlctl[megatron]'); see module doc",
)


def _config(model_type="qwen2", **kw):
    """A tiny config; the MoE types get 4 experts of width 32, 2 per token (Qwen2-MoE a
    shared expert of width 48, Qwen3-MoE renormalised top-2 weights)."""
    import transformers

    cls = transformers.AutoConfig.for_model(model_type).__class__
    base = dict(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    if model_type.endswith("_moe"):
        base.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
    if model_type == "qwen2_moe":
        base.update(shared_expert_intermediate_size=48)
    if model_type == "qwen3_moe":
        base.update(norm_topk_prob=True)
    if model_type == "deepseek_v3":  # multi-latent attention, YaRN, grouped sigmoid routing
        base.update(
            num_hidden_layers=3,
            num_key_value_heads=4,
            tie_word_embeddings=False,
            q_lora_rank=32,
            kv_lora_rank=16,
            qk_nope_head_dim=16,
            qk_rope_head_dim=8,
            v_head_dim=16,
            n_routed_experts=8,
            num_experts_per_tok=4,
            moe_intermediate_size=32,
            n_group=4,
            topk_group=2,
            n_shared_experts=1,
            first_k_dense_replace=1,
            routed_scaling_factor=2.5,
            norm_topk_prob=True,
            rope_interleave=True,
            rope_scaling=dict(
                rope_type="yarn",
                factor=4.0,
                original_max_position_embeddings=32,
                beta_fast=32,
                beta_slow=1,
                mscale=1.0,
                mscale_all_dim=1.0,
            ),
        )
        del base["head_dim"]  # HF's is the rotary part's
    base.update(kw)
    return cls(**base)


# ---------------------------------------------------------------------------
# without megatron-core


def test_parallel_sizes_against_the_world():
    ok = MegatronParallel(tensor_model_parallel_size=2)
    assert ok.problems(world_size=8) == []
    assert ok.data_parallel_size(8) == 4

    (p,) = MegatronParallel(tensor_model_parallel_size=4).problems(world_size=6)
    assert "world size 6" in p and "= 4" in p and "tensor_model_parallel_size" in p

    (p,) = MegatronParallel(tensor_model_parallel_size=0).problems(world_size=2)
    assert p == "actor_rollout_ref.actor.megatron.tensor_model_parallel_size must be >= 1, got 0"

    # Pipeline stages are supported: TP 2 × PP 2 × DP 2.
    pipelined = MegatronParallel(tensor_model_parallel_size=2, pipeline_model_parallel_size=2)
    assert pipelined.problems(world_size=8) == []
    assert pipelined.data_parallel_size(8) == 2
    (p,) = pipelined.problems(world_size=6)
    assert "world size 6" in p and "= 4" in p

    # Expert parallelism: the experts' grid is ETP × EP × PP (ETP null: TP), which must
    # divide the world; with TP > 1, Megatron needs sequence parallelism for it.
    assert MegatronParallel(expert_model_parallel_size=2).problems(world_size=4) == []
    (p,) = MegatronParallel(expert_model_parallel_size=4).problems(world_size=6)
    assert "world size 6" in p and "expert_model_parallel_size" in p and "= 4" in p
    (p,) = MegatronParallel(2, expert_model_parallel_size=2).problems(
        world_size=8, key="critic.megatron"
    )
    assert p.startswith("critic.megatron.expert_model_parallel_size 2 with")
    assert "critic.megatron.sequence_parallel=true" in p
    ep_sp = MegatronParallel(2, expert_model_parallel_size=2, sequence_parallel=True)
    assert ep_sp.problems(world_size=8) == []
    (p,) = ep_sp.problems(world_size=6)
    assert "pipeline_model_parallel_size = 2 × 2 × 1 = 4 (expert_tensor_parallel_size null" in p
    # Context parallelism counts in the model-parallel size: TP 2 × CP 2 needs 4 devices.
    cp = MegatronParallel(tensor_model_parallel_size=2, context_parallel_size=2)
    assert cp.problems(world_size=8) == [] and cp.data_parallel_size(8) == 2
    (p,) = cp.problems(world_size=6)
    assert "context_parallel_size = 4" in p
    # Sequence parallelism splits what TP replicates: ignored at TP 1, as Megatron-LM does.
    assert MegatronParallel(2, sequence_parallel=True).sequence_parallel_in_effect
    assert not MegatronParallel(1, sequence_parallel=True).sequence_parallel_in_effect
    assert MegatronParallel(1, sequence_parallel=True).problems(world_size=2) == []

    with pytest.raises(ConfigError, match="world size 3"):
        MegatronParallel(tensor_model_parallel_size=2).validate(world_size=3)


def test_expert_tensor_parallel_sizes_against_the_world():
    """The experts' grid apart from the dense one (verl's TP 2, EP 8, ETP 1 on 8 devices):
    ETP × EP × PP divides the world, TP × CP × PP too, each on its own."""

    def sizes(world, tp=2, ep=8, etp=1, pp=1, cp=1, sp=True):
        parallel = MegatronParallel(tp, pp, cp, ep, sp, expert_tensor_parallel_size=etp)
        return parallel.problems(world)

    assert MegatronParallel(2, expert_tensor_parallel_size=None).etp == 2
    assert MegatronParallel(2, expert_tensor_parallel_size=1).etp == 1
    assert sizes(8) == []  # dense TP 2 × DP 4; experts ETP 1 × EP 8
    assert sizes(64, pp=4, ep=16) == []  # 64 devices: 4 stages of EP 16
    assert sizes(4, tp=4, ep=2, etp=2) == []  # experts TP-sliced in half, on half the ranks
    assert sizes(2, tp=1, ep=1, etp=2) == []  # ETP beyond TP: experts sliced over DP ranks
    (p,) = sizes(4, tp=2, ep=8)  # TP 2 fits 4 devices; 8 experts' ranks do not
    assert p == (
        "the world size 4 must be a multiple of actor_rollout_ref.actor.megatron.expert_tensor"
        "_parallel_size × expert_model_parallel_size × pipeline_model_parallel_size ="
        " 1 × 8 × 1 = 8: the routed experts form a grid of their own, each stage's ranks"
        " grouped ETP × EP at a time to hold every expert once; change these sizes or the"
        " number of devices"
    )
    (p,) = sizes(6, tp=2, ep=1, etp=4)
    assert "= 4 × 1 × 1 = 4" in p
    (p,) = sizes(8, etp=0)
    assert p == "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size must be >= 1, got 0"
    # ETP apart from TP exchanges tokens over ETP × EP ranks: sequence parallel with TP > 1.
    (p,) = sizes(8, ep=1, sp=False)
    assert p.startswith(
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size 1 with"
        " tensor_model_parallel_size 2 needs actor_rollout_ref.actor.megatron"
        ".sequence_parallel=true"
    )
    assert sizes(8, tp=1, ep=1, etp=2, sp=False) == []  # nothing to split at TP 1


def test_distributed_optimizer_files_do_not_collide():
    """Megatron's distributed optimizer writes its state on every rank that is data-parallel
    rank 0 of the dense or the expert optimizer: at EP 2 on 2 ranks both are (each the
    only expert-DP rank of its experts), and so are both stages at PP 2; each rank's file
    has a name of its own (by TP rank, both were dist_optimizer_tp0.pt)."""
    from types import SimpleNamespace

    from engine.train.megatron_checkpoint import MegatronCheckpoint
    from engine.train.megatron_state import RankLayout

    def name(rank, **kw):
        layout = RankLayout(world_size=2, rank=rank, tp=1, tp_rank=0, **kw)
        return MegatronCheckpoint._dist_optim_file(SimpleNamespace(layout=layout))

    ep2 = [name(r, dp=2, dp_rank=r, ep=2, ep_rank=r) for r in (0, 1)]
    pp2 = [name(r, dp=1, dp_rank=0, pp=2, pp_rank=r) for r in (0, 1)]
    assert len(set(ep2)) == 2 and len(set(pp2)) == 2


def test_parallel_sizes_against_the_model():
    cfg = _config(num_attention_heads=6, num_key_value_heads=3, head_dim=8, vocab_size=255)
    problems = MegatronParallel(tensor_model_parallel_size=2).model_problems(cfg)
    assert problems == [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2 must divide the model's"
        " num_key_value_heads 3 (each rank holds whole query groups); pick a divisor of 3",
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2 must divide the model's"
        " vocab_size 255 (the vocabulary is split; none is padded); pick a divisor of 255",
    ]
    assert MegatronParallel(tensor_model_parallel_size=2).model_problems(_config()) == []
    windowed = _config(use_sliding_window=True, sliding_window=64)
    (p,) = MegatronParallel().model_problems(windowed)
    assert "sliding-window" in p
    with pytest.raises(ConfigError, match="num_attention_heads 6"):
        MegatronParallel(tensor_model_parallel_size=4).validate(4, _config(num_attention_heads=6))
    # Expert parallelism needs experts, whole ones on every rank; TP slices them.
    (p,) = MegatronParallel(expert_model_parallel_size=2).model_problems(_config())
    assert "needs a mixture-of-experts model; qwen2 is dense, set it to 1" in p
    moe = _config("qwen3_moe", num_experts=6, moe_intermediate_size=30)
    assert MegatronParallel(expert_model_parallel_size=2).model_problems(moe) == []
    (p,) = MegatronParallel(expert_model_parallel_size=4).model_problems(moe)
    assert "must divide the model's num_experts 6" in p
    odd = _config("qwen3_moe", num_experts=6, moe_intermediate_size=31)
    (p,) = MegatronParallel(2, expert_model_parallel_size=2, sequence_parallel=True).model_problems(
        odd
    )
    assert p == (
        "actor_rollout_ref.actor.megatron.expert_tensor_parallel_size (null: the TP size) 2"
        " must divide the model's moe_intermediate_size 31 (each routed expert is split by"
        " columns over ETP ranks); pick a divisor of 31"
    )
    # Whole experts (ETP 1) under TP 2; the shared expert is split like the dense MLP.
    whole = MegatronParallel(
        2, expert_model_parallel_size=2, sequence_parallel=True, expert_tensor_parallel_size=1
    )
    assert whole.model_problems(odd) == []
    shared = _config("qwen2_moe", moe_intermediate_size=31, shared_expert_intermediate_size=47)
    (p,) = whole.model_problems(shared)
    assert "tensor_model_parallel_size 2 must divide the model's shared experts' width 47" in p
    # Megatron-core's MoE layer trains under TP only with the sequence split.
    (p,) = MegatronParallel(2).model_problems(moe)
    assert p.startswith("actor_rollout_ref.actor.megatron.tensor_model_parallel_size 2 with a")
    assert "needs actor_rollout_ref.actor.megatron.sequence_parallel=true" in p
    # Pipeline stages: 7 layers go 2, 2, 2, 1 over 4 stages; 28 layers cannot form 8.
    assert (
        MegatronParallel(pipeline_model_parallel_size=4).model_problems(
            _config(num_hidden_layers=7)
        )
        == []
    )
    (p,) = MegatronParallel(pipeline_model_parallel_size=8).model_problems(
        _config(num_hidden_layers=28)
    )
    assert p.startswith("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size 8")
    # 7: 4 each; 6: 5 × 5 + 3; 10: 9 × 3 + 1; 5: 4 × 6 + 4 (9 would leave -4).
    assert "28 layers" in p and "sizes that work near it: 5, 6, 7, 10" in p


def test_parallel_of_a_config_section():
    class Section:
        tensor_model_parallel_size = 2
        pipeline_model_parallel_size = 1
        context_parallel_size = 1
        expert_model_parallel_size = 1
        expert_tensor_parallel_size = None
        sequence_parallel = False
        use_distributed_optimizer = False

    assert MegatronParallel.of(Section()) == MegatronParallel(2, use_distributed_optimizer=False)


def test_missing_megatron_core_is_a_clear_error(monkeypatch):
    import engine.versions as versions
    from engine.config import OptimConfig
    from engine.device import DEVICES
    from engine.train.megatron import MegatronEngine

    monkeypatch.setattr(versions, "installed_version", lambda name: None)
    with pytest.raises(EngineError) as err:
        MegatronEngine.from_hf("unused", MegatronParallel(), OptimConfig(), DEVICES["cpu"])
    message = str(err.value)
    assert "pip install 'rlctl[megatron]'" in message
    assert "megatron-core>=0.13,<0.17" in message

    # Installed (metadata says so) but not importable: still a clear error.
    monkeypatch.setattr(versions, "installed_version", lambda name: "0.14.0")
    monkeypatch.setitem(__import__("sys").modules, "megatron", None)
    with pytest.raises(EngineError, match=r"does not import.*rlctl\[megatron\]"):
        MegatronEngine.from_hf("unused", MegatronParallel(), OptimConfig(), DEVICES["cpu"])


def test_attention_mask_by_hand():
    # row 0: one left pad, then 3 tokens; row 1: 3 tokens, then one right pad
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    allowed = ~attention_mask_B1SS(mask)[:, 0]
    assert allowed[0].int().tolist() == [
        [1, 0, 0, 0],  # the pad query keeps only itself (finite, never read)
        [0, 1, 0, 0],
        [0, 1, 1, 0],
        [0, 1, 1, 1],
    ]
    assert allowed[1].int().tolist() == [
        [1, 0, 0, 0],
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [1, 1, 1, 1],
    ]
    # Context parallelism builds only this rank's query rows (here 3 and 0), not S × S.
    rows = ~attention_mask_B1SS(mask, torch.tensor([3, 0]))[:, 0]
    assert rows.shape == (2, 2, 4)
    assert torch.equal(rows, allowed[:, [3, 0]])


def test_positions_must_be_consecutive():
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    check_consecutive_positions(torch.tensor([[1, 0, 1, 2], [0, 1, 2, 1]]), mask)  # HF's
    with pytest.raises(EngineError, match="consecutive"):  # two sequences packed in a row
        check_consecutive_positions(torch.tensor([[1, 0, 1, 0], [0, 1, 2, 1]]), mask)


def test_sdpa_attention_matches_explicit_softmax():
    torch.manual_seed(0)
    s, b, heads, groups, d = 5, 2, 4, 2, 8
    q, k, v = (
        torch.randn(s, b, heads, d),
        torch.randn(s, b, groups, d),
        torch.randn(s, b, groups, d),
    )
    mask = attention_mask_B1SS(torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]))

    class Cfg:
        attention_dropout = 0.0

    out = SDPAttention(Cfg(), 1, None, "self").eval()(q, k, v, mask)
    assert out.shape == (s, b, heads * d)
    # by hand: query head h uses kv group h // 2
    kk, vv = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, kk) / math.sqrt(d)
    scores = scores.masked_fill(mask, float("-inf"))
    expected = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), vv).reshape(s, b, -1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# with megatron-core: real engines in spawned gloo processes


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(fn, world_size: int, *args) -> None:
    import torch.multiprocessing as mp

    mp.spawn(fn, args=(world_size, _free_port(), *args), nprocs=world_size, join=True)


def _init(rank: int, world_size: int, port: int) -> None:
    import os

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _batch(vocab: int):
    """4 rows: left-padded prompts, right-padded responses, of different lengths."""
    from engine.types import TokenBatch

    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (5, 9, 7, 3)]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in (6, 3, 8, 5)]
    return TokenBatch.from_ragged(prompts, responses, pad_token_id=0)


OPTIM = dict(
    lr=1e-3,
    weight_decay=0.01,
    lr_warmup_steps=1,
    lr_scheduler_type="cosine",
    min_lr_ratio=0.1,
)
CRITIC_LR = 1e-4
STEPS = 3  # the checkpoint is written after step 2; step 3 is replayed after loading


def _hf_reference(hf, batch, loss_fn, steps: int, total: int, lr: float = OPTIM["lr"]):
    """HF model trained with the FSDP backend's optimizer and schedule, on the whole batch
    at once; returns the losses, the learning rates and the gradient norms seen."""
    from engine.config import OptimConfig
    from engine.train import fsdp

    cfg = OptimConfig(**{**OPTIM, "lr": lr})
    optimizer = fsdp.build_optimizer(hf, cfg)
    scheduler = fsdp.build_scheduler(optimizer, cfg, total)
    losses, lrs, norms = [], [], []
    hf.train()
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        loss = loss_fn(hf, batch)
        loss.backward()
        # The norm in float64: torch's float32 one is off by ~1e-5 here (the 262k-entry
        # embedding), the engine's is float64.
        grads = [p.grad.double() for p in hf.parameters() if p.grad is not None]
        norms.append(float(torch.stack([g.pow(2).sum() for g in grads]).sum().sqrt()))
        torch.nn.utils.clip_grad_norm_(hf.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        losses.append(float(loss.detach()))
    return losses, lrs, norms


def _engine_steps(engine, batch, loss_fn, steps: int, micro: int):
    """``steps`` updates of this DP rank's rows, ``micro`` rows per micro-batch;
    ``loss_fn(engine, micro_batch, rows, scale)``. Returns this rank's loss and the
    gradient norm, per step."""
    from engine.controller.dispatch import take

    losses, norms = [], []
    engine.train()
    for _ in range(steps):
        scale = engine.global_loss_scale(batch.response_mask_BR)
        total = 0.0

        def step(rows, scale=scale):
            nonlocal total
            loss = loss_fn(engine, take(batch, rows), rows, scale)
            total += float(loss.detach())
            return loss

        engine.forward_backward([slice(s, s + micro) for s in range(0, len(batch), micro)], step)
        norms.append(engine.optimizer_step(1.0))
        engine.lr_scheduler_step()
        losses.append(total)
    return losses, norms


def _hf_copy(engine) -> dict:
    """The engine's HF tensors, copied (some are views of the live parameters)."""
    return {name: t.clone() for name, t in engine.hf_named_tensors()}


def _checkpoint_state(model) -> dict:
    """A HF model's tensors under checkpoint names (transformers 5 fuses MoE experts in
    memory; checkpoints and the engine's ``hf_named_tensors`` name one per expert)."""
    from engine.rollout.weights import as_checkpoint, checkpoint_reverter

    pairs = as_checkpoint(model.state_dict().items(), checkpoint_reverter(model))
    tied = model.config.tie_word_embeddings  # the engine sends no tied lm_head
    return {k: v.clone() for k, v in pairs if not (tied and k == "lm_head.weight")}


def _load_checkpoint_named(model, state: dict) -> tuple[list, list]:
    """Write checkpoint-named tensors into ``model``; (missing, unexpected) names."""
    from engine.rollout.weights import checkpoint_slots

    slots = checkpoint_slots(model)
    with torch.no_grad():
        for name in set(state) & set(slots):
            slots[name][1].copy_(state[name])
    return sorted(set(slots) - set(state)), sorted(set(state) - set(slots))


def _max_diff(a: dict, b: dict) -> float:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _actor_run(
    rank, world_size, port, tp, pp, model_dir, ckpt_dir, out_path, sp=False, cp=1, ep=1, etp=None
):
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForCausalLM

    from engine.config import OptimConfig
    from engine.config.routing_replay import num_experts
    from engine.controller.dispatch import ModelParallelLayout, take
    from engine.device import DEVICES
    from engine.train.forward import (
        response_logprobs,
        response_logprobs_at,
        response_logprobs_sum_pi_squared,
        response_topk,
    )
    from engine.train.megatron import MegatronEngine, hf_state_dict_from_checkpoint

    _init(rank, world_size, port)
    try:
        parallel = MegatronParallel(
            tensor_model_parallel_size=tp,
            pipeline_model_parallel_size=pp,
            context_parallel_size=cp,
            expert_model_parallel_size=ep,
            sequence_parallel=sp,
            expert_tensor_parallel_size=etp,
        )
        optim = OptimConfig(**OPTIM)
        cpu = DEVICES["cpu"]
        # A mixture of experts is built under routing replay (checked last, below); the
        # routers route freely unless a pass records or replays.
        moe = num_experts(AutoConfig.from_pretrained(model_dir)) > 0

        def build():
            return MegatronEngine.from_hf(
                model_dir, parallel, optim, cpu, role="actor", total_steps=STEPS + 1,
                routing_replay=moe,
            )  # fmt: skip

        engine = build()
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        batch = _batch(hf.config.vocab_size)
        valid = batch.attention_mask_BS.bool()
        mask = batch.response_mask_BR
        # Results are checked on the rank the controller gathers: the last pipeline
        # stage's first TP and CP rank (earlier stages return placeholders).
        answers = engine.stage.last and engine.layout.tp_rank == 0 and engine.layout.cp_rank == 0
        result = {
            "dp": engine.dp_size,
            "layout": engine.layout,
            "stage_layers": engine.stage.layers,
            "sequence_parallel": engine.model.config.sequence_parallel,
            "output": answers and engine.dp_rank == 0,
        }
        # The controller's dispatch rule agrees with Megatron's rank layout.
        layout = ModelParallelLayout(tp=tp, pp=pp, cp=cp)
        result["dispatch_agrees"] = (
            layout.shard(rank, world_size) == engine.dp_rank
            and (rank in layout.output_ranks(world_size)) == answers
        )

        engine.eval()
        with torch.no_grad():
            inputs = (batch.input_ids_BS, batch.attention_mask_BS, batch.position_ids_BS)
            ref = hf(*inputs[:2], position_ids=inputs[2]).logits
            logits = engine.logits(*inputs)
            if engine.stage.last:
                result["logit_err"] = (logits - ref)[valid].abs().max().item()
            logp, entropy = engine.response_logprobs(batch, 0.7, with_entropy=True)
            ref_logp, ref_entropy = response_logprobs(hf, batch, torch.device("cpu"), 0.7, True)
            result["logp_err"] = ((logp - ref_logp) * mask).abs().max().item()
            result["entropy_err"] = ((entropy - ref_entropy) * mask).abs().max().item()
            # Σ_v π(v)² (the optimal token baseline): over the split vocabulary at TP > 1
            logp_sq, sum_sq = engine.response_logprobs_sum_pi_squared(batch, 0.7)
            ref_sq = response_logprobs_sum_pi_squared(hf, batch, torch.device("cpu"), 0.7)[1]
            relative = (sum_sq - ref_sq) / ref_sq  # Σπ² is about 1/V here: compare relatively
            result["sum_sq_err"] = (relative * mask).abs().max().item()
            result["sum_sq_logp_err"] = ((logp_sq - ref_logp) * mask).abs().max().item()
            # log-probs at given tokens (distillation's teacher top-k), the vocabulary
            # split at TP > 1; not under CP (refused there)
            if cp == 1:
                ids = response_topk(hf, batch, torch.device("cpu"), 4)[2]
                _, _, at = engine.response_logprobs_at(batch, ids, 0.7)
                ref_at = response_logprobs_at(hf, batch, torch.device("cpu"), ids, 0.7)[2]
                err = (at - ref_at) * mask.unsqueeze(-1)
                result["at_err"] = err.abs().max().item()

        engine.train()  # the entropy has a graph only when asked (it costs memory)
        _, plain = engine.response_logprobs(batch, 0.7, with_entropy=True)
        _, graph = engine.response_logprobs(batch, 0.7, with_entropy=True, entropy_grad=True)
        result["entropy_graph"] = (plain.requires_grad, graph.requires_grad)

        # With entropy in the loss, the vocabulary-parallel entropy's gradient counts too.
        def engine_loss(eng, micro, rows, scale):
            lp, ent = eng.response_logprobs(micro, 0.7, with_entropy=True, entropy_grad=True)
            m = micro.response_mask_BR
            return (-(lp * m).sum() - 0.01 * (ent * m).sum()) / scale.num_tokens

        def hf_loss(model, b):
            lp, ent = response_logprobs(model, b, torch.device("cpu"), 0.7, True, True)
            m = b.response_mask_BR
            return (-(lp * m).sum() - 0.01 * (ent * m).sum()) / m.sum()

        # This DP rank's rows: rank r of dp takes rows r::dp (2 micro-batches of 1 or 2 rows).
        dp_rows = take(batch, slice(engine.dp_rank, None, engine.dp_size))
        micro = max(1, len(dp_rows) // 2)
        losses, norms = _engine_steps(engine, dp_rows, engine_loss, 2, micro)
        engine.save(ckpt_dir, extra={"note": "after 2"})
        saved_hf = _hf_copy(engine)
        more_losses, more_norms = _engine_steps(engine, dp_rows, engine_loss, 1, micro)
        losses, result["norms"] = losses + more_losses, norms + more_norms
        summed = torch.tensor(losses)
        dist.all_reduce(summed, group=engine.dp_group)
        result["losses"] = summed.tolist()
        result["lr_after"] = engine.lr
        trained = _hf_copy(engine)

        ref_losses, _, result["ref_norms"] = _hf_reference(hf, batch, hf_loss, STEPS, STEPS + 1)
        result["ref_losses"] = ref_losses
        hf_state = _checkpoint_state(hf)
        result["update_err"] = _max_diff(trained, hf_state)
        initial = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        result["update_size"] = _max_diff(hf_state, _checkpoint_state(initial))

        # Export: the trained tensors into a fresh HF model give the engine's logits.
        exported = AutoModelForCausalLM.from_config(hf.config).eval()
        missing, unexpected = _load_checkpoint_named(exported, trained)
        result["export_missing"] = [m for m in missing if m != "lm_head.weight"]
        result["export_unexpected"] = list(unexpected)
        exported.tie_weights()
        engine.eval()
        with torch.no_grad():
            ours = engine.logits(*inputs)
            theirs = exported(*inputs[:2], position_ids=inputs[2]).logits
        if engine.stage.last:
            result["export_logit_err"] = (ours - theirs)[valid].abs().max().item()

        # Resume: a fresh engine loads the step-2 checkpoint and replays step 3.
        resumed = build()
        extra = resumed.load(ckpt_dir)
        result["extra"] = extra
        result["loaded_err"] = _max_diff(_hf_copy(resumed), saved_hf)
        result["resumed_lr_step"] = resumed.lr_step
        _engine_steps(resumed, dp_rows, engine_loss, 1, micro)
        replayed = _hf_copy(resumed)
        result["resume_equal"] = all(torch.equal(replayed[k], trained[k]) for k in trained)
        if result["output"]:
            offline = hf_state_dict_from_checkpoint(ckpt_dir)
            result["offline_equal"] = set(offline) == set(saved_hf) and all(
                torch.equal(offline[k], saved_hf[k]) for k in saved_hf
            )
        if moe:  # last: it moves the routers of the trained engine and of its HF export
            from tests.engine.train.megatron_replay_checks import replay_checks

            result.update(replay_checks(engine, exported, batch))
        torch.save(result, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


def _check_actor(out_path, world_size):
    results = [torch.load(f"{out_path}.{r}", weights_only=False) for r in range(world_size)]
    (r,) = [each for each in results if each["output"]]
    print(
        {k: v for k, v in r.items() if any(w in k for w in ("err", "loss", "norm", "size"))}
    )  # shown with -s
    assert r["logit_err"] < 1e-5
    assert r["logp_err"] < 1e-5 and r["entropy_err"] < 1e-5
    assert r["sum_sq_err"] < 1e-5 and r["sum_sq_logp_err"] < 1e-5
    assert r.get("at_err", 0.0) < 1e-5 and ("at_err" in r or r["layout"].cp > 1)
    assert r["entropy_graph"] == (False, True)
    # The loss falls, and the engine's losses are the HF reference's.
    assert r["losses"][2] < r["losses"][0] - 0.1
    assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)
    # The global gradient norm (over DP and TP slices, replicated weights counted once).
    assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-5)
    assert r["norms"][0] > 1.0  # so clipping to 1.0 acted
    # The same weights after 3 AdamW steps (lr 1e-3, warmup then cosine, clip 1.0): float
    # rounding differs (fused qkv, TP reductions, micro-batches), and Adam's first steps
    # move every weight by about lr whatever its gradient's size, so near-zero gradients
    # may move differently; 1e-4 is a tenth of one step, well below the update (~3e-3).
    assert r["update_size"] > 2e-3
    assert r["update_err"] < 1e-4
    assert r["lr_after"] == pytest.approx(
        1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 2 / 3)))
    )
    assert r["export_missing"] == [] and r["export_unexpected"] == []
    assert r["export_logit_err"] < 1e-5
    assert r["extra"] == {"note": "after 2"}
    assert r["loaded_err"] == 0.0 and r["resumed_lr_step"] == 2
    assert r["offline_equal"]
    for each in results:
        assert each["resume_equal"]  # bit-exact: the same step from the same state
        assert each["dispatch_agrees"]
    if "replay_records_as_hf" in r:  # a mixture of experts (megatron_replay_checks.py)
        assert r["replay_logp_err"] < 1e-4 < r["replay_gap_vs_free"]
        for each in results:
            assert each["replay_records_as_hf"] and each["replay_padding_unrecorded"]
            assert each["replay_free_differs"]
            assert each["replay_takes_recorded"] and each["replay_tokens_checked"] > 0


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize(
    "world_size,tp,pp,sp,cp",
    [
        (1, 1, 1, False, 1),
        (2, 1, 1, False, 1),
        (2, 2, 1, False, 1),
        (4, 2, 1, False, 1),
        (2, 1, 2, False, 1),
        (4, 2, 2, False, 1),
        (4, 1, 2, False, 1),
        (4, 1, 4, False, 1),
        (2, 2, 1, True, 1),
        (4, 2, 2, True, 1),
        (2, 1, 1, False, 2),
        (4, 1, 1, False, 2),
        (4, 2, 1, True, 2),
        (4, 1, 2, False, 2),
    ],
    ids=[
        "ws1-tp1",
        "ws2-dp2",
        "ws2-tp2",
        "ws4-tp2-dp2",
        "ws2-pp2",
        "ws4-tp2-pp2",
        "ws4-pp2-dp2",
        "ws4-pp4",
        "ws2-tp2-sp",  # sequence parallel; the batch's 17 columns are padded to 18
        "ws4-tp2-pp2-sp",
        "ws2-cp2",  # context parallel: 17 columns padded to 20, 4 chunks of 5, zigzag
        "ws4-cp2-dp2",
        "ws4-tp2-cp2-sp",  # padded to 24 (2 · CP · TP)
        "ws4-pp2-cp2",
    ],
)
def test_actor_engine_matches_hf(tiny_model_dir, tmp_path, world_size, tp, pp, sp, cp):
    out = str(tmp_path / "result")
    ckpt = str(tmp_path / "ckpt")
    _spawn(_actor_run, world_size, tp, pp, str(tiny_model_dir), ckpt, out, sp, cp)
    _check_actor(out, world_size)
    results = [torch.load(f"{out}.{r}", weights_only=False) for r in range(world_size)]
    assert results[0]["dp"] == world_size // (tp * pp * cp)
    assert all(r["sequence_parallel"] == sp for r in results)


@needs_megatron
@pytest.mark.slow
def test_uneven_pipeline_stages_match_hf(tmp_path):
    """3 layers over 2 stages: 2 on the first, 1 on the last (Megatron's
    ``num_layers_in_last_pipeline_stage``); the same checks as the even stages."""
    from engine.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path / "model", seed=1, num_layers=3)
    out = str(tmp_path / "result")
    _spawn(_actor_run, 2, 1, 2, str(model_dir), str(tmp_path / "ckpt"), out)
    _check_actor(out, 2)
    results = [torch.load(f"{out}.{r}", weights_only=False) for r in range(2)]
    assert [r["stage_layers"] for r in results] == [2, 1]


def _tiny_moe(path, model_type: str, **kw):
    """A 2-layer Qwen2-MoE (shared expert with its sigmoid gate; the plain softmax's top 2)
    or Qwen3-MoE (q/k norms; the top 2 renormalised), 4 experts (``_config``). The router
    is drawn wide (std 0.5, HF's default is 0.02) so that each token's top 2 are clear
    and 3 AdamW steps do not reshuffle them between the two backends' rounding."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(3)
    model = AutoModelForCausalLM.from_config(_config(model_type, **kw))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.5)
        for name, buffer in model.named_buffers():  # DeepSeek's routing bias (HF: zeros)
            if name.endswith("e_score_correction_bias"):
                buffer.normal_(0.0, 0.05)
    model.save_pretrained(path)
    return str(path)


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize(
    "model_type,world_size,tp,pp,ep,etp",
    [
        ("qwen3_moe", 1, 1, 1, 1, None),
        ("qwen3_moe", 2, 1, 1, 2, None),
        ("qwen2_moe", 2, 1, 1, 2, None),
        ("qwen2_moe", 4, 2, 1, 2, None),
        ("qwen3_moe", 4, 1, 2, 2, None),
        ("deepseek_v3", 1, 1, 1, 1, None),
        ("deepseek_v3", 4, 2, 1, 2, None),
        ("deepseek_v3", 2, 1, 2, 1, None),
        ("qwen2_moe", 4, 2, 1, 2, 1),
        ("qwen3_moe", 2, 2, 1, 1, 1),
        ("qwen3_moe", 2, 1, 1, 1, 2),
        ("qwen3_moe", 4, 1, 2, 1, 2),
    ],
    ids=[
        "qwen3-ws1",
        "qwen3-ep2",  # 2 experts per rank; tokens of both data-parallel ranks meet
        "qwen2-ep2",  # with the shared expert and its gate
        "qwen2-tp2-ep2-sp",  # experts TP-sliced too; the shared expert's gather
        "qwen3-pp2-ep2",
        "deepseek-ws1",  # MLA with YaRN; sigmoid routing, groups, bias, shared experts
        "deepseek-tp2-ep2-sp",  # the low-rank projections' outputs gathered over TP
        "deepseek-pp2",  # 3 layers, 2 + 1; the dense first layer on stage 0
        # expert tensor parallelism apart from TP (the experts' own grid):
        "qwen2-tp2-ep2-etp1",  # verl's pattern: whole experts, TP-split shared expert, DP 2
        "qwen3-tp2-etp1",  # EP 1: experts whole on both TP ranks, reduced over the two
        "qwen3-etp2",  # TP 1, ETP 2: each expert sliced over the two data-parallel ranks
        "qwen3-pp2-etp2",  # the same over two stages (slices broadcast stage to stage)
    ],
)
def test_moe_actor_engine_matches_hf(tmp_path, model_type, world_size, tp, pp, ep, etp):
    """Mixture-of-experts models: the actor's logits, log-probs, 3 AdamW steps, gradient
    norms, export, resume and offline merge against Hugging Face's model (the same
    checks as the dense layouts); experts spread over expert-parallel ranks, and sliced
    over their expert-tensor-parallel ranks. Then MoE routing replay through Megatron-core's
    RouterReplay (megatron_replay_checks.py): the routing recorded is HF's, and after
    the routers moved the replayed forward takes it and gives HF's replayed log-probs."""
    model_dir = _tiny_moe(tmp_path / "model", model_type)
    out = str(tmp_path / "result")
    sp = tp > 1
    ckpt = str(tmp_path / "ckpt")
    _spawn(_actor_run, world_size, tp, pp, model_dir, ckpt, out, sp, 1, ep, etp)
    _check_actor(out, world_size)
    layouts = [torch.load(f"{out}.{r}", weights_only=False)["layout"] for r in range(world_size)]
    assert {r.etp for r in layouts} == {tp if etp is None else etp}


def _critic_run(rank, world_size, port, tp, pp, sp, cp, model_dir, out_path, ep=1):
    import torch.distributed as dist
    from transformers import AutoConfig, AutoModelForTokenClassification

    from engine.config import OptimConfig
    from engine.controller.dispatch import take
    from engine.device import DEVICES
    from engine.train.forward import response_values
    from engine.train.megatron import MegatronEngine, hf_state_dict_from_checkpoint

    _init(rank, world_size, port)
    try:
        engine = MegatronEngine.from_hf(
            model_dir,
            MegatronParallel(
                tensor_model_parallel_size=tp,
                pipeline_model_parallel_size=pp,
                context_parallel_size=cp,
                expert_model_parallel_size=ep,
                sequence_parallel=sp,
            ),
            OptimConfig(**{**OPTIM, "lr": CRITIC_LR}),
            DEVICES["cpu"],
            role="critic",
            total_steps=STEPS + 1,
            seed=3,
        )
        start = _hf_copy(engine)
        cfg = AutoConfig.from_pretrained(model_dir, num_labels=1)
        hf = AutoModelForTokenClassification.from_config(cfg)
        hf.dropout.p = 0.0  # HF's head drops 10% in training; the engine's value head does not
        missing, unexpected = _load_checkpoint_named(hf, start)
        result = {"missing": missing, "unexpected": unexpected}
        result["output"] = (
            engine.stage.last
            and engine.layout.tp_rank == 0
            and engine.layout.cp_rank == 0
            and engine.dp_rank == 0
        )
        result["head_std"] = start["score.weight"].std().item()
        batch = _batch(cfg.vocab_size)
        mask = batch.response_mask_BR
        returns = torch.linspace(-1, 1, mask.numel()).reshape(mask.shape)
        engine.eval()
        hf.eval()
        with torch.no_grad():
            ours = engine.response_values(batch)
            theirs = response_values(hf, batch, torch.device("cpu"))
        result["value_err"] = ((ours - theirs) * mask).abs().max().item()

        def hf_loss(model, b):
            v = response_values(model, b, torch.device("cpu"))
            return (
                0.5 * (((v - returns) ** 2) * b.response_mask_BR).sum() / b.response_mask_BR.sum()
            )

        # This DP rank's rows (expert parallelism: the two ranks hold different rows).
        dp_rows = take(batch, slice(engine.dp_rank, None, engine.dp_size))
        dp_returns = returns[engine.dp_rank :: engine.dp_size]

        def dp_loss(eng, micro, rows, scale):
            v = eng.response_values(micro)
            m = micro.response_mask_BR
            return 0.5 * (((v - dp_returns[rows]) ** 2) * m).sum() / scale.num_tokens

        losses, result["norms"] = _engine_steps(engine, dp_rows, dp_loss, STEPS, 2)
        summed = torch.tensor(losses)
        dist.all_reduce(summed, group=engine.dp_group)
        result["losses"] = summed.tolist()
        result["ref_losses"], _, result["ref_norms"] = _hf_reference(
            hf, batch, hf_loss, STEPS, STEPS + 1, CRITIC_LR
        )
        trained = _hf_copy(engine)
        result["update_err"] = _max_diff(trained, _checkpoint_state(hf))
        # The checkpoint merges offline into a token-classification state dict.
        engine.save(f"{out_path}.ckpt")
        if result["output"]:
            offline = hf_state_dict_from_checkpoint(f"{out_path}.ckpt")
            result["offline_err"] = _max_diff(offline, trained)
        torch.save(result, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@needs_megatron
@pytest.mark.slow
@pytest.mark.parametrize(
    "world_size,tp,pp,sp,cp",
    [
        (1, 1, 1, False, 1),
        (2, 2, 1, False, 1),
        (2, 1, 2, False, 1),
        (2, 2, 1, True, 1),
        (2, 1, 1, False, 2),
    ],
    ids=["ws1-tp1", "ws2-tp2", "ws2-pp2", "ws2-tp2-sp", "ws2-cp2"],
)
def test_critic_engine_matches_hf_token_classification(
    tiny_model_dir, tmp_path, world_size, tp, pp, sp, cp
):
    out = str(tmp_path / "result")
    _spawn(_critic_run, world_size, tp, pp, sp, cp, str(tiny_model_dir), out)
    _check_critic(out, world_size)


@needs_megatron
@pytest.mark.slow
def test_moe_critic_with_expert_parallelism_matches_hf(tmp_path):
    """A Qwen2-MoE critic over 2 expert-parallel ranks (each its own rows) against HF's
    token-classification model of it."""
    model_dir = _tiny_moe(tmp_path / "model", "qwen2_moe")
    out = str(tmp_path / "result")
    _spawn(_critic_run, 2, 1, 1, False, 1, model_dir, out, 2)
    _check_critic(out, 2)


def _check_critic(out, world_size):
    results = [torch.load(f"{out}.{r}", weights_only=False) for r in range(world_size)]
    (r,) = [each for each in results if each["output"]]
    assert r["missing"] == [] and r["unexpected"] == []
    assert 0.015 < r["head_std"] < 0.025  # a new head: N(0, initializer_range=0.02)
    assert r["value_err"] < 1e-5
    print({k: v for k, v in r.items() if any(w in k for w in ("err", "loss", "norm", "size"))})
    assert r["losses"][-1] < r["losses"][0]
    assert r["losses"] == pytest.approx(r["ref_losses"], abs=1e-5)
    assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-5)
    assert r["update_err"] < 1e-4
    assert r["offline_err"] == 0.0


def _variants_run(rank, world_size, port, tp, out_path):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from engine.config import OptimConfig
    from engine.device import DEVICES
    from engine.train.forward import response_logprobs
    from engine.train.megatron import MegatronEngine

    _init(rank, world_size, port)
    try:
        variants = {
            "qwen3": _config("qwen3", tie_word_embeddings=False),
            "llama3-rope": _config(
                "llama",
                tie_word_embeddings=False,
                max_position_embeddings=16384,
                rope_scaling={
                    "rope_type": "llama3",
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                },
                rope_theta=500000.0,
            ),
        }
        result = {}
        for name, cfg in variants.items():
            torch.manual_seed(1)
            hf = AutoModelForCausalLM.from_config(cfg)
            for p in hf.parameters():  # norms away from 1, so that a wrong norm shows
                if p.dim() == 1:
                    p.data.uniform_(0.5, 1.5)
            engine = MegatronEngine.from_hf(
                None,
                MegatronParallel(tensor_model_parallel_size=tp),
                OptimConfig(**OPTIM),
                DEVICES["cpu"],
                hf_config=cfg,
                state_dict={k: v.clone() for k, v in hf.state_dict().items()},
                total_steps=STEPS + 1,
            )
            batch = _batch(cfg.vocab_size)
            valid = batch.attention_mask_BS.bool()
            inputs = (batch.input_ids_BS, batch.attention_mask_BS, batch.position_ids_BS)
            engine.eval()
            hf.eval()
            with torch.no_grad():
                err = engine.logits(*inputs) - hf(*inputs[:2], position_ids=inputs[2]).logits
            result[f"{name}_logit_err"] = err[valid].abs().max().item()

            def engine_loss(eng, micro, rows, scale):
                lp, _ = eng.response_logprobs(micro)
                return -(lp * micro.response_mask_BR).sum() / scale.num_tokens

            def hf_loss(model, b):
                lp, _ = response_logprobs(model, b, torch.device("cpu"))
                return -(lp * b.response_mask_BR).sum() / b.response_mask_BR.sum()

            _, result[f"{name}_norms"] = _engine_steps(engine, batch, engine_loss, 2, 2)
            *_, result[f"{name}_ref_norms"] = _hf_reference(hf, batch, hf_loss, 2, STEPS + 1)
            result[f"{name}_update_err"] = _max_diff(_hf_copy(engine), hf.state_dict())
        # A forward-only engine (the reference) from the last variant's trained weights.
        reference = MegatronEngine.from_hf(
            None,
            MegatronParallel(tensor_model_parallel_size=tp),
            None,
            DEVICES["cpu"],
            role="reference",
            hf_config=cfg,
            state_dict=hf.state_dict(),
        )
        hf.eval()
        with torch.no_grad():
            ours, _ = reference.response_logprobs(batch, 0.7)
            theirs, _ = response_logprobs(hf, batch, torch.device("cpu"), 0.7)
        result["reference_logp_err"] = ((ours - theirs) * batch.response_mask_BR).abs().max().item()
        result["reference_trainable"] = any(p.requires_grad for p in reference.model.parameters())
        # Roles in one process share Megatron's parallel state: other sizes are refused.
        try:
            MegatronEngine.from_hf(
                None,
                MegatronParallel(),
                None,
                DEVICES["cpu"],
                role="reference",
                hf_config=cfg,
                state_dict=hf.state_dict(),
            )
        except EngineError as exc:
            result["colocated_error"] = str(exc)
        torch.save(result, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@needs_megatron
@pytest.mark.slow
def test_qwen3_and_llama3_rope_at_tp2(tmp_path):
    """Qwen3's q/k norms (their gradients are summed over TP ranks) and untied heads;
    Llama with Llama 3.x RoPE scaling; a colocated role with other sizes is refused."""
    out = str(tmp_path / "result")
    _spawn(_variants_run, 2, 2, out)
    r = torch.load(f"{out}.0", weights_only=False)
    print(r)  # shown with -s
    for name in ("qwen3", "llama3-rope"):
        assert r[f"{name}_logit_err"] < 1e-5, name
        assert r[f"{name}_update_err"] < 1e-4, name
        assert r[f"{name}_norms"] == pytest.approx(r[f"{name}_ref_norms"], rel=1e-5), name
    assert r["reference_logp_err"] < 1e-5 and not r["reference_trainable"]
    assert (
        "(tp, pp, cp, ep, etp) (1, 1, 1, 1, 1) requested, (2, 1, 1, 1, 2) already in use"
        in r["colocated_error"]
    )


def _families_run(rank, world_size, port, out_path):
    import torch.distributed as dist

    from engine.device import DEVICES
    from engine.models.families import MODEL_TYPES
    from engine.models.tiny import random_model, tiny_config
    from engine.train.megatron import MegatronEngine

    _init(rank, world_size, port)
    try:
        result = {}
        for model_type in MODEL_TYPES:
            cfg = tiny_config(
                model_type,
                vocab_size=256,
                hidden_size=64,
                num_layers=2,
                max_position_embeddings=128,
            )
            hf = random_model(cfg, seed=1).eval()
            state = _checkpoint_state(hf)
            engine = MegatronEngine.from_hf(
                None,
                MegatronParallel(),
                None,
                DEVICES["cpu"],
                role="reference",
                hf_config=cfg,
                state_dict=dict(state),
            )
            engine.eval()
            batch = _batch(cfg.vocab_size)
            inputs = (batch.input_ids_BS, batch.attention_mask_BS, batch.position_ids_BS)
            with torch.no_grad():
                err = engine.logits(*inputs) - hf(*inputs[:2], position_ids=inputs[2]).logits
            result[f"{model_type}_logit_err"] = (
                err[batch.attention_mask_BS.bool()].abs().max().item()
            )
            result[f"{model_type}_export_err"] = _max_diff(_hf_copy(engine), state)
        torch.save(result, f"{out_path}.{rank}")
    finally:
        dist.destroy_process_group()


@needs_megatron
@pytest.mark.slow
def test_every_family_matches_hf(tmp_path):
    """Every registered model family (engine.models.families), its tiny model built as a
    Megatron-core GPTModel from the Hugging Face weights: the same logits as Hugging
    Face's, and the same weights exported back."""
    from engine.models.families import MODEL_TYPES

    out = str(tmp_path / "result")
    _spawn(_families_run, 1, out)
    r = torch.load(f"{out}.0", weights_only=False)
    print(r)  # shown with -s
    for model_type in MODEL_TYPES:
        assert r[f"{model_type}_logit_err"] < 1e-5, model_type
        assert r[f"{model_type}_export_err"] == 0.0, model_type
