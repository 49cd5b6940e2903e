"""Layout composites: transpose, reshape, concat, slice and pad (affine or div/mod
subscripts; guarded reads instead of clamped indices)."""

from __future__ import annotations

import builtins
import itertools
import math
from collections.abc import Sequence
from typing import Any

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.dtypes import is_float
from polyfuse.graph.expr import Expr, IterVar, Tensor
from polyfuse.graph.passes.layout import reshape_subscripts
from polyfuse.ops._common import (
    affine_expr,
    all_of,
    as_operand,
    compute_op,
    desc,
    norm_axis,
    op_name,
)


def transpose(x: Tensor, perm: Sequence[int] | None = None, name: str | None = None) -> Tensor:
    """Permute dims like ``np.transpose``: ``out.shape[i] = x.shape[perm[i]]``; default reverses."""
    op = "transpose"
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    p = tuple(range(x.ndim - 1, -1, -1)) if perm is None else tuple(perm)
    if sorted(d % x.ndim if x.ndim and -x.ndim <= d < x.ndim else -1 for d in p) != list(
        range(x.ndim)
    ):
        raise ExpressionError(
            f"{op} '{name}': perm {perm!r} is not a permutation of the {x.ndim} dims of {desc(x)}"
        )
    p = tuple(d % x.ndim for d in p)
    inv = [0] * x.ndim
    for i, d in enumerate(p):
        inv[d] = i
    shape = tuple(x.shape[d] for d in p)
    return compute_op(shape, lambda *idx: x[tuple(idx[inv[d]] for d in range(x.ndim))], name, op)


def reshape(x: Tensor, shape: Sequence[int], name: str | None = None) -> Tensor:
    """Row-major reshape like ``np.reshape`` (one dim may be ``-1``); one primitive.

    Each read subscript is ``flat // stride % extent`` of the output's flattened index, computed
    per group of dims whose sizes multiply to the same product, so dims that are unchanged keep
    plain subscripts.
    """
    op = "reshape"
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    dims = [shape] if isinstance(shape, int) else list(shape)
    if not all(isinstance(d, int) and (d > 0 or d == -1) for d in dims) or dims.count(-1) > 1:
        raise ExpressionError(
            f"{op} '{name}': shape {tuple(dims)} must hold positive ints and at most one -1"
        )
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if x.size % known:
            raise ExpressionError(
                f"{op} '{name}': cannot reshape {desc(x)} ({x.size} elements) to {tuple(dims)}"
            )
        dims[dims.index(-1)] = x.size // known
    out = tuple(dims)
    if math.prod(out) != x.size:
        raise ExpressionError(
            f"{op} '{name}': cannot reshape {desc(x)} ({x.size} elements) to {out}"
        )
    shape_in = x.shape

    def body(*idx: IterVar) -> Expr:
        return x[reshape_subscripts(shape_in, idx, out)]

    return compute_op(out, body, name, op)


def concat(tensors: Sequence[Tensor], axis: int = 0, name: str | None = None) -> Tensor:
    """Join tensors along ``axis`` like ``np.concatenate``; one primitive (a chain of where)."""
    op = "concat"
    name = op_name(op, name)
    ts = list(tensors)
    if not ts:
        raise ExpressionError(f"{op} '{name}': needs at least one tensor")
    for t in ts:
        as_operand(op, name, "every input", t)
    first = ts[0]
    ax = norm_axis(op, name, first, axis)
    for t in ts[1:]:
        if t.ndim != first.ndim or any(
            d != ax and s != r for d, (s, r) in enumerate(zip(t.shape, first.shape, strict=True))
        ):
            raise ExpressionError(
                f"{op} '{name}': {desc(t)} does not match {desc(first)} "
                f"in the dims other than axis {ax}"
            )
    offsets = list(itertools.accumulate((t.shape[ax] for t in ts), initial=0))
    shape = tuple(offsets[-1] if d == ax else s for d, s in enumerate(first.shape))

    def part(n: int, idx: Sequence[Expr]) -> Expr:
        i = idx[ax] if offsets[n] == 0 else idx[ax] - offsets[n]
        return ts[n][(*idx[:ax], i, *idx[ax + 1 :])]

    def body(*idx: IterVar) -> Expr:
        e = part(len(ts) - 1, idx)
        for n in range(len(ts) - 2, -1, -1):
            e = te.where(idx[ax] < offsets[n + 1], part(n, idx), e)
        return e

    return compute_op(shape, body, name, op)


