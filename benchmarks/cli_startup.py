"""How long rlctl's commands take to start, next to the floor (a bare Python start).

    python benchmarks/cli_startup.py [--runs 15]
    python benchmarks/cli_startup.py --vs /tmp/before   # also another checkout, interleaved

``--vs DIR`` runs every command a second time from another checkout of the project (put
first on ``PYTHONPATH``; e.g. ``git worktree add /tmp/before <commit>``), interleaved with
this one's, and prints each command's median ratio this/that.

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
    parser.add_argument("--vs", help="another checkout of the project to time beside this one")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="rlctl-bench-")
    env = {**os.environ, "RLCTL_HOME": home}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    runs = {name: (argv, {**env, "PYTHONPATH": here}) for name, argv in COMMANDS.items()}
    if args.vs:
        other = {**env, "PYTHONPATH": os.path.abspath(args.vs)}
        for name, argv in COMMANDS.items():
            if not name.startswith("python"):
                runs[f"{name} [vs]"] = (argv, other)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(args.runs):
        for name, (argv, run_env) in runs.items():
            start = time.perf_counter()
            subprocess.run(
                argv, env=run_env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True
            )
            times[name].append((time.perf_counter() - start) * 1000)
    floor = statistics.median(times["python -c pass (floor)"])
    print(
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"
    )
    print(f"{'command':33} {'median ms':>10} {'best ms':>9} {'x floor':>8}")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:33} {median:10.0f} {min(values):9.0f} {median / floor:8.1f}")
    if args.vs:
        print(f"\nthis checkout / {args.vs} (median ms ratio):")
        for name in COMMANDS:
            if f"{name} [vs]" in times:
                ratio = statistics.median(times[name]) / statistics.median(times[f"{name} [vs]"])
                print(f"  {name:28} {ratio:.2f}x")


if __name__ == "__main__":
    main()
