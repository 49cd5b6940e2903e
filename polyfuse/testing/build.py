"""A :class:`~polyfuse.testing.generate.GraphSpec` made real: its input arrays (a pure
function of each input's seed) and its te tensors (``build``), the node kinds of
:func:`~polyfuse.testing.generate.generate` built here and the families' kinds by their
:class:`~polyfuse.testing.generate.Family` builders."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from polyfuse import te
from polyfuse.graph import dtypes as dt

from .generate import ONE, GraphSpec, Node, family_kind, te_name

__all__ = ["build", "input_values", "reduce_layout"]


# --------------------------------------------------------------------------- values


def input_values(spec: GraphSpec) -> dict[str, np.ndarray]:
    """The input arrays of ``spec``: a pure function of each input's seed, fill and shape."""
    out: dict[str, np.ndarray] = {}
    for n in spec.inputs:
        shape = spec.size(n.shape)
        rng = np.random.default_rng(n.seed)
        if n.fill == "positive":
            v = rng.uniform(0.5, 2.5, shape)
        else:
            v = rng.standard_normal(shape)
            if n.fill == "special":
                r = rng.random(shape)
                v = np.where(r < 0.05, np.nan, v)
                v = np.where((r >= 0.05) & (r < 0.08), np.inf, v)
                v = np.where((r >= 0.08) & (r < 0.11), -np.inf, v)
        out[n.name] = _stored(v, n.dtype)
    return out


def _stored(v: np.ndarray, dtype: str) -> np.ndarray:
    """Values ``v`` (float64) as an array of ``dtype``: rounded to a float dtype (through
    float32, as the fuzzer has always drawn them), truncated to an integer one (NaN and
    infinities become 0), tested ``!= 0`` for bool."""
    if dt.is_float(dtype):
        return np.asarray(v, dtype=np.float32).astype(dt.numpy_dtype(dtype))
    if dtype == "bool":
        return np.asarray(np.nan_to_num(v, nan=0.0) > 0.5, dtype=np.bool_)
    finite = np.where(np.isfinite(v), v * 3.0, 0.0)
    return np.asarray(np.trunc(finite).astype(dt.numpy_dtype(dtype)))  # 0-d stays an array


# --------------------------------------------------------------------------- spec -> te


def _operand(
    t: te.Tensor, shape: tuple[str, ...], out: tuple[str, ...], idx: tuple[Any, ...]
) -> Any:
    """Read ``t`` (symbolic ``shape``) at the point ``idx`` of a broadcast ``out`` shape."""
    if not shape:
        return t[()]
    off = len(out) - len(shape)
    subs = [0 if s == ONE and out[off + d] != ONE else idx[off + d] for d, s in enumerate(shape)]
    return t[tuple(subs)]


def _apply_unary(op: str, v: Any) -> Any:
    if op == "neg":
        return -v
    if op == "square":
        return v * v
    return getattr(te, op)(v)


def _apply_binary(op: str, a: Any, b: Any) -> Any:
    if op == "add":
        return a + b
    if op == "sub":
        return a - b
    if op == "mul":
        return a * b
    if op == "div":
        return a / b
    if op == "pow":
        return a**b
    return getattr(te, op)(a, b)


def reduce_layout(n: Node, src_rank: int) -> list[tuple[str, int]]:
    """How a reduce node reads its source: per source dimension ("k", d) for the reduce axis
    of dimension d, or ("i", p) for the node's own loop variable p. The node's shape is the
    source's without the reduced axes, or with them as size-1 axes (keepdims), or (1,) for a
    total."""
    kept = [d for d in range(src_rank) if d not in n.axes]
    keepdims = len(n.shape) == src_rank and src_rank > len(kept)
    out: list[tuple[str, int]] = []
    for d in range(src_rank):
        if d in n.axes:
            out.append(("k", d))
        else:
            out.append(("i", d if keepdims else kept.index(d)))
    return out


