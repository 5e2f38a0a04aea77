import math

import pytest
import torch

from engine.algo.entropy import (
    entropy_from_logits,
    logprobs_from_logits,
    sum_squared_probs_from_logits,
)

INF = float("inf")


def random_logits(*shape: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=gen) * 3


# ---------------------------------------------------------------------------
# entropy


def test_uniform_logits_give_log_vocab():
    for vocab in (2, 8, 1000):
        h = entropy_from_logits(torch.full((2, 3, vocab), 1.7))
        assert torch.allclose(h, torch.full((2, 3), math.log(vocab)), atol=1e-5)


def test_peaked_logits_give_about_zero():
    # p_other = e^−50 ≈ 2e−22: H ≈ 3 · e^−50 · 51 ≈ 3e−20
    h = entropy_from_logits(torch.tensor([[50.0, 0.0, 0.0, 0.0]]))
    assert 0.0 <= h.item() < 1e-6


def test_matches_categorical_entropy():
    logits = random_logits(4, 5, 33)
    expected = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.allclose(entropy_from_logits(logits), expected, atol=1e-5)


def test_gradient_matches_categorical():
    logits = random_logits(3, 4, 17).requires_grad_(True)
    entropy_from_logits(logits).sum().backward()
    ours = logits.grad.clone()
    logits.grad = None
    torch.distributions.Categorical(logits=logits).entropy().sum().backward()
    assert torch.allclose(ours, logits.grad, atol=1e-5)


def test_huge_logits_stay_precise():
    # Two tied maxima and one far below: H = log 2. Without the max shift, logsumexp
    # at 1e4 in float32 is off by up to ~5e−4 (the spacing of floats there is ~1e−3).
    logits = torch.tensor([[1e4, 1e4, -1e4], [-1e4, 1e4, 1e4 - 1.0]])
    h = entropy_from_logits(logits)
    p = torch.softmax(torch.tensor([0.0, -1.0]), dim=0)
    assert torch.allclose(h[0], torch.tensor(math.log(2)), atol=1e-6)
    assert torch.allclose(h[1], -(p * p.log()).sum(), atol=1e-6)


def test_minus_inf_logits_are_probability_zero():
    leaf = torch.tensor([[0.3, -1.2, 2.0, 5.0, 5.0]], requires_grad=True)
    base = leaf[:, :3].detach().clone().requires_grad_(True)
    vocab_mask = torch.tensor([[False, False, False, True, True]])
    masked = leaf.masked_fill(vocab_mask, -INF)  # a masked vocabulary

    h = entropy_from_logits(masked)
    h_ref = entropy_from_logits(base)
    assert torch.allclose(h, h_ref)
    h.sum().backward()
    h_ref.sum().backward()
    assert torch.isfinite(leaf.grad).all()
    assert torch.allclose(leaf.grad[:, :3], base.grad)
    assert (leaf.grad[:, 3:] == 0).all()


def test_minus_inf_leaf_logits_give_finite_gradients():
    logits = torch.tensor([[0.0, 0.0, -INF, 1e4, -1e4]], requires_grad=True)
    h = entropy_from_logits(logits)
    h.backward()
    assert torch.isfinite(h).all() and torch.isfinite(logits.grad).all()


def test_entropy_chunked_equals_unchunked():
    logits = random_logits(2, 7, 11)
    full = entropy_from_logits(logits)
    for chunk in (1, 3, 7, 50):
        assert torch.equal(entropy_from_logits(logits, chunk_size=chunk), full)


# ---------------------------------------------------------------------------
# log-probs of chosen tokens


def reference_logprobs(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, ids.unsqueeze(-1)).squeeze(-1)


def test_logprobs_match_log_softmax_gather():
    logits = random_logits(3, 6, 50)
    ids = torch.randint(0, 50, (3, 6), generator=torch.Generator().manual_seed(1))
    assert torch.allclose(
        logprobs_from_logits(logits, ids), reference_logprobs(logits, ids), atol=1e-5
    )


