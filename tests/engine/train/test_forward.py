"""Forward passes on trimmed micro-batches, and token-budget micro-batching."""

import math
from types import SimpleNamespace

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from transformers import AutoModelForCausalLM

from engine.algo.entropy import entropy_from_logits
from engine.controller.dispatch import take
from engine.train.forward import (
    _split_to_count,
    plan_micro_batches,
    response_logprobs,
    response_logprobs_sum_pi_squared,
    token_budget_micro_batches,
    trim_padding,
)
from engine.types import TokenBatch

CPU = torch.device("cpu")
PAD = 0


def ragged(prompt_lens, response_lens, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in prompt_lens]
    responses = [torch.randint(3, 2000, (n,), generator=g).tolist() for n in response_lens]
    return TokenBatch.from_ragged(prompts, responses, PAD)


def test_trim_drops_exactly_the_columns_that_are_padding_in_every_row():
    batch = ragged([5, 3, 7], [2, 4, 1])
    # Padded to 7 + 4; a micro-batch of rows 0 and 2 needs prompt width 7, response 2;
    # rows 0 and 1 need prompt width 5 (two left columns are padding in both), response 4.
    rows01 = trim_padding(take(batch, slice(0, 2)))
    assert rows01.input_ids_BS.shape == (2, 5 + 4)
    assert torch.equal(rows01.input_ids_BS, batch.input_ids_BS[:2, 2:])
    rows02 = trim_padding(take(batch, [0, 2]))
    assert rows02.input_ids_BS.shape == (2, 7 + 2)
    assert rows02.response_length == 2
    assert torch.equal(rows02.responses_BR, batch.responses_BR[[0, 2], :2])


def test_trimmed_forward_equals_the_untrimmed_forward(tiny_model_dir):
    """Left padding, positions and the response slice survive trimming and
    ``logits_to_keep``: log-probs and entropy equal those of the full padded forward,
    and the padding's positions come back as zeros."""
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    # The fourth row pads the others beyond what any of them uses, as a micro-batch cut
    # from a bigger batch is padded.
    wide = ragged([9, 4, 6, 12], [3, 7, 2, 10])
    tokens = take(wide, slice(0, 3))
    assert trim_padding(tokens).input_ids_BS.shape[1] < tokens.input_ids_BS.shape[1]
    with torch.no_grad():
        logits = model(
            input_ids=tokens.input_ids_BS,
            attention_mask=tokens.attention_mask_BS,
            position_ids=tokens.position_ids_BS,
        ).logits
        r = tokens.response_length
        full = logits[:, -r - 1 : -1].float() / 0.7
        want_logp = torch.log_softmax(full, -1).gather(-1, tokens.responses_BR[..., None])[..., 0]
        want_entropy = entropy_from_logits(full)
        logp, entropy = response_logprobs(model, tokens, CPU, temperature=0.7, with_entropy=True)
    mask = tokens.response_mask_BR.bool()
    assert logp.shape == entropy.shape == (3, 10)
    torch.testing.assert_close(logp[mask], want_logp[mask], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], want_entropy[mask], atol=1e-5, rtol=1e-5)
    assert not logp[:, 7:].any() and not entropy[:, 7:].any()