def slice(  # noqa: A001
    x: Tensor,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    name: str | None = None,
) -> Tensor:
    """ONNX ``Slice``: ``x[starts:ends:steps]`` on ``axes`` (default ``0..len(starts)-1``).

    Negative starts/ends count from the end, out-of-range values are clamped (so a huge ``end``
    means "to the end"); steps must be positive. One primitive reading ``x[start + i*step]``.
    """
    op = "slice"
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    st, en = list(starts), list(ends)
    ax = list(range(len(st))) if axes is None else list(axes)
    sp = [1] * len(st) if steps is None else list(steps)
    if not len(st) == len(en) == len(ax) == len(sp):
        raise ExpressionError(
            f"{op} '{name}': starts, ends, axes and steps must have the same length"
        )
    ax = [norm_axis(op, name, x, a) for a in ax]
    if len(set(ax)) != len(ax):
        raise ExpressionError(f"{op} '{name}': axes {axes!r} name a dimension twice")
    begin = [0] * x.ndim
    step = [1] * x.ndim
    shape = list(x.shape)
    for a, s, e, k in zip(ax, st, en, sp, strict=True):
        if not isinstance(k, int) or k <= 0:
            raise ExpressionError(f"{op} '{name}': step {k!r} on axis {a} must be a positive int")
        n = x.shape[a]
        s = builtins.min(builtins.max(s + n if s < 0 else s, 0), n)
        e = builtins.min(builtins.max(e + n if e < 0 else e, 0), n)
        length = (e - s + k - 1) // k if e > s else 0
        if length <= 0:
            raise ExpressionError(
                f"{op} '{name}': axis {a} of {desc(x)} selects no elements "
                f"(start {s}, end {e}, step {k})"
            )
        begin[a], step[a], shape[a] = s, k, length

    def body(*idx: IterVar) -> Expr:
        return x[tuple(affine_expr(i, k, (), b) for i, k, b in zip(idx, step, begin, strict=True))]

    return compute_op(tuple(shape), body, name, op)


def pad(
    x: Tensor,
    pads: int | Sequence[int] | Sequence[Sequence[int]],
    value: float = 0.0,
    name: str | None = None,
) -> Tensor:
    """Constant padding like ``np.pad(x, pads, constant_values=value)``; one primitive.

    ``pads`` is numpy's ``pad_width``: an int, one ``(before, after)`` pair for every dim, or a
    list of ``(before, after)`` pairs, one per dim. Reads are guarded by ``te.where``. The
    result has ``x``'s dtype: ``value`` is converted to it as numpy converts it (an integer
    tensor's value truncated toward zero).
    """
    op = "pad"
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    bad = ExpressionError(
        f"{op} '{name}': pads {pads!r} must be an int, a (before, after) pair or one pair "
        f"per dim of {desc(x)}, all >= 0"
    )
    if isinstance(pads, int):
        pw = [(pads, pads)] * x.ndim
    else:
        seq = list(pads)
        if len(seq) == 2 and all(isinstance(v, int) for v in seq):
            pw = [(seq[0], seq[1])] * x.ndim
        else:
            try:
                pw = [(int(p[0]), int(p[1])) for p in seq if len(p) == 2]  # type: ignore[index,arg-type]
            except (TypeError, IndexError):
                raise bad from None
            if len(pw) != len(seq):
                raise bad
            if len(pw) == 1:
                pw = pw * x.ndim
    if len(pw) != x.ndim or any(b < 0 or a < 0 for b, a in pw):
        raise bad
    shape = tuple(s + b + a for s, (b, a) in zip(x.shape, pw, strict=True))
    fill: Any = float(value)
    if x.dtype == "bool":
        fill = te.const(bool(value), "bool")
    elif not is_float(x.dtype):
        fill = te.const(int(value), x.dtype)

    def body(*idx: IterVar) -> Expr:
        subs = tuple(affine_expr(i, 1, (), -b) for i, (b, _) in zip(idx, pw, strict=True))
        conds = []
        for i, s, (b, a) in zip(idx, x.shape, pw, strict=True):
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < b + s)
        cond = all_of(conds)
        return x[subs] if cond is None else te.where(cond, x[subs], fill)

    return compute_op(shape, body, name, op)
