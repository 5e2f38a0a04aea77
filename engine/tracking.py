"""Where each step's metrics go, and progress bars for long phases.

``Tracker`` fans one step's metrics out to the loggers named in ``trainer.logger``
(``engine.config.LOGGERS``); several can be on at once. Each logger is a small class
with the same two methods, ``log(step, metrics)`` and ``close(failed=False)``, and those
that can show generated samples (``trainer.log_val_generations``) ``log_samples``:

    console      one line per step on stdout: ``step 3/40 | score 0.123 | ...``
    jsonl        ``<run_dir>/metrics.jsonl``, one JSON object per step; always on
                 (and ``progress.json`` beside checkpoints kept apart: engine.progress_file)
    tensorboard  ``<run_dir>/tensorboard`` (torch's ``SummaryWriter``)
    wandb        Weights & Biases; ``WANDB_MODE=offline`` works without a network
    mlflow       ``MLFLOW_TRACKING_URI``, else a file store in ``<run_dir>/mlruns``

The optional loggers import their package only when chosen, and say which extra
installs it when it is missing. A resumed run (``resumed_from_step=k``) continues the
same history in every logger: the JSONL file and TensorBoard drop the steps after
``k`` that ran before the crash, and W&B and MLflow reattach to the same run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Protocol, TextIO

from engine.config import LOGGERS, TrainerConfig
from engine.errors import EngineError
from engine.progress_file import ProgressMirror, mirror_folder

INSTALL_HINT = "pip install 'rlctl[trackers]'"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "val_generations.jsonl"  # trainer.log_val_generations

# ---------------------------------------------------------------------------
# the tracker


class Logger(Protocol):
    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self, failed: bool = False) -> None: ...


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """What a logger may need to start: the same for every logger of a run."""

    cfg: TrainerConfig
    run_dir: Path
    config: dict[str, Any]
    total_steps: int
    resumed_from_step: int
    stream: TextIO
    run_id: str  # stable across restarts of the run: W&B's run id, MLflow's tag


class Tracker:
    """Sends each step's metrics to the configured loggers.

    The JSONL file in the run directory is always written, whatever ``cfg.logger``
    says: it is the record that ``rlctl`` and resumed runs read back. Use it as a
    context manager, or call ``close()``; leaving the ``with`` block on an exception
    marks the W&B and MLflow runs as failed.
    """

    def __init__(
        self,
        cfg: TrainerConfig,
        run_dir: str | Path,
        config: dict[str, Any],
        total_steps: int,
        resumed_from_step: int = 0,
        stream: TextIO | None = None,
    ) -> None:
        if "://" in str(run_dir):
            raise EngineError(
                f"the tracker writes to a local directory, not {run_dir}: pass the local "
                "directory the run stages its files in"
            )
        unknown = [name for name in cfg.loggers if name not in LOGGERS]
        if unknown:
            raise EngineError(f"unknown trainer.logger {unknown}: choose from {', '.join(LOGGERS)}")
        run_dir = Path(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        info = RunInfo(
            cfg=cfg,
            run_dir=run_dir,
            config=config,
            total_steps=total_steps,
            resumed_from_step=resumed_from_step,
            stream=stream or sys.stdout,
            run_id=stable_run_id(run_dir, cfg.experiment_name),
        )
        self.run_id = info.run_id
        self.metrics_path = run_dir / METRICS_FILE
        self.loggers: list[Logger] = []
        self._closed = False
        try:
            for name in dict.fromkeys(["jsonl", *cfg.loggers]):  # jsonl always, each once
                self.loggers.append(_LOGGERS[name](info))
            folder = mirror_folder(cfg)
            if folder is not None:  # the run folder is out of rlctl's reach
                self.loggers.append(ProgressMirror(folder, total_steps, resumed_from_step))
        except BaseException:
            self.close(failed=True)
            raise

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for logger in self.loggers:
            logger.log(step, metrics)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """Generated samples (``trainer.log_val_generations``: input, output, score) to the
        loggers that show them: jsonl (``<run_dir>/val_generations.jsonl``), console,
        tensorboard (text), wandb (a table)."""
        for logger in self.loggers:
            show = getattr(logger, "log_samples", None)
            if show is not None:
                show(step, rows)

    def close(self, failed: bool = False) -> None:
        """Close every logger, even when one of them fails; the first error is raised."""
        if self._closed:
            return
        self._closed = True
        error: BaseException | None = None
        for logger in self.loggers:
            try:
                logger.close(failed)
            except Exception as e:
                error = error or e
        if error is not None:
            raise error

    def __enter__(self) -> Tracker:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(failed=exc is not None)


def stable_run_id(run_dir: str | Path, experiment_name: str) -> str:
    """The same id each time the run in ``run_dir`` starts, so that a resumed run
    continues the same W&B and MLflow run: the experiment name (readable) and a hash
    of the run directory's absolute path (unique)."""
    digest = hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", experiment_name).strip("-")[:40]
    return f"{slug}-{digest}" if slug else digest


