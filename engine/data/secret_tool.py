"""The tool of the shipped secret task (``engine.data.secret``), copied next to its tools
file by ``python -m engine.data.prepare secret``: it reveals the row's own secret, given
to it from the row's ``extra_info.tools_kwargs`` (a keyword-only parameter the tool's
schema does not declare, so the model cannot set it)."""

from engine.data.secret import tool_answer


def secret(*, value: str) -> str:
    return tool_answer(value)
