"""Public datasets that ``python -m engine.data.prepare`` converts to verl's layout.

A :class:`Source` says where the data lives (a Hugging Face Hub id, or the same files
downloaded to a local folder), which of its splits become ``train`` and ``val``, and how
one of its rows becomes a verl row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# (source row, source split name, index in that split) -> verl row, or None to skip it
RowFn = Callable[[dict[str, Any], str, int], "dict[str, Any] | None"]


@dataclass(frozen=True)
class Source:
    hub_id: str
    hub_config: str | None  # the dataset's config name on the hub, if it has several
    splits: dict[str, str]  # our split (train, val) -> the source's split name
    columns: tuple[str, ...]  # source columns make_row reads
    local_subdirs: tuple[str, ...]  # folders of a hub snapshot that hold the split files
    make_row: RowFn


def sources() -> dict[str, Source]:
    """The sources by command-line name."""
    from engine.data.sources import geo3k, gsm8k, math_lighteval

    return {
        "gsm8k": gsm8k.SOURCE,
        "gsm8k_tools": gsm8k.TOOLS_SOURCE,
        "gsm8k_sft": gsm8k.SFT_SOURCE,  # conversations for engine.sft
        "math": math_lighteval.SOURCE,
        "geo3k": geo3k.SOURCE,
    }
