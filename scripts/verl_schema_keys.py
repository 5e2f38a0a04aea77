#!/usr/bin/env python3
"""Every leaf key of verl's generated trainer schemas, one a line (tests/engine/verl_keys.txt).

    scripts/verl_schema_keys.py VERL_GIT_DIR [--rev v0.9.0 --rev HEAD] > tests/engine/verl_keys.txt
    scripts/verl_schema_keys.py VERL_GIT_DIR --sft > tests/engine/verl_sft_keys.txt

Reads ``verl/trainer/config/_generated_ppo_trainer.yaml`` and
``_generated_ppo_megatron_trainer.yaml`` at each revision (a git directory: ``git show``)
and prints the union of their leaf keys: a mapping's keys are walked, an empty mapping
({}) or any other value is a leaf, and Hydra's ``_target_`` entries (class names for
verl's own instantiation) are left out. The test that reads the list
(tests/engine/test_verl_keys.py) checks that the engine knows every one.

``--sft``: verl's SFT trainer (``verl.trainer.sft_trainer``) has no generated schema:
its ``sft_trainer_engine.yaml`` composed with every choice of the groups it names
(``model@model``, ``engine@engine``, ``optim@optim``, ``profiler@profiler``: the FSDP
and the Megatron files both), read by tests/engine/test_sft_config.py.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import yaml

SCHEMAS = (
    "verl/trainer/config/_generated_ppo_trainer.yaml",
    "verl/trainer/config/_generated_ppo_megatron_trainer.yaml",
)
CONFIG = "verl/trainer/config"
# verl's SFT config and, for each group it composes, the choices whose keys it may take
SFT_SCHEMA = f"{CONFIG}/sft_trainer_engine.yaml"
SFT_GROUPS = {
    "model": ("hf_model",),
    "engine": ("fsdp", "megatron"),
    "optim": ("fsdp", "megatron"),
    "profiler": ("profiler",),
}


def leaves(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if key != "_target_":
                yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def show(git_dir: str, rev: str, path: str) -> Any:
    text = subprocess.run(
        ["git", f"--git-dir={git_dir}", "show", f"{rev}:{path}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return yaml.safe_load(text)


def sft_keys(git_dir: str, rev: str) -> set[str]:
    """The SFT config's own keys and each group choice's under its package."""
    own = show(git_dir, rev, SFT_SCHEMA)
    own.pop("defaults", None)
    keys = set(leaves(own))
    for group, choices in SFT_GROUPS.items():
        for choice in choices:
            keys |= set(leaves(show(git_dir, rev, f"{CONFIG}/{group}/{choice}.yaml"), f"{group}."))
    return keys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir")
    parser.add_argument("--rev", action="append", help="revisions (default: v0.9.0 and HEAD)")
    parser.add_argument("--sft", action="store_true", help="verl's SFT trainer's keys")
    args = parser.parse_args()
    revs = args.rev or ["v0.9.0", "HEAD"]
    keys: set[str] = set()
    for rev in revs:
        if args.sft:
            keys |= sft_keys(args.git_dir, rev)
            continue
        for path in SCHEMAS:
            keys |= set(leaves(show(args.git_dir, rev, path)))
    named = [
        f"{rev} "
        + subprocess.run(
            ["git", f"--git-dir={args.git_dir}", "rev-parse", "--short", rev],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        for rev in revs
    ]
    what = "SFT trainer's composed schema" if args.sft else "generated trainer schemas'"
    reader = "test_sft_config.py" if args.sft else "test_verl_compat.py"
    print(f"# verl's {what} leaf keys ({', '.join(named)}): {len(keys)}")
    print(f"# made by scripts/verl_schema_keys.py; read by tests/engine/{reader}")
    sys.stdout.writelines(f"{key}\n" for key in sorted(keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
