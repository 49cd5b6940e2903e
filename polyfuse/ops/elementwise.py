"""Elementwise composites: numpy-broadcast binary ops and unary math (``add`` … ``gelu``)."""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, Tensor, as_expr
from polyfuse.ops._common import (
    Index,
    Operand,
    as_operand,
    bcast,
    broadcast_shape,
    compute_op,
    op_name,
)


def _binary(
    op: str, fn: Callable[[Any, Any], Expr], a: Operand, b: Operand, name: str | None
) -> Tensor:
    name = op_name(op, name)
    tensors = [t for t in (a, b) if isinstance(t, Tensor)]
    if not tensors:
        raise ExpressionError(f"{op} '{name}': at least one operand must be a Tensor")
    for what, v in (("first operand", a), ("second operand", b)):
        if not isinstance(v, Tensor) and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ExpressionError(
                f"{op} '{name}': {what} must be a Tensor or a Python number, got {type(v).__name__}"
            )
    shape = broadcast_shape(op, name, [(t.shape, t.name) for t in tensors])

    def operand(v: Operand, idx: Index) -> Any:
        if isinstance(v, Tensor):
            return v[bcast(v.shape, idx)]
        return float(v)

    return compute_op(shape, lambda *idx: fn(operand(a, idx), operand(b, idx)), name, op)


def add(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a + b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("add", lambda x, y: x + y, a, b, name)


def sub(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a - b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("sub", lambda x, y: x - y, a, b, name)


def mul(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a * b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("mul", lambda x, y: x * y, a, b, name)


def div(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a / b`` (true division) with numpy broadcasting."""
    return _binary("div", lambda x, y: x / y, a, b, name)


def maximum(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """Elementwise maximum with numpy broadcasting (``np.maximum``)."""
    return _binary("maximum", te.maximum, a, b, name)


def minimum(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """Elementwise minimum with numpy broadcasting (``np.minimum``)."""
    return _binary("minimum", te.minimum, a, b, name)


def pow(a: Operand, b: Operand, name: str | None = None) -> Tensor:  # noqa: A001
    """``a ** b`` (float power, ``np.power`` on float32) with numpy broadcasting."""
    return _binary("pow", lambda x, y: as_expr(x) ** y, a, b, name)


def _unary(op: str, fn: Callable[[Expr], Expr], x: Tensor, name: str | None) -> Tensor:
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    return compute_op(x.shape, lambda *idx: fn(x[idx]), name, op)


def neg(x: Tensor, name: str | None = None) -> Tensor:
    """``-x`` elementwise."""
    return _unary("neg", lambda v: -v, x, name)


def exp(x: Tensor, name: str | None = None) -> Tensor:
    """``e ** x`` elementwise."""
    return _unary("exp", te.exp, x, name)


def log(x: Tensor, name: str | None = None) -> Tensor:
    """Natural logarithm elementwise."""
    return _unary("log", te.log, x, name)


def sqrt(x: Tensor, name: str | None = None) -> Tensor:
    """Square root elementwise."""
    return _unary("sqrt", te.sqrt, x, name)


def rsqrt(x: Tensor, name: str | None = None) -> Tensor:
    """``1 / sqrt(x)`` elementwise."""
    return _unary("rsqrt", te.rsqrt, x, name)


def tanh(x: Tensor, name: str | None = None) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return _unary("tanh", te.tanh, x, name)


def sigmoid(x: Tensor, name: str | None = None) -> Tensor:
    """Logistic sigmoid ``1 / (1 + exp(-x))`` elementwise."""
    return _unary("sigmoid", te.sigmoid, x, name)


def relu(x: Tensor, name: str | None = None) -> Tensor:
    """``max(x, 0)`` elementwise."""
    return _unary("relu", lambda v: te.maximum(v, 0.0), x, name)


def abs(x: Tensor, name: str | None = None) -> Tensor:  # noqa: A001
    """``|x|`` elementwise."""
    return _unary("abs", te.abs, x, name)


def gelu(x: Tensor, approximate: str = "none", name: str | None = None) -> Tensor:
    """Gaussian error linear unit, one primitive (as ``torch.nn.functional.gelu``).

    ``approximate="none"``: ``0.5 * x * (1 + erf(x / sqrt(2)))``;
    ``approximate="tanh"``: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``.
    """
    name = op_name("gelu", name)
    if approximate == "none":
        c = 1.0 / math.sqrt(2.0)
        return _unary("gelu", lambda v: 0.5 * v * (1.0 + te.erf(v * c)), x, name)
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return _unary(
            "gelu", lambda v: 0.5 * v * (1.0 + te.tanh(c * (v + 0.044715 * (v * v * v)))), x, name
        )
    raise ExpressionError(
        f"gelu '{name}': approximate={approximate!r} is not one of 'none', 'tanh'"
    )
