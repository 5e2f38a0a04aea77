"""Packed sequences (``model.use_remove_padding``): every row's tokens end to end in one
row, no padding reaching the model, each row attending to itself only; log-probs, the
entropy, Σπ², values and gradients equal the padded forward's."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from engine.train.forward import (
    response_logprobs,
    response_logprobs_sum_pi_squared,
    response_values,
)
from engine.train.fused_head import HeadOptions
from engine.train.packing import model_call
from engine.types import TokenBatch
from tests.engine.train import varlen_reference

CPU = torch.device("cpu")


def ragged(prompt_lens, response_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in response_lens]
    return TokenBatch.from_ragged(prompts, responses, 0)


# mixed lengths, one empty response (a row whose generation produced nothing)
BATCH = ([9, 4, 6, 12, 3], [3, 11, 0, 7, 1])


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)


def test_the_packed_call_holds_each_rows_real_tokens_and_predicts_its_responses():
    tokens = ragged([3, 2], [2, 1])  # rows of 5 and 3 real tokens
    call = model_call(torch.nn.Linear(1, 1), tokens, CPU, packed=True)
    real = [tokens.input_ids_BS[i][tokens.attention_mask_BS[i].bool()] for i in range(2)]
    # bins as long as the longest row (sdpa): row 0 fills one, row 1 the next, whose end
    # is a row of padding of its own (positions from 0 again)
    assert call.inputs["input_ids"].tolist() == [real[0].tolist(), [*real[1].tolist(), 0, 0]]
    assert call.inputs["position_ids"].tolist() == [[0, 1, 2, 3, 4], [0, 1, 2, 0, 1]]
    assert "attention_mask" not in call.inputs  # the positions delimit the rows
    # row 0's responses at 3, 4 are predicted from columns 2, 3 of bin 0; row 1's at 2
    # from column 1 of bin 1; the head takes columns 1, 2, 3 and one more (4)
    assert call.select.tolist() == [1, 2, 3, 4]
    assert call.targets.tolist() == [[0, real[0][3], real[0][4]], [real[1][2], 0, 0]]
    back = call.unpack(torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]))
    assert back.tolist() == [[2.0, 3.0], [4.0, 0.0]]


def test_no_padding_reaches_the_model_but_at_the_ends_of_bins(model):
    tokens = ragged(*BATCH)  # pad id 0; the random tokens are 3 and up
    seen = []
    hook = model.model.embed_tokens.register_forward_hook(
        lambda module, args, out: seen.append(args[0].clone())
    )
    try:
        response_logprobs(model, tokens, CPU, packed=True)
    finally:
        hook.remove()
    (ids,) = seen
    real = int(tokens.attention_mask_BS.sum())
    assert int((ids != 0).sum()) == real  # every real token, once
    for row in ids:  # padding only after a bin's last real token
        nonzero = (row != 0).nonzero()
        assert int(nonzero.max()) + 1 == len(nonzero)
    assert ids.numel() < tokens.input_ids_BS.numel()  # fewer positions than padded rows


@pytest.mark.parametrize("head", [None, HeadOptions(chunk_size=4)], ids=["logits", "fused"])
def test_packed_log_probs_entropy_and_gradients_equal_the_padded(model, head):
    tokens = ragged(*BATCH)
    mask = tokens.response_mask_BR
    results = {}
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        logp, ent = response_logprobs(
            model, tokens, CPU, temperature=0.7, with_entropy=True, entropy_grad=True,
            head=head, packed=packed,
        )  # fmt: skip
        ((logp * mask).sum() + 0.1 * (ent * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results[packed] = (logp.detach(), ent.detach(), grads)
    (lp0, e0, g0), (lp1, e1, g1) = results[False], results[True]
    # on the response tokens (the padded forward leaves values on padding, masked out)
    torch.testing.assert_close(lp1 * mask, lp0 * mask, rtol=0, atol=1e-9)
    torch.testing.assert_close(e1 * mask, e0 * mask, rtol=0, atol=1e-9)
    assert (lp1[2] == 0).all() and (lp1 * (1 - mask) == 0).all()  # padding's places are 0
    assert g0.keys() == g1.keys()
    tol = 1e-9 if head is None else 1e-6  # the fused head sums the head's gradient in fp32
    for name in g0:
        torch.testing.assert_close(g1[name], g0[name], rtol=tol, atol=tol, msg=name)


def test_a_flash_attention_model_takes_one_row_whose_segments_are_the_rows(tiny_model_dir):
    """Under flash-attention the packed rows go end to end in one row (its varlen kernel
    costs each row's own length squared), and the segments transformers' flash path cuts
    from the positions are exactly the rows: with a reference of the kernel, the
    log-probs and gradients equal the padded forward's."""
    seen: list = []
    name = "flash_cpu_reference"  # a "flash" name: the packer's test (engine/train/packing.py)
    varlen_reference.register(name, seen)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float64)
    tokens = ragged(*BATCH)
    mask = tokens.response_mask_BR
    results = {}
    for packed in (False, True):
        varlen_reference.use(model, name if packed else "sdpa")
        model.zero_grad(set_to_none=True)
        logp, _ = response_logprobs(model, tokens, CPU, packed=packed)
        (logp * mask).sum().backward()
        grads = {n: q.grad.clone() for n, q in model.named_parameters() if q.grad is not None}
        results[packed] = (logp.detach(), grads)
    lengths = tokens.attention_mask_BS.sum(dim=1).sort(descending=True).values
    # one row, its segments the rows by decreasing length (first-fit), no padding at all
    assert seen[0] == [0, *lengths.cumsum(0).tolist()]
    assert all(cuts == seen[0] for cuts in seen)  # every layer
    (lp0, g0), (lp1, g1) = results[False], results[True]
    torch.testing.assert_close(lp1 * mask, lp0 * mask, rtol=0, atol=1e-9)
    for key in g0:
        torch.testing.assert_close(g1[key], g0[key], rtol=1e-9, atol=1e-9, msg=key)


