"""A dataset class of your own in place of ``RLDataset`` (``data.custom_cls.path`` and
``name``, verl's keys).

The contract (docs/data.md): the class is built as ``RLDataset`` is,
``cls(files, tokenizer, data_cfg, tools, max_samples=N)``, once for the training files
and once for the validation files, and has the engine's dataset interface
(``engine.data.dataset.PromptDataset``): its items are ``PromptSample`` (each with its
position as ``index``: a resumed run finds its samples by it), and ``agent_rows`` and
``data_sources`` answer the checks made before workers start. Subclassing ``RLDataset``
gives all of it. verl's own classes (subclasses of its ``RLHFDataset``, whose items are
dicts of tensors) do not fit it: each item is checked when the dataset is built, so such
a class fails then, by name, not in the middle of a step.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.config import DataConfig
from engine.data.dataset import DataError, PromptDataset, PromptSample, RLDataset

PATH_KEY, NAME_KEY = "data.custom_cls.path", "data.custom_cls.name"
_INTERFACE = ("__len__", "__getitem__", "agent_rows", "data_sources")


def dataset_class(cfg: DataConfig) -> type:
    """The configured dataset class: ``RLDataset``, or the user's loaded from its file
    (a missing file or class, or a class without the interface, raises ``DataError``
    naming the key)."""
    custom = cfg.custom_cls
    if not custom.path:
        return RLDataset
    from engine.user_code import UserCodeError, load_user_callable

    try:
        cls = load_user_callable(
            custom.path, custom.name, path_key=PATH_KEY, name_key=NAME_KEY, what="class"
        )
    except UserCodeError as exc:
        raise DataError(str(exc)) from None
    where = f"{NAME_KEY}={custom.name!r} ({custom.path})"
    if not isinstance(cls, type):
        raise DataError(f"{where} is a {type(cls).__name__}, not a class")
    missing = [name for name in _INTERFACE if not callable(getattr(cls, name, None))]
    if missing:
        raise DataError(
            f"{where} is not a dataset of this engine: it lacks {', '.join(missing)}"
            " (docs/data.md: subclass engine.data.RLDataset, or give all of"
            f" {', '.join(_INTERFACE)})"
        )
    return cls


def build_dataset(
    cfg: DataConfig,
    files: Sequence[str | Path],
    tokenizer: Any,
    tools: Sequence[dict[str, Any]] = (),
    max_samples: int = -1,
    processor: Any = None,
) -> PromptDataset:
    """The dataset of ``files`` (``data.train_files`` or ``data.val_files``), of the
    configured class, with ``RLDataset``'s arguments; a class of your own has its items
    checked. ``processor``: a vision-language model's (``engine.models.processor``),
    passed only when there is one, so that a text-only class of your own need not
    take it."""
    cls = dataset_class(cfg)
    vision = {} if processor is None else {"processor": processor}
    dataset = cls(files, tokenizer, cfg, tools, max_samples=max_samples, **vision)
    if cls is not RLDataset:
        _check_items(dataset, cfg)
    return dataset


def _check_items(dataset: Any, cfg: DataConfig) -> None:
    """Every item a ``PromptSample`` at its own index, with a prompt within
    ``data.max_prompt_length`` (what ``RLDataset`` guarantees and the rollout relies on)."""
    where = f"{NAME_KEY}={cfg.custom_cls.name!r}"
    if len(dataset) < 1:
        raise DataError(f"{where} built an empty dataset")
    for i in range(len(dataset)):
        sample = dataset[i]
        if not isinstance(sample, PromptSample):
            raise DataError(
                f"{where}: item {i} is a {type(sample).__name__}; the engine reads"
                " engine.data.PromptSample items (docs/data.md)"
            )
        if sample.index != i:
            raise DataError(f"{where}: item {i} has index {sample.index}; give each its position")
        if not 0 < len(sample.prompt_ids) <= cfg.max_prompt_length:
            raise DataError(
                f"{where}: item {i} has {len(sample.prompt_ids)} prompt tokens; give 1 to"
                f" data.max_prompt_length={cfg.max_prompt_length}"
            )
