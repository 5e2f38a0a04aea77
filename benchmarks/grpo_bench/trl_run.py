"""TRL's GRPOTrainer on the benchmark's configuration (trl 1.16.0), with HF
``generate`` or with vLLM colocated (``use_vllm=True, vllm_mode="colocate"``). Runs in
a child process of benchmarks/grpo_vs_trl.py."""

from __future__ import annotations

import os
import statistics
import time
from pathlib import Path
from typing import Any

from .config import Setup, StepRecord, load_prompts, write_child_result
from .contention import other_cores, snapshot


def vllm_args(setup: Setup) -> dict[str, Any]:
    """TRL's vLLM settings matched to the engine's vLLM rollout: one colocated engine,
    the same model length and batched-token budget, no sleep mode (vLLM's CPU platform
    has none), log-probs of the processed distribution, and no importance-sampling
    correction (it costs TRL a second forward of the batch the engine does not make by
    default)."""
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_tensor_parallel_size": 1,
        "vllm_max_model_length": setup.max_model_len,
        "vllm_enable_sleep_mode": False,
        "vllm_importance_sampling_correction": False,
    }


def child_trl(setup: Setup, out: Path, use_vllm: bool = False, sync: bool = True) -> None:
    """``sync=False`` (``trl-vllm-nosync``): TRL's push of the trained weights into vLLM
    is skipped, everything else runs. On vLLM's CPU build that push cannot run (TRL
    calls the model's ``load_weights`` after start, and vLLM has repacked the linear
    weights for the CPU kernels and dropped their loaders: ``AttributeError: 'Parameter'
    object has no attribute 'weight_loader'``), so this is what can be timed: a lower
    bound on TRL with vLLM, which a working push could only make slower."""
    import torch

    torch.set_num_threads(setup.threads)
    if use_vllm:
        # vLLM's CPU build sizes its KV cache from this (GiB), not from the GPU fraction;
        # 1 GiB is far more than 64 sequences of the tiny model need.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
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
        output_dir=str(out.parent / f"trl-output-{'vllm' if use_vllm else 'hf'}"),
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
        **(vllm_args(setup) if use_vllm else {}),
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

    # Instance attributes shadow the methods: generation (with the weight push, for
    # vLLM), and generation plus scoring, advantages and batch assembly.
    trainer._generate = timed("gen", trainer._generate)
    trainer._generate_and_score_completions = timed(
        "gen_and_score", trainer._generate_and_score_completions
    )
    if use_vllm:
        vllm = trainer.vllm_generation
        vllm.sync_weights = timed("sync", vllm.sync_weights if sync else lambda: None)

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
            sync = stage_s.get("sync", 0.0)
            gen = stage_s.get("gen", 0.0)
            prep = stage_s.get("gen_and_score", 0.0)
            stages = {"sync": sync} if use_vllm else {}
            # score_and_prep: decoding, rewards, advantages, batch assembly;
            # update: the loss forward, backward and optimizer step.
            stages |= {"gen": gen - sync, "score_and_prep": prep - gen, "update": seconds - prep}
            self.records.append(
                StepRecord(
                    seconds=seconds,
                    tokens=int(state.num_input_tokens_seen - self._tokens),
                    stages=stages,
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
