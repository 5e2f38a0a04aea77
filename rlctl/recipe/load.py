"""Recipes: the short YAML a person writes to describe a run.

    name: grpo-qwen7b-gsm8k
    description: GRPO on GSM8K, Qwen2.5-7B-Instruct, one 8×H100 node
    extends: base.yaml                 # optional: a recipe this one refines
    algorithm: grpo                    # a preset (rlctl.recipe.presets), or sft (python -m engine.sft)
    model: Qwen/Qwen2.5-7B-Instruct    # Hugging Face id, a local folder, or rlctl:tiny
    data:
      prepare: gsm8k                   # made on the cluster: gsm8k | gsm8k_tools | math | synthetic | geo3k | shapes
      # or train: [files], val: [files] (paths as seen where the job runs)
    reward:                            # optional: built-in rules by data_source otherwise
      custom: {path: my_reward.py, name: compute_score}
    hardware: {accelerators: H100:8, nodes: 1}     # or accelerators: auto | cpu:2
    rollout: vllm                      # vllm | sglang | hf
    trainer: fsdp2                     # fsdp | fsdp2 | megatron
    lora: {rank: 16, alpha: 32}        # optional: train a LoRA adapter of the actor (fsdp2)
    checkpoints: s3://bucket/runs      # optional: where checkpoints go
    image: registry.example.com/rlctl/engine:0.1.0-cuda   # optional: the nodes' image
    env: {NCCL_DEBUG: INFO}            # plain settings
    secrets: [HF_TOKEN, WANDB_API_KEY] # names only: values come from your environment at launch
    engine:                            # any engine key, dotted, checked against its schema
      data.train_batch_size: 256

Every error names the field path, the bad value and the fix.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlctl.errors import RlctlError, closest_or_all
from rlctl.recipe.engine_keys import engine_key_problems, flatten, short
from rlctl.recipe.lora import DOC as LORA_DOC
from rlctl.recipe.lora import LORA_KEYS, lora_engine_keys, lora_problems
from rlctl.recipe.presets import ALGORITHMS, PRESETS, SFT
from rlctl.recipe.shipped import rebase
from rlctl.recipe.values import RESOLVER, check_image, looks_secret, strings_in
from rlctl.yamlfile import load_yaml_file

TINY_MODEL = "rlctl:tiny"  # a tiny random model built where the job runs (quickstart, tests)
PREPARATIONS = ("gsm8k", "gsm8k_tools", "math", "synthetic", "geo3k", "shapes")
IMAGE_PREPARATIONS = ("geo3k", "shapes")  # prompts with images: a vision-language model's
SFT_PREPARATIONS = ("gsm8k_sft",)  # conversations (a messages column), for algorithm: sft
ROLLOUTS = ("vllm", "sglang", "hf")
TRAINERS = ("fsdp", "fsdp2", "megatron")
# The schema's fields, with what each takes: the parser checks against these, and
# ``docs/recipes.md`` is generated from them (rlctl/recipe/docs.py).
FIELD_DOCS: dict[str, tuple[str, str]] = {
    "name": (
        "text (letters, digits, . _ -)",
        "the run's name; job ids and the experiment name start with it",
    ),
    "description": ("text", "one line, shown by `rlctl recipes`"),
    "extends": (
        "path",
        "a recipe this one refines (relative to this file); mappings merge, the child wins",
    ),
    "algorithm": (
        "preset name, or sft",
        "an algorithm preset (below), whose engine keys apply first; or sft: supervised"
        " fine-tuning (`python -m engine.sft`, docs/sft.md), whose engine keys are verl's SFT"
        " trainer's",
    ),
    "model": (
        "HF id, folder, or rlctl:tiny",
        "the policy to train (`rlctl:tiny` is built where the job runs)",
    ),
    "data": (
        "mapping",
        "`prepare:` one of the preparations below, or `train:`/`val:` files (parquet/jsonl) as seen where the job runs (for sft: conversations in a messages column)",
    ),
    "reward": (
        "mapping",
        "`custom: {path, name}` for your own scoring function; built-in rules by data_source otherwise",
    ),
    "hardware": (
        "mapping",
        "`accelerators:` NAME:COUNT per node (catalog below), `cpu:N` or `auto`; `nodes:` a count or `auto`",
    ),
    "rollout": ("vllm, sglang or hf", "the generation backend (hf on CPU); none for sft"),
    "trainer": ("fsdp, fsdp2 or megatron", "the training backend"),
    "lora": ("mapping", LORA_DOC),
    "checkpoints": (
        "path or bucket URL",
        "where checkpoints go (s3://, gs://, or a path); default: the job's run directory",
    ),
    "image": (
        "container image",
        "the image the nodes run (default: the plan's public image, `rlctl plan` names it; images/ builds faster-starting ones); wins over the site profile's",
    ),
    "env": (
        "mapping",
        "plain environment settings for the job (secret-looking names are refused: use `secrets`)",
    ),
    "secrets": (
        "list of names",
        "environment variables whose values are read from your environment at launch, passed to the job, and never written down",
    ),
    "preflight": (
        "true or false",
        "check every node before the engine starts (`python -m engine.doctor`: devices, versions, disk, secrets, bucket, model, network; exit 2 on a failure); default true",
    ),
    "engine": (
        "mapping",
        "any engine key, dotted or nested (docs/configuration.md); checked against the engine's schema; wins over presets and the plan. A relative `actor_rollout_ref.rollout.multi_turn.tool_config_path` or `interaction_config_path` is read from the recipe's folder and shipped with the job, with the .py files its entries name (rlctl/job/files.py); other paths are the job's",
    ),
}
_FIELDS = tuple(FIELD_DOCS)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_COUNT = re.compile(r"[0-9]{1,6}")


class RecipeError(RlctlError):
    """A recipe field is wrong; the message names the field, the value and the fix."""


@dataclass(frozen=True)
class DataSpec:
    prepare: str | None = None
    train: tuple[str, ...] = ()
    val: tuple[str, ...] = ()


@dataclass(frozen=True)
class HardwareSpec:
    accelerators: str = "auto"  # "H100:8", "MI300X:8", "cpu:2", or "auto"
    nodes: int | None = None  # None: the planner decides

    @property
    def is_cpu(self) -> bool:
        return self.accelerators.lower().split(":")[0] == "cpu"

    @property
    def cpu_workers(self) -> int:
        _, _, count = self.accelerators.partition(":")
        return int(count) if count else 2

    @property
    def named(self) -> bool:
        """The recipe named the accelerator (not ``auto``, not CPU workers)."""
        return self.accelerators != "auto" and not self.is_cpu

    def target(self) -> tuple[str | None, int, int | None]:
        """What the planner sizes for, ``auto`` decided here: (the accelerator, None for
        CPU workers; devices per node; devices in all, None: the planner picks). ``auto``
        is H100:8 nodes: SkyPilot asks for them, Slurm for any GPU (``named``)."""
        if self.is_cpu:  # cpu:N is N workers per node; nodes of them
            return None, self.cpu_workers, self.cpu_workers * (self.nodes or 1)
        if not self.named:
            return "H100", 8, None
        from rlctl.hardware import parse_accelerator_spec

        acc, per_node = parse_accelerator_spec(self.accelerators)
        return acc.name, per_node, per_node * self.nodes if self.nodes else None


@dataclass(frozen=True)
class Recipe:
    name: str
    algorithm: str
    model: str
    data: DataSpec
    source: str = "<string>"
    description: str = ""
    custom_reward: tuple[str, str] | None = None  # (path, function name)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    rollout: str = "vllm"
    trainer: str = "fsdp2"
    checkpoints: str | None = None
    image: str | None = None  # None: the site profile's, else the plan's default
    env: dict[str, str] = field(default_factory=dict)
    secrets: tuple[str, ...] = ()
    engine: dict[str, Any] = field(default_factory=dict)
    lora: dict[str, Any] = field(default_factory=dict)  # rank, alpha, target_modules
    preflight: bool = True  # engine.doctor on every node before the engine (rlctl/job/preflight.py)

    @property
    def is_sft(self) -> bool:
        """Supervised fine-tuning: engine.sft runs it, with its own keys."""
        return self.algorithm == SFT

    def engine_overrides(self) -> dict[str, Any]:
        """The engine keys this recipe sets (before sizing), in the order they apply:
        the algorithm preset, then the recipe's fields, then its ``engine:`` block."""
        if self.is_sft:
            from rlctl.recipe.sft import sft_engine_overrides

            return sft_engine_overrides(self)
        keys: dict[str, Any] = dict(PRESETS[self.algorithm])
        keys["actor_rollout_ref.rollout.name"] = self.rollout
        keys["actor_rollout_ref.actor.strategy"] = self.trainer
        keys["critic.strategy"] = self.trainer
        keys["trainer.experiment_name"] = self.name
        if self.custom_reward:
            keys["custom_reward_function.path"] = self.custom_reward[0]
            keys["custom_reward_function.name"] = self.custom_reward[1]
        if self.hardware.is_cpu:
            keys["trainer.device"] = "cpu"
        keys.update(lora_engine_keys(self.lora))
        keys.update(self.engine)
        if keys.get("reward_model.overlong_buffer.enable") and (
            "reward_model.overlong_buffer.len" not in keys
        ):
            response = keys.get(
                "data.max_response_length", _engine_default("data.max_response_length")
            )
            keys["reward_model.overlong_buffer.len"] = max(1, int(response) // 5)
        return keys

    def to_yaml(self) -> str:
        """The recipe as resolved (extends applied): what the job store keeps. Secrets
        appear by name only."""
        data: dict[str, Any] = {"name": self.name, "description": self.description}
        data |= {"algorithm": self.algorithm, "model": self.model}
        data["data"] = {k: v for k, v in (
            ("prepare", self.data.prepare),
            ("train", list(self.data.train)),
            ("val", list(self.data.val)),
        ) if v}  # fmt: skip
        if self.custom_reward:
            data["reward"] = {
                "custom": {"path": self.custom_reward[0], "name": self.custom_reward[1]}
            }
        hw: dict[str, Any] = {"accelerators": self.hardware.accelerators}
        if self.hardware.nodes is not None:
            hw["nodes"] = self.hardware.nodes
        data |= {"hardware": hw} | ({} if self.is_sft else {"rollout": self.rollout})
        data["trainer"] = self.trainer
        if self.lora:
            data["lora"] = dict(self.lora)
        if self.checkpoints:
            data["checkpoints"] = self.checkpoints
        if self.image:
            data["image"] = self.image
        if self.env:
            data["env"] = dict(self.env)
        if self.secrets:
            data["secrets"] = list(self.secrets)
        if not self.preflight:
            data["preflight"] = False
        if self.engine:
            data["engine"] = dict(self.engine)
        return yaml.safe_dump(data, sort_keys=False)


def _engine_default(key: str) -> Any:
    from engine.schema import EngineConfig

    value: Any = EngineConfig()
    for part in key.split("."):
        value = getattr(value, part)
    return value


# ---------------------------------------------------------------------------
# loading


def load_recipe(path: str | Path) -> Recipe:
    """Read, merge ``extends`` chains, and check a recipe file."""
    path = Path(path)
    raw = _load_with_extends(path, seen=())
    return parse_recipe(raw, source=str(path))


def _load_with_extends(path: Path, seen: tuple[Path, ...]) -> dict[str, Any]:
    resolved = path.resolve()
    if resolved in seen:
        chain = " -> ".join(str(p) for p in (*seen, resolved))
        raise RecipeError(f"extends: the recipes extend each other in a loop: {chain}")
    if not path.is_file():
        where = f" (extended by {seen[-1]})" if seen else ""
        raise RecipeError(
            f"recipe file {str(path)!r} does not exist{where}",
            hint="`rlctl recipes` lists the bundled recipes",
        )
    raw = load_yaml_file(path, RecipeError) or {}
    if not isinstance(raw, dict):
        raise RecipeError(f"{path}: a recipe is a mapping of fields, got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise RecipeError(f"{path}: extends: expected a file path, got {parent!r}")
    try:
        base = _load_with_extends(path.parent / parent, (*seen, resolved))
        # the parent's recipe-relative paths (a tools file) keep naming the same file
        base = rebase(base, (path.parent / parent).parent, path.parent)
    except RecipeError as exc:  # a problem in (or with) the parent: say it came from extends
        if exc.message.startswith("extends: "):
            raise
        raise RecipeError(f"extends: {exc.message}", hint=exc.hint) from None
    return _merge(base, raw)


def _merge(base: dict[str, Any], child: dict[str, Any]) -> dict[str, Any]:
    """The child's fields win; mappings (data, hardware, env, engine, ...) merge key by key."""
    out = dict(base)
    for key, value in child.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def parse_recipe(raw: dict[str, Any], source: str = "<string>") -> Recipe:
    errors: list[str] = []
    p = _Parser(raw, source, errors)
    for key in raw:
        if key not in _FIELDS:
            errors.append(f"{key}: unknown field; {closest_or_all(key, _FIELDS)}")
    name = p.string("name", required=True, pattern=_NAME, what="a name of letters, digits, . _ -")
    algorithm = p.choice("algorithm", ALGORITHMS, required=True)
    sft = algorithm == SFT
    model = p.string("model", required=True)
    recipe = Recipe(
        name=name or "",
        algorithm=algorithm or "grpo",
        model=model or "",
        data=p.data(SFT_PREPARATIONS if sft else PREPARATIONS),
        source=source,
        description=p.string("description") or "",
        custom_reward=p.reward(),
        hardware=p.hardware(),
        rollout=p.choice("rollout", ROLLOUTS) or "vllm",
        trainer=p.choice("trainer", TRAINERS) or "fsdp2",
        checkpoints=p.string("checkpoints"),
        image=p.image(),
        env=p.env(),
        secrets=p.secrets(),
        engine=p.engine(sft),
        lora=p.lora(),
        preflight=p.flag("preflight", default=True),
    )
    p.resolvers()
    if sft:
        from rlctl.recipe.sft import sft_field_problems

        errors.extend(sft_field_problems(raw))
    if recipe.lora:
        errors.extend(lora_problems(recipe.lora, recipe.trainer))
    if recipe.hardware.is_cpu and recipe.rollout != "hf" and "rollout" in raw and not sft:
        errors.append(
            f"rollout: {recipe.rollout} needs GPUs; with hardware.accelerators=cpu use rollout: hf"
        )
    if errors:
        raise RecipeError(_format(source, errors))
    if recipe.hardware.is_cpu and "rollout" not in raw:
        recipe = _replace(recipe, rollout="hf")
    return recipe


def _replace(recipe: Recipe, **changes: Any) -> Recipe:
    from dataclasses import replace

    return replace(recipe, **changes)


def _format(source: str, errors: list[str]) -> str:
    if len(errors) == 1:
        return f"recipe {source}: {errors[0]}"
    return f"recipe {source} has {len(errors)} problems:\n" + "\n".join(f"  - {e}" for e in errors)


class _Parser:
    """Reads one field at a time, collecting every problem instead of stopping at the first."""

    def __init__(self, raw: dict[str, Any], source: str, errors: list[str]) -> None:
        self.raw, self.source, self.errors = raw, source, errors

    def image(self) -> str | None:
        value = self.string("image")
        if value is not None:
            try:
                check_image(value, "image")
            except RlctlError as exc:
                self.errors.append(f"{exc} ({exc.hint})")
                return None
        return value

    def string(
        self, key: str, required: bool = False, pattern: re.Pattern | None = None, what: str = ""
    ) -> str | None:
        value = self.raw.get(key)
        if value is None:
            if required:
                self.errors.append(f"{key}: required")
            return None
        if not isinstance(value, str) or not value.strip():
            self.errors.append(f"{key}: expected text, got {value!r}")
            return None
        if pattern and not pattern.match(value):
            self.errors.append(f"{key}: {value!r} is not {what}")
            return None
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.raw.get(key, default)
        if not isinstance(value, bool):
            self.errors.append(f"{key}: expected true or false, got {value!r}")
            return default
        return value

    def choice(self, key: str, valid: tuple[str, ...], required: bool = False) -> str | None:
        value = self.string(key, required=required)
        if value is None:
            return None
        if value not in valid:
            close = difflib.get_close_matches(value, valid, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            self.errors.append(f"{key}: unknown value {value!r}{hint}; valid: {', '.join(valid)}")
            return None
        return value

    def _mapping(self, key: str) -> dict[str, Any]:
        value = self.raw.get(key) or {}
        if not isinstance(value, dict):
            self.errors.append(f"{key}: expected a mapping, got {value!r}")
            return {}
        return value

    def _unknown(self, key: str, value: dict[str, Any], known: tuple[str, ...]) -> None:
        for sub in value:
            if sub not in known:
                hint = closest_or_all(sub, known, listing="valid")
                self.errors.append(f"{key}.{sub}: unknown field; {hint}")

    def _paths(self, key: str, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            return (value,)
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
        self.errors.append(f"{key}: expected a path or a list of paths, got {value!r}")
        return ()

    def data(self, preparations: tuple[str, ...] = PREPARATIONS) -> DataSpec:
        data = self._mapping("data")
        self._unknown("data", data, ("prepare", "train", "val"))
        prepare = data.get("prepare")
        if prepare is not None and prepare not in preparations:
            self.errors.append(
                f"data.prepare: unknown preparation {prepare!r} for this algorithm; valid:"
                f" {', '.join(preparations)}"
            )
        spec = DataSpec(
            prepare=prepare,
            train=self._paths("data.train", data.get("train")),
            val=self._paths("data.val", data.get("val")),
        )
        if "data" in self.raw and not spec.prepare and not spec.train:
            self.errors.append(
                "data: give data.train (parquet/jsonl files) or data.prepare"
                f" ({', '.join(preparations)})"
            )
        if "data" not in self.raw:
            self.errors.append("data: required (data.train files or data.prepare)")
        if spec.prepare and (spec.train or spec.val):
            self.errors.append("data: data.prepare makes the files; do not also give train/val")
        return spec

    def reward(self) -> tuple[str, str] | None:
        reward = self._mapping("reward")
        self._unknown("reward", reward, ("custom",))
        custom = reward.get("custom")
        if custom is None:
            return None
        if not isinstance(custom, dict) or not isinstance(custom.get("path"), str):
            self.errors.append(
                f"reward.custom: expected {{path: file.py, name: function}}, got {custom!r}"
            )
            return None
        self._unknown("reward.custom", custom, ("path", "name"))
        return custom["path"], str(custom.get("name", "compute_score"))

    def lora(self) -> dict[str, Any]:
        """``lora:`` ({} when absent), checked with the trainer (rlctl.recipe.lora)."""
        lora = self._mapping("lora")
        self._unknown("lora", lora, tuple(LORA_KEYS))
        return dict(lora)

    def hardware(self) -> HardwareSpec:
        hw = self._mapping("hardware")
        self._unknown("hardware", hw, ("accelerators", "nodes"))
        accelerators = hw.get("accelerators", "auto")
        nodes = hw.get("nodes")
        if not isinstance(accelerators, str):
            self.errors.append(f"hardware.accelerators: expected e.g. H100:8, got {accelerators!r}")
            accelerators = "auto"
        elif accelerators != "auto":
            name, _, count = accelerators.partition(":")
            if name.lower() == "cpu":
                if count and (not _COUNT.fullmatch(count) or int(count) < 1):
                    self.errors.append(
                        f"hardware.accelerators: {accelerators!r}: cpu:N takes N >= 1 workers,"
                        " e.g. cpu:2"
                    )
            else:
                from rlctl.hardware import parse_accelerator_spec

                try:
                    parse_accelerator_spec(accelerators)
                except RlctlError as exc:
                    hint = f"; {exc.hint}" if exc.hint else ""
                    self.errors.append(f"hardware.accelerators: {exc}{hint}")
        if (
            nodes is not None
            and nodes != "auto"
            and (not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1)
        ):
            self.errors.append(
                f"hardware.nodes: expected a positive integer or auto, got {nodes!r}"
            )
            nodes = None
        return HardwareSpec(accelerators=accelerators, nodes=None if nodes == "auto" else nodes)

    def env(self) -> dict[str, str]:
        env = self._mapping("env")
        out = {}
        for key, value in env.items():
            if not isinstance(key, str) or not _ENV_NAME.match(key):
                self.errors.append(f"env.{key}: not a valid environment variable name")
            elif isinstance(value, dict | list) or value is None:
                self.errors.append(f"env.{key}: expected a plain value, got {value!r}")
            elif "\0" in str(value):
                self.errors.append(f"env.{key}: holds a NUL character, which no environment can")
            elif looks_secret(key):
                self.errors.append(
                    f"env.{key}: looks like a secret; list it under secrets: (by name) so its"
                    " value is read from your environment at launch and never written down"
                )
            else:
                out[key] = str(value)
        return out

    def secrets(self) -> tuple[str, ...]:
        value = self.raw.get("secrets") or []
        if not isinstance(value, list):
            self.errors.append(f"secrets: expected a list of names, got {value!r}")
            return ()
        names = []
        for item in value:
            if not isinstance(item, str) or not _ENV_NAME.match(item):
                self.errors.append(
                    f"secrets: {item!r} is not an environment variable name (list names, not values)"
                )
            else:
                names.append(item)
        return tuple(names)

    def engine(self, sft: bool = False) -> dict[str, Any]:
        engine = flatten(self._mapping("engine"), errors=self.errors)
        self.errors.extend(engine_key_problems(engine, sft))
        return engine

    def resolvers(self) -> None:
        """No ``${resolver:...}`` in a value that reaches the engine config (see RESOLVER),
        and no ``${...}`` at all in the recipe's own fields: they are literal values (an
        interpolation there would be resolved against the engine config, which is not what
        the recipe shows); ``engine:`` keys may interpolate other engine keys."""
        for key in ("model", "data", "reward", "checkpoints"):
            for path, text in strings_in(self.raw.get(key), key):
                if "${" in text and not RESOLVER.search(text):
                    self.errors.append(
                        f"{path}: {short(text)} is an OmegaConf interpolation; recipe fields"
                        " take the value itself (interpolations of engine keys work only"
                        " under engine:)"
                    )
        for key in ("model", "data", "reward", "checkpoints", "engine"):
            for path, text in strings_in(self.raw.get(key), key):
                if RESOLVER.search(text):
                    self.errors.append(
                        f"{path}: {short(text)} uses an OmegaConf resolver, which would be"
                        " resolved where you launch and its result written into the job's"
                        " files; write the value itself (a secret: list it under secrets:)"
                    )
