"""Start an SFT run: the data, Ray, the workers, the trackers; then the loop.

Why Ray workers and not torchrun's SPMD launch (verl's): the engine already runs every
trained role as a Ray actor on every node (``engine.workers.host.WorkerHost``), and
rlctl's jobs already start a Ray cluster across the nodes (local, Slurm, SkyPilot) and
run the engine's module on the head. One more role on those workers keeps one launch
path, and the host's process group, device and seeds, its checkpoint and random-state
files and bucket uploads, the worker group's dispatch by Megatron's layout, the hang
watchdog and the trackers are the RL trainer's, not copies. What it costs: each step's
batch (token ids) crosses Ray to the workers, a few milliseconds.

The driver reads and tokenizes the conversations on a thread while Ray starts (the two
take seconds each), as ``engine.runtime`` does for prompts.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint import CheckpointManager, read_trainer_state
from engine.config import EngineConfig
from engine.config.dump import to_yaml
from engine.config.sft import engine_view, with_device
from engine.config.sft_sections import SFTConfig
from engine.errors import ConfigError, EngineError
from engine.runtime import init_ray, resolve_cluster_device, run_dir, write_worker_table
from engine.sft.trainer import StopRule

ROLE = "sft"


@dataclass
class SFTData:
    """What the driver reads before the workers build their models."""

    tokenizer: Any
    train: Any  # engine.sft.dataset.ConversationDataset
    loader: Any  # engine.data.loader.PromptLoader
    val: Any  # ConversationDataset | None
    total_steps: int


def run_sft(cfg: SFTConfig, stop: StopRule | None = None) -> None:
    """Train; ``stop(step, metrics)`` ends the run early once true (a caller's rule, after
    that step's checkpoint)."""
    here = Path(__file__).resolve().parents[1]
    print(f"engine: running {here} with {sys.executable}", flush=True)
    cfg = with_saved_adapter(cfg)
    starting = ThreadPoolExecutor(1, thread_name_prefix="engine-data")
    workers = None
    try:
        reading = starting.submit(read_data, cfg)
        init_ray(engine_view(cfg, 1))
        cfg = with_device(cfg, resolve_cluster_device(engine_view(cfg, 1)))
        workers = spawn_workers(cfg)
        data = reading.result()
        view = engine_view(cfg, data.total_steps)
        workers.start(view)
        starting.shutdown()
        train(cfg, view, workers, data, stop)
    finally:
        starting.shutdown(cancel_futures=True)
        if workers is not None:
            workers.shutdown()
    if cfg.trainer.export_hf_dir:
        from engine.export import export_checkpoint

        out = export_checkpoint(cfg.trainer.default_local_dir, cfg.trainer.export_hf_dir, ROLE)
        print(f"exported the fine-tuned model to {out}", flush=True)


def with_saved_adapter(cfg: SFTConfig) -> SFTConfig:
    """``model.lora_adapter_path``'s rank, alpha and targets as the run's (checked)."""
    if not cfg.model.lora_adapter_path:
        return cfg
    from engine.train.lora_saved import adapter_settings

    return dataclasses.replace(cfg, model=adapter_settings(cfg.model))


def read_data(cfg: SFTConfig) -> SFTData:
    """The tokenizer, the datasets and their loader, and the checks that need the
    model's config: before any worker builds a model."""
    from transformers import AutoTokenizer

    from engine.data.loader import PromptLoader
    from engine.sft.dataset import ConversationDataset

    model, data = cfg.model, cfg.data
    tokenizer = AutoTokenizer.from_pretrained(
        model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code
    )
    train = ConversationDataset(data.train_file_list, tokenizer, data, data.train_max_samples)
    loader = PromptLoader(train, data.train_batch_size, shuffle=True, seed=cfg.trainer.seed)
    val = (
        ConversationDataset(data.val_file_list, tokenizer, data, data.val_max_samples)
        if data.val_file_list
        else None
    )
    total = cfg.trainer.total_training_steps or len(loader) * cfg.trainer.total_epochs
    print(
        f"sft: {len(train)} training conversations ({train.loss_tokens} loss tokens,"
        f" {train.truncated} cut to data.max_length), {len(loader)} steps an epoch,"
        f" {total} steps" + (f"; {len(val)} validation conversations" if val else ""),
        flush=True,
    )
    _check_model(cfg)
    return SFTData(tokenizer, train, loader, val, total)


def _check_model(cfg: SFTConfig) -> None:
    """From the model's config, now: override_config's fields, the heads a Ulysses size
    needs, a quantized checkpoint trained in full, LoRA targets that match nothing."""
    from engine.config.train import ulysses_heads_problems
    from engine.models.hf_config import load_hf_config

    model = cfg.model
    hf = load_hf_config(model, "model").get_text_config()
    key = "engine.ulysses_sequence_parallel_size"
    problems = ulysses_heads_problems(cfg.engine.ulysses_sequence_parallel_size, key, hf)
    if getattr(hf, "quantization_config", None) and not model.uses_lora:
        problems.append(
            f"model.path={model.path!r} is a quantized checkpoint: its weights cannot be"
            " trained in full; set model.lora_rank to train an adapter over it"
        )
    if problems:
        raise ConfigError(problems)
    if model.lora_rank > 0:
        from engine.train.lora import check_targets

        check_targets(model)


def spawn_workers(cfg: SFTConfig) -> Any:
    """One worker group, one worker a device, each holding the ``sft`` role (its
    processes started; ``start`` builds the models)."""
    from engine.controller.dispatch import ModelParallelLayout
    from engine.controller.worker_group import PoolSpec, ResourcePool, WorkerGroup
    from engine.device import DEVICES
    from engine.workers.host import WorkerHost

    t, e = cfg.trainer, cfg.engine
    spec = DEVICES["cuda" if t.device == "cuda" else t.device]
    pool = ResourcePool(
        PoolSpec(t.nnodes, t.n_gpus_per_node, spec.ray_resource, t.cpus_per_worker),
        name="sft",
    )
    layout = (
        ModelParallelLayout(
            tp=e.tensor_model_parallel_size,
            pp=e.pipeline_model_parallel_size,
            cp=e.context_parallel_size,
        )
        if cfg.megatron
        else ModelParallelLayout(cp=e.ulysses_sequence_parallel_size)
    )
    host = {"cfg": engine_view(cfg, 1), "roles": [ROLE], "cpus_per_worker": t.cpus_per_worker}
    return WorkerGroup(pool, WorkerHost, host, layouts={ROLE: layout})


def train(
    cfg: SFTConfig, view: EngineConfig, workers: Any, data: SFTData, stop: StopRule | None
) -> None:
    """The loop on workers that are up, with its trackers, checkpoints and watchdog."""
    from engine.sft.trainer import SFTTrainer
    from engine.tracking import Tracker
    from engine.watchdog import watching

    checkpoints = CheckpointManager(view.trainer)
    resume_from = checkpoints.resume_point()
    resumed_step = read_trainer_state(resume_from).step if resume_from else 0
    folder = run_dir(view)
    table = write_worker_table(workers, folder)
    pad = data.tokenizer.pad_token_id
    pad = data.tokenizer.eos_token_id if pad is None else pad
    if pad is None:
        raise EngineError("the tokenizer has neither a pad nor an eos token to pad rows with")
    config = dataclasses.asdict(cfg)
    with Tracker(view.trainer, folder, config, data.total_steps, resumed_step) as tracker:
        trainer = SFTTrainer(
            cfg,
            workers,
            pad,
            data.loader,
            data.val,
            tracker,
            checkpoints,
            to_yaml(cfg),
            data.total_steps,
            resume_from,
            stop,
        )
        previous = signal.signal(signal.SIGTERM, lambda *_: trainer.request_stop())
        try:
            with watching(view.trainer, workers, table, lambda: trainer.step):
                trainer.fit()
        finally:
            signal.signal(signal.SIGTERM, previous)
