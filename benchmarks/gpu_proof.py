"""The GPU proof: the engine's own worker code on one device, measured, beside the
planner's estimate for the same configuration.

For each model shape (Qwen2.5-0.5B and -1.5B by default, built locally from their published
config fields with random weights: no download) and each variant (``base``: padded rows;
``fused``: ``use_fused_kernels``; ``packed``: ``use_remove_padding``; ``lora``: rank-32
adapter on every linear layer) it builds the configuration the planner chooses for one
device (``rlctl.planner.plan.make_plan``: micro-batches, gradient checkpointing, the HF rollout),
starts one ``engine.workers.host.WorkerHost`` (world size 1: NCCL on a GPU, gloo in the dry
mode; FSDP2; bf16 compute on an accelerator) with the actor and the colocated HF rollout,
and runs what a training step runs, phase by phase:

- ``generate``: the rollout's ``generate`` of every sample at full length (``ignore_eos``);
- ``log_probs``: the actor's π_old pass;
- ``update``: the actor's PPO update on those samples (one optimizer step), twice: the
  second is timed, the peak is the larger of the two (the first allocates Adam's state).

Per phase it reports the wall time, tokens per second, the peak of allocated and of
reserved device memory, and beside the peaks the planner's estimate (``MemoryEstimate``:
the rollout's and the training's peak); for the update the model FLOPs utilisation against
the accelerator's dense bf16 peak (``rlctl.hardware``). The variants' π_old log-probs are
compared with the base variant's (the same weights and tokens: they must agree).

    python benchmarks/gpu_proof.py                      # on the GPU machine (scripts/gpu_proof.sh)
    python benchmarks/gpu_proof.py --dry --out /tmp/p   # on CPU: small shapes, the same code

Each case is written to the results as soon as it ends, so a run cut short keeps what it
measured; ``--budget-s`` skips the cases that would start after it.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_proof_engine import engine_run  # noqa: E402
from gpu_proof_report import render_report  # noqa: E402

GIB = 1024**3
MODELS = {"0.5b": "Qwen/Qwen2.5-0.5B", "1.5b": "Qwen/Qwen2.5-1.5B"}
VARIANTS = {
    "base": {},
    "fused": {"actor_rollout_ref.model.use_fused_kernels": "true"},
    "packed": {"actor_rollout_ref.model.use_remove_padding": "true"},
    "lora": {
        "actor_rollout_ref.model.lora_rank": "32",
        "actor_rollout_ref.model.lora_alpha": "32",
    },
}
# The variants whose generation differs: the others generate as ``base`` does.
GENERATES = ("base", "lora")
# The dry mode's shapes: the same families and code paths, small enough for 2 CPU cores.
DRY_SIZES = dict(
    hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128, vocab_size=4096,
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Shape:
    """The samples of one step: prompts × n, each prompt and response at full length."""

    prompts: int
    n: int
    prompt_len: int
    response_len: int

    @property
    def samples(self) -> int:
        return self.prompts * self.n


# ---------------------------------------------------------------------------
# the model, built locally


def build_model(name: str, out: Path, dry: bool) -> Path:
    """A random model of ``name``'s published shape (``rlctl.model_table``) and the tiny
    tokenizer (its ids are a subset of the model's vocabulary), saved in bf16."""
    import torch
    import transformers

    from engine.models.tiny import ENDOFTEXT, IM_END, build_tokenizer, random_model
    from rlctl.models import model_config

    if (out / "config.json").exists():
        return out
    fields = dict(model_config(name))
    if dry:
        fields.update(DRY_SIZES)
    tokenizer = build_tokenizer(2048)
    eos, pad = tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    model_type = fields.pop("model_type")
    config = transformers.AutoConfig.for_model(
        model_type, **fields, eos_token_id=eos, pad_token_id=pad, bos_token_id=None
    )
    model = random_model(config, seed=0).to(torch.bfloat16)
    model.generation_config = transformers.GenerationConfig(eos_token_id=eos, pad_token_id=pad)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out


# ---------------------------------------------------------------------------
# the plan and the engine configuration it makes


def accelerator_name(device_name: str) -> str:
    """The catalog row (``rlctl.hardware``) of a device torch names: 'NVIDIA H100 80GB HBM3'
    -> 'H100'; H100 when the name is not recognised (the dry mode's CPU)."""
    from rlctl.hardware import ACCELERATORS

    upper = device_name.upper()
    for acc in sorted(ACCELERATORS, key=lambda a: -len(a.name)):
        if acc.name.upper() in upper:
            return acc.name
    return "H100"


def plan_for(model_dir: Path, accelerator: str, shape: Shape, variant: dict[str, str]):
    """The planner's plan of this configuration on one device of ``accelerator``."""
    from engine.config import load_config
    from rlctl.planner.plan import PlanRequest, make_plan

    base = [f"actor_rollout_ref.model.path={model_dir}", "data.train_files=unused"]
    pinned = {
        "data.train_batch_size": shape.prompts,
        "data.max_prompt_length": shape.prompt_len,
        "data.max_response_length": shape.response_len,
        "actor_rollout_ref.rollout.n": shape.n,
        "actor_rollout_ref.rollout.name": "hf",
        "actor_rollout_ref.actor.ppo_mini_batch_size": shape.prompts,
        "trainer.nnodes": 1,
        "trainer.n_gpus_per_node": 1,
        **variant,
    }
    cfg = load_config([*base, *(f"{k}={v}" for k, v in pinned.items())], check=False)
    req = PlanRequest(
        model=str(model_dir),
        accelerator=accelerator,
        num_devices=1,
        max_devices_per_node=1,
        rollout_backend="hf",
        train_batch_size=shape.prompts,
        rollout_n=shape.n,
        max_prompt_length=shape.prompt_len,
        max_response_length=shape.response_len,
        ppo_mini_batch_size=shape.prompts,
        config=cfg,
        pinned=frozenset(pinned),
    )
    return make_plan(req), base, pinned


def engine_config(plan: Any, base: list[str], pinned: dict[str, Any], dry: bool):
    from engine.config import load_config

    values = {**plan.engine_overrides(), **pinned}
    if dry:
        values["trainer.device"] = "cpu"
    text = [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in values.items()]
    return load_config([*base, *text, "trainer.logger=[console]"])


# ---------------------------------------------------------------------------
# measuring


class Device:
    """Peaks and synchronisation on the device the host uses (none on CPU)."""

    def __init__(self, torch_device: Any) -> None:
        import torch

        self.torch = torch
        self.cuda = torch_device.type == "cuda"

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def reset_peak(self) -> None:
        if self.cuda:
            self.sync()
            self.torch.cuda.reset_peak_memory_stats()

    def peaks(self) -> dict[str, float | None]:
        if not self.cuda:
            return {"peak_allocated_gib": None, "peak_reserved_gib": None}
        self.sync()
        return {
            "peak_allocated_gib": self.torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": self.torch.cuda.max_memory_reserved() / GIB,
        }


def timed(device: Device, fn: Any) -> tuple[Any, float]:
    device.sync()
    start = time.perf_counter()
    result = fn()
    device.sync()
    return result, time.perf_counter() - start


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def update_flops(shape_fields: dict[str, Any], tokens: int, context: float) -> float:
    """Model FLOPs of one forward and backward over ``tokens`` tokens (no recomputation
    counted, as MFU is defined): 6 × the matrix parameters (the embedding lookup is not a
    product; a tied head is) plus causal attention, 6 × layers × context × query width per
    token (QKᵀ and AV, forward and backward, half the square)."""
    h, layers = shape_fields["hidden_size"], shape_fields["num_hidden_layers"]
    heads, kv = shape_fields["num_attention_heads"], shape_fields["num_key_value_heads"]
    inter, vocab = shape_fields["intermediate_size"], shape_fields["vocab_size"]
    head_dim = shape_fields.get("head_dim") or h // heads
    q, kvw = heads * head_dim, kv * head_dim
    per_layer = h * q + 2 * h * kvw + q * h + 3 * h * inter
    matrix = layers * per_layer + h * vocab
    return tokens * (6 * matrix + 6 * layers * context * q)


# ---------------------------------------------------------------------------
# one case


def run_case(
    model_dir: Path,
    shape: Shape,
    variant: str,
    accelerator: str,
    dry: bool,
    first: tuple[list[list[int]], Any] | None,
) -> tuple[dict[str, Any], tuple[list[list[int]], Any]]:
    """One variant's phases; ``first``: the first case's responses and π_old, which this
    case trains on (and compares its π_old with), or None in the first case."""
    import torch

    from engine.types import ActorBatch, SamplingParams, TokenBatch
    from engine.workers.host import WorkerHost

    plan, base, pinned = plan_for(model_dir, accelerator, shape, VARIANTS[variant])
    cfg = engine_config(plan, base, pinned, dry)
    est = plan.memory
    record: dict[str, Any] = {
        "variant": variant,
        "plan": {
            "train_peak_gib": est.train_peak_gib,
            "rollout_peak_gib": est.rollout_peak_gib,
            "memory": est.to_json(),
            "overrides": {k: v for k, v in plan.engine_overrides().items()},
        },
        "phases": {},
    }
    start = time.perf_counter()
    host = WorkerHost(0, 1, 0, cfg, ["actor", "rollout"], cpus_per_worker=os.cpu_count() or 1)
    host.init_distributed("127.0.0.1", free_port())
    device = Device(host.device.torch_device())
    record["start_s"] = time.perf_counter() - start
    actor = host.roles["actor"]
    record["trainable_params"] = sum(
        p.numel() for p in actor.module.parameters() if p.requires_grad
    )
    phases = record["phases"]
    samples, base_logp = first if first is not None else (None, None)
    try:
        g = torch.Generator().manual_seed(0)
        prompts = [
            torch.randint(3, 2048, (shape.prompt_len,), generator=g).tolist()
            for _ in range(shape.prompts)
        ]
        expanded = [p for p in prompts for _ in range(shape.n)]
        sampling = SamplingParams(
            temperature=1.0, max_new_tokens=shape.response_len, ignore_eos=True
        )
        # Trained on full-length random responses, the same in every case (their π_old
        # must agree); generation is measured after the updates, in the steady state a
        # step generates in (Adam's states allocated), as the planner counts it.
        responses = samples if samples is not None else [
            torch.randint(3, 2048, (shape.response_len,), generator=g).tolist()
            for _ in expanded
        ]  # fmt: skip
        pad = host.roles["rollout"].engine.pad_token_id
        tokens = TokenBatch.from_ragged(expanded, responses, pad)
        real_tokens = int(tokens.attention_mask_BS.sum())
        device.reset_peak()
        logp, seconds = timed(device, lambda: host.call("actor", "log_probs", tokens))
        phases["log_probs"] = {
            "seconds": seconds,
            "tokens": real_tokens,
            "tokens_per_s": real_tokens / seconds,
            **device.peaks(),
        }
        logp = logp.float().cpu()
        if base_logp is not None:
            mask = tokens.response_mask_BR.bool()
            record["logp_max_abs_diff_vs_first"] = float((logp - base_logp)[mask].abs().max())
        # the same advantages in every case (their own draw: the responses come from g once)
        adv = torch.randn(tokens.response_mask_BR.shape, generator=torch.Generator().manual_seed(1))
        batch = ActorBatch(tokens=tokens, old_logprobs_BR=logp, advantages_BR=adv)
        before = _probe(actor)
        device.reset_peak()
        update_1, first_s = timed(device, lambda: host.call("actor", "update", batch))
        peaks_first = device.peaks()
        device.reset_peak()
        update_2, seconds = timed(device, lambda: host.call("actor", "update", batch))
        peaks = device.peaks()
        peak = {k: _max(peaks_first[k], peaks[k]) for k in peaks}
        context = (shape.prompt_len + shape.response_len) / 2
        flops = update_flops(_shape_fields(model_dir), real_tokens, context)
        peak_tflops = _peak_tflops(accelerator)
        phases["update"] = {
            "seconds": seconds,
            "first_seconds": first_s,
            "tokens": real_tokens,
            "tokens_per_s": real_tokens / seconds,
            "tflops": flops / seconds / 1e12,
            "mfu": flops / seconds / (peak_tflops * 1e12) if device.cuda else None,
            **peak,
            "plan_gib": est.train_peak_gib,
            "pg_loss": [update_1.get("actor/pg_loss"), update_2.get("actor/pg_loss")],
            "grad_norm": [update_1.get("actor/grad_norm"), update_2.get("actor/grad_norm")],
            "weights_changed": not torch.equal(before, _probe(actor)),
        }
        if variant in GENERATES:
            phases["generate"] = _generate(host, device, expanded, sampling, est.rollout_peak_gib)
        return record, (responses, logp) if first is None else first
    finally:
        host.close()
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def _generate(host: Any, device: Device, prompts: list, sampling: Any, plan_gib: float) -> dict:
    """The rollout's ``generate`` of every sample at full length, after a few tokens'
    warm-up (kernels, cuBLAS handles) that are not counted."""
    from engine.types import GenerationRequest

    warm = dataclasses.replace(sampling, max_new_tokens=4)
    host.call("rollout", "generate", GenerationRequest(prompts[:2], warm))
    device.reset_peak()
    out, seconds = timed(
        device, lambda: host.call("rollout", "generate", GenerationRequest(prompts, sampling))
    )
    new_tokens = sum(len(r) for r in out.response_ids)
    return {
        "seconds": seconds,
        "tokens": new_tokens,
        "tokens_per_s": new_tokens / seconds,
        **device.peaks(),
        "plan_gib": plan_gib,
    }


def _probe(actor: Any) -> Any:
    """A copy of one trained tensor (the adapter's under LoRA), to see the update land."""
    for _name, param in actor.module.named_parameters():
        if param.requires_grad:
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            return full.detach().float().cpu().clone()
    raise RuntimeError("the actor has no trainable parameter")


def _max(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else max(a, b)


def _shape_fields(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "config.json").read_text())


def _peak_tflops(accelerator: str) -> float:
    from rlctl.hardware import get_accelerator

    return get_accelerator(accelerator).bf16_tflops


# ---------------------------------------------------------------------------
# the run


def machine(dry: bool) -> dict[str, Any]:
    import torch
    import transformers

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpus": os.cpu_count(),
        "date": time.strftime("%Y-%m-%d"),
    }
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        info["peft"] = None
    if not dry and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=torch.cuda.get_device_name(0), device_gib=props.total_memory / GIB,
                    cuda=torch.version.cuda)  # fmt: skip
    else:
        info["device"] = "cpu (dry mode)"
    return info


