"""One GRPO step, three ways: this engine, TRL's GRPOTrainer, and the floor.

The same configuration runs through each system in turn, each in its own process
(they share no threads or memory), and the per-step times are compared:

1. the engine (``python -m engine.main``) in two layouts: one worker with two threads
   (``engine-1x2``, the like-for-like layout against single-process TRL) and two FSDP
   workers with one thread each (``engine-2x1``);
2. TRL's ``GRPOTrainer`` (trl 1.16.0, ``pip install -e ".[bench]"``), one process,
   two threads;
3. the floor: one process, two threads, one Hugging Face ``generate`` of the same 64
   completions and one forward/backward/AdamW step on them per iteration, with the
   same activation checkpointing setting. No scoring, no Ray, no FSDP: the least any
   implementation can spend on a step of this configuration.

Every system gets the tiny Qwen2 model (``engine.models.tiny``), the synthetic sums
task (``engine.data.synthetic``) in the same order (no shuffling), 8 prompts × 8
samples = 64 completions of at most 32 tokens per step, temperature 1.0, lr 1e-5, no
KL term, fp32 on CPU, and one optimizer step per generation.

    python benchmarks/grpo_vs_trl.py                       # all systems, 2 + 8 steps each
    python benchmarks/grpo_vs_trl.py --steps 8 --warmup 2 --out results.json
    python benchmarks/grpo_vs_trl.py --systems engine-1x2,floor

Each step's tokens are the attention-mask sum of its 64 sequences (prompt tokens plus
completion tokens up to and including EOS), counted the same way for every system.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SYSTEMS = ("engine-1x2", "engine-2x1", "trl", "floor")
# The engine's per-step stages (timing_s/*) shown in the breakdown; what the step spends
# outside them is "other". The engine's "gen" timer includes "reward".
ENGINE_STAGES = ("gen", "reward", "old_log_prob", "adv", "update_actor")
# A step during which the rest of the machine kept less than this many cores busy counts
# as quiet: its time is the system's own, not the neighbours'.
QUIET_OTHER_CORES = 0.25


@dataclasses.dataclass(frozen=True)
class Setup:
    """The one GRPO configuration every system runs."""

    model_dir: str
    train_file: str
    steps: int = 8  # measured steps
    warmup: int = 2  # steps run first and not measured
    prompts: int = 8  # P prompts per step
    n: int = 8  # samples per prompt
    max_new_tokens: int = 32
    temperature: float = 1.0
    lr: float = 1e-5
    weight_decay: float = 0.01  # the engine's AdamW default; TRL is set to match
    grad_clip: float = 1.0
    threads: int = 2  # torch threads of the single-process systems
    gradient_checkpointing: bool = True  # the default of both the engine and TRL
    seed: int = 1

    @property
    def total_steps(self) -> int:
        return self.warmup + self.steps

    @property
    def samples(self) -> int:
        return self.prompts * self.n


@dataclasses.dataclass
class StepRecord:
    """What one system reports for one measured step."""

    seconds: float  # the step as the system times it
    tokens: int  # attention-mask sum of the step's sequences
    stages: dict[str, float] = dataclasses.field(default_factory=dict)
    response_length: float = 0.0  # mean completion tokens
    wall_s: float | None = None  # previous step's end to this one's, seen from outside
    other_cores: float | None = None  # CPU cores other processes kept busy meanwhile


# ---------------------------------------------------------------------------
# contention: what the rest of the machine did while a system ran


@dataclasses.dataclass(frozen=True)
class CpuSnapshot:
    t: float  # perf_counter seconds
    machine_busy_s: float  # CPU seconds every process has used, all cores
    own_cpu_s: float  # CPU seconds the measured system has used


def machine_busy_s() -> float:
    """CPU seconds spent busy since boot, all cores (Linux ``/proc/stat``; 0 elsewhere)."""
    try:
        first = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    except OSError:
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, *rest = (int(x) for x in first[1:])
    steal = rest[0] if rest else 0
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def snapshot(own_cpu_s: float) -> CpuSnapshot:
    return CpuSnapshot(time.perf_counter(), machine_busy_s(), own_cpu_s)


def other_cores(a: CpuSnapshot, b: CpuSnapshot) -> float | None:
    """Cores the rest of the machine kept busy between two snapshots. Well above 0, the
    system shared its cores with someone else and its times are inflated."""
    if b.t <= a.t or not b.machine_busy_s:
        return None
    foreign = (b.machine_busy_s - a.machine_busy_s) - (b.own_cpu_s - a.own_cpu_s)
    return max(0.0, foreign) / (b.t - a.t)


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live descendants (the engine's driver, Ray's
    daemons and workers, the reward worker), plus this benchmark process's own."""
    import psutil  # a dependency of accelerate, which trl brings

    total = time.process_time()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


