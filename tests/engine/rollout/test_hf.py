"""The HF rollout: EOS handling, the response mask, and agreement with the training forward."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from engine.rollout.base import trim_response
from engine.rollout.hf import HFRollout
from engine.train.forward import response_logprobs
from engine.types import GenerationRequest, SamplingParams, TokenBatch


def test_trim_keeps_the_first_eos_and_drops_what_follows():
    assert trim_response([5, 6, 2, 7, 2], eos_token_ids={2}, ignore_eos=False) == ([5, 6, 2], True)
    assert trim_response([5, 6, 7], eos_token_ids={2}, ignore_eos=False) == ([5, 6, 7], False)
    assert trim_response([2], eos_token_ids={2, 3}, ignore_eos=False) == ([2], True)
    # Several EOS ids (tokenizer's and generation config's): whichever comes first.
    assert trim_response([5, 3, 2], eos_token_ids={2, 3}, ignore_eos=False) == ([5, 3], True)
    assert trim_response([5, 2, 6], eos_token_ids={2}, ignore_eos=True) == ([5, 2, 6], False)


@pytest.fixture(scope="module")
def model_and_tokenizer(tiny_model_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    return model, AutoTokenizer.from_pretrained(tiny_model_dir)


def prompts(tokenizer, texts):
    return [
        tokenizer.encode(
            tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True, tokenize=False
            ),
            add_special_tokens=False,
        )
        for t in texts
    ]


def response_logits(model, tokens: TokenBatch) -> torch.Tensor:
    """The training forward's logits at the positions that predict each response token."""
    with torch.no_grad():
        logits = model(
            input_ids=tokens.input_ids_BS,
            attention_mask=tokens.attention_mask_BS,
            position_ids=tokens.position_ids_BS,
        ).logits
    r = tokens.response_length
    return logits[:, -r - 1 : -1]


def test_greedy_tokens_are_the_argmax_of_the_training_forward(model_and_tokenizer):
    """Left padding, positions and the response slice agree between generate and training:
    otherwise PPO's ratio would not start at 1."""
    model, tokenizer = model_and_tokenizer
    rollout = HFRollout(model, tokenizer, torch.device("cpu"))
    ids = prompts(tokenizer, ["Add 3 and 4.", "What is 12 minus 5? Answer with a number."])
    assert len(ids[0]) != len(ids[1])  # so one of them is left-padded
    greedy = SamplingParams(do_sample=False, max_new_tokens=8, ignore_eos=True)
    out = rollout.generate(GenerationRequest(ids, greedy))
    tokens = TokenBatch.from_ragged(ids, out.response_ids, tokenizer.pad_token_id)
    argmax = response_logits(model, tokens).argmax(-1)
    mask = tokens.response_mask_BR.bool()
    assert torch.equal(argmax[mask], tokens.responses_BR[mask])
    logp, _ = response_logprobs(model, tokens, torch.device("cpu"))
    assert torch.isfinite(logp).all() and (logp[mask] <= 0).all()