def _scalar(value: Any) -> float | None:
    """A metric value as a float; None for what is not a number (never logged)."""
    if hasattr(value, "item"):  # a 0-d tensor or a numpy scalar
        value = value.item()
    if isinstance(value, (bool, int, float)):
        return float(value)
    return None


def _require(module: str, logger: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise EngineError(
            f"trainer.logger={logger} needs the '{module}' package, which is not installed: "
            f"{INSTALL_HINT}"
        ) from e


# ---------------------------------------------------------------------------
# console


# The headline of the console line: a person watching a run looks for these.
CONSOLE_KEYS = (
    ("critic/score/mean", "score"),
    ("val/score/mean", "val"),
    ("train/loss", "loss"),  # engine.sft's runs
    ("val/loss", "val_loss"),
    ("train/grad_norm", "grad_norm"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/entropy", "entropy"),
    ("actor/ppo_kl", "ppo_kl"),
    ("actor/grad_norm", "grad_norm"),
    ("critic/vf_loss", "vf_loss"),
    ("response_length/mean", "resp_len"),
    ("timing_s/step", "step_s"),
    ("perf/throughput", "tok/s/dev"),
)


def console_line(step: int, total: int, metrics: Mapping[str, Any]) -> str:
    """``step 3/40 | score 0.123 | ...``: the headline metrics present, in a fixed order."""
    parts = [f"step {step}/{total}"]
    for key, label in CONSOLE_KEYS:
        value = _scalar(metrics.get(key))
        if value is not None:
            parts.append(f"{label} {value:.4g}")
    return " | ".join(parts)


class ConsoleLogger:
    def __init__(self, total_steps: int, stream: TextIO) -> None:
        self.total_steps = total_steps
        self.stream = stream

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        print(console_line(step, self.total_steps, metrics), file=self.stream, flush=True)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        for i, row in enumerate(rows):
            text = f"[{i}] {row['input']!r} -> {row['output']!r} (score {row['score']:.4g})"
            print(f"val sample, step {step}: {text}", file=self.stream, flush=True)

    def close(self, failed: bool = False) -> None:
        pass


# ---------------------------------------------------------------------------
# jsonl


class JsonlLogger:
    """``{"step": N, "<metric>": value, ...}`` per line, keys sorted, flushed each step
    so that other processes can tail the file. NaN and infinities are written as
    ``null`` (JSON has no such numbers)."""

    def __init__(self, path: Path, resumed_from_step: int) -> None:
        self.path = path
        keep_history(path, resumed_from_step)
        self.file = path.open("a", encoding="utf-8")
        self.samples_path = path.parent / SAMPLES_FILE
        keep_history(self.samples_path, resumed_from_step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        with self.samples_path.open("a", encoding="utf-8") as f:
            f.writelines(json.dumps({"step": step, **row}, default=str) + "\n" for row in rows)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        record: dict[str, Any] = {"step": step}
        for key in sorted(metrics):
            value = _scalar(metrics[key])
            if key != "step" and (value is not None or metrics[key] is None):
                record[key] = value if value is not None and math.isfinite(value) else None
        self.file.write(json.dumps(record, allow_nan=False) + "\n")
        self.file.flush()

    def close(self, failed: bool = False) -> None:
        self.file.close()


def keep_history(path: Path, resumed_from_step: int) -> None:
    """Make ``path`` hold only the steps a run resumed at ``resumed_from_step`` keeps.

    A run resumed from the checkpoint of step k drops the lines of steps after k (they
    ran after that checkpoint, before the crash, and run again now) and a torn last line;
    a fresh run (k = 0) starts an empty file. The file is replaced in one rename, so a
    reader never sees half of it.
    """
    if not path.exists():
        return
    kept: list[str] = []
    if resumed_from_step > 0:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                step = json.loads(line)["step"]
            except (ValueError, KeyError, TypeError):
                continue
            if isinstance(step, int) and step <= resumed_from_step:
                kept.append(line + "\n")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.writelines(kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------------------
# tensorboard


class TensorBoardLogger:
    """Scalars in ``<run_dir>/tensorboard``. On resume at step k, TensorBoard hides the
    events after k written before the crash (``purge_step``)."""

    def __init__(self, log_dir: Path, resumed_from_step: int) -> None:
        _require("tensorboard", "tensorboard")
        from torch.utils.tensorboard import SummaryWriter

        # TensorBoard hides the events at and after purge_step written by earlier attempts.
        purge = resumed_from_step + 1 if resumed_from_step > 0 else 0
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge)

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, raw in metrics.items():
            value = _scalar(raw)
            if value is not None:
                self.writer.add_scalar(key, value, global_step=step)
        self.writer.flush()

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        text = "\n\n".join(f"{r['input']} -> {r['output']} (score {r['score']})" for r in rows)
        self.writer.add_text("val/generations", text, global_step=step)

    def close(self, failed: bool = False) -> None:
        self.writer.close()


# ---------------------------------------------------------------------------
# wandb


class WandbLogger:
    """One W&B run per run directory: its id is ``stable_run_id``, so a restarted run
    continues it (``resume="allow"``). ``WANDB_MODE``, ``WANDB_DIR`` and the other
    ``WANDB_*`` variables apply as usual; files go to ``<run_dir>/wandb`` unless
    ``WANDB_DIR`` is set."""

    def __init__(self, info: RunInfo) -> None:
        wandb = _require("wandb", "wandb")
        self.run = wandb.init(
            project=info.cfg.project_name,
            name=info.cfg.experiment_name,
            id=info.run_id,
            resume="allow",
            config=redact(info.config),
            dir=os.environ.get("WANDB_DIR") or str(info.run_dir),
        )

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        values = {k: v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not None}
        self.run.log(values, step=step)

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        import wandb

        table = wandb.Table(columns=["step", "input", "output", "score"])
        for row in rows:
            table.add_data(step, row["input"], row["output"], row["score"])
        self.run.log({"val/generations": table}, step=step)

    def close(self, failed: bool = False) -> None:
        self.run.finish(exit_code=1 if failed else 0)


# ---------------------------------------------------------------------------
# mlflow

RUN_ID_TAG = "rlctl.run_id"
_MLFLOW_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. :/]")
_MLFLOW_MAX_KEY = 250
_MLFLOW_MAX_PARAM_VALUE = 500  # the smallest limit of the MLflow servers still in use


def mlflow_metric_name(key: str) -> str:
    """A metric name MLflow accepts: ``@`` becomes ``_at_`` (``reward/mean@4`` →
    ``reward/mean_at_4``), any other character outside letters, digits and ``_-. :/``
    becomes ``_``, and empty, ``.`` and ``..`` path segments are dropped or replaced
    (MLflow refuses names that a file path would normalise)."""
    name = _MLFLOW_BAD_CHARS.sub("_", key.replace("@", "_at_"))
    parts = [p if p != ".." else "__" for p in name.split("/") if p not in ("", ".")]
    return "/".join(parts)[:_MLFLOW_MAX_KEY] or "_"


class MlflowLogger:
    """One MLflow run per run directory, in the experiment ``project_name``, named
    ``experiment_name`` and tagged ``rlctl.run_id``; a restarted run finds it by that
    tag and logs on into it. The engine config is logged as parameters once, when the
    run is created."""

    def __init__(self, info: RunInfo) -> None:
        _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (info.run_dir / "mlruns").resolve().as_uri()
            # MLflow 3 refuses a file store unless told it is wanted; it is, here: a
            # local record that needs no server (set MLFLOW_TRACKING_URI for one).
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id = self._find_or_create_run(info)

    def _find_or_create_run(self, info: RunInfo) -> str:
        client, project = self.client, info.cfg.project_name
        experiment = client.get_experiment_by_name(project)
        if experiment is None:
            experiment_id = client.create_experiment(project)
        else:
            experiment_id = experiment.experiment_id
            if experiment.lifecycle_stage == "deleted":
                client.restore_experiment(experiment_id)
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{info.run_id}'", max_results=1
        )
        if found:
            run_id = found[0].info.run_id
            client.update_run(run_id, status="RUNNING")
            return run_id
        run = client.create_run(
            experiment_id,
            run_name=info.cfg.experiment_name,
            tags={RUN_ID_TAG: info.run_id, "rlctl.run_dir": str(info.run_dir.resolve())},
        )
        self._log_params(run.info.run_id, info.config)
        return run.info.run_id

    def _log_params(self, run_id: str, config: dict[str, Any]) -> None:
        from mlflow.entities import Param

        params = [
            Param(mlflow_metric_name(k), str(v)[:_MLFLOW_MAX_PARAM_VALUE])
            for k, v in flatten(redact(config)).items()
        ]
        for i in range(0, len(params), 100):  # MLflow's limit per request
            self.client.log_batch(run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: Mapping[str, Any]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [
            Metric(mlflow_metric_name(key), value, now, step)
            for key, value in ((k, _scalar(v)) for k, v in metrics.items())
            if value is not None
        ]
        for i in range(0, len(batch), 1000):  # MLflow's limit per request
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


# ---------------------------------------------------------------------------
# config helpers

_SECRET_KEY = re.compile(r"api_?key|secret|password|passwd|credential|(^|_)token$", re.I)


def redact(config: Any) -> Any:
    """The config with the values of secret-looking keys (``*api_key*``, ``*secret*``,
    ``*password*``, ``*_token``, ...) replaced: trackers upload what they are given."""
    if isinstance(config, Mapping):
        return {
            k: "<redacted>" if _SECRET_KEY.search(str(k)) and v else redact(v)
            for k, v in config.items()
        }
    if isinstance(config, (list, tuple)):
        return [redact(v) for v in config]
    return config


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` → ``{"a.b": 1}``; lists stay values."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out |= flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


_LOGGERS: dict[str, Callable[[RunInfo], Logger]] = {
    "console": lambda info: ConsoleLogger(info.total_steps, info.stream),
    "jsonl": lambda info: JsonlLogger(info.run_dir / METRICS_FILE, info.resumed_from_step),
    "tensorboard": lambda info: TensorBoardLogger(
        info.run_dir / "tensorboard", info.resumed_from_step
    ),
    "wandb": WandbLogger,
    "mlflow": MlflowLogger,
}
assert set(_LOGGERS) == set(LOGGERS), "every name in engine.config.LOGGERS needs a logger"


# ---------------------------------------------------------------------------
# progress


class Progress:
    """A tqdm bar on stderr when it is a terminal; otherwise ``update`` does nothing."""

    def __init__(self, total: int, desc: str) -> None:
        self._bar: Any = None
        if progress_enabled():
            from tqdm import tqdm

            self._bar = tqdm(
                total=total, desc=desc, file=sys.stderr, leave=False, dynamic_ncols=True
            )

    @property
    def drawn(self) -> bool:
        return self._bar is not None

    def update(self, n: int = 1) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_enabled() -> bool:
    """Bars are drawn only on a terminal, and never with ``RLCTL_NO_PROGRESS=1``."""
    if os.environ.get("RLCTL_NO_PROGRESS", "") not in ("", "0"):
        return False
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress(total: int, desc: str) -> Progress:
    """``with progress(len(prompts), "validation") as bar: ... bar.update(k)``"""
    return Progress(total, desc)
