"""The suite's measured durations: what each run records (tests/durations_plugin.py),
what scripts/durations.py makes of it, and the xdist scheduler's order taken from the
summary (tests/conftest.py). No assertion here is about how long anything
took: the recorder is checked against pytest's own JUnit report of the same run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
_spec = importlib.util.spec_from_file_location("durations", REPO / "scripts" / "durations.py")
durations = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(durations)

# A suite of its own for a pytest run of its own: a setup and a teardown that take
# measurable time (so a recorder that left either out disagrees with JUnit), a failure,
# a skip, a class and parameters.
SAMPLE = """
import time
import pytest

@pytest.fixture
def slow_fixture():
    time.sleep(0.03)
    yield
    time.sleep(0.05)

def test_passes(slow_fixture):
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="skipped")
def test_skipped():
    pass

class TestGroup:
    @pytest.mark.parametrize("x", [1, 2])
    def test_param(self, x, slow_fixture):
        pass
"""
SAMPLE_IDS = {
    "test_sample.py::test_passes",
    "test_sample.py::test_fails",
    "test_sample.py::test_skipped",
    "test_sample.py::TestGroup::test_param[1]",
    "test_sample.py::TestGroup::test_param[2]",
}


def _pytest(tmp_path: Path, *args: str) -> tuple[dict, Path]:
    """Run pytest on SAMPLE with the recorder loaded as a plugin; its record and the
    JUnit XML of the same run."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    out, junit = tmp_path / "durations.json", tmp_path / "junit.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # not ours
    env |= {"PYTHONPATH": str(REPO / "tests"), "RLCTL_DURATIONS_OUT": str(out)}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "durations_plugin", "-q", "-p", "no:cacheprovider",
         f"--junitxml={junit}", "--rootdir", str(tmp_path), *args, "test_sample.py"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr  # test_fails failed
    return json.loads(out.read_text()), junit


def _junit_seconds(junit: Path) -> dict[str, float]:
    return durations.from_junit(junit).tests


def test_this_session_records_its_durations(request):
    """tests/conftest.py registers the recorder for every run of the suite (on the
    controller alone under xdist)."""
    recorder = request.config.pluginmanager.get_plugin("rlctl-durations")
    if hasattr(request.config, "workerinput"):
        assert recorder is None
        return
    assert recorder.out == Path(
        os.environ.get("RLCTL_DURATIONS_OUT") or REPO / ".pytest-durations.json"
    )
    assert request.node.nodeid in recorder.seconds  # this test's setup is in already


def test_each_test_is_its_setup_call_and_teardown(tmp_path):
    record, junit = _pytest(tmp_path)
    assert set(record["tests"]) == SAMPLE_IDS
    assert record["exitstatus"] == 1
    assert record["machine"]["cores"] == len(os.sched_getaffinity(0))
    assert record["machine"]["date"][:4].isdigit()
    # JUnit's time is setup + call + teardown: the same sums, to its millisecond.
    reference = _junit_seconds(junit)
    assert set(reference) == SAMPLE_IDS
    for nodeid, seconds in record["tests"].items():
        assert seconds == pytest.approx(reference[nodeid], abs=0.0015), nodeid


@pytest.mark.slow
def test_under_xdist_the_controller_writes_the_whole_run(tmp_path):
    record, junit = _pytest(tmp_path, "-n", "2")
    assert set(record["tests"]) == SAMPLE_IDS
    reference = _junit_seconds(junit)
    for nodeid, seconds in record["tests"].items():
        assert seconds == pytest.approx(reference[nodeid], abs=0.0015), nodeid


RUN = {
    "machine": {"cores": 2, "date": "2026-11-28T01:00:00+00:00"},
    "tests": {
        "tests/a/test_short.py::test_one": 1.0,
        "tests/a/test_short.py::test_two": 2.5,
        "tests/b/test_long.py::TestX::test_three[p]": 30.0,
        "tests/b/test_middle.py::test_four": 7.0,
    },
}


def test_a_run_becomes_the_summary_and_its_table(tmp_path, capsys):
    run, out = tmp_path / "run.json", tmp_path / "summary.json"
    run.write_text(json.dumps(RUN))
    assert durations.main([str(run), "--out", str(out)]) == 0
    summary = json.loads(out.read_text())
    assert summary["machine"] == {"cores": 2, "date": "2026-11-28"}
    assert summary["total_seconds"] == 40.5 and summary["tests"] == 4
    assert list(summary["modules"]) == [
        "tests/b/test_long.py", "tests/b/test_middle.py", "tests/a/test_short.py",
    ]  # fmt: skip
    assert summary["modules"]["tests/a/test_short.py"] == {
        "seconds": 3.5,
        "tests": 2,
        "per_test": {"test_one": 1.0, "test_two": 2.5},
    }
    assert summary["modules"]["tests/b/test_long.py"]["per_test"] == {"TestX::test_three[p]": 30.0}
    rows = capsys.readouterr().out.splitlines()
    assert [r.split()[0] for r in rows[1:5]] == [*summary["modules"], "total"]
    assert rows[3].split()[1:3] == ["2", "3.5"]
    # the summary reads back as the same run (so --table and --before/--after take it)
    assert durations.load(out).tests == RUN["tests"]


