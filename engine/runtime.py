"""Start a run: Ray, the worker group, data, rewards, trackers; then the loop.

The driver reads its data (tokenizer, datasets: torch and transformers imported for them)
on a thread while Ray starts (``run_training``): the two take seconds each and neither
needs the other. Every check that needs no data runs before either starts. Torch is
imported on that thread, not here, so that Ray's start waits for nothing heavy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray

from engine.checkpoint import CheckpointManager, is_remote, read_trainer_state
from engine.config import EngineConfig
from engine.config.verl_sections import ray_init_args
from engine.errors import ConfigError, EngineError
from engine.startup import StartupClock, gc_paused
from engine.watchdog import Hung

# spawn_workers named here: tests give a run other workers by replacing it
from engine.workers.spawn import cpus_needed, spawn_workers

if TYPE_CHECKING:
    from engine.data.dataset import PromptDataset
    from engine.data.loader import PromptLoader

# Settings every worker process starts with: these constants and nothing read from the
# environment. Ray writes a job's runtime_env into its logs (runtime_env_agent.log) and
# its GCS, so a value copied from here (HF_TOKEN, a recipe's secrets) would land on disk.
# The workers inherit the rest of their environment, secrets included, from the Ray node
# that starts them: here the driver's own (ray.init starts the node), on Slurm and
# SkyPilot the job script's, which starts `ray start` on every node. A cluster joined by
# address gets these through the job's runtime_env; a cluster started here through the
# driver's own environment, which its node inherits: with a runtime_env, Ray starts each
# worker through a setup process of its own (setup_worker.py) after asking its runtime-env
# agent (an actor took 1.2 s to start here instead of 0.4 s).
WORKER_ENV = {"TOKENIZERS_PARALLELISM": "false", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
# The names (never the values) of the secrets the job was given, set by rlctl's job
# scripts: on a cluster joined by address, every node is checked to have them.
SECRET_NAMES_ENV = "RLCTL_SECRET_NAMES"


def init_ray(cfg: EngineConfig) -> None:
    """Join the cluster named by RAY_ADDRESS (Slurm, SkyPilot), or start one here."""
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        own = {"address": os.environ["RAY_ADDRESS"], "runtime_env": {"env_vars": dict(WORKER_ENV)}}
        ray.init(**ray_init_args(cfg, own, joining=True), log_to_driver=True)
        check_node_secrets(secret_names())
        return
    needed = cpus_needed(cfg)
    os.environ.update(WORKER_ENV)  # the node started next, and so every worker, inherits it
    own = {
        "num_cpus": max(needed, os.cpu_count() or 1),
        "include_dashboard": False,
        # Unix socket paths are limited to 107 bytes: keep Ray's session dir short.
        "_temp_dir": tempfile.mkdtemp(prefix="ray", dir="/tmp"),
    }
    ray.init(**ray_init_args(cfg, own))  # the user's ray_kwargs.ray_init over the engine's


def secret_names() -> list[str]:
    return [n for n in os.environ.get(SECRET_NAMES_ENV, "").split(",") if n.strip()]


def check_node_secrets(names: list[str], timeout_s: float = 300.0) -> None:
    """Every alive node's workers see the named variables in their environment (each node
    inherits them from the job script that started it; nothing carries them in Ray), or
    an error naming the node and the missing names, before any model loads."""
    if not names:
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    def missing(wanted: list[str]) -> list[str]:
        return [name for name in wanted if name not in os.environ]

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    pending = [
        missing.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote(names)
        for n in nodes
    ]
    try:
        answers = ray.get(pending, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        raise EngineError(
            f"the Ray nodes did not all answer in {timeout_s:.0f} s (checking that each has"
            f" the secrets {', '.join(names)}): is every node up? `ray status` says"
        ) from None
    for node, lacking in zip(nodes, answers, strict=True):
        if lacking:
            raise EngineError(
                f"the Ray node at {node.get('NodeManagerAddress')} lacks the secrets"
                f" {', '.join(lacking)} in its environment: start every node's `ray start`"
                " with them exported (rlctl's job scripts do)"
            )


def resolve_cluster_device(cfg: EngineConfig) -> str:
    """``trainer.device=auto`` decided by what the cluster has, not by the driver's
    own node (the driver may run on a head without accelerators)."""
    if cfg.trainer.device != "auto":
        return cfg.trainer.device
    resources = ray.cluster_resources()
    if resources.get("GPU", 0) >= 1:
        return "cuda"
    if resources.get("NPU", 0) >= 1:
        return "npu"
    return "cpu"


@dataclass
class AgentFiles:
    """A multi-turn rollout's files, built: the tools' schemas (the prompts show them),
    the tools, the interactions and the agent loops, by name. Empty where not set."""

    schemas: list[dict] = field(default_factory=list)
    tools: dict[str, Any] = field(default_factory=dict)
    interactions: dict[str, Any] = field(default_factory=dict)
    loops: dict[str, Any] = field(default_factory=dict)


def _agent_files(cfg: EngineConfig) -> AgentFiles:
    """Built here once so that every option is checked before any worker (the rows'
    agent names and per-sample keywords are checked against them next)."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    key = "actor_rollout_ref.rollout.multi_turn"
    files = AgentFiles()
    if not mt.enable:
        return files
    if mt.tool_config_path:
        from engine.agents.tools import build_tools, load_tool_specs, tool_schemas

        with _naming(f"{key}.tool_config_path"):
            specs = load_tool_specs(mt.tool_config_path)
            files.schemas, files.tools = tool_schemas(specs), build_tools(specs)
    if mt.interaction_config_path:
        from engine.agents.interactions import load_interactions

        with _naming(f"{key}.interaction_config_path"):
            files.interactions = load_interactions(mt.interaction_config_path)
    if mt.agent_loop_config_path:
        from engine.agents.loops import load_agent_loops

        with _naming(f"{key}.agent_loop_config_path"):
            files.loops = load_agent_loops(mt.agent_loop_config_path)
    return files


