#!/usr/bin/env python3
"""The test suite's measured durations: per test, summed per module.

    scripts/durations.py .pytest-durations.json      # -> tests/durations.json, and the table
    scripts/durations.py --from-junit junit.xml      # the same from pytest's --junitxml
    scripts/durations.py A.json --from-junit B.xml   # runs of parts of the suite, merged
    scripts/durations.py --table FILE                # the per-module table only
    scripts/durations.py --before A --after B        # per module, before and after

Every pytest run writes ``.pytest-durations.json`` (tests/durations_plugin.py): each
test's wall time, setup + call + teardown, which is also what a JUnit XML's ``time``
counts. The committed summary, ``tests/durations.json``, holds per module its total
seconds, its test count and each test's seconds, and the machine it was measured on;
tests/conftest.py's xdist scheduler hands out the longest groups first from it. Refresh
it from a full run (``scripts/test.sh``) on the 2-core machine CI runs on.

Any of the three forms (a run's file, a summary, a JUnit XML, known by its ``.xml``) is
an input of ``--table``, ``--before`` and ``--after``. Standard library only: CI prints
the table before anything else is installed, and a laptop without the venv can read it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SUMMARY = REPO / "tests" / "durations.json"


class Run:
    """One run's seconds per test node id, and the machine it ran on."""

    def __init__(self, tests: dict[str, float], cores: int | None, date: str | None) -> None:
        self.tests, self.cores, self.date = tests, cores, date

    def modules(self) -> dict[str, dict]:
        """Module path -> {seconds, tests, per_test}, the longest module first."""
        per: dict[str, dict[str, float]] = defaultdict(dict)
        for nodeid, seconds in self.tests.items():
            module, _, name = nodeid.partition("::")
            per[module][name] = seconds
        rows = {
            module: {
                "seconds": round(sum(tests.values()), 2),
                "tests": len(tests),
                "per_test": {name: round(tests[name], 2) for name in sorted(tests)},
            }
            for module, tests in per.items()
        }
        return dict(sorted(rows.items(), key=lambda kv: (-kv[1]["seconds"], kv[0])))


def merge(runs: list[Run]) -> Run:
    """Several runs as one (a test in more than one: the later run's time); the first
    machine's cores that are known, the latest date."""
    tests: dict[str, float] = {}
    for run in runs:
        tests |= run.tests
    cores = next((run.cores for run in runs if run.cores), None)
    dates = [run.date for run in runs if run.date]
    return Run(tests, cores, max(dates) if dates else None)


def load(path: Path, junit: bool | None = None) -> Run:
    """A run's file, a summary, or (``junit``, or a name ending in .xml) a JUnit XML."""
    if junit or (junit is None and path.suffix == ".xml"):
        return from_junit(path)
    data = json.loads(path.read_text())
    machine = data.get("machine", {})
    if "modules" in data:  # a summary this script wrote
        tests = {
            f"{module}::{name}" if name else module: seconds
            for module, entry in data["modules"].items()
            for name, seconds in entry["per_test"].items()
        }
    else:
        tests = data["tests"]
    return Run(tests, machine.get("cores"), machine.get("date"))


def from_junit(path: Path) -> Run:
    """Node ids from JUnit's dotted ``classname`` (a module, then any classes) and
    ``name``: the module is the longest prefix that is a file under the repo, else the
    parts before the first capitalised one (a class, by pytest's naming)."""
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    tests: dict[str, float] = {}
    for case in root.iter("testcase"):
        parts = case.get("classname", "").split(".")
        cut = next(
            (
                i
                for i in range(len(parts), 0, -1)
                if (REPO / Path(*parts[:i])).with_suffix(".py").is_file()
            ),
            None,
        )
        if cut is None:
            cut = next((i for i, p in enumerate(parts) if p[:1].isupper()), len(parts))
        module = "/".join(parts[:cut]) + ".py"
        nodeid = "::".join([module, *parts[cut:], case.get("name", "")])
        tests[nodeid] = tests.get(nodeid, 0.0) + float(case.get("time", 0))
    stamp = suites[0].get("timestamp") if suites else None
    return Run(tests, None, stamp)


