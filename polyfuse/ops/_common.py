"""Helpers every ``polyfuse.ops`` module uses: result names, argument checks, broadcasting
and axis normalisation, affine index arithmetic."""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.dtypes import HALF_DTYPES, is_float, numpy_dtype
from polyfuse.graph.expr import Expr, Tensor, as_expr

Operand = Tensor | float | int
Index = tuple[Expr, ...]

_counter = itertools.count()  # default result names (tests/golden/generate.py restarts it)


def op_name(op: str, name: str | None) -> str:
    return name if name else f"{op}{next(_counter)}"


def as_operand(op: str, name: str, what: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise ExpressionError(f"{op} '{name}': {what} must be a Tensor, got {type(t).__name__}")
    return t


def lowest(dtype: str) -> Expr:
    """The smallest value of ``dtype`` (-inf for a float): a max's identity."""
    if is_float(dtype):
        return te.const(-math.inf, dtype)
    return te.const(int(np.iinfo(numpy_dtype(dtype)).min), dtype)


def highest(dtype: str) -> Expr:
    """The largest value of ``dtype`` (+inf for a float): a min's identity."""
    if is_float(dtype):
        return te.const(math.inf, dtype)
    return te.const(int(np.iinfo(numpy_dtype(dtype)).max), dtype)


def compute_op(shape: Sequence[int], fcompute: Callable[..., Any], name: str, tag: str) -> Tensor:
    """``te.compute`` with variadic loop variables (``*idx``) and the composite's tag."""
    return te.compute(tuple(shape), fcompute, name=name, tag=tag)


def wide(x: Tensor) -> Callable[[Expr], Expr]:
    """A float16/bfloat16 tensor's values as float32, what a normalisation or a softmax of
    it computes in (torch's "opmath" type); other tensors' values as they are."""
    if x.dtype in HALF_DTYPES:
        return lambda v: te.cast(v, "float32")
    return lambda v: v


def narrow(x: Tensor) -> Callable[[Expr], Expr]:
    """The inverse of :func:`wide`: a float32 result rounded once to ``x``'s 16-bit dtype
    (other dtypes: as it is)."""
    if x.dtype in HALF_DTYPES:
        return lambda v: te.cast(v, x.dtype)
    return lambda v: v


def desc(t: Tensor) -> str:
    return f"'{t.name}' {t.shape}"


def broadcast_shape(
    op: str, name: str, operands: Sequence[tuple[tuple[int, ...], str]]
) -> tuple[int, ...]:
    """numpy broadcasting of ``(shape, tensor name)`` operands, or an error naming them."""
    nd = builtins.max((len(s) for s, _ in operands), default=0)
    out = [1] * nd
    for shape, _ in operands:
        off = nd - len(shape)
        for d, s in enumerate(shape):
            if s == 1:
                continue
            if out[off + d] not in (1, s):
                shapes = " and ".join(f"'{n}' {tuple(sh)}" for sh, n in operands)
                raise ExpressionError(f"{op} '{name}': shapes {shapes} do not broadcast")
            out[off + d] = s
    return tuple(out)


def bcast(shape: Sequence[int], idx: Sequence[Expr]) -> Index:
    """Subscripts reading a tensor of ``shape`` broadcast (right-aligned) to loop vars ``idx``."""
    off = len(idx) - len(shape)
    return tuple(as_expr(0) if s == 1 else idx[off + d] for d, s in enumerate(shape))


def norm_axis(op: str, name: str, x: Tensor, axis: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ExpressionError(f"{op} '{name}': axis {axis!r} must be an int")
    if not -x.ndim <= axis < x.ndim:
        raise ExpressionError(
            f"{op} '{name}': axis {axis} is out of range for {desc(x)} ({x.ndim} dims)"
        )
    return axis % x.ndim


def norm_axes(op: str, name: str, x: Tensor, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    norm = tuple(norm_axis(op, name, x, a) for a in axes)
    if len(set(norm)) != len(norm):
        raise ExpressionError(f"{op} '{name}': axis {axis!r} names a dimension twice")
    return tuple(sorted(norm))


def int_pair(op: str, name: str, what: str, v: int | Sequence[int], lo: int) -> tuple[int, int]:
    p = (v, v) if isinstance(v, int) else tuple(v)
    if len(p) != 2 or not all(isinstance(e, int) and e >= lo for e in p):
        raise ExpressionError(
            f"{op} '{name}': {what} {v!r} must be an int or a pair of ints >= {lo}"
        )
    return int(p[0]), int(p[1])


def affine_expr(base: Expr, scale: int, terms: Sequence[tuple[Expr, int]], offset: int) -> Expr:
    """``base*scale + sum(v*c) + offset`` without trivial ``*1`` and ``+0`` nodes."""
    e: Expr = base if scale == 1 else base * scale
    for v, c in terms:
        e = e + (v if c == 1 else v * c)
    if offset > 0:
        e = e + offset
    elif offset < 0:
        e = e - (-offset)
    return e


def all_of(conds: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for c in conds:
        out = c if out is None else out & c
    return out
