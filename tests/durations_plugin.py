"""Every test run records how long each test took, so that the suite's time is measured,
not guessed: tests/conftest.py registers ``Recorder``, which writes each test's wall time
(setup + call + teardown, as JUnit's ``time`` counts it) to ``.pytest-durations.json`` in
the repo root, or to ``$RLCTL_DURATIONS_OUT``. ``scripts/durations.py`` turns such a file
into the committed ``tests/durations.json``, from which ``group_seconds`` gives the xdist
scheduler its longest-first order.

A module of its own (tests/ is on the path of conftest.py's imports) so that
tests/scripts/test_durations.py can load it into a pytest run of its own with ``-p``.
"""

from __future__ import annotations

import datetime
import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

SUMMARY = Path(__file__).with_name("durations.json")  # written by scripts/durations.py
DEFAULT_OUT = ".pytest-durations.json"  # under the rootdir; gitignored


class Recorder:
    """Sums each test's phase durations and writes them when the session ends. Under
    pytest-xdist only the controller registers it (workers' reports reach the
    controller's hook), so one file holds the whole run."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.seconds:  # --collect-only, or nothing ran: keep the last real run's
            return
        record = {
            "machine": {
                "cores": len(os.sched_getaffinity(0)),
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            },
            "args": list(session.config.invocation_params.args),
            "exitstatus": int(exitstatus),
            "tests": {nodeid: round(s, 3) for nodeid, s in self.seconds.items()},
        }
        tmp = self.out.with_name(self.out.name + ".tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(self.out)  # a reader never sees half a file


def register(config: pytest.Config) -> None:
    """Record this run's durations unless this process is an xdist worker."""
    if hasattr(config, "workerinput"):
        return
    out = Path(os.environ.get("RLCTL_DURATIONS_OUT") or config.rootpath / DEFAULT_OUT)
    config.pluginmanager.register(Recorder(out), "rlctl-durations")


def pytest_configure(config: pytest.Config) -> None:  # when loaded with -p durations_plugin
    if config.pluginmanager.get_plugin("rlctl-durations") is None:
        register(config)


def group_seconds(group_of: Callable[[str], str]) -> dict[str, float]:
    """Seconds per scheduling group (``group_of(test module path)``), from the committed
    summary (``$RLCTL_DURATIONS_SUMMARY`` instead: another machine's, or a test's); empty
    when there is none (every group then counts as 0)."""
    summary = Path(os.environ.get("RLCTL_DURATIONS_SUMMARY") or SUMMARY)
    if not summary.is_file():
        return {}
    totals: dict[str, float] = defaultdict(float)
    for module, entry in json.loads(summary.read_text())["modules"].items():
        totals[group_of(module)] += entry["seconds"]
    return dict(totals)
