"""Padded micro-batches vs packed sequences (``actor_rollout_ref.model.use_remove_padding``,
``engine.train.packing``) on a batch of varied lengths.

A tiny Qwen2 body built locally (``engine.models.tiny``), float32 on the CPU, sdpa
attention. One step is the actor's ``response_logprobs`` (log-probs and entropy with its
graph, temperature 0.7), a loss of both and its backward, over one micro-batch of
``--rows`` rows whose prompt and response lengths are drawn uniformly from the given
ranges. Padded (the default) drops only the columns that are padding in every row; packed
runs the rows end to end in bins as long as the longest row. The two alternate in one
process, ``--repeat`` times each after a warm-up; the median step time is printed, and
the ratio packed / padded.

    .venv/bin/python benchmarks/packing.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.models.tiny import random_model, tiny_config
from engine.train.forward import response_logprobs
from engine.train.packing import model_call
from engine.types import TokenBatch

CPU = torch.device("cpu")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=16)
    p.add_argument("--prompt", default="32,96", help="min,max prompt tokens")
    p.add_argument("--response", default="8,512", help="min,max response tokens")
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    config = tiny_config("qwen2", vocab_size=args.vocab, hidden_size=args.hidden,
                         num_layers=args.layers)  # fmt: skip
    model = random_model(config)
    g = torch.Generator().manual_seed(0)

    def lengths(spec: str) -> list[int]:
        lo, hi = (int(x) for x in spec.split(","))
        return torch.randint(lo, hi + 1, (args.rows,), generator=g).tolist()

    prompts = [torch.randint(3, args.vocab, (n,), generator=g).tolist()
               for n in lengths(args.prompt)]  # fmt: skip
    responses = [torch.randint(3, args.vocab, (n,), generator=g).tolist()
                 for n in lengths(args.response)]  # fmt: skip
    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    real = int(tokens.attention_mask_BS.sum())
    padded_positions = model_call(model, tokens, CPU, False).inputs["input_ids"].numel()
    packed_positions = model_call(model, tokens, CPU, True).inputs["input_ids"].numel()
    print(f"torch {torch.__version__}, {args.threads} threads; hidden {args.hidden},"
          f" {args.layers} layers, vocab {args.vocab}, float32, sdpa; {args.rows} rows,"
          f" prompts {args.prompt}, responses {args.response}: {real} real tokens; the model"
          f" sees {padded_positions} positions padded, {packed_positions} packed")  # fmt: skip

    def step(packed: bool) -> float:
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        logp, ent = response_logprobs(
            model, tokens, CPU, 0.7, with_entropy=True, entropy_grad=True, packed=packed
        )
        mask = tokens.response_mask_BR
        (-(logp * mask).sum() / mask.sum() - 0.01 * (ent * mask).sum() / mask.sum()).backward()
        return time.perf_counter() - start

    step(False), step(True)  # warm-up
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.repeat):
        for packed in (False, True):
            times[packed].append(step(packed))
    padded, packed = (statistics.median(times[k]) for k in (False, True))
    print(f"  padded {padded:.3f} s   packed {packed:.3f} s   (medians of {args.repeat})")
    print(f"  packed / padded: {packed / padded:.2f} of the time")


if __name__ == "__main__":
    main()