def test_junit_xml_gives_the_same_node_ids(tmp_path):
    """A module is the longest dotted prefix that is a file here, else the parts before
    the first class; the name keeps its parameters."""
    xml = tmp_path / "junit.xml"
    suite = ET.Element("testsuite", timestamp="2026-11-28T01:35:00.1+00:00")
    cases = [
        ("tests.scripts.test_durations", "test_x[a.b]", "1.5"),
        ("tests.nowhere.test_mod.TestCls", "test_y", "2.0"),
        ("tests.nowhere.test_mod", "test_z", "0.25"),
    ]
    for classname, name, time in cases:
        ET.SubElement(suite, "testcase", classname=classname, name=name, time=time)
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(xml)
    run = durations.load(xml)
    assert run.tests == {
        "tests/scripts/test_durations.py::test_x[a.b]": 1.5,
        "tests/nowhere/test_mod.py::TestCls::test_y": 2.0,
        "tests/nowhere/test_mod.py::test_z": 0.25,
    }
    assert run.date.startswith("2026-11-28")
    out = tmp_path / "summary.json"
    assert durations.main(["--from-junit", str(xml), "--out", str(out)]) == 0
    assert json.loads(out.read_text())["modules"]["tests/nowhere/test_mod.py"]["seconds"] == 2.25


def test_before_and_after_per_module_with_ratios(tmp_path, capsys):
    before, after = tmp_path / "before.json", tmp_path / "after.json"
    before.write_text(json.dumps(RUN))
    faster = {k: v / 2 for k, v in RUN["tests"].items() if "middle" not in k}
    after.write_text(json.dumps({"tests": {**faster, "tests/c/test_new.py::test_n": 4.0}}))
    assert durations.main(["--before", str(before), "--after", str(after)]) == 0
    rows = {r.split()[0]: r.split()[1:] for r in capsys.readouterr().out.splitlines()[1:]}
    assert rows["tests/b/test_long.py"] == ["30.0", "15.0", "0.50"]
    assert rows["tests/b/test_middle.py"] == ["7.0", "-", "-"]  # gone after
    assert rows["tests/c/test_new.py"] == ["-", "4.0", "-"]  # new after
    assert rows["total"] == ["40.5", "20.8", "0.51"]


def test_runs_of_parts_of_the_suite_are_merged(tmp_path, capsys):
    """The summary from several partial runs: each test's time from the last run that
    had it, the latest date."""
    first, second, out = tmp_path / "first.json", tmp_path / "second.json", tmp_path / "s.json"
    first.write_text(json.dumps(RUN))
    again = {"tests/a/test_short.py::test_one": 5.0, "tests/d/test_more.py::test_m": 1.0}
    second.write_text(
        json.dumps({"machine": {"cores": 2, "date": "2026-11-29T00:00:00"}, "tests": again})
    )
    argv = [str(first), str(second), "--out", str(out), "--note", "two parts"]
    assert durations.main(argv) == 0
    summary = json.loads(out.read_text())
    assert summary["machine"]["date"] == "2026-11-29" and summary["note"] == "two parts"
    assert summary["modules"]["tests/a/test_short.py"]["per_test"]["test_one"] == 5.0
    assert summary["tests"] == 5 and summary["source"] == "first.json, second.json"


def test_xdist_hands_out_the_longest_measured_groups_first(tmp_path):
    """tests/conftest.py orders the groups by the summary, the Slurm and SkyPilot
    modules summed as one group: named here in another order, the modules come out the
    longest group first, though the Slurm module alone is the shortest."""
    render, golden = "tests/slurm/test_render.py", "tests/rlctl/test_golden_renders.py"
    hardware = "tests/rlctl/test_hardware.py"
    measured = {render: 1.0, "tests/skypilot/test_task.py": 100.0, golden: 50.0, hardware: 10.0}
    summary = tmp_path / "durations.json"
    summary.write_text(json.dumps({"modules": {m: {"seconds": s} for m, s in measured.items()}}))
    env = {
        **os.environ,
        "PYTEST_XDIST_WORKER": "gw0",  # the order applies under xdist only
        "RLCTL_DURATIONS_SUMMARY": str(summary),
        "RLCTL_DURATIONS_OUT": str(tmp_path / "run.json"),
    }
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         hardware, golden, render],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    order = [line.split("::")[0] for line in result.stdout.splitlines() if "::" in line]
    firsts = [m for i, m in enumerate(order) if m not in order[:i]]
    assert firsts == [render, golden, hardware]
