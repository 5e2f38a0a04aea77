"""The ``calculator`` built-in: arithmetic on Python's ``ast``, never ``eval``.

Accepted: numbers (int and float; not bool, complex or strings), ``+ - * / // % **``,
unary ``+ -``, parentheses, the constants ``pi``, ``e``, ``tau`` and the functions in
``FUNCTIONS``. Anything else (names, attributes, subscripts, comprehensions, comparisons,
lambdas) is refused by the node type. Sizes are bounded so that no expression can stall
the run: at most ``MAX_EXPRESSION_CHARS`` characters; integers of at most ``MAX_INT_BITS``
bits (``9**9**9`` is refused before it is computed, from the size its result would have);
``round``'s digits within ±``MAX_ROUND_DIGITS``; a float result that overflows or is not
finite is an error.
"""

from __future__ import annotations

import ast
import math
import operator
from collections.abc import Callable
from typing import Any

from engine.agents.tools.types import ToolError

MAX_EXPRESSION_CHARS = 2000
MAX_INT_BITS = 4096  # about 1233 decimal digits
MAX_ROUND_DIGITS = 100

_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}
CONSTANTS = {"pi": math.pi, "e": math.e, "tau": math.tau}


def _round(x: float, digits: int | None = None) -> float:
    if digits is None:
        return round(x)
    if isinstance(digits, float) or abs(digits) > MAX_ROUND_DIGITS:
        raise ToolError(f"round's digits must be a whole number within ±{MAX_ROUND_DIGITS}")
    return round(x, digits)


FUNCTIONS: dict[str, Callable[..., Any]] = {
    "abs": abs,
    "round": _round,
    "min": min,
    "max": max,
    "sqrt": math.sqrt,
    "exp": math.exp,
    "log": math.log,
    "log2": math.log2,
    "log10": math.log10,
    "sin": math.sin,
    "cos": math.cos,
    "tan": math.tan,
    "asin": math.asin,
    "acos": math.acos,
    "atan": math.atan,
    "floor": math.floor,
    "ceil": math.ceil,
}

DESCRIPTION = (
    "Evaluate an arithmetic expression and return its value. Supports + - * / // % ** and "
    "parentheses, the constants pi, e, tau and the functions " + ", ".join(FUNCTIONS) + "."
)
PARAMETERS = {
    "type": "object",
    "properties": {
        "expression": {"type": "string", "description": "The expression, e.g. (3 + 4) * 2 ** 3"}
    },
    "required": ["expression"],
}


def _check_size(value: Any) -> Any:
    if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
        raise ToolError(f"the result is too large (more than {MAX_INT_BITS} bits)")
    if isinstance(value, float) and not math.isfinite(value):
        raise ToolError(f"the result is not a finite number ({value})")
    if isinstance(value, complex):
        raise ToolError("the result is not a real number")
    return value


def _power(base: Any, exponent: Any) -> Any:
    # |base ** exponent| has at least exponent * (bits(base) - 1) bits: refuse before computing.
    if (
        isinstance(base, int)
        and isinstance(exponent, int)
        and exponent > 0
        and abs(base) > 1
        and exponent * (abs(base).bit_length() - 1) > MAX_INT_BITS
    ):
        raise ToolError(
            f"{short_number(base)} ** {short_number(exponent)} is too large to compute "
            f"(more than {MAX_INT_BITS} bits)"
        )
    return base**exponent


def short_number(value: Any) -> str:
    text = str(value)
    return text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"


def _evaluate(node: ast.AST) -> Any:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant):
        value = node.value
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ToolError(f"{value!r} is not a number")
        return _check_size(value)
    if isinstance(node, ast.Name):
        if node.id not in CONSTANTS:
            raise ToolError(f"unknown name {node.id!r}; constants: {', '.join(CONSTANTS)}")
        return CONSTANTS[node.id]
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _check_size(_power(left, right))
        return _check_size(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.Call):
        if not isinstance(node.func, ast.Name) or node.func.id not in FUNCTIONS:
            raise ToolError(f"unknown function; functions: {', '.join(FUNCTIONS)}")
        if node.keywords:
            raise ToolError("functions take positional arguments only")
        args = [_evaluate(arg) for arg in node.args]
        return _check_size(FUNCTIONS[node.func.id](*args))
    raise ToolError(f"{type(node).__name__} is not allowed; write arithmetic only")


def calculate(expression: str) -> str:
    """The value of ``expression`` as text; a ``ToolError`` that says why when it has none."""
    if not isinstance(expression, str):
        raise ToolError("the expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _evaluate(tree)
    except ToolError:
        raise
    except SyntaxError as exc:
        raise ToolError(f"not an arithmetic expression ({exc.msg})") from None
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except OverflowError:
        raise ToolError("the result is too large") from None
    except (ValueError, TypeError) as exc:  # math domain errors, min() of nothing
        raise ToolError(str(exc)) from None
    except (RecursionError, MemoryError):
        raise ToolError("the expression is nested too deeply") from None
    return str(value)
