"""The code interpreter tool's reply (engine/agents/code_interpreter.py): what the model
reads after its code ran, for each way a run can end."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from engine.agents.code_interpreter import code_interpreter, code_interpreter_async, format_result
from engine.agents.sandbox import SandboxResult
from engine.agents.sandbox_limits import SandboxError, SandboxLimits

pytestmark = pytest.mark.timeout(120)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=3, memory_bytes=256 << 20, output_bytes=1000)
CLEAN = SandboxResult(
    stdout="",
    stderr="",
    exit_code=0,
    signal=None,
    timed_out=False,
    cpu_exceeded=False,
    memory_exceeded=False,
    stdout_truncated=False,
    stderr_truncated=False,
    wall_seconds=0.1,
    cpu_seconds=0.05,
    isolation="namespaces: test",
)


def reply(**fields: object) -> str:
    return format_result(dataclasses.replace(CLEAN, **fields), LIMITS, max_chars=500)


def test_stdout_then_stderr_then_the_status() -> None:
    text = reply(stdout="42\n", stderr="Traceback ...\nValueError: x\n", exit_code=1)
    assert text == "42\n[stderr]\nTraceback ...\nValueError: x\n[exit status 1]"


def test_each_way_to_stop_is_named() -> None:
    assert reply(exit_code=None, signal=9, timed_out=True) == "[timed out: stopped after 3 s]"
    assert reply(exit_code=None, signal=24, cpu_exceeded=True) == (
        "[stopped: CPU time limit of 2 s exceeded]"
    )
    assert reply(stderr="MemoryError\n", exit_code=1, memory_exceeded=True) == (
        "[stderr]\nMemoryError\n[memory limit of 256 MiB exceeded]\n[exit status 1]"
    )
    assert reply(exit_code=None, signal=11) == "[killed by SIGSEGV]"
    assert reply(exit_code=None, error="no interpreter") == "[sandbox error: no interpreter]"
    assert reply() == "[no output: print() what you want to see]"


def test_cut_output_is_marked_and_the_reply_fits() -> None:
    text = reply(stdout="x" * 1000, stdout_truncated=True, stderr="e" * 300 + "END")
    assert len(text) <= 500
    assert "[stdout cut: only the first 1000 bytes were kept]" in text
    assert "characters cut ...]" in text
    assert "END" in text  # the end of a traceback survives the cut


def test_a_real_run_end_to_end() -> None:
    assert code_interpreter("print(sum(range(10)))", LIMITS) == "45"
    text = code_interpreter("import time\ntime.sleep(30)", LIMITS)
    assert text == "[timed out: stopped after 3 s]"
    text = code_interpreter("print('y' * 5000)", LIMITS, max_chars=300)
    assert len(text) <= 300 and "[stdout cut" in text


def test_the_async_tool_and_its_misuse() -> None:
    async def three() -> list[str]:
        return await asyncio.gather(
            *(code_interpreter_async(f"print({i} + 1)", LIMITS) for i in range(3))
        )

    assert asyncio.run(three()) == ["1", "2", "3"]
    with pytest.raises(SandboxError, match="max_chars"):
        code_interpreter("print(1)", LIMITS, max_chars=10)