@contextlib.contextmanager
def _naming(key: str) -> Iterator[None]:
    """A file's problems, each under the config key that names the file."""
    try:
        yield
    except ConfigError as exc:  # before any worker starts: the key, the value, the fix
        raise ConfigError([f"{key}: {p}" for p in exc.problems]) from None


def _check_default_agent(cfg: EngineConfig, files: AgentFiles) -> None:
    """``multi_turn.default_agent`` names a built-in loop or one the loops file declares:
    with the files, before anything starts."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if mt.enable and mt.default_agent not in _agent_loops(files):
        raise ConfigError(
            [
                f"actor_rollout_ref.rollout.multi_turn.default_agent: unknown agent loop"
                f" {mt.default_agent!r}; use one of {', '.join(_agent_loops(files))} (the"
                " built-ins and those the agent loops file declares)"
            ]
        )


def _agent_loops(files: AgentFiles) -> tuple[str, ...]:
    from engine.config import AGENT_LOOPS

    return (*AGENT_LOOPS, *files.loops)


def _check_agent_rows(cfg: EngineConfig, files: AgentFiles, datasets: list[Any]) -> None:
    """Each row's agent loop, per-sample tool keywords and interaction, before any
    worker starts."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable:
        return
    from engine.agents.rows import agent_row_problems

    problems = [
        p
        for dataset in datasets
        for p in agent_row_problems(
            dataset.agent_rows(),
            files.tools,
            _agent_loops(files),
            mt.default_agent,
            files.interactions,
        )
    ]
    if problems:
        raise ConfigError(problems)


@dataclass
class DriverData:
    """What the driver reads before the workers start: the tokenizer, the datasets and
    their loader, the number of training steps they make, the judge's tokenizer."""

    tokenizer: Any
    train: PromptDataset
    loader: PromptLoader
    val: PromptDataset | None
    total_steps: int
    judge_tokenizer: Any