# ---------------------------------------------------------------------------
# setup


def prepare(workdir: Path, steps: int, warmup: int, gradient_checkpointing: bool) -> Setup:
    """Build the tiny model and the synthetic data once, for all systems."""
    sys.path.insert(0, str(REPO))
    from transformers.utils import logging as hf_logging

    from engine.data.synthetic import write_synthetic_dataset
    from engine.models.tiny import build_tiny_model

    hf_logging.disable_progress_bar()
    model_dir = build_tiny_model(workdir / "model")
    # One epoch covers every step, so no system wraps around to a new epoch.
    train, _ = write_synthetic_dataset(
        workdir / "data", n_train=max(64, (warmup + steps) * Setup.prompts), n_val=8
    )
    return Setup(
        model_dir=str(model_dir),
        train_file=str(train),
        steps=steps,
        warmup=warmup,
        gradient_checkpointing=gradient_checkpointing,
    )


def load_prompts(setup: Setup) -> list[dict[str, Any]]:
    """The training rows in file order: the chat and the reference answer."""
    import pyarrow.parquet as pq

    rows = pq.read_table(setup.train_file).to_pylist()
    return [
        {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]} for r in rows
    ]


def child_env(threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_DISABLE_PROGRESS_BARS="1",
        CUDA_VISIBLE_DEVICES="",  # CPU only, even where a GPU exists
        PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
    )
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


# ---------------------------------------------------------------------------
# 1. the engine


def engine_overrides(setup: Setup, workers: int, cpus_per_worker: int, run_dir: Path) -> list[str]:
    per_device = setup.samples // workers  # samples each worker gets per mini-batch
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        f"data.train_files={setup.train_file}",
        f"data.train_batch_size={setup.prompts}",
        f"data.max_response_length={setup.max_new_tokens}",
        "data.shuffle=false",
        f"actor_rollout_ref.model.path={setup.model_dir}",
        f"actor_rollout_ref.model.enable_gradient_checkpointing={str(setup.gradient_checkpointing).lower()}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={setup.prompts}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={per_device}",
        "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.actor.optim.lr={setup.lr}",
        f"actor_rollout_ref.actor.optim.weight_decay={setup.weight_decay}",
        f"actor_rollout_ref.actor.grad_clip={setup.grad_clip}",
        f"actor_rollout_ref.rollout.n={setup.n}",
        f"actor_rollout_ref.rollout.temperature={setup.temperature}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={per_device}",
        "trainer.device=cpu",
        "trainer.val_before_train=false",
        f"trainer.n_gpus_per_node={workers}",
        f"trainer.cpus_per_worker={cpus_per_worker}",
        f"trainer.total_training_steps={setup.total_steps}",
        f"trainer.seed={setup.seed}",
        f"trainer.default_local_dir={run_dir}",
        "trainer.logger=[console]",
        "reward_model.num_workers=1",
    ]


