"""A user's code, loaded from a ``.py`` file named in the config: a reward function, a
tool, an agent loop, a dataset class. Below every package that loads one (``engine.reward``,
``engine.agents``, ``engine.data``): each turns ``UserCodeError`` into its own error."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any


class UserCodeError(Exception):
    """The file or the callable named in the config cannot be loaded (the message names
    the key)."""


def load_user_callable(
    path: str | Path,
    name: str,
    *,
    path_key: str = "custom_reward_function.path",
    name_key: str = "custom_reward_function.name",
    what: str = "function",
) -> Any:
    """Import ``path`` as a module and return its callable ``name``.

    ``path_key``/``name_key`` are the config keys the messages name (a custom tool's
    loader, ``engine/agents/tools/specs.py``, names its own); ``what`` the kind of
    callable looked for (a dataset's loader, ``engine.data.custom``, looks for a class)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise UserCodeError(
            f"{path_key} {str(path)!r} is not a file "
            f"(looked for {str(file)!r}); give the path of a .py file"
        )
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:12]
    module_name = f"_rlctl_custom_reward_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise UserCodeError(f"{path_key} {str(file)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise UserCodeError(
            f"importing {path_key} {str(file)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, name):
        functions = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_")
        )
        raise UserCodeError(
            f"{str(file)!r} has no {what} {name!r} (set {name_key}; "
            f"callables in the file: {', '.join(functions) or 'none'})"
        )
    function = getattr(module, name)
    if not callable(function):
        raise UserCodeError(
            f"{name_key} {name!r} in {str(file)!r} is a {type(function).__name__}, not a {what}"
        )
    return function