def test_entropy_carries_a_graph_only_when_it_is_a_loss_term(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    batch = ragged([4, 4], [3, 3])
    logp, entropy = response_logprobs(model, batch, CPU, with_entropy=True)
    assert logp.requires_grad and not entropy.requires_grad
    _, entropy = response_logprobs(model, batch, CPU, with_entropy=True, entropy_grad=True)
    assert entropy.requires_grad


class TableModel(nn.Module):
    """A 'language model' whose logits at a position depend only on the token there:
    row ``table[token]``."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = table

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        return SimpleNamespace(logits=self.table[input_ids])


def test_sum_pi_squared_by_hand():
    """Σ_v π(v)² and log π(o_t) at each response token, from the temperature-scaled
    logits of the position before it. Vocabulary {0, 1, 2}; temperature 0.5:

        after token 1: z = (ln 3 / 2, 0, -inf) / 0.5 = (ln 3, 0, -inf): π = (3/4, 1/4, 0),
                       Σπ² = 9/16 + 1/16 = 5/8
        after token 2: z = (0, 0, 0): π = (1/3, 1/3, 1/3), Σπ² = 1/3

    row 0: prompt [2], response [1, 1]: π(1 | 2) = 1/3, then π(1 | 1) = 1/4
    row 1: prompt [1, 2], response [2]: π(2 | 2) = 1/3, then padding
    row 2: prompt [1], response [0]:    π(0 | 1) = 3/4, then padding

    (Padding inside the trimmed width holds whatever the model gave there: every reader
    masks it out.)
    """
    inf = float("inf")
    table = torch.tensor([[0.0, 0.0, 0.0], [math.log(3) / 2, 0.0, -inf], [0.0, 0.0, 0.0]])
    tokens = TokenBatch.from_ragged([[2], [1, 2], [1]], [[1, 1], [2], [0]], pad_token_id=0)
    logp, sum_sq = response_logprobs_sum_pi_squared(TableModel(table), tokens, CPU, 0.5)
    ln = math.log
    want_logp = torch.tensor([[ln(1 / 3), ln(1 / 4)], [ln(1 / 3), 0.0], [ln(3 / 4), 0.0]])
    want_sum_sq = torch.tensor([[1 / 3, 5 / 8], [1 / 3, 0.0], [5 / 8, 0.0]])
    mask = tokens.response_mask_BR.bool()
    torch.testing.assert_close(logp[mask], want_logp[mask])
    torch.testing.assert_close(sum_sq[mask], want_sum_sq[mask])
    # The log-probs are response_logprobs' own.
    alone, _ = response_logprobs(TableModel(table), tokens, CPU, temperature=0.5)
    torch.testing.assert_close(logp, alone)


def test_sum_pi_squared_of_a_model_equals_its_full_softmax(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    tokens = take(ragged([9, 4, 6, 12], [3, 7, 2, 10]), slice(0, 3))  # trimmed inside
    with torch.no_grad():
        logits = model(
            input_ids=tokens.input_ids_BS,
            attention_mask=tokens.attention_mask_BS,
            position_ids=tokens.position_ids_BS,
        ).logits
        r = tokens.response_length
        want = torch.softmax(logits[:, -r - 1 : -1].float() / 0.7, -1).square().sum(-1)
        logp, sum_sq = response_logprobs_sum_pi_squared(model, tokens, CPU, temperature=0.7)
        alone, _ = response_logprobs(model, tokens, CPU, temperature=0.7)
    mask = tokens.response_mask_BR.bool()
    torch.testing.assert_close(sum_sq[mask], want[mask], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(logp, alone)
    assert sum_sq.shape == (3, 10) and not sum_sq[:, 7:].any()  # past the trimmed width


def test_token_budget_packs_contiguous_rows_under_the_budget():
    # Real lengths (prompt, response): cost of a micro-batch = rows × (max p + max r).
    batch = ragged([4, 4, 4, 10, 2, 2], [4, 4, 4, 6, 1, 1])
    # rows 0-2: 3 × 8 = 24 ≤ 24; adding row 3 → 4 × 16 = 64; row 3 alone 16, with row 4:
    # 2 × 16 = 32 > 24; rows 4-5: 2 × 3 = 6.
    assert token_budget_micro_batches(batch, 24, CPU) == [slice(0, 3), slice(3, 4), slice(4, 6)]
    # A row longer than the budget goes alone rather than failing.
    assert token_budget_micro_batches(batch, 10, CPU) == [
        slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4), slice(4, 6),
    ]  # fmt: skip
    assert plan_micro_batches(batch, 4, None, CPU) == [slice(0, 4), slice(4, 6)]


def test_split_to_count_halves_the_biggest_micro_batch():
    assert _split_to_count([slice(0, 5), slice(5, 6)], 3) == [
        slice(0, 2), slice(2, 5), slice(5, 6),
    ]  # fmt: skip
    assert _split_to_count([slice(0, 2)], 2) == [slice(0, 1), slice(1, 2)]


def _ranks_agree_on_the_count(rank, world, port, out):
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    # Rank 0's short rows fit one micro-batch; rank 1's long rows need four.
    batch = ragged([2] * 4, [2] * 4) if rank == 0 else ragged([20] * 4, [10] * 4)
    out[rank] = token_budget_micro_batches(batch, 40, CPU)
    dist.destroy_process_group()


def test_every_rank_runs_the_same_number_of_micro_batches():
    """FSDP's collectives pair up forward for forward: a rank with short sequences must
    still run as many micro-batches as the rank with the longest."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = mp.Manager().dict()
    mp.spawn(_ranks_agree_on_the_count, args=(2, port, out), nprocs=2)
    assert out[1] == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)]
    assert out[0] == [slice(0, 1), slice(1, 2), slice(2, 3), slice(3, 4)]


def test_value_model_has_no_dropout_in_training(tiny_model_dir):
    """PPO's value loss compares the update's values with those the advantages used: a
    value head with dropout (HF's token-classification default) would add noise to both."""
    from engine.config import ModelConfig
    from engine.train.forward import response_values
    from engine.train.fsdp import load_hf_model

    model = load_hf_model(ModelConfig(path=str(tiny_model_dir)), kind="value").train()
    batch = ragged([5, 3], [4, 2])
    with torch.no_grad():
        first, second = (response_values(model, batch, CPU) for _ in range(2))
    torch.testing.assert_close(first, second, rtol=0, atol=0)
