"""Write a public or synthetic dataset as ``train.parquet`` and ``val.parquet`` in verl's layout.

    python -m engine.data.prepare gsm8k --out data/gsm8k                  # from the hub
    python -m engine.data.prepare gsm8k_tools --out data/gsm8k_tools      # the prompt offers Python
    python -m engine.data.prepare gsm8k_sft --out data/gsm8k_sft          # conversations, for SFT
    python -m engine.data.prepare gsm8k --out data/gsm8k --local-dir DIR  # offline
    python -m engine.data.prepare math --out data/math --local-dir DIR
    python -m engine.data.prepare geo3k --out data/geo3k --local-dir DIR   # with images
    python -m engine.data.prepare synthetic --out data/synthetic --train-size 2048
    python -m engine.data.prepare secret --out data/secret   # the tool task, with its tools
    python -m engine.data.prepare shapes --out data/shapes   # the visual task (docs/vision.md)

``--local-dir`` holds the source's own files (parquet, jsonl or json with its original
columns), e.g. a copy of the hub repository or GSM8K's ``train.jsonl``/``test.jsonl``.
Exit codes: 0 success, 2 a usage or data error (the message says what to change).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.data.dataset import SUPPORTED_EXTENSIONS, DataError, read_columns, require_columns
from engine.data.sources import Source, sources
from engine.errors import EXIT_USER_ERROR, user_errors

HUB_TIMEOUT_S = 5.0
SPLITS = ("train", "val")
_TRUTHY = ("1", "true", "yes", "on")
GENERATED = ("synthetic", "secret", "shapes")  # made here, not read from a source


def prepare(
    name: str,
    out_dir: str | Path,
    *,
    local_dir: str | Path | None = None,
    train_size: int | None = None,
    val_size: int | None = None,
    seed: int = 0,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``val.parquet`` of dataset ``name``; return their paths."""
    out = Path(out_dir)
    if name == "synthetic":
        from engine.data.synthetic import write_synthetic_dataset

        sizes = {}
        if train_size is not None:
            sizes["n_train"] = train_size
        if val_size is not None:
            sizes["n_val"] = val_size
        train, val = write_synthetic_dataset(out, seed=seed, **sizes)
        return {"train": train, "val": val}
    if name == "secret":  # the tool task: data, tools file and tool (engine.data.secret)
        from engine.data.secret import write_secret_task

        sizes = {"n_train": train_size, "n_val": val_size}
        return write_secret_task(out, seed=seed, **{k: v for k, v in sizes.items() if v})
    if name == "shapes":  # the synthetic visual task (engine.data.shapes)
        from engine.data.shapes import write_shapes_dataset

        sizes = {"n_train": train_size, "n_val": val_size}
        train, val = write_shapes_dataset(out, seed=seed, **{k: v for k, v in sizes.items() if v})
        return {"train": train, "val": val}
    known = sources()
    if name not in known:
        raise DataError(f"unknown dataset {name!r}; choose from {', '.join((*GENERATED, *known))}")
    source = known[name]
    limits = {"train": train_size, "val": val_size}
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split in SPLITS:
        raw = _load_split(source, split, local_dir)
        rows = _convert(source, split, raw, limits[split])
        paths[split] = _write(rows, out / f"{split}.parquet")
    return paths


def _load_split(source: Source, split: str, local_dir: str | Path | None) -> list[dict[str, Any]]:
    if local_dir is not None:
        return _load_local(source, split, Path(local_dir))
    return _load_hub(source, split)


def _convert(
    source: Source, split: str, raw: list[dict[str, Any]], limit: int | None
) -> list[dict[str, Any]]:
    source_split = source.splits[split]
    rows = []
    skipped = 0
    for index, row in enumerate(raw):
        if limit is not None and len(rows) >= limit:
            break
        converted = source.make_row(row, source_split, index)
        if converted is None:
            skipped += 1
        else:
            rows.append(converted)
    if skipped:
        print(f"{split}: skipped {skipped} rows without a usable answer", file=sys.stderr)
    if not rows:
        raise DataError(f"{source.hub_id} {source_split}: no usable rows")
    return rows


