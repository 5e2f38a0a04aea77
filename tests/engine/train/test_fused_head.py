"""Log-probs and entropy from the hidden states chunk by chunk (``use_fused_kernels``):
equal to the full logits' values and gradients, and the full logits never allocated."""

import math

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoModelForCausalLM

from engine.algo.entropy import entropy_from_logits
from engine.controller.dispatch import take
from engine.train.forward import response_logprobs, response_logprobs_sum_pi_squared
from engine.train.fused_head import HeadOptions, head_quantities
from engine.types import TokenBatch

CPU = torch.device("cpu")


def _head(hidden: int, vocab: int, bias: bool = False, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    head = nn.Linear(hidden, vocab, bias=bias, dtype=torch.float64)
    nn.init.normal_(head.weight, std=0.5)
    if bias:
        nn.init.normal_(head.bias)
    return head


def _unfused(h, head, targets, temperature):
    z = head(h) / temperature
    logp = torch.log_softmax(z, -1).gather(-1, targets[:, None])[:, 0]
    return logp, entropy_from_logits(z), torch.softmax(z, -1).square().sum(-1)


def test_by_hand_two_tokens_two_words():
    """h = [1, 0] and [0, 1], W = I (2 words), temperature 0.5: the logits are 2·h, so
    token 0 sees z = (2, 0), p = (e²/(e²+1), 1/(e²+1)); token 1 sees z = (0, 2)."""
    head = nn.Linear(2, 2, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.eye(2))
    h = torch.eye(2, dtype=torch.float64)
    targets = torch.tensor([1, 1])
    logp, ent, sq = head_quantities(
        h, head, targets, 0.5, HeadOptions(chunk_size=1), entropy=True, sum_sq=True
    )
    big, small = math.exp(2) / (math.exp(2) + 1), 1 / (math.exp(2) + 1)
    h_want = -(big * math.log(big) + small * math.log(small))
    torch.testing.assert_close(logp, torch.tensor([math.log(small), math.log(big)]).float())
    torch.testing.assert_close(ent, torch.tensor([h_want, h_want]).float())
    torch.testing.assert_close(sq, torch.tensor([big**2 + small**2] * 2).float())


@pytest.mark.parametrize(
    ("chunk", "temperature", "bias"),
    [(3, 1.0, False), (1, 1.0, False), (7, 0.6, True), (64, 1.3, False)],
    ids=["chunk-3-of-7", "chunk-1", "chunk-of-all-bias-temp", "chunk-over-all"],
)
def test_values_and_gradients_equal_the_full_logits(chunk, temperature, bias):
    """A chunk size that does not divide the 7 tokens, chunks of one token, a chunk as big
    as all of them and beyond; temperatures other than 1; a bias. The loss mixes the
    log-probs and the entropy with per-token weights, so both gradients are checked."""
    head = _head(5, 11, bias=bias)
    h = torch.randn(7, 5, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,))
    w_lp, w_ent = torch.randn(7, dtype=torch.float64), torch.randn(7, dtype=torch.float64)

    want_lp, want_ent, want_sq = _unfused(h, head, targets, temperature)
    (w_lp * want_lp + w_ent * want_ent).sum().backward()
    want_grads = [h.grad.clone(), head.weight.grad.clone()]
    want_grads += [head.bias.grad.clone()] if bias else []
    h.grad = None
    head.zero_grad()

    opts = HeadOptions(chunk_size=chunk)
    logp, ent, sq = head_quantities(h, head, targets, temperature, opts, entropy=True, sum_sq=True)
    (w_lp * logp + w_ent * ent).sum().backward()
    got_grads = [h.grad, head.weight.grad] + ([head.bias.grad] if bias else [])
    # float64 in, float32 out: the quantities are float32, their gradients float64.
    torch.testing.assert_close(logp, want_lp.float(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, want_ent.float(), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(sq, want_sq.float(), atol=1e-6, rtol=1e-6)
    for got, want in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_gradient_of_log_probs_alone_by_hand():
    """One token, W = I over 3 words, h = (0, 0, 0): p is uniform, so ∂ log p_t/∂h =
    W·(onehot(t) − p) = (−1/3, 2/3, −1/3) for t = 1, and ∂/∂W = (onehot − p) ⊗ h = 0."""
    head = nn.Linear(3, 3, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.copy_(torch.eye(3))
    h = torch.zeros(1, 3, dtype=torch.float64, requires_grad=True)
    logp, _, _ = head_quantities(
        h, head, torch.tensor([1]), 1.0, HeadOptions(2), entropy=False, sum_sq=False
    )
    logp.sum().backward()
    torch.testing.assert_close(logp, torch.tensor([-math.log(3)]))
    torch.testing.assert_close(h.grad, torch.tensor([[-1 / 3, 2 / 3, -1 / 3]], dtype=torch.float64))
    assert not head.weight.grad.any()


def test_bf16_weights_round_like_the_unchunked_path():
    """bf16 hidden states and head (FSDP's mixed precision): values equal the unchunked
    ``head(h).float()`` path's to float32 rounding, and the weight gradient, summed over
    chunks in float32, is within bf16 rounding of the unchunked one."""
    torch.manual_seed(1)
    head = nn.Linear(16, 40, bias=False).to(torch.bfloat16)
    h = torch.randn(13, 16, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, 40, (13,))
    z = head(h).float()
    want = torch.log_softmax(z, -1).gather(-1, targets[:, None])[:, 0]
    want.sum().backward()
    want_gw = head.weight.grad.clone()
    head.zero_grad()
    logp, _, _ = head_quantities(h, head, targets, 1.0, HeadOptions(4), entropy=False, sum_sq=False)
    logp.sum().backward()
    torch.testing.assert_close(logp, want, atol=1e-5, rtol=1e-5)
    assert head.weight.grad.dtype == torch.bfloat16
    torch.testing.assert_close(head.weight.grad, want_gw, atol=2e-2, rtol=2e-2)


def test_bad_options_name_the_key_and_the_fix():
    with pytest.raises(ValueError, match=r"chunk_size must be a positive.*got 0"):
        HeadOptions(chunk_size=0)
    with pytest.raises(ValueError, match=r"impl_backend 'triton' is not one of torch, liger"):
        HeadOptions(impl_backend="triton")


class _BigTensorWatch(TorchDispatchMode):
    """Records the most rows of any tensor an op creates whose last dimension is the
    vocabulary (logits-like: rows × V), leaving out the head's weight's transpose
    (hidden × V; FSDP makes it from the gathered weight, a tensor of its own)."""

    def __init__(self, vocab: int, hidden: int) -> None:
        super().__init__()
        self.vocab, self.hidden, self.largest = vocab, hidden, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if not (isinstance(t, torch.Tensor) and t.dim() >= 1 and t.shape[-1] == self.vocab):
                continue
            if tuple(t.shape) != (self.hidden, self.vocab):
                self.largest = max(self.largest, t.numel() // self.vocab)
        return out


def _ragged(prompt_lens, response_lens, vocab, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, vocab, (n,), generator=g).tolist() for n in response_lens]
    return TokenBatch.from_ragged(prompts, responses, 0)


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def test_the_model_never_allocates_its_full_logits(model):
    """Forward and backward of the actor's loss on a real model: without the fused head,
    some op makes a tensor of all response positions × V; with it, none holds more than
    one chunk (5 tokens) of V-sized rows."""
    vocab, hidden = model.config.vocab_size, model.config.hidden_size
    tokens = _ragged([6, 4, 5], [9, 7, 8], vocab)
    positions = 3 * 9

    def loss_of(head):
        logp, ent = response_logprobs(
            model, tokens, CPU, 0.7, with_entropy=True, entropy_grad=True, head=head
        )
        return (logp.sum() + ent.sum()).backward()

    with _BigTensorWatch(vocab, hidden) as unfused:
        loss_of(None)
    assert unfused.largest >= positions
    model.zero_grad()
    with _BigTensorWatch(vocab, hidden) as fused:
        loss_of(HeadOptions(chunk_size=5))
    assert fused.largest == 5


@pytest.mark.parametrize("chunk", [1, 4, 100])
def test_model_log_probs_entropy_and_gradients_equal_the_unfused(model, chunk):
    """Through the model (trimmed padding, ``logits_to_keep``, temperature 0.7): values
    and every parameter's gradient equal the unfused path's."""
    vocab = model.config.vocab_size
    tokens = take(_ragged([9, 4, 6, 12], [3, 7, 2, 10], vocab), slice(0, 3))
    mask = tokens.response_mask_BR.bool()
    results = []
    for head in (None, HeadOptions(chunk_size=chunk)):
        model.zero_grad()
        logp, ent = response_logprobs(
            model, tokens, CPU, 0.7, with_entropy=True, entropy_grad=True, head=head
        )
        ((logp * mask).sum() - 0.3 * (ent * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((logp.detach(), ent.detach(), grads))
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert lp1.shape == ent1.shape == (3, 10)
    torch.testing.assert_close(lp1, lp0, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent1, ent0, atol=1e-5, rtol=1e-5)
    assert not lp1[:, 7:].any() and not ent1[:, 7:].any()  # beyond the widest response
    # (the tiny model ties its head to the embedding: one parameter, two uses)
    assert g0.keys() == g1.keys() and model.get_output_embeddings().weight.grad is not None
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], atol=1e-5, rtol=1e-4, msg=name)


def test_entropy_graph_only_when_asked_and_sum_pi_squared(model):
    vocab = model.config.vocab_size
    tokens = _ragged([4, 4], [3, 5], vocab)
    head = HeadOptions(chunk_size=2)
    logp, ent = response_logprobs(model, tokens, CPU, with_entropy=True, head=head)
    assert logp.requires_grad and not ent.requires_grad
    _, ent = response_logprobs(model, tokens, CPU, with_entropy=True, entropy_grad=True, head=head)
    assert ent.requires_grad
    with torch.no_grad():
        want = response_logprobs_sum_pi_squared(model, tokens, CPU, 0.5)
        got = response_logprobs_sum_pi_squared(model, tokens, CPU, 0.5, head=head)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    # the head's forward is the class's again afterwards
    assert "forward" not in vars(model.get_output_embeddings())


def test_a_model_that_changes_its_logits_after_the_head_is_refused(model):
    """A model whose output is not its head's (here: scaled, as Cohere's logit_scale
    does) would make the fused quantities wrong: refused, not silently used."""

    class Scaled(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

        def forward(self, **kw):
            out = self.inner(**kw)
            out.logits = out.logits * 2.0
            return out

    tokens = _ragged([4], [3], model.config.vocab_size)
    with pytest.raises(ValueError, match="does not return its output head's result"):
        response_logprobs(Scaled(model), tokens, CPU, head=HeadOptions())
    assert "forward" not in vars(model.get_output_embeddings())


# ---------------------------------------------------------------------------
# Through the actor worker on two FSDP2 ranks (gloo): the engine reads the config, and
# the sharded head (tied to the embedding) is gathered for the swapped forward.


def _actor_run(rank, model_dir, ports, out):
    from engine.config import load_config
    from engine.train.fsdp import full_parameters
    from engine.types import ActorBatch
    from engine.workers.host import WorkerHost

    g = torch.Generator().manual_seed(rank)
    vocab = 2000
    tokens = _ragged([5, 16, 3, 9], [12, 2, 7, 4], vocab, seed=rank)
    adv = torch.randn(tokens.response_mask_BR.shape, generator=g) * tokens.response_mask_BR
    results = {}
    for i, fused in enumerate([[], ["actor_rollout_ref.model.use_fused_kernels=true",
                                    "actor_rollout_ref.model.fused_kernel_options.chunk_size=5"]]):  # fmt: skip
        cfg = load_config(
            [
                f"actor_rollout_ref.model.path={model_dir}",
                "trainer.device=cpu",
                "trainer.n_gpus_per_node=2",
                "data.train_batch_size=4",
                "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.actor.optim.lr=1e-2",
                "actor_rollout_ref.actor.entropy_coeff=0.01",
                "actor_rollout_ref.rollout.temperature=0.8",
                *fused,
            ],
            check=False,
        )
        host = WorkerHost(rank, 2, rank, cfg, ["actor"])
        host.init_distributed("127.0.0.1", ports[i])
        actor = host.roles["actor"]
        hidden = actor.module.config.hidden_size
        with _BigTensorWatch(actor.module.config.vocab_size, hidden) as watch:
            probs = actor.log_probs_sum_pi_squared(tokens)
            metrics = actor.update(ActorBatch(tokens, probs.logprobs_BR, adv))
        with full_parameters(actor.module):
            weights = {n: p.detach().clone() for n, p in actor.module.named_parameters()}
        results[bool(fused)] = (probs, metrics, weights, watch.largest)
        del actor, host
    if rank == 0:
        out["results"] = results


def test_the_actor_update_is_the_same_and_never_holds_full_logits(tiny_model_dir):
    import socket

    import torch.multiprocessing as mp

    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    out = mp.Manager().dict()
    mp.spawn(_actor_run, args=(str(tiny_model_dir), ports, out), nprocs=2)
    (p0, m0, w0, big0), (p1, m1, w1, big1) = out["results"][False], out["results"][True]
    assert big0 >= 12 and big1 == 5  # the longest response alone is 12 positions
    mask = _ragged([5, 16, 3, 9], [12, 2, 7, 4], 2000).response_mask_BR.bool()
    torch.testing.assert_close(p1.logprobs_BR[mask], p0.logprobs_BR[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        p1.sum_pi_squared_BR[mask], p0.sum_pi_squared_BR[mask], atol=1e-6, rtol=1e-5
    )
    for key in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert m1[key] == pytest.approx(m0[key], rel=1e-4, abs=1e-6), key
    # The same step, compared in the mean: AdamW's first step is lr·g/(|g|+ε), so an
    # element whose gradient is ~0 may move by ±lr on rounding alone.
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    start = {n: p.detach() for n, p in initial.named_parameters()}

    def moved(a, b):
        return sum(float((a[n] - b[n]).abs().sum()) for n in start)

    assert moved(w1, w0) < 1e-3 * moved(w0, start)
