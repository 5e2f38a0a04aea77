"""Peak memory of the actor's loss, forward and backward, with and without the fused head
(``actor_rollout_ref.model.use_fused_kernels``, ``engine.train.fused_head``).

A tiny Qwen2 body (``engine.models.tiny``) under a Qwen-sized vocabulary (152064 words,
tied head), float32 on the CPU: the logits dominate as they do at 32B. One step is
``response_logprobs`` (log-probs and entropy, the entropy with its graph as an entropy
bonus needs it, temperature 0.7), a loss of both, and its backward. Each setting runs in
a process of its own; memory is the process's resident set: its high-water mark
(``ru_maxrss``) after the step minus its size just before (the model, its inputs and the
allocator's pools already in). The step runs once to warm up and is then measured
``--repeat`` times in fresh processes; the smallest rise is reported, and the wall time
of that run.

    python benchmarks/fused_head_memory.py                       # chunks off, 1024, 512, 128
    python benchmarks/fused_head_memory.py --batch 4 --response 2048 --chunks 0,512
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _one(args: argparse.Namespace) -> dict:
    import torch

    from engine.models.tiny import random_model, tiny_config
    from engine.train.forward import response_logprobs
    from engine.train.fused_head import HeadOptions
    from engine.types import TokenBatch

    torch.set_num_threads(args.threads)
    config = tiny_config(
        "qwen2", vocab_size=args.vocab, hidden_size=args.hidden, num_layers=args.layers
    )
    model = random_model(config)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, args.vocab, (args.prompt,), generator=g).tolist()] * args.batch
    responses = [
        torch.randint(3, args.vocab, (args.response,), generator=g).tolist()
        for _ in range(args.batch)
    ]
    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    head = HeadOptions(chunk_size=args.chunk) if args.chunk else None

    def step() -> None:
        logp, ent = response_logprobs(
            model, tokens, torch.device("cpu"), 0.7, with_entropy=True, entropy_grad=True,
            head=head,
        )  # fmt: skip
        (-(logp.mean()) - 0.01 * ent.mean()).backward()
        model.zero_grad(set_to_none=True)

    step()  # warm-up: the allocator's pools and the gradients' first allocation
    before = _rss_bytes()
    start = time.perf_counter()
    step()
    wall = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    return {"chunk": args.chunk, "rise": peak - before, "wall": wall, "before": before}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--prompt", type=int, default=64)
    p.add_argument("--response", type=int, default=1024)
    p.add_argument("--chunks", default="0,1024,512,128", help="0: the full logits")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk", type=int, default=None, help=argparse.SUPPRESS)  # one setting
    args = p.parse_args(argv)
    if args.chunk is not None:
        print(json.dumps(_one(args)))
        return
    tokens = args.batch * args.response
    print(
        f"vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers; {args.batch} ×"
        f" ({args.prompt} prompt + {args.response} response) tokens; float32, CPU,"
        f" {args.threads} threads; one full-logits tensor of the responses ="
        f" {tokens * args.vocab * 4 / 2**20:.0f} MiB"
    )
    rows = []
    for chunk in (int(c) for c in args.chunks.split(",")):
        runs = []
        for _ in range(args.repeat):
            cmd = [sys.executable, __file__, *(argv or sys.argv[1:]), "--chunk", str(chunk)]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        best = min(runs, key=lambda r: r["rise"])
        rows.append(best)
        rises = ", ".join(f"{r['rise'] / 2**20:.0f}" for r in runs)
        name = "full logits" if chunk == 0 else f"chunk {chunk}"
        print(
            f"  {name:12s} peak rise {best['rise'] / 2**20:7.0f} MiB (runs: {rises})"
            f"  wall {best['wall']:.2f} s"
        )
    base = rows[0]
    for row in rows[1:]:
        print(
            f"  chunk {row['chunk']}: peak rise {row['rise'] / base['rise']:.3f} of the full"
            f" logits', wall {row['wall'] / base['wall']:.2f}×"
        )


if __name__ == "__main__":
    main()