def _write(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    print(f"wrote {len(rows)} rows to {path}")
    return path


# ---------------------------------------------------------------------------
# local files


def split_files(source: Source, split: str, local_dir: Path) -> list[Path]:
    """The files of one split under ``local_dir``: ``<split>.<ext>`` or hub shards
    ``<split>-00000-of-00002.<ext>``, in ``local_dir`` or one of the source's subfolders."""
    if not local_dir.is_dir():
        raise DataError(f"--local-dir {local_dir} is not a folder")
    source_split = source.splits[split]
    pattern = re.compile(rf"{re.escape(source_split)}(-\d+-of-\d+)?")
    for folder in (*(local_dir / d for d in source.local_subdirs), local_dir):
        if not folder.is_dir():
            continue
        found = sorted(
            p
            for p in folder.iterdir()
            if p.suffix in SUPPORTED_EXTENSIONS and pattern.fullmatch(p.stem)
        )
        if found:
            return found
    where = ", ".join(str(local_dir / d) for d in source.local_subdirs)
    raise DataError(
        f"no {source_split!r} split of {source.hub_id} in {local_dir} (nor in {where}): expected "
        f"{source_split}.jsonl, {source_split}.parquet or {source_split}-00000-of-00001.parquet"
    )


def _load_local(source: Source, split: str, local_dir: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for path in split_files(source, split, local_dir):
        columns = read_columns(path)
        require_columns(path, columns, source.columns)
        n = len(next(iter(columns.values()))) if columns else 0
        rows.extend({name: columns[name][i] for name in source.columns} for i in range(n))
    return rows


# ---------------------------------------------------------------------------
# the hub


def hub_offline() -> bool:
    return any(
        os.environ.get(var, "").strip().lower() in _TRUTHY
        for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _offline_hint(source: Source, reason: str) -> str:
    config = f" (config {source.hub_config!r})" if source.hub_config else ""
    return (
        f"cannot download {source.hub_id}{config}: {reason}. Download its files elsewhere "
        f"(parquet or jsonl with its original columns: {', '.join(source.columns)}) and pass "
        "the folder with --local-dir PATH"
    )


def _load_hub(source: Source, split: str) -> list[dict[str, Any]]:
    if hub_offline():
        raise DataError(
            _offline_hint(
                source,
                "the Hugging Face Hub cannot be reached (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE is set)",
            )
        )
    from huggingface_hub import HfApi

    try:  # one quick request, so that an unreachable hub fails now instead of after retries
        HfApi().dataset_info(source.hub_id, timeout=HUB_TIMEOUT_S)
    except Exception as exc:
        raise DataError(
            _offline_hint(source, f"the Hugging Face Hub could not be reached ({exc})")
        ) from exc
    import datasets

    try:
        data = datasets.load_dataset(source.hub_id, source.hub_config, split=source.splits[split])
    except Exception as exc:
        raise DataError(_offline_hint(source, f"loading failed ({exc})")) from exc
    return data.select_columns(list(source.columns)).to_list()


# ---------------------------------------------------------------------------
# command line


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m engine.data.prepare",
        description="Write a dataset as train.parquet and val.parquet in verl's layout.",
        epilog="examples:\n"
        "  python -m engine.data.prepare gsm8k --out data/gsm8k\n"
        "  python -m engine.data.prepare math --out data/math --local-dir ~/MATH-lighteval\n"
        "  python -m engine.data.prepare geo3k --out data/geo3k --local-dir ~/geometry3k\n"
        "  python -m engine.data.prepare synthetic --out data/synthetic --train-size 512\n"
        "  python -m engine.data.prepare secret --out data/secret  # the tool task",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dataset", choices=(*sources(), *GENERATED))
    parser.add_argument("--out", required=True, metavar="DIR", help="output folder")
    parser.add_argument(
        "--local-dir",
        metavar="PATH",
        help="the source's own files, for machines without hub access",
    )
    parser.add_argument(
        "--train-size", type=_positive, metavar="N", help="rows in train (default: all)"
    )
    parser.add_argument(
        "--val-size", type=_positive, metavar="N", help="rows in val (default: all)"
    )
    parser.add_argument("--seed", type=int, default=0, help="synthetic, secret: generation seed")
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.local_dir is not None and args.dataset in GENERATED:
        print(f"error: --local-dir does not apply to the {args.dataset} dataset", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)  # a usage error, as argparse's own
    with user_errors():
        prepare(
            args.dataset,
            args.out,
            local_dir=args.local_dir,
            train_size=args.train_size,
            val_size=args.val_size,
            seed=args.seed,
        )


if __name__ == "__main__":
    main()