def run_engine(setup: Setup, workers: int, cpus_per_worker: int, run_dir: Path) -> dict[str, Any]:
    """Run the engine to the end; read its per-step metrics from metrics.jsonl. The
    console's step lines are timestamped as they arrive: the intervals between them
    are the wall time of whole steps (controller bookkeeping and logging included)."""
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cmd = [
        sys.executable,
        "-m",
        "engine.main",
        *engine_overrides(setup, workers, cpus_per_worker, run_dir),
    ]
    start = time.perf_counter()
    arrivals: list[CpuSnapshot] = []
    log_lines: list[str] = []
    with subprocess.Popen(
        cmd,
        cwd=REPO,
        env=child_env(None),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            log_lines.append(line)
            if line.startswith("step "):
                arrivals.append(snapshot(tree_cpu_s(proc.pid)))
    if proc.returncode != 0:
        tail = "".join(log_lines[-30:])
        raise RuntimeError(f"the engine exited with code {proc.returncode}:\n{tail}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = []
    for i, record in enumerate(records):
        stages = {s: record.get(f"timing_s/{s}", 0.0) for s in ENGINE_STAGES}
        stages["gen"] -= stages["reward"]  # generation alone
        previous = arrivals[i - 1] if 0 < i < len(arrivals) else None
        steps.append(
            StepRecord(
                seconds=record["timing_s/step"],
                tokens=int(record["perf/total_num_tokens"]),
                stages=stages,
                response_length=record["response_length/mean"],
                wall_s=arrivals[i].t - previous.t if previous else None,
                other_cores=other_cores(previous, arrivals[i]) if previous else None,
            )
        )
    return {"steps": steps[setup.warmup :], "process_s": time.perf_counter() - start}


# ---------------------------------------------------------------------------
# 2. TRL's GRPOTrainer (runs in a child process)


def child_trl(setup: Setup, out: Path) -> None:
    import torch

    torch.set_num_threads(setup.threads)
    import transformers
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from engine.reward.synthetic import compute_score

    transformers.logging.set_verbosity_error()
    rows = load_prompts(setup)[: setup.total_steps * setup.prompts]
    dataset = Dataset.from_list(rows)

    def synthetic_reward(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [compute_score(t, g)["score"] for t, g in zip(texts, ground_truth, strict=True)]

    args = GRPOConfig(
        output_dir=str(out.parent / "trl-output"),
        use_cpu=True,
        bf16=False,
        fp16=False,
        report_to="none",
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="no",
        seed=setup.seed,
        # One training step = one generation of P × n completions = one optimizer step:
        # the global batch is the generation batch (steps_per_generation = 1) and each
        # batch is used once (num_iterations = 1), so TRL skips the old-log-prob pass.
        per_device_train_batch_size=setup.samples,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=setup.n,
        max_completion_length=setup.max_new_tokens,
        temperature=setup.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        learning_rate=setup.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=setup.weight_decay,
        max_grad_norm=setup.grad_clip,
        gradient_checkpointing=setup.gradient_checkpointing,
        max_steps=setup.total_steps,
        shuffle_dataset=False,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        model_init_kwargs={"dtype": torch.float32},
    )
    tokenizer = AutoTokenizer.from_pretrained(setup.model_dir)
    trainer = GRPOTrainer(
        model=setup.model_dir,
        reward_funcs=synthetic_reward,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )

    stage_s: dict[str, float] = {}
    lengths: list[float] = []

    def timed(name: str, fn: Any) -> Any:
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.perf_counter()
            try:
                result = fn(*a, **kw)
            finally:
                stage_s[name] = stage_s.get(name, 0.0) + time.perf_counter() - t0
            if name == "gen":  # (prompt_ids, completion_ids, ...): ids up to and with EOS
                lengths.append(statistics.fmean(len(c) for c in result[1]))
            return result

        return wrapper

    # Instance attributes shadow the methods: generation alone, and generation plus
    # scoring, advantages and batch assembly.
    trainer._generate = timed("gen", trainer._generate)
    trainer._generate_and_score_completions = timed(
        "gen_and_score", trainer._generate_and_score_completions
    )

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.records: list[StepRecord] = []
            self._begin = self._end = snapshot(time.process_time())
            self._tokens = 0

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            stage_s.clear()
            self._tokens = state.num_input_tokens_seen
            self._begin = snapshot(time.process_time())

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            end = snapshot(time.process_time())
            seconds = end.t - self._begin.t
            gen = stage_s.get("gen", 0.0)
            prep = stage_s.get("gen_and_score", 0.0)
            self.records.append(
                StepRecord(
                    seconds=seconds,
                    tokens=int(state.num_input_tokens_seen - self._tokens),
                    # score_and_prep: decoding, rewards, advantages, batch assembly;
                    # update: the loss forward, backward and optimizer step.
                    stages={"gen": gen, "score_and_prep": prep - gen, "update": seconds - prep},
                    response_length=lengths[-1] if lengths else 0.0,
                    wall_s=end.t - self._end.t if self.records else None,
                    other_cores=other_cores(self._begin, end),
                )
            )
            self._end = end

    timer = StepTimer()
    trainer.add_callback(timer)
    trainer.train()
    write_child_result(out, timer.records)


# ---------------------------------------------------------------------------
# 3. the floor (runs in a child process)


def child_floor(setup: Setup, out: Path) -> None:
    import torch
    import torch.nn.functional as F
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(setup.threads)
    torch.manual_seed(setup.seed)
    tokenizer = AutoTokenizer.from_pretrained(setup.model_dir)
    model = AutoModelForCausalLM.from_pretrained(setup.model_dir, dtype=torch.float32)
    if setup.gradient_checkpointing:  # the same configuration as the other systems
        enable = getattr(model, "activation_checkpointing_enable", None)  # transformers 5
        (enable or model.gradient_checkpointing_enable)({"use_reentrant": False})
    optimizer = torch.optim.AdamW(model.parameters(), lr=setup.lr, weight_decay=setup.weight_decay)
    eos = model.generation_config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    rows = load_prompts(setup)
    records: list[StepRecord] = []
    for step in range(setup.total_steps):
        chats = [r["prompt"] for r in rows[step * setup.prompts : (step + 1) * setup.prompts]]
        begin = snapshot(time.process_time())
        # Tokenised as the engine's dataset does it: template as text, then no specials.
        texts = tokenizer.apply_chat_template(chats, tokenize=False, add_generation_prompt=True)
        encoded = tokenizer(texts, add_special_tokens=False)["input_ids"]
        prompt_ids = [ids for ids in encoded for _ in range(setup.n)]
        width = max(len(p) for p in prompt_ids)
        input_ids = torch.full((len(prompt_ids), width), pad, dtype=torch.long)
        prompt_mask = torch.zeros_like(input_ids)
        for i, ids in enumerate(prompt_ids):
            input_ids[i, width - len(ids) :] = torch.tensor(ids)
            prompt_mask[i, width - len(ids) :] = 1
        model.eval()
        with torch.no_grad():
            sequences = model.generate(
                input_ids=input_ids,
                attention_mask=prompt_mask,
                do_sample=True,
                temperature=setup.temperature,
                top_p=1.0,
                top_k=None,
                max_new_tokens=setup.max_new_tokens,
                eos_token_id=eos,
                pad_token_id=pad,
            )
        gen_s = time.perf_counter() - begin.t
        completion = sequences[:, width:]
        is_eos = completion == eos
        no_eos = torch.full_like(completion[:, 0], completion.shape[1])
        first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), no_eos)
        completion_mask = (torch.arange(completion.shape[1]) <= first_eos[:, None]).long()
        attention = torch.cat([prompt_mask, completion_mask], dim=1)
        # Any advantages do: the floor measures the work, not the learning.
        advantages = torch.randn(len(prompt_ids), 1)
        model.train()
        # The LM head only where a completion token is predicted (as TRL and the engine).
        r_len = completion.shape[1]
        logits = model(
            input_ids=sequences, attention_mask=attention, logits_to_keep=r_len + 1
        ).logits[:, :-1]
        logp = torch.gather(F.log_softmax(logits, -1), 2, completion[..., None]).squeeze(-1)
        mask = completion_mask.float()
        loss = -(advantages * logp * mask).sum() / mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        end = snapshot(time.process_time())
        records.append(
            StepRecord(
                seconds=end.t - begin.t,
                tokens=int(attention.sum()),
                stages={"gen": gen_s, "update": end.t - begin.t - gen_s},
                response_length=float(mask.sum(1).mean()),
                wall_s=end.t - begin.t,  # nothing runs between the floor's steps
                other_cores=other_cores(begin, end),
            )
        )
    write_child_result(out, records)


def write_child_result(out: Path, records: list[StepRecord]) -> None:
    out.write_text(json.dumps([dataclasses.asdict(r) for r in records]))


def run_child(kind: str, setup: Setup, workdir: Path) -> dict[str, Any]:
    out = workdir / f"{kind}.json"
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--child",
        kind,
        "--child-setup",
        json.dumps(dataclasses.asdict(setup)),
        "--child-out",
        str(out),
    ]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd, cwd=REPO, env=child_env(setup.threads), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} exited with code {proc.returncode}:\n{proc.stderr[-3000:]}")
    steps = [StepRecord(**r) for r in json.loads(out.read_text())[setup.warmup :]]
    return {"steps": steps, "process_s": time.perf_counter() - start}


