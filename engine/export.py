"""Export a trained role of a checkpoint as a Hugging Face model folder.

    python -m engine.export CKPT OUT [--role actor|critic|sft] [--dtype float32|bfloat16|float16]
                                     [--adapter-only] [--push-to-hub REPO_ID [--private]]

CKPT is a checkpoint ``.../global_step_<k>`` (it must have its ``COMPLETE`` marker), a
run directory (its latest complete checkpoint is taken, and named), or either of those
as a bucket URL (``s3://...``, ``gs://...``: only the role's weights and its ``hf/``
folder are downloaded, to a temporary directory). OUT receives ``model.safetensors``
(or its shards), ``config.json``, ``generation_config.json`` and the tokenizer (a
vision-language model's processor files too: ``preprocessor_config.json``, and its
chat template), and loads with ``AutoModelForCausalLM.from_pretrained(OUT)``
(``AutoModelForImageTextToText`` for a vision-language model); the critic role exports a
token-classification model with one output (``AutoModelForTokenClassification``).
An actor trained with LoRA exports merged, or as its adapter alone with ``--adapter-only``
(``engine.export_lora``).

How: the role's ``model/`` folder is a torch distributed checkpoint of the FSDP2
model's state dict, with Hugging Face parameter names, written in shards by every
rank. The architecture is built from ``hf/config.json`` in this one process, with
no torch.distributed process group and without random initialisation, then
``dcp.load(..., no_dist=True)`` fills its full-size tensors in place: the load
planner reads, for each tensor, the chunks that every rank wrote and copies them
into place (casting to ``--dtype`` as it copies). A tied output embedding
(``tie_word_embeddings``) is one tensor here, filled from whichever of its names the
checkpoint holds. The config's ``use_cache`` (turned off for training) is turned
back on.

A role trained with ``strategy=megatron`` has per-rank files and ``meta.json`` instead
of ``model/``: ``engine.train.megatron.hf_state_dict_from_checkpoint`` merges the tensor-
parallel slices of data-parallel rank 0 into HF tensors (torch only, no Megatron-core),
which fill the same model.

Memory: the peak is the whole model once, at the export dtype, in this process's CPU
memory, plus one safetensors shard (at most 5 GB) while it is written. Every shard
of every rank is read into this one process: a 70B model exported in bfloat16 needs
about 140 GB of RAM here, where training spread it over all ranks.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import shutil
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from engine.checkpoint import COMPLETE, step_dir
from engine.errors import EngineError, user_errors

log = logging.getLogger(__name__)

ROLES = ("actor", "critic", "sft")  # sft: engine.sft's runs
EXPORT_DTYPES = ("float32", "bfloat16", "float16")
MAX_SHARD_SIZE = "5GB"
_STEP_DIR = re.compile(r"^global_step_(\d+)$")
# Written by the model's own save_pretrained, never copied from the checkpoint's hf/.
_MODEL_FILES = ("config.json", "generation_config.json", "adapter_config.json")
MEGATRON_META = "meta.json"  # engine.train.megatron's checkpoint marker, written last


class ExportError(EngineError):
    """The checkpoint cannot be exported as asked; the message says what to pass instead."""


# ----------------------------------------------------------------------------- API


def export_checkpoint(
    ckpt: str,
    out: str | Path,
    role: str = "actor",
    dtype: str = "float32",
    adapter_only: bool = False,
) -> Path:
    """Write checkpoint ``ckpt``'s ``role`` to ``out`` as a Hugging Face folder; returns it.

    ``out`` must not exist or be empty; it appears whole or not at all (the folder is
    written under a temporary name beside it, then renamed).
    """
    if role not in ROLES:
        raise ExportError(f"unknown role {role!r}: pass --role {' or --role '.join(ROLES)}")
    if dtype not in EXPORT_DTYPES:
        raise ExportError(f"unknown dtype {dtype!r}: pass one of {', '.join(EXPORT_DTYPES)}")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ExportError(f"{out} already exists and is not empty: pass a new output folder")
    from engine.export_lora import is_lora, write_lora

    with _local_role(str(ckpt), role) as (role_dir, tokenizer_dir):
        lora = is_lora(role_dir)
        if adapter_only and not lora:
            raise ExportError(
                f"--adapter-only: the {role} of {ckpt} was not trained with LoRA"
                " (actor_rollout_ref.model.lora_rank=0): leave the flag out"
            )
        model = None if lora else _load_model(role_dir, role, dtype)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=_parent(out)))
        try:
            if lora:
                write_lora(role_dir, staging, dtype, adapter_only, ExportError)
            else:
                model.save_pretrained(
                    staging, safe_serialization=True, max_shard_size=MAX_SHARD_SIZE
                )
                del model
            if tokenizer_dir is not None:
                _copy_tokenizer(tokenizer_dir, staging)
            if out.exists():
                out.rmdir()
            staging.rename(out)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return out


def push_to_hub(folder: str | Path, repo_id: str, private: bool = False) -> str:
    """Upload an exported folder to the Hugging Face Hub; returns the repository's URL.

    The token is ``HF_TOKEN`` (else huggingface_hub's saved login); it is never printed.
    """
    _check_online()
    from huggingface_hub import HfApi

    token = os.environ.get("HF_TOKEN") or None
    api = HfApi(token=token)
    try:
        url = api.create_repo(repo_id, repo_type="model", private=private, exist_ok=True)
        api.upload_folder(
            repo_id=repo_id,
            repo_type="model",
            folder_path=str(folder),
            commit_message="Upload model exported by rlctl (python -m engine.export)",
        )
    except Exception as exc:  # huggingface_hub raises HTTP, network and validation errors
        reason = _redact(f"{type(exc).__name__}: {exc}".strip().splitlines()[0], token)
        raise ExportError(
            f"could not push {folder} to the Hugging Face Hub repository {repo_id} ({reason}):"
            " check the network, that HF_TOKEN is set to a token with write access, and the"
            f" repository name; the export itself is complete, upload it later with"
            f" `hf upload {repo_id} {folder}`"
        ) from None
    return str(url)


# ----------------------------------------------------------------------------- finding


def resolve_checkpoint(ckpt: str) -> str:
    """The complete checkpoint that ``ckpt`` names: itself, or a run's latest one."""
    if _is_remote(ckpt):
        return _resolve_remote(ckpt.rstrip("/"))
    path = Path(ckpt.removeprefix("file://"))
    if not path.is_dir():
        raise ExportError(
            f"no such checkpoint directory {path}: pass a run's global_step_<k> directory,"
            " or the run directory (trainer.default_local_dir) to take its latest checkpoint"
        )
    if (path / COMPLETE).is_file():
        return str(path)
    if _STEP_DIR.match(path.name):
        raise ExportError(
            f"{path} has no {COMPLETE} marker: the run stopped before this checkpoint was"
            f" finished. {_complete_hint(path.parent)}"
        )
    steps = _complete_steps(path)
    if steps:
        chosen = path / step_dir(steps[-1])
        log.info("exporting %s, the latest complete checkpoint of the run %s", chosen, path)
        return str(chosen)
    if any(_STEP_DIR.match(p.name) for p in path.iterdir()):
        raise ExportError(
            f"the run directory {path} has no complete checkpoint (no global_step_<k> in it"
            f" has a {COMPLETE} marker): pass the run directory of a run that saved one"
        )
    raise ExportError(
        f"{path} is neither a checkpoint (global_step_<k> with a {COMPLETE} marker) nor a run"
        " directory holding one: pass the run's trainer.default_local_dir or one of its"
        " global_step_<k> directories"
    )


def _complete_steps(run_dir: Path) -> list[int]:
    if not run_dir.is_dir():
        return []
    return sorted(
        int(m.group(1))
        for p in run_dir.iterdir()
        if (m := _STEP_DIR.match(p.name)) and (p / COMPLETE).is_file()
    )


def _complete_hint(run_dir: Path) -> str:
    steps = _complete_steps(run_dir)
    if not steps:
        return "The run has no complete checkpoint to export instead."
    return f"Pass a complete one instead, such as {run_dir / step_dir(steps[-1])}."


def _resolve_remote(url: str) -> str:
    from engine.storage import open_store

    store = open_store(url)
    if store.exists(COMPLETE):
        return url
    name = url.rsplit("/", 1)[-1]
    if _STEP_DIR.match(name):
        raise ExportError(
            f"{url} has no {COMPLETE} marker: the run stopped (or its upload was cut off)"
            " before this checkpoint was finished; pass an earlier global_step_<k>, or the"
            " run's URL to take its latest complete checkpoint"
        )
    steps = sorted(
        int(m.group(1))
        for d in store.list_dirs("")
        if (m := _STEP_DIR.match(d)) and store.exists(f"{d}/{COMPLETE}")
    )
    if not steps:
        raise ExportError(
            f"{url} holds no complete checkpoint (global_step_<k> with a {COMPLETE} marker):"
            " pass the URL of a run that saved one, or of one of its checkpoints"
        )
    chosen = f"{url}/{step_dir(steps[-1])}"
    log.info("exporting %s, the latest complete checkpoint of the run %s", chosen, url)
    return chosen


@contextlib.contextmanager
def _local_role(ckpt: str, role: str) -> Iterator[tuple[Path, Path | None]]:
    """The role's directory on local disk, and the folder holding the tokenizer (the
    role's own hf/, else the actor's: the critic saves none)."""
    path = resolve_checkpoint(ckpt)
    if not _is_remote(path):
        role_dir = _check_role(Path(path), role, {d.name for d in Path(path).iterdir()})
        yield role_dir, _tokenizer_dir(Path(path), role)
        return
    from engine.storage import open_store

    store = open_store(path)
    present = {r for r in ROLES if store.exists(r)}
    with tempfile.TemporaryDirectory(prefix="rlctl-export-") as tmp:
        local = Path(tmp)
        if role in present and store.exists(f"{role}/{MEGATRON_META}"):
            log.info("downloading %s/%s", path, role)  # per-rank files: the whole role
            store.download_dir(role, local / role)
        elif role in present:
            for part in ("model", "hf"):
                if store.exists(f"{role}/{part}"):
                    log.info("downloading %s/%s/%s", path, role, part)
                    store.download_dir(f"{role}/{part}", local / role / part)
            if role != "actor" and store.exists("actor/hf"):
                store.download_dir("actor/hf", local / "actor" / "hf")
        role_dir = _check_role(local, role, present, shown=path)
        yield role_dir, _tokenizer_dir(local, role)


def _check_role(ckpt: Path, role: str, present: set[str], shown: str | None = None) -> Path:
    shown = shown or str(ckpt)
    if role not in present:
        roles = [r for r in ROLES if r in present]
        instead = (
            f"pass --role {roles[0]}" if roles else "it holds no trained role (actor/, critic/)"
        )
        raise ExportError(f"the checkpoint {shown} has no {role}/: {instead}")
    role_dir = ckpt / role
    # A Megatron role (strategy=megatron) has per-rank files and meta.json, not model/.
    weights = MEGATRON_META if (role_dir / MEGATRON_META).is_file() else "model"
    for part, what in ((weights, "sharded weights"), ("hf", "Hugging Face config")):
        if not (role_dir / part).exists():
            raise ExportError(
                f"{shown}/{role} has no {part}/ (the {what}): the checkpoint is damaged or was"
                " not written by this engine; pass another global_step_<k> of the run"
            )
    if not (role_dir / "hf" / "config.json").is_file():
        raise ExportError(
            f"{shown}/{role}/hf has no config.json: the checkpoint is damaged; pass another"
            " global_step_<k> of the run"
        )
    return role_dir


def _tokenizer_dir(ckpt: Path, role: str) -> Path | None:
    for candidate in (ckpt / role / "hf", ckpt / "actor" / "hf"):
        if candidate.is_dir() and any(
            p.is_file() and p.name not in _MODEL_FILES for p in candidate.iterdir()
        ):
            return candidate
    return None


# ----------------------------------------------------------------------------- loading


def _load_model(role_dir: Path, role: str, dtype: str) -> Any:
    """The role's model, built from hf/config.json and filled from model/ in place."""
    import torch
    from transformers import AutoConfig, GenerationConfig

    hf_dir = role_dir / "hf"
    try:
        config = AutoConfig.from_pretrained(hf_dir)
    except Exception as exc:  # transformers validates configs with assorted errors
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ExportError(
            f"cannot read {hf_dir}/config.json ({reason.strip()}): the checkpoint is damaged,"
            " or needs a newer transformers; pass another global_step_<k> of the run"
        ) from None
    config.use_cache = True  # off for training; an exported model is for inference
    torch_dtype = getattr(torch, dtype)
    with _no_init_weights():
        if role == "critic":
            from transformers import AutoModelForTokenClassification

            config.num_labels = 1
            model = _from_config(AutoModelForTokenClassification, config, torch_dtype)
        else:
            from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

            from engine.models.hf_config import is_vision_language

            auto = (
                AutoModelForImageTextToText if is_vision_language(config) else AutoModelForCausalLM
            )
            model = _from_config(auto, config, torch_dtype)
    model.tie_weights()  # skipped with initialisation: tied names must share one tensor
    model.eval()
    if (role_dir / MEGATRON_META).is_file():
        _fill_from_megatron(model, role_dir)
    else:
        _fill_from_dcp(model, role_dir, hf_dir)
    if (hf_dir / "generation_config.json").is_file() and model.can_generate():
        model.generation_config = GenerationConfig.from_pretrained(hf_dir)
    return model


def _fill_from_megatron(model: Any, role_dir: Path) -> None:
    """A Megatron checkpoint's TP slices merged into HF tensors (no Megatron needed),
    named as Hugging Face checkpoints name them (one tensor per expert), written into
    the model's parameters or the slices of its fused experts parameters."""
    import torch

    from engine.rollout.weights import checkpoint_slots
    from engine.train.megatron import hf_state_dict_from_checkpoint

    state = hf_state_dict_from_checkpoint(role_dir)
    slots = checkpoint_slots(model)
    missing = sorted(set(slots) - set(state))
    if getattr(model.config, "tie_word_embeddings", False):
        missing = [name for name in missing if name != "lm_head.weight"]  # the embedding's
    unexpected = sorted(set(state) - set(slots))
    if missing or unexpected:
        raise ExportError(
            f"the Megatron checkpoint {role_dir} does not fit the architecture in its"
            f" hf/config.json (missing {_few(missing)}, unexpected {_few(unexpected)}): the"
            " checkpoint is damaged; pass another global_step_<k> of the run"
        )
    with torch.no_grad():
        for name, tensor in state.items():
            target = slots[name][1]
            if target.shape != tensor.shape:
                raise ExportError(
                    f"{name} in {role_dir} has shape {tuple(tensor.shape)} but the"
                    f" architecture expects {tuple(target.shape)}: the checkpoint is"
                    " damaged"
                )
            target.copy_(tensor)


def _fill_from_dcp(model: Any, role_dir: Path, hf_dir: Path) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    model_dir = role_dir / "model"
    try:
        metadata = FileSystemReader(str(model_dir)).read_metadata().state_dict_metadata
    except Exception as exc:
        raise ExportError(
            f"cannot read the distributed checkpoint in {model_dir} ({type(exc).__name__}:"
            f" {exc}): the checkpoint is damaged; pass another global_step_<k> of the run"
        ) from None
    state = model.state_dict()  # views of the model's own tensors: loading fills them
    wanted = _tensors_to_load(state, metadata, model_dir)
    for name, tensor in wanted.items():
        stored = metadata[name]
        if not isinstance(stored, TensorStorageMetadata) or tuple(stored.size) != tuple(
            tensor.shape
        ):
            shape = getattr(stored, "size", "not a tensor")
            raise ExportError(
                f"{name} in {model_dir} has shape {tuple(shape)} but the architecture in"
                f" {hf_dir}/config.json expects {tuple(tensor.shape)}: the config does not"
                " match the weights; the checkpoint is damaged"
            )
    with warnings.catch_warnings():
        # "torch.distributed is ... uninitialized, assuming ... a single process": intended.
        warnings.filterwarnings("ignore", message=r"torch\.distributed is disabled")
        dcp.load(wanted, checkpoint_id=str(model_dir), no_dist=True)


def _tensors_to_load(state: dict[str, Any], metadata: dict[str, Any], model_dir: Path) -> dict:
    """The model's tensors that the checkpoint holds, one name per tensor; fails when a
    tensor has none of its names there (a tied one needs only one), or the checkpoint
    holds a name the architecture lacks."""
    names_of: dict[tuple, list[str]] = {}
    for name, tensor in state.items():
        # Tied names are views of one tensor: same address, shape and dtype.
        key = (tensor.data_ptr(), tuple(tensor.shape), tensor.dtype) if tensor.numel() else (name,)
        names_of.setdefault(key, []).append(name)
    wanted = {}
    missing = []
    for names in names_of.values():
        held = [n for n in names if n in metadata]
        if held:
            wanted[held[0]] = state[held[0]]
        else:
            missing.append(names[0])
    extra = sorted(set(metadata) - set(state))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {_few(missing)}")
        if extra:
            parts.append(f"unknown to the architecture: {_few(extra)}")
        raise ExportError(
            f"the weights in {model_dir} do not match the architecture in its hf/config.json"
            f" ({'; '.join(parts)}): the checkpoint is damaged or was written by another"
            " program; pass another global_step_<k> of the run"
        )
    return wanted


def _from_config(auto_cls: Any, config: Any, dtype: Any) -> Any:
    try:
        return auto_cls.from_config(config, dtype=dtype)
    except ValueError as exc:  # an architecture transformers does not know
        raise ExportError(
            f"transformers cannot build model type {config.model_type!r} as"
            f" {auto_cls.__name__} ({exc}); install a transformers version that has it"
        ) from None


def _no_init_weights() -> contextlib.AbstractContextManager:
    """Skip random initialisation (every weight is loaded right after)."""
    try:
        from transformers.initialization import no_init_weights  # transformers 5
    except ImportError:
        try:
            from transformers.modeling_utils import no_init_weights  # transformers 4
        except ImportError:
            return contextlib.nullcontext()
    return no_init_weights()


def _copy_tokenizer(src: Path, dest: Path) -> None:
    """The tokenizer's files as saved with the checkpoint (byte for byte)."""
    for item in src.iterdir():
        if item.name in _MODEL_FILES:
            continue
        if item.is_dir():
            shutil.copytree(item, dest / item.name)
        else:
            shutil.copy2(item, dest / item.name)


# ----------------------------------------------------------------------------- helpers


def _is_remote(path: str) -> bool:
    return "://" in path and not path.startswith("file://")


def _parent(out: Path) -> Path:
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    return parent


def _few(names: list[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "***") if token and len(token) >= 4 else text


def _hub_offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return value.strip().upper() in ("1", "ON", "YES", "TRUE")


def _check_online() -> None:
    if _hub_offline():
        raise ExportError(
            "--push-to-hub needs the Hugging Face Hub, but HF_HUB_OFFLINE is set: unset it"
            " on a machine with network access, or export without --push-to-hub and upload"
            " the folder later with `hf upload REPO_ID OUT`"
        )


# ----------------------------------------------------------------------------- CLI


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m engine.export",
        description="Export a trained role of a checkpoint as a Hugging Face model folder.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
        "  python -m engine.export checkpoints/rlctl/run/global_step_100 ./qwen-grpo\n"
        "  python -m engine.export checkpoints/rlctl/run ./qwen-grpo --dtype bfloat16\n"
        "  python -m engine.export s3://bucket/runs/grpo ./qwen-grpo --push-to-hub me/qwen-grpo",
    )
    parser.add_argument(
        "ckpt",
        metavar="CKPT",
        help="a global_step_<k> checkpoint, or a run directory (its latest complete"
        " checkpoint); local or s3:// / gs://",
    )
    parser.add_argument("out", metavar="OUT", help="the folder to write (new or empty)")
    parser.add_argument("--role", choices=ROLES, default="actor", help="default: actor")
    parser.add_argument(
        "--dtype", choices=EXPORT_DTYPES, default="float32", help="weights' dtype (float32)"
    )
    parser.add_argument(
        "--adapter-only",
        action="store_true",
        help="a LoRA actor: write its adapter (peft's folder) instead of the merged model",
    )
    parser.add_argument(
        "--push-to-hub", metavar="REPO_ID", help="then upload OUT there (token: HF_TOKEN)"
    )
    parser.add_argument("--private", action="store_true", help="create the Hub repository private")
    args = parser.parse_args(argv)
    if args.private and not args.push_to_hub:
        parser.error("--private goes with --push-to-hub REPO_ID")
    return args


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    with user_errors():
        if args.push_to_hub:
            _check_online()  # before the export, not after it
        ckpt = resolve_checkpoint(args.ckpt)
        if ckpt.rstrip("/") != args.ckpt.rstrip("/"):
            print(f"exporting {ckpt}, the latest complete checkpoint of the run", file=sys.stderr)
        out = export_checkpoint(
            ckpt, args.out, role=args.role, dtype=args.dtype, adapter_only=args.adapter_only
        )
        print(f"exported {args.role} ({args.dtype}) to {out}")
        if args.push_to_hub:
            url = push_to_hub(out, args.push_to_hub, private=args.private)
            print(f"pushed {out} to {url}")


if __name__ == "__main__":
    main()