def test_logprobs_of_huge_and_masked_logits():
    logits = torch.tensor([[[1e4, -1e4, -INF], [1e4, -1e4, -INF], [0.0, 0.0, -INF]]])
    ids = torch.tensor([[0, 1, 2]])
    # log 1 = 0; −1e4 − 1e4; a token of probability 0 has log-prob −inf
    assert logprobs_from_logits(logits, ids).tolist() == [[0.0, -2e4, -INF]]
    logits[0, 2, 2] = 0.0
    assert logprobs_from_logits(logits, ids)[0, 2].item() == pytest.approx(-math.log(3))


@pytest.mark.parametrize("chunk", [1, 2, 4, 5, 64])
def test_logprobs_chunked_equal_unchunked_with_equal_gradients(chunk):
    logits = random_logits(3, 5, 40)
    ids = torch.randint(0, 40, (3, 5), generator=torch.Generator().manual_seed(2))
    weights = torch.randn(3, 5, generator=torch.Generator().manual_seed(3))

    grads = []
    for size in (None, chunk):
        leaf = logits.clone().requires_grad_(True)
        out = logprobs_from_logits(leaf, ids, chunk_size=size)
        (out * weights).sum().backward()
        grads.append((out.detach(), leaf.grad))
    (full, full_grad), (chunked, chunked_grad) = grads
    assert torch.equal(chunked, full)
    assert torch.allclose(chunked_grad, full_grad, atol=1e-7)

    leaf = logits.clone().requires_grad_(True)
    (reference_logprobs(leaf, ids) * weights).sum().backward()
    assert torch.allclose(full_grad, leaf.grad, atol=1e-6)


def test_logprobs_of_packed_sequences():
    logits = random_logits(9, 13)  # (total tokens, V)
    ids = torch.arange(9) % 13
    expected = reference_logprobs(logits, ids)
    assert torch.allclose(logprobs_from_logits(logits, ids), expected, atol=1e-5)
    assert torch.equal(
        logprobs_from_logits(logits, ids, chunk_size=4), logprobs_from_logits(logits, ids)
    )


def test_bad_arguments():
    logits = random_logits(2, 3, 5)
    with pytest.raises(ValueError, match="do not match"):
        logprobs_from_logits(logits, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="chunk_size"):
        logprobs_from_logits(logits, torch.zeros(2, 3, dtype=torch.long), chunk_size=0)


# ---------------------------------------------------------------------------
# Σ_v π(v)², the optimal token baseline's Logit-Gradient Proxy


def test_sum_squared_probs_hand_computed():
    # z = (0, 0):       π = (1/2, 1/2)            Σπ² = 1/4 + 1/4 = 0.5
    # z = (ln 3, 0):    π = (3/4, 1/4)            Σπ² = 9/16 + 1/16 = 0.625
    # z = (0, 0, -inf): π = (1/2, 1/2, 0)         Σπ² = 0.5 (the masked entry counts as 0)
    # z = (1e4, 0, 0):  π ≈ (1, 0, 0)             Σπ² = 1 (no overflow)
    logits = torch.tensor(
        [[0.0, 0.0, -INF], [math.log(3.0), 0.0, -INF], [0.0, 0.0, -INF], [1e4, 0.0, 0.0]]
    )
    got = sum_squared_probs_from_logits(logits)
    torch.testing.assert_close(got, torch.tensor([0.5, 0.625, 0.5, 1.0]))


def test_sum_squared_probs_matches_softmax_and_chunks():
    logits = random_logits(2, 5, 11)
    expected = (torch.softmax(logits, dim=-1) ** 2).sum(dim=-1)
    torch.testing.assert_close(sum_squared_probs_from_logits(logits), expected)
    torch.testing.assert_close(sum_squared_probs_from_logits(logits, chunk_size=2), expected)
    # The squared gradient norm of log π(o) w.r.t. the logits is 1 − 2π(o) + Σπ²:
    z = logits[0, 0].clone().requires_grad_(True)
    torch.log_softmax(z, dim=-1)[3].backward()
    pi = torch.softmax(logits[0, 0], dim=-1)
    assert z.grad.square().sum().item() == pytest.approx(
        1 - 2 * pi[3].item() + expected[0, 0].item(), rel=1e-5
    )
