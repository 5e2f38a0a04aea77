#!/usr/bin/env python3
"""Every leaf key of verl's generated trainer schemas, one a line (tests/engine/verl_keys.txt).

    scripts/verl_schema_keys.py VERL_GIT_DIR [--rev v0.9.0 --rev HEAD] > tests/engine/verl_keys.txt

Reads ``verl/trainer/config/_generated_ppo_trainer.yaml`` and
``_generated_ppo_megatron_trainer.yaml`` at each revision (a git directory: ``git show``)
and prints the union of their leaf keys: a mapping's keys are walked, an empty mapping
({}) or any other value is a leaf, and Hydra's ``_target_`` entries (class names for
verl's own instantiation) are left out. The test that reads the list
(tests/engine/test_verl_keys.py) checks that the engine knows every one.
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


def leaves(node: Any, prefix: str = "") -> Iterator[str]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            if key != "_target_":
                yield from leaves(value, f"{prefix}{key}.")
    else:
        yield prefix[:-1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("git_dir")
    parser.add_argument("--rev", action="append", help="revisions (default: v0.9.0 and HEAD)")
    args = parser.parse_args()
    revs = args.rev or ["v0.9.0", "HEAD"]
    keys: set[str] = set()
    for rev in revs:
        for path in SCHEMAS:
            text = subprocess.run(
                ["git", f"--git-dir={args.git_dir}", "show", f"{rev}:{path}"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            keys |= set(leaves(yaml.safe_load(text)))
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
    print(f"# verl's generated trainer schemas' leaf keys ({', '.join(named)}): {len(keys)}")
    print("# made by scripts/verl_schema_keys.py; read by tests/engine/test_verl_keys.py")
    sys.stdout.writelines(f"{key}\n" for key in sorted(keys))
    return 0


if __name__ == "__main__":
    sys.exit(main())
