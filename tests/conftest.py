import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import durations_plugin  # tests/durations_plugin.py (conftest's folder is on the path)
import pytest

# No model hub here or in CI: a hub name must fail at once, not after retries.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# SkyPilot reports usage to a public host by default: tests reach no network.
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")


# The Megatron tests (those skipped without megatron-core) run as a smoke subset unless
# RLCTL_TEST_MEGATRON=all: the whole matrix of layouts takes about 12 minutes on 2 cores,
# the subset under 2. The subset covers TP × PP with SP, expert parallelism with a
# shared expert, expert tensor parallelism apart from TP, DeepSeek's multi-latent
# attention, every model family built and matched against Hugging Face, one whole engine
# run, a Megatron actor feeding the vLLM rollout, and an SFT run against FSDP2's.
MEGATRON_SMOKE = (
    "tests/engine/train/test_megatron_backend.py::test_actor_engine_matches_hf[ws4-tp2-pp2-sp]",
    "tests/engine/train/test_megatron_backend.py::test_moe_actor_engine_matches_hf[qwen2-tp2-ep2-sp]",
    "tests/engine/train/test_megatron_backend.py::test_moe_actor_engine_matches_hf[deepseek-tp2-ep2-sp]",
    "tests/engine/train/test_megatron_backend.py::test_moe_actor_engine_matches_hf[qwen3-etp2]",
    "tests/engine/train/test_megatron_backend.py::test_every_family_matches_hf",
    "tests/e2e/test_megatron_cpu.py::test_megatron_moe_grpo_takes_the_fsdp_update[deepseek_v3-8]",
    "tests/e2e/test_engine_cpu.py::test_algorithm_runs[grpo_megatron_tp2_vllm]",
    "tests/e2e/test_sft_cpu.py::test_megatron_takes_the_fsdp_losses[dp2]",
)  # fmt: skip


def _needs_megatron(item: pytest.Item) -> bool:
    return any(
        mark.name == "skipif" and "megatron-core" in str(mark.kwargs.get("reason", ""))
        for mark in item.iter_markers()
    )


# scripts/test.sh runs the tests not marked slow on two pytest-xdist workers (and the slow
# ones in one process: CONTRIBUTING.md says why), handing out whole groups:
# a module goes to one worker, so its module-scoped fixtures (a Ray cluster, a
# warm-started model) are built once, and the tests that start the real Slurm and
# SkyPilot daemons, which share a session-scoped cluster, form one group. Groups go out
# the longest first, as measured in tests/durations.json (scripts/durations.py), so that
# no long one starts last. (xdist's own --dist loadgroup renames node ids, which pytest
# 9.2 no longer lets a plugin do: the groups are this scheduler's.)
DAEMONS = ("tests/slurm/", "tests/skypilot/")


