"""A job spec: everything a backend needs to run a recipe, resolved and checked.

recipe + plan + where the job runs  ──►  JobSpec
    setup steps (build the tiny model, prepare data) as argv lists
    the engine's full config, validated against the engine's own schema
    the environment (plain values) and the names of the secrets to pass
    the files the recipe names on this machine that ship with the job (rlctl/job/files.py)

The engine config travels as a YAML file (``python -m engine.main --config``, or
``python -m engine.sft --config`` for a recipe with ``algorithm: sft``): recipe values
never become words of a shell command line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rlctl import __version__
from rlctl.errors import RlctlError
from rlctl.hardware import Accelerator, get_accelerator
from rlctl.job.files import JobFile, ship_files
from rlctl.job.preflight import preflight_command
from rlctl.job.wheel import WHEEL_NAME
from rlctl.planner.images import JobImage, default_image
from rlctl.recipe.load import TINY_MODEL, Recipe, RecipeError

# The image's Python, which makes the job's environment (rlctl/node/jobenv.py) on a node.
BASE_PYTHON = "python3"

if TYPE_CHECKING:
    from engine.schema import EngineConfig, SFTConfig
    from rlctl.planner.plan import Plan


@dataclass(frozen=True)
class BucketMount:
    """A bucket the backend mounts on every node (SkyPilot's file mounts)."""

    source: str  # scheme://bucket
    at: str  # the mount point on the nodes


@dataclass(frozen=True)
class JobPaths:
    """Where the job's files live on the machine that runs it, decided by its backend."""

    root: str  # the job's directory there
    # where the engine keeps checkpoints, as the nodes reach the recipe's `checkpoints:`
    # (None: the run directory); under ``mount`` when the backend mounts their bucket
    checkpoints: str | None = None
    mount: BucketMount | None = None

    @property
    def model_dir(self) -> str:
        return f"{self.root}/model"

    @property
    def data_dir(self) -> str:
        return f"{self.root}/data"

    @property
    def run_dir(self) -> str:
        return f"{self.root}/run"

    @property
    def engine_config(self) -> str:
        return f"{self.root}/engine.yaml"

    @property
    def restarts(self) -> str:
        """The supervisor's record of the run's attempts (engine.supervisor)."""
        from engine.schema import RESTARTS_FILE

        return f"{self.root}/{RESTARTS_FILE}"

    @property
    def wheel(self) -> str:
        """The rlctl wheel shipped with the job (rlctl/job/wheel.py)."""
        return f"{self.root}/{WHEEL_NAME}"

    @property
    def env(self) -> str:
        """The job's Python environment: the wheel over the image's packages (rlctl/node/jobenv.py)."""
        return f"{self.root}/env"


@dataclass(frozen=True)
class Layout:
    """Where the job runs, resolved once, from the plan and the engine config it made:
    every backend reads this and none re-plans or re-parses the config."""

    nodes: int
    devices_per_node: int  # devices, or CPU workers on a CPU job
    accelerator: str | None  # the hardware table's name; None: a CPU job
    # The recipe named the accelerator; False for `auto`, whose accelerator is the one
    # the plan was sized for (SkyPilot asks for it; Slurm asks for any GPU).
    accelerator_named: bool
    cpus_per_worker: int

    @property
    def hardware(self) -> Accelerator | None:
        return get_accelerator(self.accelerator) if self.accelerator else None


@dataclass(frozen=True)
class JobSpec:
    recipe: Recipe
    paths: JobPaths
    layout: Layout
    engine_yaml: str  # the engine's full, validated config
    setup: tuple[tuple[str, ...], ...]  # argv of each step before training (python is "python")
    image: JobImage  # the plan's default image (a backend may run another: image:, profiles)
    extras: tuple[str, ...]  # rlctl's extras the job needs (what the image lacks is installed)
    max_restarts: int  # the engine config's trainer.max_restarts (engine.supervisor)
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    files: tuple[JobFile, ...] = ()  # shipped into paths.root, by their relative names
    engine_module: str = "engine.main"  # engine.sft for algorithm: sft
    # python -m engine.doctor with the plan's checks, run on every node before the engine
    # (rlctl/job/preflight.py); () when the recipe turned it off
    preflight: tuple[str, ...] = ()
    # the engine's trainer.default_local_dir, as the nodes reach it (a path, a bucket URL)
    checkpoints: str = ""

    @property
    def file_texts(self) -> dict[str, str]:
        """The shipped files, name -> text, as a backend's render lists them."""
        return {f.name: f.text for f in self.files}

    @property
    def engine_args(self) -> tuple[str, ...]:
        """What follows ``python -m engine.main`` (or ``engine.sft``): the config travels
        as a file."""
        return ("--config", self.paths.engine_config)

    @property
    def engine_command(self) -> tuple[str, ...]:
        return ("python", "-m", self.engine_module, *self.engine_args)

    def supervised_command(
        self,
        requeue_marker: str | None = None,
        stop_marker: str | None = None,
        record: str | None = None,
        hand_back: int | None = None,
    ) -> tuple[str, ...]:
        """The engine under its supervisor (``engine.supervisor``), which starts it again
        after a failure worth retrying, at most ``max_restarts`` times, and records each
        attempt in ``record`` (default ``paths.restarts``); the markers as the Slurm job
        script passes them, ``hand_back`` as SkyPilot's run section does."""
        from engine.schema import supervisor_args

        args = supervisor_args(
            self.max_restarts,
            record or self.paths.restarts,
            self.engine_args,
            requeue_marker=requeue_marker,
            stop_marker=stop_marker,
            module=self.engine_module,
            hand_back=hand_back,
        )
        return ("python", *args)

    @property
    def install_command(self) -> tuple[str, ...]:
        """Makes the job's environment on a node, from the shipped wheel, before Ray
        starts (the module runs from the wheel itself: it is a zip Python imports)."""
        p = self.paths
        return (
            "env", f"PYTHONPATH={p.wheel}", BASE_PYTHON, "-m", "rlctl.node.jobenv",
            p.env, p.wheel, "--extras", ",".join(self.extras),
        )  # fmt: skip

    def with_python(self, argv: tuple[str, ...], python: str) -> tuple[str, ...]:
        """A step's argv with its "python" as ``python``."""
        return (python, *argv[1:]) if argv[:1] == ("python",) else argv

    def on_node(self, argv: tuple[str, ...]) -> tuple[str, ...]:
        """A step's argv with "python" as the job environment's Python."""
        return self.with_python(argv, f"{self.paths.env}/bin/python")

    def setup_line(self, over: str) -> str:
        """What ``rlctl plan`` says the nodes' setup installs, over ``over``."""
        return (
            f"setup: installs rlctl {__version__} (a wheel of this rlctl) in {self.paths.env}"
            f" over {over}, and what it lacks of rlctl[{','.join(self.extras)}]"
        )


def build_spec(recipe: Recipe, plan: Plan, paths: JobPaths) -> JobSpec:
    """Resolve the recipe and its plan for ``paths`` and check it against the engine's
    schema."""
    from engine.schema import to_yaml
    from rlctl.recipe.sft import FIELD_KEYS

    field_key = FIELD_KEYS[recipe.is_sft]
    keys: dict[str, Any] = {}
    setup: list[tuple[str, ...]] = []
    if recipe.model == TINY_MODEL:
        setup.append(("python", "-m", "engine.models.tiny", paths.model_dir))
        keys[field_key["model"]] = paths.model_dir
    else:
        keys[field_key["model"]] = recipe.model
    if recipe.data.prepare:
        setup.append(
            ("python", "-m", "engine.data.prepare", recipe.data.prepare, "--out", paths.data_dir)
        )
        keys[field_key["train"]] = [f"{paths.data_dir}/train.parquet"]
        keys[field_key["val"]] = [f"{paths.data_dir}/val.parquet"]
    else:
        keys[field_key["train"]] = list(recipe.data.train)
        keys[field_key["val"]] = list(recipe.data.val)
    assert paths.checkpoints or not recipe.checkpoints, "paths made without the checkpoints"
    keys[field_key["checkpoints"]] = paths.checkpoints or paths.run_dir
    if paths.checkpoints:  # metrics and logs stay on the node's disk: a bucket (mounted
        # or not) cannot append to a file; progress.json goes beside the checkpoints
        keys[field_key["run_dir"]] = paths.run_dir
    # Order: what the recipe's fields mean, then the plan's sizing, then the recipe's
    # own engine keys (a person's explicit choice wins; the planner checked them).
    merged = {**keys, **recipe.engine_overrides(), **plan.engine_overrides(), **recipe.engine}
    files, shipped = ship_files(merged, recipe.source, paths.root)
    merged.update(shipped)  # the engine reads the shipped copies
    model = None if recipe.model == TINY_MODEL else recipe.model
    cfg = job_engine_config(merged, recipe.source, model, sft=recipe.is_sft)
    trainer = cfg.trainer
    cpu = trainer.device == "cpu" or recipe.hardware.is_cpu
    layout = Layout(
        # the planner's: the training's and the pools of their own (rollout, reward
        # model, teachers) placed beside it
        nodes=plan.nodes,
        devices_per_node=plan.devices_per_node,
        accelerator=None if cpu else plan.accelerator,
        accelerator_named=not cpu and recipe.hardware.named,
        cpus_per_worker=trainer.cpus_per_worker,
    )
    model_cfg = cfg.model if recipe.is_sft else cfg.actor_rollout_ref.model
    return JobSpec(
        recipe=recipe,
        paths=paths,
        layout=layout,
        engine_yaml=to_yaml(cfg, compact=True),
        setup=tuple(setup),
        image=default_image(layout.hardware, recipe.rollout),
        extras=extras_needed(cfg, paths.mount),
        # SFT's trainer has no restarts of its own: its run goes once under the supervisor
        max_restarts=getattr(trainer, "max_restarts", 0),
        env=dict(recipe.env),
        secrets=recipe.secrets,
        files=files,
        engine_module="engine.sft" if recipe.is_sft else "engine.main",
        preflight=preflight_command(
            recipe,
            f"{layout.hardware.torch_device}:{layout.devices_per_node}"
            if layout.hardware
            else None,
            trainer.default_local_dir,
            plan.model.num_params,
            None if model_cfg.path == paths.model_dir else model_cfg.path,
            model_cfg.trust_remote_code,
            mounted=paths.mount is not None,  # SkyPilot: the bucket as the nodes see it
        ),
        checkpoints=trainer.default_local_dir,
    )


def extras_needed(
    cfg: EngineConfig | SFTConfig, mount: BucketMount | None = None
) -> tuple[str, ...]:
    """rlctl's extras (pyproject) this engine config uses (an RL or an SFT config): on a
    node, pip installs the ones the image lacks. With the checkpoints' bucket mounted,
    the bucket's."""
    extras = ["engine"]
    if hasattr(cfg, "actor_rollout_ref"):
        roles = cfg.actor_rollout_ref
        strategies = {roles.actor.strategy, roles.ref.strategy, cfg.critic.strategy}
    else:
        strategies = {cfg.engine.strategy}
    if "megatron" in strategies:
        extras.append("megatron")
    if set(cfg.trainer.loggers) - {"console"}:
        extras.append("trackers")
    where = mount.source if mount else str(cfg.trainer.default_local_dir)
    if where.startswith("s3://"):
        extras.append("aws")
    elif where.startswith("gs://"):
        extras.append("gcs")
    return tuple(extras)


def job_engine_config(
    dotted: dict[str, Any], source: str, model: str | None = None, sft: bool = False
) -> EngineConfig | SFTConfig:
    """The engine's typed config for these keys, validated; errors name the recipe's keys.
    With ``model``, the Megatron roles' and the Ulysses sizes are also checked against its
    config (``model_problems``): what the engine would refuse once the cluster is up.
    ``sft``: engine.sft's config (``sft_model_problems``)."""
    from engine.schema import SFT, ConfigError, load, load_config

    try:
        if sft:
            cfg = load(base=nest(dotted), schema=SFT).config
            problems = sft_model_problems(cfg, model) if model is not None else []
        else:
            cfg = load_config(base=nest(dotted))
            problems = model_problems(cfg, model) if model is not None else []
    except ConfigError as exc:
        problems = [p.replace("base config: ", "engine.") for p in exc.problems]
    if problems:
        raise RecipeError(
            f"recipe {source}: the engine config it makes is invalid:\n"
            + "\n".join(f"  - {p}" for p in problems),
            hint="change the recipe's engine: keys (or hardware/algorithm) as each line says",
        ) from None
    return cfg


def model_problems(cfg: EngineConfig, model: str) -> list[str]:
    """``megatron_problems``, Ulysses sizes that do not divide the model's heads, MoE
    routing replay of a dense model, and a quantized checkpoint trained in full."""
    from types import SimpleNamespace

    from engine.schema import (
        quantized_model_problems,
        routing_replay_model_problems,
        ulysses_model_problems,
    )
    from rlctl.models import model_config

    problems = megatron_problems(cfg, model)
    fields = SimpleNamespace(**model_config(model))
    if any(cfg.ulysses_size(role) > 1 for role in ("actor", "reference", "critic")):
        problems += ulysses_model_problems(cfg, lambda _model: fields)
    problems += routing_replay_model_problems(cfg, lambda _model: model_config(model))
    problems += quantized_model_problems(
        cfg,
        lambda m: (
            fields if m.path in (None, "", model) else SimpleNamespace(**model_config(m.path))
        ),
    )
    return problems


def sft_model_problems(cfg: SFTConfig, model: str) -> list[str]:
    """An SFT run's Megatron sizes and Ulysses size against the model's config."""
    from types import SimpleNamespace

    from engine.schema import MegatronParallel, ulysses_heads_problems
    from rlctl.models import model_config

    fields = SimpleNamespace(**model_config(model))
    e = cfg.engine
    if cfg.megatron:
        return MegatronParallel.of(e.megatron()).model_problems(fields, "engine")
    key = "engine.ulysses_sequence_parallel_size"
    return ulysses_heads_problems(e.ulysses_sequence_parallel_size, key, fields)


def megatron_problems(cfg: EngineConfig, model: str) -> list[str]:
    """Why the Megatron engine would refuse this model with these sizes (TP must divide
    the heads, PP form the stages, EP divide the experts, the model type be convertible),
    from its config fields, before anything is launched. Empty without Megatron roles."""
    roles = cfg.megatron_roles()
    if not roles:
        return []
    from types import SimpleNamespace

    from engine.schema import MegatronParallel
    from rlctl.models import model_config

    hf_config = SimpleNamespace(**model_config(model))
    problems: list[str] = []
    for key, section in roles.values():
        problems += MegatronParallel.of(section).model_problems(hf_config, key)
    return problems


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    tree: dict[str, Any] = {}
    for key, value in dotted.items():
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise RlctlError(f"engine key {key!r} conflicts with {part!r} set to a value")
            node = child
        node[parts[-1]] = value
    return tree
