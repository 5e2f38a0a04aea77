"""Load a user's reward function from a ``.py`` file (``custom_reward_function.path/name``).

The function is called as ``fn(data_source, solution_str, ground_truth, extra_info)`` and
returns a float or a dict with ``"score"`` (and optionally ``"acc"`` and other numbers).
When set, it scores every data source; the built-in registry is not consulted.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path

from engine.config.reward import CustomRewardFunctionConfig
from engine.reward.types import CustomScorer, RewardError


def load_custom_function(
    path: str | Path,
    name: str,
    *,
    path_key: str = "custom_reward_function.path",
    name_key: str = "custom_reward_function.name",
    what: str = "function",
) -> CustomScorer:
    """Import ``path`` as a module and return its callable ``name``.

    ``path_key``/``name_key`` are the config keys the messages name (a custom tool's
    loader, ``engine/agents/tools/specs.py``, names its own); ``what`` the kind of
    callable looked for (a dataset's loader, ``engine.data.custom``, looks for a class)."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise RewardError(
            f"{path_key} {str(path)!r} is not a file "
            f"(looked for {str(file)!r}); give the path of a .py file"
        )
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:12]
    module_name = f"_rlctl_custom_reward_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise RewardError(f"{path_key} {str(file)!r} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise RewardError(
            f"importing {path_key} {str(file)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not hasattr(module, name):
        functions = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_")
        )
        raise RewardError(
            f"{str(file)!r} has no {what} {name!r} (set {name_key}; "
            f"callables in the file: {', '.join(functions) or 'none'})"
        )
    function = getattr(module, name)
    if not callable(function):
        raise RewardError(
            f"{name_key} {name!r} in {str(file)!r} is a {type(function).__name__}, not a {what}"
        )
    return function


def load_from_config(cfg: CustomRewardFunctionConfig) -> CustomScorer | None:
    """The configured function, or ``None`` when ``custom_reward_function.path`` is unset."""
    if not cfg.path:
        return None
    return load_custom_function(cfg.path, cfg.name)
