"""Reductions over axes (``reduce_sum``, ``reduce_mean``, ``reduce_max``) and softmax."""

from __future__ import annotations

import math
from collections.abc import Sequence

from polyfuse import te
from polyfuse.graph.expr import Expr, IterVar, Tensor
from polyfuse.ops._common import (
    Index,
    as_operand,
    compute_op,
    narrow,
    norm_axes,
    norm_axis,
    op_name,
    wide,
)


def reduce_subscripts(
    ndim: int, ks: dict[int, IterVar], keepdims: bool, idx: tuple[IterVar, ...]
) -> tuple[Expr, ...]:
    """Subscripts of the reduced input: reduce axes where reduced, output loop variables
    elsewhere (skipping the size-1 output dims ``keepdims`` leaves)."""
    it = iter(idx)
    subs: list[Expr] = []
    for d in range(ndim):
        if d in ks:
            subs.append(ks[d])
            if keepdims:
                next(it)
        else:
            subs.append(next(it))
    return tuple(subs)


def _reduce(
    op: str,
    kind: str,
    x: Tensor,
    axis: int | Sequence[int] | None,
    keepdims: bool,
    name: str | None,
    scale: float | None = None,
) -> Tensor:
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    axes = norm_axes(op, name, x, axis)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    if not axes:  # nothing to reduce (a 0-d input with axis=None): a copy
        return compute_op(shape, lambda *idx: x[idx], name, op)
    ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}
    reducer = {"sum": te.sum, "max": te.max}[kind]

    def body(*idx: IterVar) -> Expr:
        v = x[reduce_subscripts(x.ndim, ks, keepdims, idx)]
        return reducer(v if scale is None else v * scale, axis=list(ks.values()))

    return compute_op(shape, body, name, op)


def reduce_sum(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Sum over ``axis`` (int, tuple, or None for all axes) like ``np.sum``; one primitive."""
    return _reduce("reduce_sum", "sum", x, axis, keepdims, name)


def reduce_mean(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Mean over ``axis`` like ``np.mean``; one primitive ``sum(x * (1/n))``."""
    name = op_name("reduce_mean", name)
    xt = as_operand("reduce_mean", name, "input", x)
    n = math.prod(xt.shape[d] for d in norm_axes("reduce_mean", name, xt, axis))
    return _reduce("reduce_mean", "sum", x, axis, keepdims, name, scale=1.0 / n)


def reduce_max(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Maximum over ``axis`` like ``np.max``; one primitive."""
    return _reduce("reduce_max", "max", x, axis, keepdims, name)


def _insert(idx: Sequence[Expr], axis: int, k: Expr) -> Index:
    return (*idx[:axis], k, *idx[axis:])


def _drop(idx: Sequence[Expr], axis: int) -> Index:
    return (*idx[:axis], *idx[axis + 1 :])


def _softmax_parts(op: str, x: Tensor, axis: int, name: str) -> tuple[Tensor, Tensor, Tensor, int]:
    """max, x - max, exp, sum: the common head of softmax and log_softmax. The max is in
    ``x``'s dtype (exact); for a float16/bfloat16 ``x`` the rest is float32, so that the
    caller rounds its result once (:func:`wide`)."""
    x = as_operand(op, name, "input", x)
    ax = norm_axis(op, name, x, axis)
    n = x.shape[ax]
    red = _drop(x.shape, ax)
    k1 = te.reduce_axis(n, name="r")
    mx = compute_op(red, lambda *i: te.max(x[_insert(i, ax, k1)], axis=k1), f"{name}_max", op)
    w = wide(x)
    sh = compute_op(x.shape, lambda *i: w(x[i]) - w(mx[_drop(i, ax)]), f"{name}_sub", op)
    ex = compute_op(x.shape, lambda *i: te.exp(sh[i]), f"{name}_exp", op)
    k2 = te.reduce_axis(n, name="r")
    sm = compute_op(red, lambda *i: te.sum(ex[_insert(i, ax, k2)], axis=k2), f"{name}_sum", op)
    return sh, ex, sm, ax


def softmax(x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Five primitives: ``max`` (reduce), ``sub`` (x - max), ``exp``, ``sum`` (reduce), ``div``.
    A float16/bfloat16 ``x`` computes in float32 and its result is rounded once, as torch's
    kernels do: 16-bit exponentials and sums would round each (a unit or two off).
    """
    name = op_name("softmax", name)
    _, ex, sm, ax = _softmax_parts("softmax", x, axis, name)
    back = narrow(x)
    return compute_op(ex.shape, lambda *i: back(ex[i] / sm[_drop(i, ax)]), name, "softmax")


def log_softmax(x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
    """``(x - max) - log(sum(exp(x - max)))`` along ``axis``.

    Six primitives: ``max``, ``sub``, ``exp``, ``sum``, ``log`` (of the sum), final ``sub``.
    A float16/bfloat16 ``x`` computes in float32, its result rounded once (as :func:`softmax`).
    """
    name = op_name("log_softmax", name)
    sh, _, sm, ax = _softmax_parts("log_softmax", x, axis, name)
    lg = compute_op(sm.shape, lambda *i: te.log(sm[i]), f"{name}_log", "log_softmax")
    back = narrow(x)
    return compute_op(sh.shape, lambda *i: back(sh[i] - lg[_drop(i, ax)]), name, "log_softmax")
