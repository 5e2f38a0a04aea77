"""The fused head on a GPU (``actor_rollout_ref.model.use_fused_kernels``): the full
logits, the torch path chunk by chunk, and Liger's fused linear cross-entropy, side by
side in one process, against a float32 full-logits reference.

A Qwen2 body built locally (``engine.models.tiny``: ``--hidden``, ``--layers``) under a
Qwen-sized vocabulary (152064 words), on the GPU. One step is
``response_logprobs`` (log-probs and entropy with its graph, temperature 0.7), a loss of
both, and its backward. Printed per setting: the peak of allocated GPU memory above what
was allocated before the step, the median wall time of ``--repeat`` steps (after one
warm-up), and the difference from the same dtype's full-logits run: log-probs (max |Δ|)
and the gradients of the embedding (tied head) and of the first layer's q_proj
(‖Δ‖ / ‖full‖).

    python benchmarks/fused_head_gpu.py                # needs CUDA; liger-kernel optional
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.models.tiny import random_model, tiny_config
from engine.train.forward import response_logprobs
from engine.train.fused_head import HeadOptions
from engine.types import TokenBatch

DEVICE = torch.device("cuda")


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def _step(model, tokens, head):
    logp, ent = response_logprobs(
        model, tokens, DEVICE, 0.7, with_entropy=True, entropy_grad=True, head=head
    )
    mask = tokens.response_mask_BR.to(DEVICE)
    ((-(logp * mask).sum() - 0.01 * (ent * mask).sum()) / mask.sum()).backward()
    return logp.detach().float()


def _grads(model):
    named = dict(model.named_parameters())
    emb = named["model.embed_tokens.weight"].grad.float()
    q = named["model.layers.0.self_attn.q_proj.weight"].grad.float()
    return emb, q


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--vocab", type=int, default=152064)
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--prompt", type=int, default=256)
    p.add_argument("--response", type=int, default=2048)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--device", default="cuda", help="cpu: a smoke run of this script")
    args = p.parse_args()
    global DEVICE
    DEVICE = torch.device(args.device)
    cuda = DEVICE.type == "cuda"
    torch.manual_seed(0)
    config = tiny_config("qwen2", vocab_size=args.vocab, hidden_size=args.hidden,
                         num_layers=args.layers)  # fmt: skip
    ref_model = random_model(config).to(DEVICE).float()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, args.vocab, (args.prompt,), generator=g).tolist()] * args.batch
    responses = [torch.randint(3, args.vocab, (args.response,), generator=g).tolist()
                 for _ in range(args.batch)]  # fmt: skip
    tokens = TokenBatch.from_ragged(prompts, responses, 0)
    print(f"{torch.cuda.get_device_name() if cuda else 'cpu'}, torch {torch.__version__};"
          f" vocab {args.vocab}, hidden {args.hidden}, {args.layers} layers; {args.batch} ×"
          f" ({args.prompt} + {args.response}) tokens; one full-logits tensor of the responses"
          f" (fp32) = {args.batch * args.response * args.vocab * 4 / 2**30:.2f} GiB")  # fmt: skip
    settings = [("full logits", None), ("torch chunk 512", HeadOptions(512, "torch")),
                ("torch chunk 2048", HeadOptions(2048, "torch"))]  # fmt: skip
    try:
        import liger_kernel  # noqa: F401

        settings.append(("liger (chunk 512 entropy)", HeadOptions(512, "liger")))
    except ImportError:
        print("  liger-kernel is not installed: its backend is skipped")
    model = ref_model
    for dtype in (torch.float32, torch.bfloat16):
        model = model.to(dtype)
        print(f" {dtype}: errors against this dtype's full logits")
        _compare(model, tokens, settings, args.repeat, cuda)


def _compare(model, tokens, settings, repeat, cuda) -> None:
    rows, ref = [], None
    for name, head in settings:
        model.zero_grad(set_to_none=True)
        try:
            _step(model, tokens, head)  # warm-up (kernels compiled, gradients allocated)
        except Exception as error:  # report and go on: one backend's failure is a result
            print(f"  {name:26s} FAILED: {type(error).__name__}: {error}"[:600])
            continue
        walls = []
        for _ in range(repeat):
            model.zero_grad(set_to_none=True)
            _sync()
            before = torch.cuda.memory_allocated() if cuda else 0
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            logp = _step(model, tokens, head)
            _sync()
            walls.append(time.perf_counter() - start)
            peak = (torch.cuda.max_memory_allocated() - before) if cuda else 1
        emb, q = _grads(model)
        if ref is None:
            ref = (logp, emb, q)
        err = (
            float((logp - ref[0]).abs().max()),
            float((emb - ref[1]).norm() / ref[1].norm()),
            float((q - ref[2]).norm() / ref[2].norm()),
        )
        rows.append((name, peak, statistics.median(walls)))
        print(f"  {name:26s} peak {peak / 2**30:6.2f} GiB  step {statistics.median(walls) * 1e3:7.1f}"
              f" ms  |Δlogp| {err[0]:.3g}  grad err emb {err[1]:.3g} q_proj {err[2]:.3g}")  # fmt: skip
    base = rows[0]
    for name, peak, wall in rows[1:]:
        print(
            f"  {name}: peak {peak / base[1]:.3f} of the full logits', time {wall / base[2]:.2f}×"
        )


if __name__ == "__main__":
    main()
