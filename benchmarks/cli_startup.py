"""How long rlctl's commands take to start, next to the floor (a bare Python start).

    python benchmarks/cli_startup.py [--runs 15]

Each command runs in a fresh process, alternating between commands (so drift in the
machine's load hits all of them alike), against an empty job store. Prints the median
and the best run in milliseconds, and each command's median as a ratio to the floor.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "python -c pass (floor)": [sys.executable, "-c", "pass"],
    "rlctl --version": [sys.executable, "-m", "rlctl.cli", "--version"],
    "rlctl --help": [sys.executable, "-m", "rlctl.cli", "--help"],
    "rlctl status": [sys.executable, "-m", "rlctl.cli", "status"],
    "rlctl plan quickstart": [sys.executable, "-m", "rlctl.cli", "plan", "quickstart"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="rlctl-bench-")
    env = {**os.environ, "RLCTL_HOME": home}
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(args.runs):
        for name, argv in COMMANDS.items():
            start = time.perf_counter()
            subprocess.run(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            times[name].append((time.perf_counter() - start) * 1000)
    floor = statistics.median(times["python -c pass (floor)"])
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"{'command':28} {'median ms':>10} {'best ms':>9} {'x floor':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:28} {median:10.0f} {min(values):9.0f} {median / floor:8.1f}")


if __name__ == "__main__":
    main()
