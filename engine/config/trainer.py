"""``trainer``: the run as a whole (``engine.runtime``, ``engine.loop.trainer``,
``engine.checkpoint``, ``engine.tracking``): devices, length, checkpoints, resumption,
loggers; and the rules on them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from engine.config import verl_trees
from engine.config.fields import choice, inert, one_of, positive, setting, tree

if TYPE_CHECKING:
    from engine.config.engine import EngineConfig

DEVICES = ("auto", "cuda", "npu", "cpu")
RESUME_MODES = ("auto", "disable", "resume_path")
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")
_LOGGER_NAMES = {"file": "jsonl"}  # verl's file logger writes JSON lines, as jsonl does


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
    logger: Any = setting(
        help=f"Where metrics go: a list of {one_of(LOGGERS)}, or one of them (verl's file"
        " logger is read as jsonl).",
        factory=lambda: ["console"],
        kind="list of names, or one name",
    )
    default_local_dir: str = setting(
        "checkpoints/${trainer.project_name}/${trainer.experiment_name}",
        "The run's folder (checkpoints, metrics): a local path or a bucket URL (s3://, gs://).",
    )
    run_dir: str | None = setting(
        None,
        "The run's own folder (metrics.jsonl, tensorboard, the workers' table and stacks),"
        " a local path; null: default_local_dir when that is local, else"
        " runs/<project_name>/<experiment_name>. rlctl sets it when the checkpoints are in a"
        " bucket, mounted or not (a mounted bucket cannot append to a file); the run then"
        " also writes progress.json beside the checkpoints for `rlctl status`.",
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
    hang_timeout_factor: float = setting(
        5.0,
        "The hang watchdog: a phase (a call the controller waits on, such as"
        " rollout.generate or actor.update) may run this many times its longest of the"
        " last 10 runs (at least hang_timeout_floor_s); past it every worker's stacks go"
        " to the log and the run exits with code 76. 0: off; else at least 1.",
    )
    hang_timeout_floor_s: float = setting(
        3600.0,
        "Seconds any phase may run before the hang watchdog ends the run, and the bound of"
        " a phase not measured yet (the first steps compile and warm up); the process"
        " group's collective timeout is twice this.",
    )
    max_restarts: int = setting(
        3,
        "Times the job starts the run again, from its last complete checkpoint, after it"
        " stopped for a reason worth retrying: preempted (75), hung (76), a worker's"
        " process or node died; never after a configuration error (2), the NaN stop or an"
        " error that would recur. The job's supervisor restarts it (engine.supervisor:"
        " local, and Slurm within its allocation or by requeue; on SkyPilot's managed"
        " jobs it exits 75 and SkyPilot starts the job again). 0: never.",
    )
    export_hf_dir: str | None = setting(
        None,
        "Export the final checkpoint to this folder as a Hugging Face model (needs save_freq).",
    )
    seed: int = setting(1, "Seed of model building, sampling and validation.")
    # verl's other trainer keys (docs/verl-compat.md).
    balance_batch: bool = setting(
        False,
        "Reorder each step's samples so that every data-parallel rank gets about the same"
        " number of tokens (verl's key; its default is true, here false: it changes which"
        " samples share a mini-batch, and only speed otherwise).",
    )
    log_val_generations: int = setting(
        0,
        "After each validation, show this many of its samples (prompt, response, score; the"
        " same prompts each time): lines in <run folder>/val_generations.jsonl, printed with"
        " the console logger, text in tensorboard, a table in wandb (verl's key); 0: none.",
    )
    validation_data_dir: str | None = setting(
        None,
        "Write each validation's samples to <dir>/<step>.jsonl (as rollout_data_dir does"
        " for training steps; verl's key); null: none.",
    )
    val_only: bool = setting(
        False, "Validate once (needs data.val_files) and stop, without training (verl's key)."
    )
    max_critic_ckpt_to_keep: int | None = inert(
        None,
        "verl keeps the critic's checkpoints apart; changes nothing here: a checkpoint holds"
        " every role, kept by max_actor_ckpt_to_keep.",
    )
    default_hdfs_dir: str | None = inert(
        None,
        "verl copies checkpoints to HDFS; not in this engine (refused when set):"
        " default_local_dir may be a bucket URL (s3://, gs://).",
    )
    del_local_ckpt_after_load: bool = inert(
        False, "verl deletes a checkpoint after resuming from it; changes nothing here."
    )
    esi_redundant_time: int = inert(
        0, "verl's save-before-expiry margin on Volcano's elastic instances; changes nothing here."
    )
    ray_wait_register_center_timeout: int = inert(
        300, "verl's wait for its workers' registry; changes nothing here."
    )
    use_legacy_worker_impl: str = inert(
        "auto", "verl's choice between its old and new worker code; changes nothing here."
    )
    use_v1: bool = inert(
        True, "verl's choice of its v1 trainer; changes nothing here (one trainer loop)."
    )
    v1: dict[str, Any] = tree(
        verl_trees.TRAINER_V1,
        "verl's v1 trainer modes; a trainer_mode other than sync is refused: overlapping"
        " generation and training here is async_training.mode (docs/async.md).",
    )

    @property
    def collective_timeout_s(self) -> float:
        """torch.distributed's timeout for the workers' collectives: above the watchdog's
        floor, so that the watchdog reports a stuck collective (with the stacks) first."""
        return 2 * self.hang_timeout_floor_s

    @property
    def loggers(self) -> list[str]:
        """``logger`` as a list (verl accepts one name as a string)."""
        names = [self.logger] if isinstance(self.logger, str) else list(self.logger)
        return [_LOGGER_NAMES.get(name, name) for name in names]


def rules(cfg: EngineConfig) -> list[str]:
    t = cfg.trainer
    p = choice(t.device, DEVICES, "trainer.device", "device")
    p += choice(t.resume_mode, RESUME_MODES, "trainer.resume_mode", "resume mode")
    for logger in t.loggers:
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
    if t.hang_timeout_factor != 0 and not t.hang_timeout_factor >= 1:
        p.append(
            "trainer.hang_timeout_factor must be 0 (the hang watchdog off) or at least 1,"
            f" got {t.hang_timeout_factor}"
        )
    if t.max_restarts < 0:
        p.append(f"trainer.max_restarts must be >= 0 (0: never restart), got {t.max_restarts}")
    if not t.hang_timeout_floor_s > 0:
        p.append(f"trainer.hang_timeout_floor_s must be > 0 seconds, got {t.hang_timeout_floor_s}")
    if t.export_hf_dir and t.save_freq < 1:
        p.append(
            "trainer.export_hf_dir exports the final checkpoint: set trainer.save_freq to a"
            " positive step count (the last step is always saved then)"
        )
    if t.val_only and not cfg.data.val_file_list:
        p.append("trainer.val_only=true validates only: set data.val_files")
    if t.log_val_generations < 0:
        p.append(f"trainer.log_val_generations must be >= 0, got {t.log_val_generations}")
    if t.max_actor_ckpt_to_keep is not None and t.max_actor_ckpt_to_keep < 1:
        p.append("trainer.max_actor_ckpt_to_keep must be >= 1 or null (keep all)")
    return p
