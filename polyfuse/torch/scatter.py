"""ATen scatters: ``scatter`` (``.src``, ``.value``, ``.reduce``), ``scatter_add``,
``scatter_reduce`` (sum, prod, amax, amin, mean), ``index_put`` and ``index_add`` on
:mod:`polyfuse.ops.scatter` (per output element, a reduction over the update rows that name it).

Among duplicate indices torch leaves the written value unspecified (its CPU kernel writes the
last); polyfuse writes the last. A ``mean`` of integers divides toward negative infinity where
torch's CPU kernel does too (``floor_divide``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from polyfuse import ops, te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Expr, Tensor
from polyfuse.ops.scatter import scatter_rows

__all__ = ["LOWERINGS", "unsupported_reason"]

aten = torch.ops.aten

#: torch's names of scatter reductions → polyfuse's
_REDUCE = {"add": "add", "sum": "add", "multiply": "mul", "prod": "mul", "amax": "max",
           "amin": "min"}  # fmt: skip


def _reduce_of(reduce: str) -> str:
    if reduce not in _REDUCE:
        raise UnsupportedOpError(
            f"scatter reduce '{reduce}' (add, sum, multiply, prod, amax, amin)"
        )
    return _REDUCE[reduce]


def _scatter(x: Tensor, dim: int, index: Tensor, src: Any, *, reduce: str | None = None) -> Tensor:
    """``aten.scatter.src``/``.value`` (and ``.reduce``/``.value_reduce``)."""
    how = _reduce_of(reduce) if reduce is not None else None
    return ops.scatter(x, dim, index, src, how)


def _scatter_add(x: Tensor, dim: int, index: Tensor, src: Tensor) -> Tensor:
    return ops.scatter(x, dim, index, src, "add")


def _scatter_reduce(
    x: Tensor, dim: int, index: Tensor, src: Tensor, reduce: str, *, include_self: bool = True
) -> Tensor:
    """``aten.scatter_reduce.two``; ``mean`` is the sum over the count (the element itself
    counted with ``include_self``)."""
    if reduce != "mean":
        return ops.scatter(x, dim, index, src, _reduce_of(reduce), include_self=include_self)
    total = ops.scatter(x, dim, index, src, "add", include_self=include_self)
    ones = te.compute(index.shape, lambda *i: te.const(1, "int64"), name=f"{x.name}_ones")
    base = te.compute(x.shape, lambda *i: te.const(int(include_self), "int64"),
                      name=f"{x.name}_count0")  # fmt: skip
    count = ops.scatter(base, dim, index, ones, "add", include_self=True)

    def mean(*i: Any) -> Expr:
        n = te.maximum(count[i], 1)
        if dt.is_float(x.dtype):
            return te.cast(total[i] / te.cast(n, x.dtype), x.dtype)
        return te.cast(_floor_div(total[i], n), x.dtype)

    return te.compute(x.shape, mean, name=f"{x.name}_scatter_mean")


def _floor_div(a: Expr, b: Expr) -> Expr:
    """``a // b`` of integers by a positive run-time ``b`` (te's ``//`` takes constants)."""
    q = te.truncdiv(te.cast(a, "int64"), b)
    return te.where(te.not_equal(q * b, a) & (a < 0), q - 1, q)


def _index_put(
    x: Tensor, indices: Sequence[Tensor | None], values: Any, accumulate: bool = False
) -> Tensor:
    """``aten.index_put`` (``x[indices] = values``; ``+=`` with ``accumulate``)."""
    return ops.index_put(x, indices, values, bool(accumulate))


def _index_add(x: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha: Any = 1) -> Tensor:
    """``aten.index_add``: ``out[..., index[r], ...] += alpha * source[..., r, ...]``."""
    ax = dim % x.ndim if x.ndim else 0
    n = x.shape[ax]

    def at(p: Sequence[Expr], r: Expr) -> tuple[Expr, ...]:
        return (*p[:ax], r, *p[ax + 1 :])

    def hit(p: Sequence[Expr], r: Expr) -> Expr:
        v = index[(r,)] if index.ndim else index[()]
        return te.equal(te.where(v < 0, v + n, v), te.cast(p[ax], index.dtype))

    def update(p: Sequence[Expr], r: Expr) -> Expr:
        v = te.cast(source[at(p, r)], x.dtype)
        return v if alpha == 1 else te.cast(v * alpha, x.dtype)

    rows = index.shape[0] if index.ndim else 1
    return scatter_rows(x, rows, hit, update, "add", f"{x.name}_index_add")


LOWERINGS: dict[Any, Callable[..., Any]] = {
    aten.scatter.src: _scatter,
    aten.scatter.value: _scatter,
    aten.scatter.reduce: _scatter,
    aten.scatter.value_reduce: _scatter,
    aten.scatter_add.default: _scatter_add,
    aten.scatter_reduce.two: _scatter_reduce,
    aten.index_put.default: _index_put,
    aten.index_add.default: _index_add,
}


#: Update rows a scatter may have: each output element compares every row (a reduction over
#: them), so a KV-cache step (a few rows) or a one-hot (one) is cheap and a scatter as large
#: as its target (``F.fold``'s ``index_put``, a graph's edges summed into its nodes) is
#: quadratic; past this it stays in PyTorch, whose kernels visit each row once.
SCATTER_MAX_ROWS = 4096


def _meta_shape(a: Any) -> tuple[int, ...]:
    v = a.meta.get("val") if isinstance(a, torch.fx.Node) else None
    return tuple(v.shape) if isinstance(v, torch.Tensor) else ()


def _rows(node: torch.fx.Node) -> int:
    """The update rows each output element of scatter ``node`` compares."""
    if node.target is aten.index_put.default:
        shapes = [_meta_shape(i) for i in node.args[1] if i is not None]
        return math.prod(torch.broadcast_shapes(*shapes)) if shapes else 1
    if node.target is aten.index_add.default:
        return math.prod(_meta_shape(node.args[2]))
    shape = _meta_shape(node.args[2])
    return shape[node.args[1] % len(shape)] if shape else 1


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why a scatter node stays in PyTorch, or None: more than :data:`SCATTER_MAX_ROWS`
    update rows, an ``index_put`` by a bool mask (its rows depend on the data), a reduction
    other than those of :data:`_REDUCE` (and ``scatter_reduce``'s mean)."""
    rows = _rows(node)
    if rows > SCATTER_MAX_ROWS:
        return f"a scatter of more than {SCATTER_MAX_ROWS} update rows (each element compares all)"
    if node.target is aten.index_put.default:
        masks = [
            i for i in node.args[1] if isinstance(i, torch.fx.Node)
            and getattr(i.meta.get("val"), "dtype", None) == torch.bool
        ]  # fmt: skip
        return "index_put with a bool mask (its rows depend on the data)" if masks else None
    reduce = node.kwargs.get("reduce")
    if node.target is aten.scatter_reduce.two:
        reduce = node.args[4]
        return None if reduce in (*_REDUCE, "mean") else f"scatter_reduce '{reduce}'"
    if reduce is not None and reduce not in _REDUCE:
        return f"scatter reduce '{reduce}'"
    return None
