"""Files a recipe names on the launching machine that travel with the job.

Paths in the engine config are the job's: data files, a checkpoint folder, a custom
reward are read where the job runs. Two files are the launcher's instead, because a
person writes them beside the recipe and the job cannot reach them there: a multi-turn
rollout's tools file (``actor_rollout_ref.rollout.multi_turn.tool_config_path``,
docs/tools.md), its interactions file (``...multi_turn.interaction_config_path``) and its
agent loops file (``...multi_turn.agent_loop_config_path``, docs/agents.md), given as
relative paths. Each is read relative to the recipe's folder when the job is prepared,
with the ``.py`` files its entries name, and shipped in the job's directory under
``tools/``, ``interactions/`` or ``agent_loops/`` (the layout kept, so the entries'
relative paths still hold); the engine config then names the shipped copy. Every backend puts the job's files on
every node (local: this machine; Slurm: the shared job directory; SkyPilot: file mounts).

An absolute path (or ``~/...``) stays the job machine's, as data paths are.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from rlctl.errors import RlctlError
from rlctl.recipe.shipped import SHIPPED, Shipped, is_launcher_path
from rlctl.yamlfile import parse_yaml, read_text

MAX_FILE_BYTES = 1024 * 1024  # a tools file or a tool's source, not data
# Names that go into the engine config, a tar stream and SkyPilot's file mounts as they are.
_PLAIN_NAME = re.compile(r"^[A-Za-z0-9._-]+(/[A-Za-z0-9._-]+)*$")


@dataclass(frozen=True)
class JobFile:
    """One file shipped with the job: its path under the job's directory and its text."""

    name: str  # "/"-separated, relative: "tools/code_interpreter.yaml"
    text: str
    source: str  # where it was read, for messages


def ship_files(
    keys: dict[str, Any], recipe_source: str, job_root: str
) -> tuple[tuple[JobFile, ...], dict[str, Any]]:
    """The files to ship for these engine keys, and the keys that then name the shipped
    copies. Nothing to ship: ``((), {})``."""
    files: list[JobFile] = []
    named: dict[str, Any] = {}
    for key, shipped in SHIPPED.items():
        value = keys.get(key)
        if is_launcher_path(value):
            mine, name = _ship(key, shipped, value, recipe_source)
            files += mine
            named[key] = f"{job_root}/{name}"
    unique = {f.name: f for f in files}
    return tuple(unique.values()), named


def _ship(key: str, shipped: Shipped, value: str, recipe_source: str) -> tuple[list[JobFile], str]:
    base = Path(recipe_source).parent
    file = (base / value).resolve()
    field = f"engine.{key}"
    if not file.is_file():
        raise RlctlError(
            f"recipe {recipe_source}: {field}: {value!r} is not a file (looked for {str(file)!r})",
            hint=f"a relative {shipped.what} path is read from the recipe's folder and shipped"
            " with the job; fix the path, or give an absolute path that exists where the job"
            " runs",
        )
    text = _read(file, f"{field} ({value})")
    name = _shipped_name(shipped.folder, file.name, f"{field}: {value!r}")
    files = [JobFile(name, text, str(file))]
    # errors in the file name the recipe's field as well as the file
    for path, where in _entry_paths(text, f"{field}: {file}", shipped):
        files.append(_entry_source(shipped, file.parent, path, where))
    return files, name


def _read(path: Path, what: str) -> str:
    if path.stat().st_size > MAX_FILE_BYTES:
        raise RlctlError(
            f"{what}: {path} is larger than {MAX_FILE_BYTES // 1024} KiB",
            hint="a tools file and its tools' code are shipped with the job; keep data"
            " elsewhere and read it from where the job runs",
        )
    return read_text(path)


def _shipped_name(folder: str, relative: str, what: str) -> str:
    name = f"{folder}/{PurePosixPath(relative).as_posix()}"
    if not _PLAIN_NAME.match(name):
        raise RlctlError(
            f"{what}: the name {relative!r} has characters a shipped file cannot have",
            hint="name the file and its folders with letters, digits, '.', '_' and '-'",
        )
    return name


def _entry_paths(text: str, source: str, shipped: Shipped) -> list[tuple[str, str]]:
    """(path, where) of each ``.py`` file the file's entries name with a relative path:
    ``path:`` in rlctl's tools form, ``class_name: file.py:name`` in verl's form (tools,
    interactions) and ``_target_: file.py:Class`` (agent loops). Everything else in the
    file is checked by the engine when it starts."""
    data = parse_yaml(text, source)
    list_key = shipped.entries
    entries = data  # the agent loops file is the list itself
    if list_key:
        entries = data.get(list_key) if isinstance(data, dict) else None
    if not isinstance(entries, list):
        shape = f"a mapping with a list under {list_key}:" if list_key else "a list of entries"
        article = "an" if shipped.what[0] in "aeiou" else "a"
        raise RlctlError(
            f"{source}: {article} {shipped.what} is {shape}", hint=f"write e.g. {shipped.example}"
        )
    label = list_key or "agent_loop"
    found = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            continue
        path = entry.get("path")
        if isinstance(path, str):
            found.append((path, f"{source}: {label}[{i}].path"))
        for key in ("class_name", "_target_"):
            spec = entry.get(key)
            if isinstance(spec, str) and ":" in spec:
                file = spec.rpartition(":")[0]
                if file.endswith(".py"):
                    found.append((file, f"{source}: {label}[{i}].{key}"))
    return [(p, where) for p, where in found if is_launcher_path(p)]


def _entry_source(shipped: Shipped, folder: Path, path: str, where: str) -> JobFile:
    """An entry's ``.py`` file, from its file's folder or below (its place there is its
    place in the job's ``tools/``, ``interactions/`` or ``agent_loops/``)."""
    file = (folder / path).resolve()
    try:
        relative = file.relative_to(folder.resolve())
    except ValueError:
        raise RlctlError(
            f"{where}: {path!r} is outside the {shipped.what}'s folder, so it cannot be"
            " shipped beside it",
            hint=f"move the .py file into the {shipped.what}'s folder (or below), or give its"
            " absolute path where the job runs",
        ) from None
    if not file.is_file():
        raise RlctlError(
            f"{where}: {path!r} is not a file (looked for {str(file)!r})",
            hint="an entry's relative path is read from its file's folder",
        )
    name = _shipped_name(shipped.folder, relative.as_posix(), f"{where}: {path!r}")
    return JobFile(name, _read(file, where), str(file))