def _whole_engine(
    workdir: Path, model: str, args: argparse.Namespace, dry: bool, began: float
) -> dict:
    import importlib.util

    check_only = args.engine_check_only
    if not check_only and importlib.util.find_spec("ray") is None:
        return {
            "returncode": None,
            "skipped": "ray is not importable (see scripts/gpu_proof_pack.sh)",
        }
    print(f"[gpu_proof] engine, {args.engine_steps} GRPO steps ...", flush=True)
    # what is left of the 10 minutes scripts/gpu_proof.sh allows (it stops the run at 590 s)
    left = 570 - (time.perf_counter() - began)
    return engine_run(workdir / model, workdir / "engine", args.engine_steps, dry, check_only,
                      timeout_s=max(60.0, left))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dry", action="store_true", help="CPU, gloo, small shapes: the same code")
    p.add_argument("--models", default=None, help=f"comma-separated, of {', '.join(MODELS)}")
    p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated")
    p.add_argument("--prompts", type=int, default=None, help="prompts per step (16; dry 2)")
    p.add_argument("--n", type=int, default=None, help="samples per prompt (4; dry 2)")
    p.add_argument("--prompt-len", type=int, default=None, help="tokens (256; dry 16)")
    p.add_argument("--response-len", type=int, default=None, help="tokens (512; dry 8)")
    p.add_argument("--budget-s", type=float, default=360, help="start no case after this")
    p.add_argument(
        "--engine-steps",
        type=int,
        default=2,
        help="GRPO steps of the whole engine (python -m engine.main) after the"
        " cases, where Ray imports; 0: none",
    )
    p.add_argument(
        "--engine-check-only",
        action="store_true",
        help="validate the whole-engine run's overrides (--check) instead",
    )
    p.add_argument("--workdir", default="/tmp/rlctl-gpu-proof", help="built models go here")
    p.add_argument("--out", required=True, help="the results file (.txt; a .json beside it)")
    args = p.parse_args(argv)
    began = time.perf_counter()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    dry = args.dry
    shape = Shape(
        prompts=args.prompts or (2 if dry else 16),
        n=args.n or (2 if dry else 4),
        prompt_len=args.prompt_len or (16 if dry else 256),
        response_len=args.response_len or (8 if dry else 512),
    )
    models = (args.models or ("0.5b" if dry else "0.5b,1.5b")).split(",")
    variants = args.variants.split(",")
    for name in [*models, *variants]:
        if name not in MODELS and name not in VARIANTS:
            p.error(
                f"unknown model or variant {name!r}: models {list(MODELS)}, variants {list(VARIANTS)}"
            )
    import torch

    info = machine(dry)
    accelerator = accelerator_name(info["device"])
    results: dict[str, Any] = {
        "machine": info,
        "accelerator": accelerator,
        "bf16_peak_tflops": _peak_tflops(accelerator),
        "shape": dataclasses.asdict(shape),
        "dry": dry,
        "cases": [],
        "skipped": [],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) / ("dry" if dry else "full")

    def write() -> None:
        results["wall_s"] = time.perf_counter() - began
        out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
        out.write_text(render_report(results))

    failures = 0
    for key in models:
        built = time.perf_counter()
        try:
            model_dir = build_model(MODELS[key], workdir / key, dry)
        except Exception:  # reported; the other models still run
            results["cases"].append(
                {"model": key, "variant": "build", "error": traceback.format_exc()}
            )
            failures += 1
            write()
            continue
        build_s = time.perf_counter() - built
        first = None
        for variant in variants:
            if time.perf_counter() - began > args.budget_s:
                results["skipped"].append(f"{key}/{variant}")
                continue
            print(f"[gpu_proof] {key} {variant} ...", flush=True)
            try:
                record, first = run_case(model_dir, shape, variant, accelerator, dry, first)
            except Exception:  # reported; the next case still runs
                record = {"variant": variant, "error": traceback.format_exc()}
                failures += 1
                print(record["error"], file=sys.stderr, flush=True)
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            record["model"] = key
            record["build_s"] = build_s
            results["cases"].append(record)
            write()
    if args.engine_steps and models:
        results["engine"] = _whole_engine(workdir, models[0], args, dry, began)
        failures += results["engine"]["returncode"] not in (0, None)
    write()
    print(out.read_text())
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