def read_data(cfg: EngineConfig, files: AgentFiles, clock: StartupClock) -> DriverData:
    """The driver's slow part, run while Ray and the workers start: its heavy imports,
    the tokenizer, the datasets (``RLDataset``, or ``data.custom_cls``'s class of your
    own, built alike), and the checks that need them or transformers (each row's agent
    loop, the LoRA targets, the models' configs, the judge's chat template). Raises as
    they would."""
    with gc_paused():
        from transformers import AutoTokenizer

        import engine.loop.trainer  # noqa: F401  (torch and the loop's modules, imported here)
        from engine.data.custom import build_dataset
        from engine.data.loader import PromptLoader
        from engine.models.hf_config import is_vision_language
        from engine.models.processor import load_vision_processor
    clock.mark("imports")
    model = cfg.actor_rollout_ref.model
    tokenizer = AutoTokenizer.from_pretrained(
        model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code
    )
    actor_config = _check_model_configs(cfg)
    processor = None  # a vision-language model's, for the prompts' images
    if is_vision_language(actor_config):
        processor = load_vision_processor(
            model.path, tokenizer, actor_config, cfg.data.mm_processor_kwargs
        )
    train = build_dataset(
        cfg.data,
        cfg.data.train_file_list,
        tokenizer,
        files.schemas,
        max_samples=cfg.data.train_max_samples,
        processor=processor,
    )
    loader = PromptLoader(
        train, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed
    )
    val = (
        build_dataset(
            cfg.data,
            cfg.data.val_file_list,
            tokenizer,
            files.schemas,
            max_samples=cfg.data.val_max_samples,
            processor=processor,
        )
        if cfg.data.val_file_list
        else None
    )
    _check_agent_rows(cfg, files, [train] + ([val] if val else []))
    total = cfg.trainer.total_training_steps or len(loader) * cfg.trainer.total_epochs
    if total < 1:
        raise EngineError("no training steps: the dataset is smaller than data.train_batch_size")
    judge_tokenizer = None  # loaded once: its chat template checked now, then used
    rm = cfg.reward_model
    if rm.enable and rm.style == "generative":
        from engine.reward.judge import load_judge_tokenizer

        judge_tokenizer = load_judge_tokenizer(rm)
    if model.lora_rank > 0:  # target_modules that match nothing: now, not in each worker
        from engine.train.lora import check_targets

        check_targets(model)
    clock.mark("data")
    return DriverData(tokenizer, train, loader, val, total, judge_tokenizer)


def check_data_sources(cfg: EngineConfig, reward: Any, data: DriverData) -> None:
    """Every data source has a scorer (those the reward model scores need none)."""
    sources = data.train.data_sources() | (data.val.data_sources() if data.val else set())
    rm = cfg.reward_model
    if rm.enable and rm.data_sources is not None:
        reward.check_data_sources(sources - set(rm.data_sources))
    elif not rm.enable:
        reward.check_data_sources(sources)


