"""The code interpreter tool: run model-written Python in the sandbox and tell the model
what happened, as the text of the tool's reply.

A plain function for the tool registry to wrap (engine/agents/tools/):

    text = code_interpreter(code, SandboxLimits(wall_seconds=10))
    text = await code_interpreter_async(code, limits)

The reply is one bracketed line for each thing the model should know (a timeout, a
limit, the exit status, cut output), then stdout, then stderr under a ``[stderr]`` line,
never longer than ``max_chars``. The code runs as a script: only what it prints shows.

What the code prints cannot pass for the reply's own lines: control characters (ANSI
escapes, NUL, a lone carriage return, line separators, bidirectional overrides) are
shown as escapes (``\x1b``), and an output line that begins as a note does (``[exit
status``, ``[stderr]``, ...) is shown with a backslash in front. The notes come first,
so a cut further on (the tool's ``max_tool_response_length``) never loses them.
"""

from __future__ import annotations

import re

from engine.sandbox.limits import SandboxError
from engine.sandbox.run import SandboxLimits, SandboxResult, run_python, run_python_async

# What one tool reply may hold, in characters, unless the caller says otherwise.
DEFAULT_MAX_CHARS = 4000
_MIN_MAX_CHARS = 200
# Characters shown as escapes: C0 controls but tab and newline, DEL and C1 controls,
# Unicode's line and paragraph separators and its bidirectional embeddings and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
# The start of an output line that reads like one of the reply's notes (or the tool
# layer's "[truncated: ...]"): a backslash goes in front of it.
_NOTE_LIKE = re.compile(
    r"^(?=\[(?:stderr|stdout|timed out|stopped|killed|memory|exit status|no output"
    r"|sandbox error|truncated|\.\.\.))",
    re.MULTILINE,
)


def code_interpreter(
    code: str, limits: SandboxLimits | None = None, *, max_chars: int = DEFAULT_MAX_CHARS
) -> str:
    """Run ``code`` in a fresh sandbox and return the reply the model sees."""
    limits = limits or SandboxLimits()
    _check_max_chars(max_chars)
    return format_result(run_python(code, limits), limits, max_chars)


async def code_interpreter_async(
    code: str, limits: SandboxLimits | None = None, *, max_chars: int = DEFAULT_MAX_CHARS
) -> str:
    """``code_interpreter`` as a coroutine, for tool calls run concurrently."""
    limits = limits or SandboxLimits()
    _check_max_chars(max_chars)
    return format_result(await run_python_async(code, limits), limits, max_chars)


def format_result(
    result: SandboxResult, limits: SandboxLimits, max_chars: int = DEFAULT_MAX_CHARS
) -> str:
    """The model's view of a run: what stopped it, and its output, made plain text and
    cut to fit (the module's docstring)."""
    notes = _notes(result, limits)
    budget = max(max_chars - sum(len(n) + 1 for n in notes) - len("[stderr]\n") - 4, 0)
    out, err = plain(result.stdout), plain(result.stderr)
    if len(out) + len(err) > budget:
        # stderr (a traceback) keeps at least half, or all it needs when it is short.
        err_share = min(len(err), max(budget // 2, budget - len(out)))
        out, err = _shorten(out, budget - err_share), _shorten(err, err_share)
    parts = [n + "\n" for n in notes]
    if out:
        parts.append(out if out.endswith("\n") else out + "\n")
    if err:
        parts.append("[stderr]\n" + (err if err.endswith("\n") else err + "\n"))
    text = "".join(parts).rstrip("\n")
    return text[:max_chars]


def plain(text: str) -> str:
    """Output as plain lines: control characters as escapes, note-like lines marked."""
    text = _CONTROL.sub(_escape, text.replace("\r\n", "\n"))
    return _NOTE_LIKE.sub("\\\\", text)


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _notes(result: SandboxResult, limits: SandboxLimits) -> list[str]:
    if result.error:
        return [f"[sandbox error: {result.error}]"]
    notes = []
    if result.timed_out:
        notes.append(f"[timed out: stopped after {limits.wall_seconds:g} s]")
    elif result.cpu_exceeded:
        notes.append(f"[stopped: CPU time limit of {limits.cpu_seconds} s exceeded]")
    elif result.signal is not None and not (result.memory_exceeded and result.signal == 9):
        notes.append(f"[killed by {result.signal_name}]")
    if result.memory_exceeded:  # the kernel's verdict: it killed a process of the run
        notes.append(f"[memory limit of {limits.memory_bytes >> 20} MiB exceeded: killed]")
    if result.exit_code not in (0, None):
        notes.append(f"[exit status {result.exit_code}]")
    if result.stdout_truncated:
        notes.append(f"[stdout cut: only the first {limits.output_bytes} bytes were kept]")
    if result.stderr_truncated:
        notes.append(f"[stderr cut: only the first {limits.output_bytes} bytes were kept]")
    if not notes and not result.stdout and not result.stderr:
        notes.append("[no output: print() what you want to see]")
    return notes


def _shorten(text: str, limit: int) -> str:
    """``text`` in at most about ``limit`` characters: its start and its end."""
    if len(text) <= limit:
        return text
    if limit < 80:
        return text[: max(limit, 0)]
    marker = "\n[... {} characters cut ...]\n"
    room = limit - len(marker) - 8
    head, tail = room * 2 // 3, room - room * 2 // 3
    # The end starts where the cut fell, perhaps inside a line: that line is a line now.
    end = _NOTE_LIKE.sub("\\\\", text[len(text) - tail :], count=1)
    return text[:head] + marker.format(len(text) - head - tail) + end


def _check_max_chars(max_chars: int) -> None:
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < _MIN_MAX_CHARS:
        raise SandboxError(
            f"max_chars={max_chars!r} must be an integer of at least {_MIN_MAX_CHARS}"
        )