# ---------------------------------------------------------------------------
# report


def machine() -> dict[str, Any]:
    import torch
    import transformers

    try:
        import trl

        trl_version = trl.__version__
    except ImportError:
        trl_version = None
    cpu_model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads_default": torch.get_num_threads(),
        "transformers": transformers.__version__,
        "trl": trl_version,
        "platform": platform.platform(),
    }


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize(name: str, result: dict[str, Any]) -> dict[str, Any]:
    steps: list[StepRecord] = result["steps"]
    seconds = [s.seconds for s in steps]
    stage_names = list(dict.fromkeys(k for s in steps for k in s.stages))
    stages = {k: statistics.median(s.stages.get(k, 0.0) for s in steps) for k in stage_names}
    median_s = statistics.median(seconds)
    stages["other"] = max(0.0, median_s - sum(stages.values()))
    quiet = [
        s.seconds for s in steps if s.other_cores is not None and s.other_cores < QUIET_OTHER_CORES
    ]
    return {
        "system": name,
        "step_s_median": median_s,
        "step_s_min": min(seconds),
        "step_s_quiet_median": _median(quiet),
        "quiet_steps": len(quiet),
        "steps": len(steps),
        "wall_s_median": _median([s.wall_s for s in steps if s.wall_s is not None]),
        "tokens_per_step": statistics.median(s.tokens for s in steps),
        "tokens_per_s": statistics.median(s.tokens / s.seconds for s in steps),
        "response_length_mean": statistics.fmean(s.response_length for s in steps),
        "other_cores_median": _median([s.other_cores for s in steps if s.other_cores is not None]),
        "stages_median_s": stages,
        "process_s": result["process_s"],
        "per_step": [dataclasses.asdict(s) for s in steps],
    }


