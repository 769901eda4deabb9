"""The calculator the model may call in examples/smollm2_tools (``episode.tools``)::

    episode.tools=[examples/smollm2_tools/tools.py:calculate]

Its type hints and Google-style docstring are the tool's schema (transformers'
``get_json_schema``, via ``asyncrl.actors.episodes.tools.tool_from_function``), so the
docstring is what the model reads about the tool: keep it short and plain.

The expression is parsed with ``ast.parse(mode="eval")`` and walked node by node: only numbers,
``+ - * /``, unary minus/plus and parentheses are evaluated; anything else (names, calls,
attributes, ``**``, strings...) is refused with a ``ValueError`` that says what is allowed.
Nothing is ever passed to ``eval``. A tool that raises answers the model with the error's text
(``ToolBox.call``: ``"Error: calculate raised ValueError: ..."``), counted as a tool error.
"""

from __future__ import annotations

import ast
import math
import operator
import re

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv}  # fmt: skip
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
_SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**",
           ast.FloorDiv: "//", ast.Mod: "%", ast.BitXor: "^", ast.MatMult: "@"}  # fmt: skip
MAX_LENGTH = 200
"""Longest expression accepted (characters): a guard, not a limit a real problem meets."""
MAX_MAGNITUDE = 1e15
"""Largest intermediate result accepted: keeps ``9999999*9999999*...`` chains cheap and exact."""
ALLOWED = "numbers, + - * / and parentheses"
_TIMES = re.compile(r"(?<=[\d)\s])[xX](?=[\s\d(])")
"""An ``x`` between numbers (``12 x 7``, ``12x7``): multiplication."""


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression and return the result.

    Args:
        expression: The arithmetic expression to evaluate, using numbers, + - * / and parentheses, e.g. "(12 + 30) * 4".
    """
    if not isinstance(expression, str):
        raise ValueError(f'expression must be a string such as "12 * 7", not {expression!r}')
    # forgiving about what models often write around the arithmetic: "12 x 7 =", "12 × 7"
    text = expression.strip().rstrip("=").strip().replace("×", "*").replace("÷", "/")
    text = _TIMES.sub("*", text)
    if not text:
        raise ValueError(f'the expression is empty; write one with {ALLOWED}, e.g. "12 * 7"')
    if len(text) > MAX_LENGTH:
        raise ValueError(f"the expression is longer than {MAX_LENGTH} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError:
        raise ValueError(
            f'cannot read {expression!r} as arithmetic; use only {ALLOWED}, e.g. "12 * 7"'
        ) from None
    return _format(_eval(tree.body))


def _eval(node: ast.AST) -> int | float:
    """The value of one node of an expression allowed by ``calculate``; a ``ValueError`` else."""
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise ValueError(f"{node.value!r} is not a number; use only {ALLOWED}")
        return _checked(node.value)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _checked(_UNARY[type(node.op)](_eval(node.operand)))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        return _checked(_BINARY[type(node.op)](left, right))
    if isinstance(node, ast.BinOp):
        symbol = _SYMBOL.get(type(node.op), type(node.op).__name__)
        raise ValueError(f"the operator {symbol} is not supported; use only {ALLOWED}")
    if isinstance(node, ast.Name):
        raise ValueError(f"{node.id!r} is not a number; use only {ALLOWED}")
    if isinstance(node, ast.Tuple):
        raise ValueError(f"commas are not supported (write 1234, not 1,234); use only {ALLOWED}")
    if isinstance(node, ast.Call):
        raise ValueError(f"function calls are not supported; use only {ALLOWED}")
    raise ValueError(f"{ast.unparse(node)!r} is not supported; use only {ALLOWED}")


def _checked(value: int | float) -> int | float:
    if not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
        raise ValueError(f"a result is too large (the limit is {MAX_MAGNITUDE:g})")
    return value


def _format(value: int | float) -> str:
    """Whole numbers without a decimal point (``"42"``, not ``"42.0"``); others to at most 6
    decimals, trailing zeros dropped (``"3.5"``, ``"0.333333"``)."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return str(value)
    return f"{value:.6f}".rstrip("0").rstrip(".")
