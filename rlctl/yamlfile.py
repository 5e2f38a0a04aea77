"""Reading the YAML files people write (recipes, site profiles), strictly.

YAML itself says a mapping's keys are unique, but PyYAML keeps the last of two silently:
a recipe with ``name:`` twice would run under the second. Here a repeated key, a file
that is not UTF-8, an alias (``*name``: its expansion can be exponential, and a recipe's
values are written out) or nesting too deep for the parser is refused with the file, the
line and the fix, as an ``RlctlError`` (or the subclass the caller names).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from rlctl.errors import RlctlError

MAX_BYTES = 4 * 1024 * 1024  # a recipe or profile is a few hundred lines


class _Refused(Exception):
    """A rule of this loader broken: the message, and the fix."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message, self.hint = message, hint


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing duplicate keys and aliases."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _Refused(
                f"line {event.start_mark.line + 1}: alias *{event.anchor} (anchors and aliases"
                " are not accepted)",
                "write the value out where it is used (a recipe can share fields with `extends:`)",
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                mark = key_node.start_mark
                try:
                    first = seen.setdefault(key, mark)
                except TypeError:  # an unhashable key: PyYAML's own error says so below
                    continue
                if first is not mark:
                    where = (
                        f"line {mark.line + 1}, columns {first.column + 1} and {mark.column + 1}"
                        if first.line == mark.line
                        else f"lines {first.line + 1} and {mark.line + 1}"
                    )
                    raise _Refused(
                        f"key {key!r} appears twice in one mapping, at {where}",
                        "keep one of them (YAML keys are unique; the second would silently win)",
                    )
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str, error: type[RlctlError] = RlctlError) -> Any:
    """``text`` parsed strictly; problems raise ``error`` naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except _Refused as exc:
        raise error(f"{source}: {exc.message}", hint=exc.hint) from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None
    except RecursionError:
        raise error(
            f"{source}: nested too deeply to read",
            hint="a recipe or profile is a few levels of mappings and lists",
        ) from None


def read_text(path: Path, error: type[RlctlError] = RlctlError) -> str:
    """The file as UTF-8 text (a byte-order mark is allowed); otherwise ``error`` naming
    the file, and the line and column of the first byte that is not UTF-8."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc.strerror or exc}") from None
    if len(data) > MAX_BYTES:
        raise error(f"{path}: larger than {MAX_BYTES // (1024 * 1024)} MiB: not a recipe")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise error(
            f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column {column}",
            hint="save the file as UTF-8 (e.g. `iconv -f latin1 -t utf-8 OLD > NEW`)",
        ) from None


def load_yaml_file(path: Path, error: type[RlctlError] = RlctlError) -> Any:
    """Read and parse ``path`` strictly (see the module's doc)."""
    return parse_yaml(read_text(path, error), str(path), error)