def _compare(op: str, a: Any, b: Any) -> Any:
    if op == "gt":
        return a > b
    if op == "lt":
        return a < b
    if op == "ge":
        return a >= b
    return a <= b


def build(spec: GraphSpec) -> tuple[list[te.Tensor], list[te.Tensor], dict[str, te.Tensor]]:
    """te tensors for ``spec``: (inputs the outputs use, outputs, every tensor by name)."""
    spec = spec.pruned()
    ts: dict[str, te.Tensor] = {}
    for n in spec.nodes:
        shape = spec.size(n.shape)
        if n.kind == "input":
            ts[n.name] = te.placeholder(shape, n.dtype, name=te_name(spec, n))
            continue
        if (fam := family_kind(n.kind)) is not None:
            ts[n.name] = fam.build[n.kind](spec, n, ts)
            continue
        srcs = [ts[a] for a in n.args]
        shapes = [spec.node(a).shape for a in n.args]
        ts[n.name] = _build_compute(spec, n, shape, srcs, shapes)
    inputs = [ts[n.name] for n in spec.inputs]
    return inputs, [ts[o] for o in spec.outputs], ts


def _cast(n: Node, k: int, v: Any) -> Any:
    """Read ``v`` of argument ``k`` of ``n``, cast as ``n.casts`` says."""
    return te.cast(v, n.casts[k]) if k < len(n.casts) and n.casts[k] else v


def _build_compute(
    spec: GraphSpec,
    n: Node,
    shape: tuple[int, ...],
    srcs: list[te.Tensor],
    shapes: list[tuple[str, ...]],
) -> te.Tensor:
    out = n.shape

    def rd(k: int, i: tuple[Any, ...]) -> Any:
        return _cast(n, k, _operand(srcs[k], shapes[k], out, i))

    if n.kind == "unary":
        f = lambda *i: _apply_unary(n.op, rd(0, i))  # noqa: E731
    elif n.kind == "binary":
        if n.const is not None:
            f = lambda *i: _apply_binary(n.op, rd(0, i), n.const)  # noqa: E731
        else:
            f = lambda *i: _apply_binary(n.op, rd(0, i), rd(1, i))  # noqa: E731
    elif n.kind == "where":
        f = lambda *i: te.where(_compare(n.op, rd(0, i), n.const), rd(1, i), rd(2, i))  # noqa: E731
    elif n.kind == "transpose":
        f = lambda i, j: _cast(n, 0, srcs[0][j, i])  # noqa: E731
    elif n.kind == "matmul":
        src_shape = spec.size(shapes[0])
        k = te.reduce_axis(src_shape[1], name=f"{n.name}_k")

        def a(i: Any) -> Any:
            v = _cast(n, 0, srcs[0][i, k])
            return _apply_unary(n.pre, v) if n.pre else v

        if n.op == "nt":
            f = lambda i, j: te.sum(a(i) * _cast(n, 1, srcs[1][j, k]), axis=k)  # noqa: E731
        else:
            f = lambda i, j: te.sum(a(i) * _cast(n, 1, srcs[1][k, j]), axis=k)  # noqa: E731
    elif n.kind == "reduce":
        src_shape = spec.size(shapes[0])
        rks = {d: te.reduce_axis(src_shape[d], name=f"{n.name}_k{d}") for d in n.axes}
        count = math.prod(src_shape[d] for d in n.axes)
        layout = reduce_layout(n, len(src_shape))

        def f(*i: Any) -> Any:
            sub = [rks[d] if kind == "k" else i[d] for kind, d in layout]
            v = _cast(n, 0, srcs[0][tuple(sub)] if sub else srcs[0][()])
            if n.pre:
                v = _apply_unary(n.pre, v)
            axis = [rks[d] for d in n.axes]
            if n.op == "mean":
                return te.sum(v, axis=axis) / float(count)
            return getattr(te, n.op)(v, axis=axis)

    else:
        raise ValueError(f"unknown node kind {n.kind}")
    return te.compute(shape, f, name=te_name(spec, n), dtype=n.dtype)
