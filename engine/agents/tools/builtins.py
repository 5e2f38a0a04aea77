"""The tools themselves: a Python function as a tool, and the registered built-ins.

A built-in is a class registered by name in ``BUILTIN_TOOLS`` with what the loader checks
before anything runs: its default ``DESCRIPTION`` and ``PARAMETERS`` (what the model sees
unless the tools file gives its own), the ``ARGUMENTS`` it reads (a schema the file gives
must declare them), the ``CONFIG_KEYS`` it accepts (``None``: any, passed on) and
``unavailable()`` (why it cannot run in this build, or ``None``). It is built as
``cls(name, schema, config)``.

- ``calculator``: arithmetic (``calculator.py``), evaluated in the event loop (bounded).
- ``code_interpreter``: runs the model's Python in the sandbox (``engine.sandbox.run``,
  through ``engine.agents.code_interpreter``, imported on the first call); the tool's
  ``config`` holds the sandbox's limits (``SandboxLimits``' fields), checked when built.

A function (a custom tool, or a built-in written as one) is called with the arguments as
keywords, and with the sample's own keywords (``extra_info.tools_kwargs``, ``sample.py``)
as its keyword-only parameters the schema does not declare. A plain function runs in a daemon thread of its own, so a slow one never blocks
the event loop and a hung one is left behind at the timeout without holding a pool or the
process's exit; an ``async def`` one is awaited (it must not block: write a plain function
for blocking work). It returns text; a dict or list is sent as JSON, ``None`` as nothing,
anything else as ``str(value)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from engine.agents.tools import calculator
from engine.agents.tools.sample import sample_parameters
from engine.agents.tools.types import ToolError, ToolResult
from engine.algo.registry import Registry
from engine.errors import ConfigError

BUILTIN_TOOLS: Registry[Any] = Registry("built-in tool")

SANDBOX_MODULE = "engine.agents.code_interpreter"  # the sandbox's tool-side function


def as_text(value: Any) -> str:
    """What a tool function returned, as the text the model reads."""
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    if isinstance(value, dict | list | tuple):
        try:
            return json.dumps(value, ensure_ascii=False, default=str)
        except (ValueError, TypeError, RecursionError):
            pass
    return str(value)


async def run_in_thread(fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a new daemon thread, awaited without blocking the loop.

    Cancelling the wait (a timeout) leaves the thread to finish on its own; its result is
    dropped. A ``SystemExit`` in ``fn`` comes back as a ``ToolError``: a tool's ``exit()``
    ends the call, not the run."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(error: BaseException | None, value: Any) -> None:
        if future.done():
            return
        if error is None:
            future.set_result(value)
        else:
            future.set_exception(error)

    def target() -> None:
        error: BaseException | None = None
        value = None
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:
            error = exc
        except SystemExit as exc:  # never past this call
            error = ToolError(f"it called exit({exc.code})")
        except BaseException as exc:
            error = ToolError(f"it stopped with {type(exc).__name__}")
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
            loop.call_soon_threadsafe(settle, error, value)

    threading.Thread(
        target=target, name=f"tool:{getattr(fn, '__name__', 'fn')}", daemon=True
    ).start()
    return await future


class FunctionTool:
    """A tool that calls ``fn(**arguments)`` (see the module's docstring)."""

    def __init__(
        self, name: str, schema: dict[str, Any], fn: Callable[..., Any], *, threaded: bool = True
    ) -> None:
        self.name = name
        self.schema = schema
        self.fn = fn
        self.threaded = threaded
        declared = (schema.get("function", {}).get("parameters") or {}).get("properties", {})
        # What a sample's extra_info.tools_kwargs may give it (engine.agents.tools.sample)
        self.sample_parameters = sample_parameters(fn, declared)

    async def call(
        self, arguments: dict[str, Any], sample: Mapping[str, Any] | None = None
    ) -> ToolResult:
        """``fn(**arguments, **sample)``: the sample's keywords win over the model's."""
        kwargs = {**arguments, **(sample or {})}
        if inspect.iscoroutinefunction(self.fn):
            value = await self.fn(**kwargs)
        elif self.threaded:
            value = await run_in_thread(self.fn, **kwargs)
        else:
            value = self.fn(**kwargs)
        if inspect.isawaitable(value):
            value = await value
        return ToolResult.success(as_text(value))


class Builtin:
    """What every built-in declares (the module's docstring says how each is used)."""

    DESCRIPTION: ClassVar[str]
    PARAMETERS: ClassVar[dict[str, Any]]
    ARGUMENTS: ClassVar[tuple[str, ...]]
    CONFIG_KEYS: ClassVar[tuple[str, ...] | None] = ()

    @classmethod
    def unavailable(cls) -> str | None:
        return None


@BUILTIN_TOOLS.register("calculator")
class CalculatorTool(Builtin, FunctionTool):
    DESCRIPTION = calculator.DESCRIPTION
    PARAMETERS = calculator.PARAMETERS
    ARGUMENTS = ("expression",)

    def __init__(self, name: str, schema: dict[str, Any], config: dict[str, Any]) -> None:
        super().__init__(name, schema, calculator.calculate, threaded=False)


@BUILTIN_TOOLS.register("code_interpreter")
class CodeInterpreterTool(Builtin, FunctionTool):
    DESCRIPTION = "Run Python code in a sandbox and return what it printed."
    PARAMETERS: ClassVar[dict[str, Any]] = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "The Python code to run."}},
        "required": ["code"],
    }
    ARGUMENTS = ("code",)
    CONFIG_KEYS = None  # the sandbox's limits (SandboxLimits' fields): checked when built

    def __init__(self, name: str, schema: dict[str, Any], config: dict[str, Any]) -> None:
        super().__init__(name, schema, self._run)
        self.limits = _sandbox_limits(name, config) if config else None

    @classmethod
    def unavailable(cls) -> str | None:
        try:
            found = importlib.util.find_spec(SANDBOX_MODULE) is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return None
        return f"it needs {SANDBOX_MODULE} (and the sandbox under it), which this engine lacks"

    def _run(self, code: str) -> Any:
        sandbox = importlib.import_module(SANDBOX_MODULE)
        return sandbox.code_interpreter(code, self.limits)


def _sandbox_limits(name: str, config: dict[str, Any]) -> Any:
    """The tool's ``config`` as the sandbox's limits; a ConfigError naming the tool,
    the key and what it takes otherwise."""
    import dataclasses

    from engine.sandbox.limits import SandboxError, SandboxLimits

    known = [f.name for f in dataclasses.fields(SandboxLimits)]
    unknown = sorted(set(config) - set(known))
    if unknown:
        raise ConfigError(
            [f"tool {name!r}: config keys {unknown} are not sandbox limits; use {', '.join(known)}"]
        )
    try:
        return SandboxLimits(**config)
    except (SandboxError, TypeError) as exc:
        raise ConfigError([f"tool {name!r}: config: {exc}"]) from None