def _group(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    return "daemons" if path.startswith(DAEMONS) else path


def pytest_configure(config: pytest.Config) -> None:
    durations_plugin.register(config)  # every run records its tests' durations


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _group(nodeid)

    return ByGroup(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # the order groups go out in
        seconds = durations_plugin.group_seconds(_group)  # a group not measured: last
        # stable: a module's tests keep their order
        items.sort(key=lambda item: -seconds.get(_group(item.nodeid), 0.0))
    if os.environ.get("RLCTL_TEST_MEGATRON") == "all":
        return
    skip = pytest.mark.skip(
        reason="a Megatron layout outside the smoke subset: RLCTL_TEST_MEGATRON=all runs it"
    )
    for item in items:
        if _needs_megatron(item) and item.nodeid not in MEGATRON_SMOKE:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Qwen2 model and its tokenizer, built once per test session."""
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_model"), seed=0)


@pytest.fixture(scope="session")
def tiny_vl_model_dir(tmp_path_factory):
    """A tiny random Qwen2.5-VL model and its processor's parts, built once per session."""
    from engine.models.tiny_vl import build_tiny_vl_model

    return build_tiny_vl_model(tmp_path_factory.mktemp("tiny_vl_model"), seed=0)


@pytest.fixture(scope="session")
def vl_prompts(tiny_vl_model_dir, tmp_path_factory):
    """Prompts of the tiny Qwen2.5-VL read as a run reads them (RLDataset with its
    processor): two of the shapes task (one image of 4 pad tokens each), one with two
    images of other shapes, one without: ``(tokenizer, [PromptSample, ...])``."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image
    from transformers import AutoConfig, AutoTokenizer

    from engine.config import DataConfig
    from engine.data import RLDataset
    from engine.data.shapes import make_rows
    from engine.models.processor import load_vision_processor

    def png(size, colour):
        out = io.BytesIO()
        Image.new("RGB", size, colour).save(out, format="PNG")
        return {"bytes": out.getvalue(), "path": None}

    rows = make_rows(2, split="test", seed=0)
    two = [png((28, 28), (200, 30, 30)), png((84, 56), (30, 30, 200))]
    rows.append({**rows[0], "prompt": [{"role": "user", "content": "A <image> then <image>?"}],
                 "images": two})  # fmt: skip
    rows.append({**rows[0], "prompt": [{"role": "user", "content": "No image."}], "images": None})
    path = tmp_path_factory.mktemp("vl_prompts") / "p.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    tokenizer = AutoTokenizer.from_pretrained(tiny_vl_model_dir)
    config = AutoConfig.from_pretrained(tiny_vl_model_dir)
    processor = load_vision_processor(tiny_vl_model_dir, tokenizer, config)
    data = RLDataset(str(path), tokenizer, DataConfig(), processor=processor)
    return tokenizer, [data[i] for i in range(len(data))]


# Helpers of the tests that drive jobs through the CLI (tests/e2e, tests/slurm,
# tests/skypilot), given to them as fixtures: a conftest is not a module to import, and
# `tests` is a namespace package a site-packages `tests` would shadow. Each takes
# ``rlctl``: the test's CLI runner, ``rlctl(*args) -> subprocess.CompletedProcess``.


def _job_state(rlctl, job_id: str) -> dict:
    result = rlctl("status", job_id, "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)[0]


def _wait_state(
    rlctl, job_id: str, states: set[str], timeout: float = 400, poll_s: float = 2
) -> dict:
    deadline = time.monotonic() + timeout
    while (job := _job_state(rlctl, job_id))["state"] not in states:
        assert time.monotonic() < deadline, (
            f"{job_id} still {job['state']} after {timeout} s",
            job,
            rlctl("logs", job_id).stdout[-3000:],
        )
        time.sleep(poll_s)
    return job


@contextlib.contextmanager
def _follow_logs(job_id: str, env: dict[str, str], cwd: Path) -> Iterator[subprocess.Popen]:
    follow = subprocess.Popen(
        [sys.executable, "-c", "from rlctl.cli import main; main()", "logs", job_id, "-f"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
    )  # fmt: skip
    try:
        yield follow
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.communicate()


def _find_processes(*needles: str) -> dict[int, str]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if not any(needle in cmd for needle in needles):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":  # exited, not yet reaped: nothing left to stop
            found[int(entry.name)] = cmd[:160]
    return found


@pytest.fixture
def vllm_tp_alone() -> Iterator[None]:
    """No other test's tensor-parallel vLLM runs on this machine while the test does (an
    exclusive lock across pytest-xdist workers): its shared-memory segments, which a test
    checks are gone at the end, are then its own."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "rlctl-tests-vllm-tp.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def job_state():
    """``job_state(rlctl, job_id) -> dict``: the job's record from ``rlctl status JOB
    --json`` (which must succeed)."""
    return _job_state


@pytest.fixture(scope="session")
def wait_state():
    """``wait_state(rlctl, job_id, states, timeout=400, poll_s=2) -> dict``: polls
    ``rlctl status`` until the job is in one of ``states`` and returns its record; past
    ``timeout`` seconds it fails with the record and the tail of the job's log."""
    return _wait_state


@pytest.fixture(scope="session")
def follow_logs():
    """``with follow_logs(job_id, env, cwd) as follow:``: ``rlctl logs JOB -f`` (a
    ``subprocess.Popen``, output piped) running beside the block; killed if the block
    leaves it running."""
    return _follow_logs


@pytest.fixture(scope="session")
def find_processes():
    """``find_processes(*needles) -> {pid: command line}``: the live processes whose
    command line (its first 160 characters returned) contains one of ``needles``."""
    return _find_processes