def summary(run: Run, source: str, note: str | None = None) -> dict:
    return {
        "machine": {
            "cores": run.cores or len(os.sched_getaffinity(0)),
            "date": (run.date or datetime.date.today().isoformat())[:10],
        },
        "source": source,
        **({"note": note} if note else {}),
        "total_seconds": round(sum(run.tests.values()), 1),
        "tests": len(run.tests),
        "modules": run.modules(),
    }


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:6.1f}"


def table(run: Run) -> str:
    modules = run.modules()
    width = max([len("module"), *map(len, modules)])
    lines = [f"{'module':<{width}}  {'tests':>5}  {'seconds':>8}  {'min':>6}"]
    for module, row in modules.items():
        lines.append(
            f"{module:<{width}}  {row['tests']:>5}  {row['seconds']:>8.1f}  {_minutes(row['seconds'])}"
        )
    total = sum(run.tests.values())
    lines.append(f"{'total':<{width}}  {len(run.tests):>5}  {total:>8.1f}  {_minutes(total)}")
    machine = f"{run.cores} cores" if run.cores else "cores not recorded"
    lines.append(f"({machine}, {run.date or 'date not recorded'})")
    return "\n".join(lines)


def compare(before: Run, after: Run) -> str:
    """Per module: seconds before, after, and after/before; the longest before first, then
    modules new in ``after``."""
    old, new = before.modules(), after.modules()
    names = list(old) + [m for m in new if m not in old]
    width = max([len("module"), *map(len, names)])
    lines = [f"{'module':<{width}}  {'before s':>9}  {'after s':>9}  {'ratio':>6}"]

    def row(name: str, a: float | None, b: float | None) -> str:
        ratio = f"{b / a:6.2f}" if a and b is not None else f"{'-':>6}"
        a_s = f"{a:9.1f}" if a is not None else f"{'-':>9}"
        b_s = f"{b:9.1f}" if b is not None else f"{'-':>9}"
        return f"{name:<{width}}  {a_s}  {b_s}  {ratio}"

    for name in names:
        a = old[name]["seconds"] if name in old else None
        b = new[name]["seconds"] if name in new else None
        lines.append(row(name, a, b))
    lines.append(row("total", sum(before.tests.values()), sum(after.tests.values())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="*", type=Path, help="runs' .pytest-durations.json")
    parser.add_argument(
        "--from-junit", type=Path, action="append", default=[], metavar="XML", help="a JUnit XML"
    )
    parser.add_argument("--out", type=Path, default=SUMMARY, help="the summary to write")
    parser.add_argument("--note", help="what the runs were (the summary keeps it)")
    parser.add_argument("--table", type=Path, metavar="FILE", help="print FILE's table only")
    parser.add_argument("--before", type=Path, metavar="FILE")
    parser.add_argument("--after", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    if args.before or args.after:
        if not (args.before and args.after):
            parser.error("--before and --after go together")
        print(compare(load(args.before), load(args.after)))
    elif args.table:
        print(table(load(args.table)))
    elif args.runs or args.from_junit:
        sources = [*args.runs, *args.from_junit]
        run = merge([load(p) for p in args.runs] + [load(p, junit=True) for p in args.from_junit])
        if not run.tests:
            print(f"{', '.join(map(str, sources))}: no tests in them", file=sys.stderr)
            return 1
        source = ", ".join(p.name for p in sources)
        args.out.write_text(json.dumps(summary(run, source, args.note), indent=1) + "\n")
        print(table(run))
        print(f"wrote {args.out}")
    else:
        parser.error("give a run's file or --from-junit XML, or --table FILE, or --before/--after")
    return 0


if __name__ == "__main__":
    sys.exit(main())