def run_training(cfg: EngineConfig, clock: StartupClock | None = None) -> None:
    """``clock``: when the process started (``engine.main``); else now."""
    from engine.reward.manager import RewardManager
    from engine.train.lora_saved import resolve as with_saved_adapter

    clock = clock or StartupClock()
    # Which code runs (a job launched by rlctl runs its shipped wheel, rlctl/node/jobenv.py)
    here = Path(__file__).resolve().parent
    print(f"engine: running {here} with {sys.executable}", flush=True)
    # What needs no data fails before anything starts: the agents' files, the saved
    # LoRA adapter (its rank, alpha and targets become the config's, for every check
    # after it and every role), a local quantized checkpoint, the reward.
    agent_files = _agent_files(cfg)
    _check_default_agent(cfg, agent_files)
    cfg = with_saved_adapter(cfg)
    _check_local_checkpoints(cfg)
    reward = RewardManager(
        cfg.reward_model, cfg.custom_reward_function, cfg.data.max_response_length
    )
    # The data is read (and checked) on a thread while Ray starts and then the workers'
    # processes do; then the rule rewards' processes start there. The workers build
    # their roles (models) only once the data has passed its checks.
    starting = ThreadPoolExecutor(1, thread_name_prefix="engine-data")
    workers = None
    grace_s = 10.0  # for each worker to close (WorkerGroup.shutdown)
    try:
        reading = starting.submit(read_data, cfg, agent_files, clock)
        warming = starting.submit(reward.start) if not cfg.reward_model.enable else None
        init_ray(cfg)
        clock.mark("ray")
        cfg = dataclasses.replace(
            cfg, trainer=dataclasses.replace(cfg.trainer, device=resolve_cluster_device(cfg))
        )
        workers = spawn_workers(cfg)
        data = reading.result()
        check_data_sources(cfg, reward, data)
        cfg = with_total_steps(cfg, data.total_steps)
        workers.start(cfg)
        starting.shutdown()
        if warming is not None:
            warming.result()  # its error, if it had one
        mark_worker_milestones(workers, clock)
        train(cfg, workers, reward, data, clock)
    except Hung:
        grace_s = 2.0  # its stuck ranks never run close(): the restart need not wait
        raise
    finally:
        starting.shutdown(cancel_futures=True)  # first: the thread may start the rewards
        reward.close()
        if workers is not None:
            workers.shutdown(grace_s)
    if cfg.trainer.export_hf_dir:
        from engine.export import export_checkpoint

        out = export_checkpoint(cfg.trainer.default_local_dir, cfg.trainer.export_hf_dir)
        print(f"exported the final policy to {out}", flush=True)


def train(
    cfg: EngineConfig, workers: Any, reward: Any, data: DriverData, clock: StartupClock
) -> None:
    """The loop, on workers that are up, with its trackers and checkpoints."""
    from engine.loop.scoring import Scorer
    from engine.loop.trainer import Trainer
    from engine.tracking import Tracker
    from engine.watchdog import watching

    checkpoints = CheckpointManager(cfg.trainer)
    resume_from = checkpoints.resume_point()
    resumed_step = read_trainer_state(resume_from).step if resume_from else 0
    table = write_worker_table(workers, run_dir(cfg))
    total = data.total_steps
    with Tracker(
        cfg.trainer, run_dir(cfg), dataclasses.asdict(cfg), total, resumed_step
    ) as tracker:
        scorer = Scorer(cfg, reward, data.tokenizer, workers, data.judge_tokenizer)
        trainer = Trainer(
            cfg,
            workers,
            scorer,
            data.tokenizer,
            data.loader,
            data.val,
            tracker,
            checkpoints,
            resume_from,
            startup=clock,
        )
        previous = signal.signal(signal.SIGTERM, lambda *_: trainer.request_stop())
        try:
            with watching(cfg.trainer, workers, table, lambda: trainer.step):
                trainer.fit()
        finally:
            signal.signal(signal.SIGTERM, previous)


def mark_worker_milestones(workers: Any, clock: StartupClock) -> None:
    """When the last worker process came up, and when the last rank had its models."""
    times = workers.host_all("startup_times")
    for milestone in ("workers", "models"):
        clock.mark(milestone, at=max(t[milestone] for t in times))


def _config_file(model: Any) -> Path:
    """A local model folder's config.json (no such file: the path is a hub name)."""
    return Path(model.path) / "config.json"


def _check_local_checkpoints(cfg: EngineConfig) -> None:
    """A quantized checkpoint trained in full, refused before Ray starts where the model
    is a local folder: its config.json read as JSON, without transformers (imported on
    the data thread, overlapped with Ray's start). A hub name is checked there, with
    the other checks that need the model's config (``_check_model_configs``)."""
    from engine.config.train import quantized_model_problems

    def local_config(model: Any) -> dict:
        path = _config_file(model)
        return json.loads(path.read_text()) if path.is_file() else {}

    problems = quantized_model_problems(cfg, local_config)
    if problems:
        raise ConfigError(problems)