def ratio(a: dict[str, Any] | None, b: dict[str, Any] | None, key: str) -> float | None:
    if a is None or b is None or a.get(key) is None or b.get(key) is None:
        return None
    return a[key] / b[key]


RATIO_PAIRS = (
    ("engine-1x2", "trl"),
    ("engine-1x2", "floor"),
    ("engine-2x1", "trl"),
    ("engine-2x1", "floor"),
    ("trl", "floor"),
)
RATIO_KEYS = (
    ("median", "step_s_median"),
    ("min", "step_s_min"),
    ("quiet median", "step_s_quiet_median"),
)


def all_ratios(summaries: dict[str, dict[str, Any]]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for a, b in RATIO_PAIRS:
        values = {
            label: ratio(summaries.get(a), summaries.get(b), key) for label, key in RATIO_KEYS
        }
        values = {k: v for k, v in values.items() if v is not None}
        if values:
            out[f"{a}/{b}"] = values
    return out


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def format_report(summaries: dict[str, dict[str, Any]], info: dict[str, Any], setup: Setup) -> str:
    lines = [
        f"machine: {info['cpu_model']}, {info['cores']} cores ({info['usable_cores']} usable), "
        f"{info['memory_gb']} GB; python {info['python']}, torch {info['torch']}, "
        f"transformers {info['transformers']}, trl {info['trl']}",
        f"config: {setup.prompts} prompts x {setup.n} samples = {setup.samples} completions, "
        f"<= {setup.max_new_tokens} new tokens, T={setup.temperature}, lr {setup.lr}, no KL, "
        f"fp32 CPU, gradient checkpointing {'on' if setup.gradient_checkpointing else 'off'} "
        f"(engine, TRL); {setup.warmup} warmup + {setup.steps} measured steps",
        "",
        f"{'system':<11} {'median s':>8} {'min s':>6} {'quiet med s (n)':>15} {'wall s':>6} "
        f"{'tok/step':>8} {'tok/s':>6} {'resp len':>8} {'other cores':>11}",
    ]
    for name, s in summaries.items():
        quiet = f"{_fmt(s['step_s_quiet_median'])} ({s['quiet_steps']}/{s['steps']})"
        lines.append(
            f"{name:<11} {s['step_s_median']:>8.3f} {s['step_s_min']:>6.3f} {quiet:>15} "
            f"{_fmt(s['wall_s_median']):>6} {s['tokens_per_step']:>8.0f} {s['tokens_per_s']:>6.0f} "
            f"{s['response_length_mean']:>8.1f} {_fmt(s['other_cores_median'], '.2f'):>11}"
        )
    lines += ["", "ratios of s/step (below 1: the first is faster):"]
    for pair, values in all_ratios(summaries).items():
        parts = ", ".join(f"{label} {v:.2f}x" for label, v in values.items())
        lines.append(f"  {pair:<19} {parts}")
    lines += ["", "where the time goes (median s per stage; other = step - stages):"]
    for name, s in summaries.items():
        stages = ", ".join(f"{k} {v:.3f}" for k, v in s["stages_median_s"].items())
        lines.append(f"  {name:<11} {stages}")
    lines.append(
        f"\nother cores: CPU cores the rest of the machine kept busy during the steps; quiet "
        f"steps are those under {QUIET_OTHER_CORES}."
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="GRPO step time: this engine vs TRL's GRPOTrainer vs a generate+update floor.",
    )
    parser.add_argument("--steps", type=int, default=8, help="measured steps per system")
    parser.add_argument("--warmup", type=int, default=2, help="steps run first and not measured")
    parser.add_argument("--out", type=Path, help="also write the numbers as JSON here")
    parser.add_argument(
        "--systems",
        default=",".join(SYSTEMS),
        help=f"comma-separated subset of {', '.join(SYSTEMS)} (default: all)",
    )
    parser.add_argument(
        "--no-gradient-checkpointing",
        action="store_true",
        help="turn activation checkpointing off in the engine, TRL and the floor (default: on)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where the model, data and runs go, kept afterwards (default: a temp dir, removed)",
    )
    parser.add_argument("--child", choices=("trl", "floor"), help=argparse.SUPPRESS)
    parser.add_argument("--child-setup", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.warmup < 0:
        parser.error("--steps must be >= 1 and --warmup >= 0")
    unknown = set(args.systems.split(",")) - set(SYSTEMS)
    if unknown:
        parser.error(f"unknown system(s) {', '.join(sorted(unknown))}; valid: {', '.join(SYSTEMS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.child:
        sys.path.insert(0, str(REPO))
        setup = Setup(**json.loads(args.child_setup))
        (child_trl if args.child == "trl" else child_floor)(setup, args.child_out)
        return
    systems = [s for s in SYSTEMS if s in args.systems.split(",")]
    if args.workdir:
        args.workdir.mkdir(parents=True, exist_ok=True)
        run_all(args, systems, args.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="grpo-bench-") as tmp:
            run_all(args, systems, Path(tmp))


def run_all(args: argparse.Namespace, systems: list[str], workdir: Path) -> None:
    setup = prepare(workdir, args.steps, args.warmup, not args.no_gradient_checkpointing)
    info = machine()
    summaries: dict[str, dict[str, Any]] = {}
    for name in systems:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        if name == "engine-1x2":
            result = run_engine(setup, 1, setup.threads, workdir / name)
        elif name == "engine-2x1":
            result = run_engine(setup, 2, 1, workdir / name)
        else:
            result = run_child(name, setup, workdir)
        summaries[name] = summarize(name, result)
        print(
            f"  {name}: median {summaries[name]['step_s_median']:.3f} s/step "
            f"({result['process_s']:.0f} s in all)",
            file=sys.stderr,
            flush=True,
        )
    print(format_report(summaries, info, setup))
    if args.out:
        payload = {
            "machine": info,
            "setup": dataclasses.asdict(setup),
            "systems": summaries,
            "ratios": all_ratios(summaries),
        }
        args.out.write_text(json.dumps(payload, indent=2) + "\n")
        print(f"wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
