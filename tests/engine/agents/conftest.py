"""Fixtures of the agents' tests: stand-ins for the sandbox on the tool side."""

import importlib.machinery
import sys
import types

import pytest

from engine.agents.tools.builtins import SANDBOX_MODULE


@pytest.fixture
def fake_sandbox(monkeypatch):
    """A stand-in ``engine.sandbox.run`` that records its calls: the code_interpreter
    built-in's side of the contract, whether or not the real sandbox is in this tree."""
    module = types.ModuleType(SANDBOX_MODULE)
    module.__spec__ = importlib.machinery.ModuleSpec(SANDBOX_MODULE, None)
    module.calls = []

    def code_interpreter(code, limits=None):
        module.calls.append((code, limits))
        return f"ran {len(code)} characters"

    module.code_interpreter = code_interpreter
    monkeypatch.setitem(sys.modules, SANDBOX_MODULE, module)
    return module


@pytest.fixture
def no_sandbox(monkeypatch):
    """As if ``engine/sandbox/run.py`` were not in the tree."""
    monkeypatch.setitem(sys.modules, SANDBOX_MODULE, None)
