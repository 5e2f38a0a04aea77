"""Countdown (TinyZero-style): reach a target with given numbers and + - * / ( ).

Ground truth: ``{"target": int, "numbers": [int, ...]}``. The response's last
``<answer>...</answer>`` must hold an arithmetic expression that uses every given number
exactly once (no other numbers, no unary minus, no powers). Scores:

- 1.0: the expression equals the target (within 1e-5);
- ``format_score`` (0.1): a well-formed expression that is wrong: the wrong value, the
  numbers not used exactly once, or a division by zero;
- 0.0: no ``<answer>`` tag, or its content is not such an expression.

The expression is checked and evaluated on its syntax tree (``ast``, exact fractions);
nothing from the response is ever executed.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ALLOWED_CHARS = re.compile(r"[0-9+\-*/().\s]+")
_MAX_EXPRESSION_CHARS = 512
_OPERATORS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
}


class _Malformed(ValueError):
    pass


def extract_expression(solution_str: str) -> str | None:
    matches = _ANSWER.findall(solution_str)
    return matches[-1].strip() if matches else None


def parse_expression(expression: str) -> ast.expr:
    """The syntax tree of an allowed expression; raises ``ValueError`` otherwise."""
    if len(expression) > _MAX_EXPRESSION_CHARS or not _ALLOWED_CHARS.fullmatch(expression):
        raise _Malformed("characters other than digits, + - * / ( ) and spaces")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError as exc:
        raise _Malformed(f"not an expression: {exc.msg}") from None
    _check(tree.body)
    return tree.body


def _check(node: ast.expr) -> None:
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        _check(node.left)
        _check(node.right)
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        return
    else:
        raise _Malformed(f"{type(node).__name__} is not allowed")


def numbers_used(node: ast.expr) -> list[int]:
    if isinstance(node, ast.BinOp):
        return numbers_used(node.left) + numbers_used(node.right)
    assert isinstance(node, ast.Constant)  # parse_expression admits nothing else
    return [node.value]


def evaluate(node: ast.expr) -> Fraction:
    """Exact value; ``ZeroDivisionError`` on a division by zero."""
    if isinstance(node, ast.BinOp):
        return _OPERATORS[type(node.op)](evaluate(node.left), evaluate(node.right))
    assert isinstance(node, ast.Constant)
    return Fraction(node.value)


def compute_score(
    solution_str: str,
    ground_truth: Any,
    extra_info: Any = None,
    *,
    format_score: float = 0.1,
    score: float = 1.0,
) -> dict[str, float]:
    expression = extract_expression(solution_str)
    if expression is None:
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    try:
        tree = parse_expression(expression)
    except _Malformed:
        return {"score": 0.0, "acc": 0.0, "format": 0.0}
    wrong = {"score": format_score, "acc": 0.0, "format": 1.0}
    if Counter(numbers_used(tree)) != Counter(int(n) for n in ground_truth["numbers"]):
        return wrong
    try:
        value = evaluate(tree)
    except ZeroDivisionError:
        return wrong
    if abs(float(value) - float(ground_truth["target"])) > 1e-5:
        return wrong
    return {"score": score, "acc": 1.0, "format": 1.0}