def test_a_row_attends_to_itself_only(model):
    """A row's log-probs do not change with the rows packed before it."""
    alone = ragged([4], [6], seed=3)
    prompt, response = alone.input_ids_BS[0, :4].tolist(), alone.input_ids_BS[0, 4:].tolist()
    crowd = TokenBatch.from_ragged([[5] * 12, [6] * 7, prompt], [[7] * 9, [8] * 5, response], 0)
    with torch.no_grad():
        one, _ = response_logprobs(model, alone, CPU, packed=True)
        many, _ = response_logprobs(model, crowd, CPU, packed=True)
    torch.testing.assert_close(many[2, :6], one[0], rtol=0, atol=1e-9)


def test_packed_sum_pi_squared_and_values_equal_the_padded(model, tiny_model_dir):
    tokens = ragged(*BATCH)
    with torch.no_grad():
        padded = response_logprobs_sum_pi_squared(model, tokens, CPU, 1.3)
        packed = response_logprobs_sum_pi_squared(model, tokens, CPU, 1.3, packed=True)
    mask = tokens.response_mask_BR
    for a, b in zip(padded, packed, strict=True):
        torch.testing.assert_close(b * mask, a * mask, rtol=0, atol=1e-9)
    critic = AutoModelForTokenClassification.from_pretrained(
        tiny_model_dir, num_labels=1, dtype=torch.float64
    )
    with torch.no_grad():
        v0 = response_values(critic, tokens, CPU)
        v1 = response_values(critic, tokens, CPU, packed=True)
    torch.testing.assert_close(v1 * mask, v0 * mask, rtol=0, atol=1e-9)


def test_first_fit_by_decreasing_length_by_hand():
    from engine.train.packing import first_fit

    # longest first: 5 opens a bin (2 left), 4 opens one (3 left), 3 fits the second,
    # 2 the first; a row as long as the bin has one of its own
    assert first_fit([5, 3, 4, 2], 7) == [[0, 3], [2, 1]]
    assert first_fit([7, 1], 7) == [[0], [1]]
    assert first_fit([], 4) == []