def _check_model_configs(cfg: EngineConfig) -> Any:
    """From the models' configs, now, not once the workers have loaded them: fields of
    ``override_config`` the config lacks, Ulysses sizes the heads cannot take (each
    config read with its overrides), routing replay of a dense model, a quantized
    checkpoint trained in full where the model is a hub name (a local folder's was
    refused before Ray started, ``_check_local_checkpoints``; an override cannot add a
    quantization_config), and what a vision-language actor cannot run with yet.
    Returns the actor's config."""
    from engine.config.routing_replay import model_problems as routing_replay_problems
    from engine.config.train import (
        quantized_model_problems,
        selected_model,
        ulysses_model_problems,
    )
    from engine.config.vision import vision_model_problems
    from engine.models.hf_config import is_vision_language, load_hf_config

    problems: list[str] = []

    def full_config_of(model: Any) -> Any:
        key = "actor_rollout_ref.model" if model is cfg.actor_rollout_ref.model else "critic.model"
        try:
            return load_hf_config(model, key)
        except ConfigError as exc:
            from transformers import AutoConfig

            problems.extend(exc.problems)
            return AutoConfig.from_pretrained(model.path, trust_remote_code=model.trust_remote_code)

    def hf_config_of(model: Any) -> Any:
        return full_config_of(model).get_text_config()

    def hub_config_of(model: Any) -> Any:
        return {} if _config_file(model).is_file() else hf_config_of(model)

    actor = full_config_of(cfg.actor_rollout_ref.model)
    if is_vision_language(actor):
        problems += vision_model_problems(cfg)
    if cfg.use_critic:
        hf_config_of(selected_model(cfg, "critic"))
    problems += ulysses_model_problems(cfg, hf_config_of)
    problems += routing_replay_problems(cfg, hf_config_of)
    problems += quantized_model_problems(cfg, hub_config_of)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return actor


def run_dir(cfg: EngineConfig) -> Path:
    """Where logs and metrics go: ``trainer.run_dir`` when set, else the checkpoint dir
    when it is local, else a local folder named after the run (a bucket holds only
    checkpoints)."""
    if cfg.trainer.run_dir:
        return Path(cfg.trainer.run_dir)
    root = cfg.trainer.default_local_dir
    if is_remote(root):
        return Path("runs") / cfg.trainer.project_name / cfg.trainer.experiment_name
    return Path(root)


def write_worker_table(workers: Any, directory: Path) -> list[dict]:
    """Which process holds each rank (of which group, with a rollout or reward model
    group of its own), on which Ray node, and where SIGUSR1 writes its stacks
    (engine.watchdog): for operators, for the watchdog, and for fault tests."""
    directory.mkdir(parents=True, exist_ok=True)
    where = workers.host_all("whereabouts")
    # engine.controller.groups.SeparateGroups: its groups' hosts in this order
    groups = getattr(workers, "groups", [workers])
    table = []
    for group in groups:
        for rank in range(group.world_size):
            row = {"rank": rank, **where[len(table)]}
            table.append({**row, "group": group.label} if group.label else row)
    (directory / "workers.json").write_text(json.dumps(table))
    return table


def with_total_steps(cfg: EngineConfig, total: int) -> EngineConfig:
    """The config with the optimizers' schedule length filled in."""
    arr = cfg.actor_rollout_ref
    actor = dataclasses.replace(
        arr.actor, optim=dataclasses.replace(arr.actor.optim, total_training_steps=total)
    )
    critic = dataclasses.replace(
        cfg.critic, optim=dataclasses.replace(cfg.critic.optim, total_training_steps=total)
    )
    return dataclasses.replace(
        cfg, actor_rollout_ref=dataclasses.replace(arr, actor=actor), critic=critic
    )
