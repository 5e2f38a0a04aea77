"""``trainer``: the run as a whole (``engine.runtime``, ``engine.trainer``,
``engine.checkpoint``, ``engine.tracking``): devices, length, checkpoints, resumption,
loggers; and the rules on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.config.fields import choice, one_of, positive, setting

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

DEVICES = ("auto", "cuda", "npu", "cpu")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


@dataclass
class TrainerConfig:
    """The run: where it runs, how long, where its checkpoints and metrics go."""

    project_name: str = setting("rlctl", "Project the run is logged under (wandb, mlflow).")
    experiment_name: str = setting("run", "Name of the run in the loggers.")
    nnodes: int = setting(1, "Nodes the run spans.")
    n_gpus_per_node: int = setting(
        8, "Devices per node (worker processes per node when device=cpu)."
    )
    device: str = setting(
        "auto",
        "auto (what the cluster has), cuda (NVIDIA, and AMD through ROCm), npu (Ascend) or cpu.",
    )
    cpus_per_worker: int = setting(1, "CPU cores reserved for each device's worker process.")
    total_epochs: int = setting(1, "Passes over the training prompts.")
    total_training_steps: int | None = setting(
        None, "Training steps to run, instead of `total_epochs`; null: from the epochs."
    )
    critic_warmup: int = setting(0, "First steps that train the critic only.")
    save_freq: int = setting(-1, "Save a checkpoint every N steps and at the last step; -1: never.")
    test_freq: int = setting(
        -1, "With val_files, validate every N steps and after the last; -1: after the last only."
    )
    val_before_train: bool = setting(
        True, "With val_files, validate before the first step (not when resuming)."
    )
    resume_mode: str = setting(
        "auto",
        "auto (the last complete checkpoint in `default_local_dir`, if any), disable, or"
        " resume_path (`resume_from_path`).",
    )
    resume_from_path: str | None = setting(
        None, "resume_mode=resume_path: the global_step_<k> checkpoint (a path or bucket URL)."
    )
    rollout_data_dir: str | None = setting(
        None,
        "Write each step's samples to <dir>/<step>.jsonl (verl's key): the prompt, the"
        " response, the ground truth, the score and the prompt's index in the training set.",
    )
    logger: list[str] = setting(
        help=f"Where metrics go, any of: {one_of(LOGGERS)}.", factory=lambda: ["console"]
    )
    default_local_dir: str = setting(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "The run's folder (checkpoints, metrics): a local path or a bucket URL (s3://, gs://).",
    )
    max_actor_ckpt_to_keep: int | None = setting(
        None, "Keep the last K complete checkpoints; null: all."
    )
    preemption_save_steps: int = setting(
        1,
        "On SIGTERM, save first if this many steps ran since the last checkpoint (0: never);"
        " the exit code 75 asks to be requeued.",
    )
    max_consecutive_skipped_updates: int = setting(
        5, "Stop after this many actor updates in a row with a NaN/inf loss or gradient."
    )
    export_hf_dir: str | None = setting(
        None,
        "Export the final checkpoint to this folder as a Hugging Face model (needs save_freq).",
    )
    seed: int = setting(1, "Seed of model building, sampling and validation.")


def rules(cfg: EngineConfig) -> list[str]:
    t = cfg.trainer
    p = choice(t.device, DEVICES, "trainer.device", "device")
    p += choice(t.resume_mode, RESUME_MODES, "trainer.resume_mode", "resume mode")
    for logger in t.logger:
        p += choice(logger, LOGGERS, "trainer.logger", "logger")
    p += positive(
        [
            ("trainer.nnodes", t.nnodes),
            ("trainer.n_gpus_per_node", t.n_gpus_per_node),
            ("trainer.total_epochs", t.total_epochs),
            ("trainer.cpus_per_worker", t.cpus_per_worker),
        ]
    )
    if t.total_training_steps is not None and t.total_training_steps < 1:
        p.append(
            "trainer.total_training_steps must be positive or null (use epochs), "
            f"got {t.total_training_steps}"
        )
    if t.resume_mode == "resume_path" and not t.resume_from_path:
        p.append(
            "trainer.resume_mode=resume_path needs trainer.resume_from_path (a checkpoint dir)"
        )
    if t.save_freq == 0 or t.save_freq < -1:
        p.append(
            f"trainer.save_freq must be -1 (never) or a positive step count, got {t.save_freq}"
        )
    if t.test_freq == 0 or t.test_freq < -1:
        p.append(
            f"trainer.test_freq must be -1 (never) or a positive step count, got {t.test_freq}"
        )
    if t.preemption_save_steps < 0:
        p.append(f"trainer.preemption_save_steps must be >= 0, got {t.preemption_save_steps}")
    if t.max_consecutive_skipped_updates < 1:
        p.append(
            "trainer.max_consecutive_skipped_updates must be >= 1,"
            f" got {t.max_consecutive_skipped_updates}"
        )
    if t.export_hf_dir and t.save_freq < 1:
        p.append(
            "trainer.export_hf_dir exports the final checkpoint: set trainer.save_freq to a"
            " positive step count (the last step is always saved then)"
        )
    if t.max_actor_ckpt_to_keep is not None and t.max_actor_ckpt_to_keep < 1:
        p.append("trainer.max_actor_ckpt_to_keep must be >= 1 or null (keep all)")
    return p