def test_eos_ends_a_response_and_the_mask_covers_it(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    eos = tokenizer.eos_token_id
    # Make EOS the most likely token everywhere: every greedy response is exactly [EOS].
    with torch.no_grad():
        bias = torch.zeros(model.config.vocab_size)
        bias[eos] = 1e4
        model.lm_head.bias = torch.nn.Parameter(bias)
    try:
        rollout = HFRollout(model, tokenizer, torch.device("cpu"))
        ids = prompts(tokenizer, ["Add 3 and 4.", "Hello"])
        out = rollout.generate(
            GenerationRequest(ids, SamplingParams(do_sample=False, max_new_tokens=6))
        )
        assert out.response_ids == [[eos], [eos]]
        assert out.finished == [True, True]
        tokens = TokenBatch.from_ragged(ids, out.response_ids, tokenizer.pad_token_id)
        assert tokens.response_mask_BR.tolist() == [[1.0], [1.0]]
    finally:
        model.lm_head.bias = None


def test_length_limit_and_sampling_settings(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    rollout = HFRollout(model, tokenizer, torch.device("cpu"), micro_batch_size=3)
    ids = prompts(tokenizer, ["a", "bb", "ccc", "dddd", "eeeee"])
    torch.manual_seed(1)
    sampled = SamplingParams(temperature=1.0, top_p=0.9, top_k=50, max_new_tokens=5)
    out = rollout.generate(GenerationRequest(ids, sampled))
    assert len(out.response_ids) == 5  # two generate calls (3 + 2), order kept
    assert all(1 <= len(r) <= 5 for r in out.response_ids)
    assert all(
        f == (r[-1] in rollout.eos_token_ids)
        for r, f in zip(out.response_ids, out.finished, strict=False)
    )
    greedy = SamplingParams(do_sample=False, max_new_tokens=5)
    first = rollout.generate(GenerationRequest(ids, greedy)).response_ids
    assert rollout.generate(GenerationRequest(ids, greedy)).response_ids == first


def test_sync_weights_fills_an_owned_model(model_and_tokenizer, tiny_model_dir):
    """With a Megatron actor the HF rollout generates on a model of its own, filled from
    the engine's HF-named tensors (a tied lm_head arrives as the embedding)."""
    source, tokenizer = model_and_tokenizer
    own = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in own.parameters():
            p.zero_()
    rollout = HFRollout(own, tokenizer, torch.device("cpu"))
    pairs = [(n, p.detach().clone()) for n, p in source.named_parameters()]
    assert source.config.tie_word_embeddings and "lm_head.weight" not in dict(pairs)
    rollout.sync_weights(iter(pairs))
    mine = own.state_dict()
    for name, tensor in source.state_dict().items():
        assert mine[name].equal(tensor), name
    greedy = SamplingParams(do_sample=False, max_new_tokens=6)
    request = GenerationRequest(prompts(tokenizer, ["1+1", "2+3"]), greedy)
    assert (
        rollout.generate(request).response_ids
        == HFRollout(source, tokenizer, torch.device("cpu")).generate(request).response_ids
    )
    with pytest.raises(KeyError, match="stale"):
        rollout.sync_weights(iter(pairs[1:]))
    with pytest.raises(KeyError, match=r"no parameter 'model\.extra'"):
        rollout.sync_weights(iter([("model.extra", torch.zeros(1))]))


@pytest.mark.parametrize(
    "sampling",
    [
        SamplingParams(do_sample=False, max_new_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.7, max_new_tokens=8, ignore_eos=True),
        SamplingParams(temperature=0.7, top_k=5, max_new_tokens=8, ignore_eos=True),
    ],
    ids=["greedy", "t07", "t07_topk5"],
)
def test_logprobs_are_of_the_distribution_sampled(model_and_tokenizer, sampling):
    """With ``logprobs`` the HF rollout returns, like vLLM's, each token's log-prob under
    the distribution it was drawn from: log softmax(logits / T), renormalised over the
    top k when top-k is on (the model's own sampling defaults play no part)."""
    model, tokenizer = model_and_tokenizer
    model.generation_config.top_k = 3  # a model default that must not leak in
    try:
        rollout = HFRollout(model, tokenizer, torch.device("cpu"), logprobs=True)
        ids = prompts(tokenizer, ["Add 3 and 4.", "What is 12 minus 5? Answer with a number."])
        out = rollout.generate(GenerationRequest(ids * 4, sampling))
    finally:
        model.generation_config.top_k = None
    tokens = TokenBatch.from_ragged(ids * 4, out.response_ids, tokenizer.pad_token_id)
    logits = response_logits(model, tokens) / (sampling.temperature if sampling.do_sample else 1.0)
    if sampling.do_sample and sampling.top_k > 0:
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    expected = torch.log_softmax(logits, -1).gather(-1, tokens.responses_BR.unsqueeze(-1))[..., 0]
    for i, row in enumerate(out.logprobs):
        assert len(row) == len(out.response_ids[i])
        assert torch.allclose(torch.tensor(row), expected[i, : len(row)], atol=1e-4)
    if sampling.do_sample:  # it sampled, and not from the model's top-3 default
        drawn = logits.gather(-1, tokens.responses_BR.unsqueeze(-1))
        rank = (logits > drawn).sum(-1) + 1  # 1: the most likely token
        assert rank[tokens.response_mask_BR.bool()].max() > 3


def test_no_logprobs_unless_asked(model_and_tokenizer):
    model, tokenizer = model_and_tokenizer
    out = HFRollout(model, tokenizer, torch.device("cpu")).generate(
        GenerationRequest([[1, 2, 3]], SamplingParams(max_new_tokens=4))
    )
    assert out.logprobs is None
