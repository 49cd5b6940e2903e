"""Reductions and gathers of any stored dtype, with torch's result dtypes.

``sum`` counts integers and bools in int64 (torch's rule) unless ``dtype=`` says otherwise;
``amax``/``amin`` keep the dtype; ``any``/``all`` are the max/min of the input tested
``!= 0``; ``cumsum`` sums each prefix (integers and bools in int64, as ``sum``);
``argmax``/``argmin`` give the int64 index of the first extreme (a NaN wins, as in
torch); ``index``/``index_select``/``embedding`` gather by int32/int64 index tensors
(negative indices count from the end).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from polyfuse import te
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Tensor
from polyfuse.graph.inline import stored
from polyfuse.ops._common import bcast, op_name
from polyfuse.ops.reductions import reduce_subscripts

from .typed import as_dtype, elementwise, te_dtype

__all__ = ["any_all", "arg_extreme", "cumsum", "index", "index_select", "reduce", "sum_"]


def _axes(x: Tensor, dims: Any) -> list[int]:
    """The dims a reduction of ``x`` reduces (a 0-d tensor's dim 0 or -1 is none: torch
    reduces a scalar to itself)."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) or not x.shape:
        return list(range(len(x.shape)))
    dims = [dims] if isinstance(dims, int) else list(dims)
    return sorted({d % len(x.shape) for d in dims})


def reduce(op: str, x: Tensor, dims: Any, keepdim: bool, dtype: str) -> Tensor:
    """``te.sum/max/min`` of ``x`` converted to ``dtype`` over ``dims`` (all for None)."""
    axes = _axes(x, dims)
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keepdim or d not in axes)
    name = op_name(f"reduce_{op}", None)
    if not axes:
        return elementwise(f"reduce_{op}", lambda v: v, [x], dtype)
    ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}
    reducer = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}[op]

    def body(*idx: Any) -> Any:
        v = x[reduce_subscripts(len(x.shape), ks, keepdim, idx)]
        if x.dtype != dtype:
            v = te.cast(v if dt.is_float(dtype) else stored(v, x.dtype), dtype)
        return reducer(v, axis=list(ks.values()))

    return te.compute(shape, body, name=name, tag=f"reduce_{op}")


def sum_(
    x: Tensor, dims: Any = None, keepdim: bool = False, *, dtype: Any = None, op: str = "sum"
) -> Tensor:
    """``aten.sum`` (``op`` prod: ``aten.prod``): integers and bools count in int64 (torch's
    rule) unless ``dtype`` says."""
    if dtype is not None:
        d = te_dtype(dtype)
    else:
        d = x.dtype if dt.is_float(x.dtype) else "int64"
    return reduce(op, x, dims, bool(keepdim), d)



def cumsum(x: Tensor, dim: int, *, dtype: Any = None, op: str = "sum") -> Tensor:
    """``aten.cumsum`` (``op`` prod: ``aten.cumprod``): element j along ``dim`` is the sum
    (product) of elements 0..j, one reduction over the row under ``k <= j`` (n * n
    operations per row; a 16-bit float accumulates in float32 as every te reduction).
    Integers and bools count in int64 unless ``dtype`` says."""
    d = te_dtype(dtype) if dtype is not None else (x.dtype if dt.is_float(x.dtype) else "int64")
    if not x.shape:  # a scalar's prefix is itself
        return elementwise(f"cum{op}", lambda v: v, [x], d)
    ax = dim % len(x.shape)
    k = te.reduce_axis(x.shape[ax], name="kc")

    def body(*i: Any) -> Any:
        v = x[(*i[:ax], k, *i[ax + 1 :])]
        if x.dtype != d:
            v = te.cast(v if dt.is_float(d) else stored(v, x.dtype), d)
        if op == "prod":
            return te.prod(te.where(k <= i[ax], v, 1), axis=k)
        return te.sum(te.where(k <= i[ax], v, 0), axis=k)

    return te.compute(x.shape, body, name=op_name(f"cum{op}", None), tag=f"cum{op}")

def any_all(op: str) -> Callable[..., Tensor]:
    """``aten.any``/``aten.all``: the max/min of the input tested ``!= 0``; of a uint8 input
    a uint8 0 or 1, as torch gives (its stand-in for bool before bool existed)."""

    def lower(x: Tensor, dims: Any = None, keepdim: bool = False) -> Tensor:
        found = reduce(op, x, dims, bool(keepdim), "bool")
        if x.dtype != "uint8":
            return found
        return elementwise(f"reduce_{op}", lambda v: te.cast(v, "uint8"), [found], "uint8")

    return lower


def arg_extreme(op: str) -> Callable[..., Tensor]:
    """``aten.argmax``/``argmin``: the int64 index of the first maximum (minimum) along
    ``dim`` (in the flattened tensor for None). Reductions: the extreme value, the first
    index holding it and, for floats, the first NaN's index — torch's answer where a NaN is
    present."""

    def lower(x: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
        if not x.shape:  # a scalar's only index
            return te.compute((), lambda: te.const(0, "int64"), name=op_name(f"arg{op}", None))
        axes = _axes(x, dim)
        keepdim = bool(keepdim)
        ext = reduce(op, x, axes, True, x.dtype)  # unit dims where reduced
        n = math.prod(x.shape[d] for d in axes)
        shape = tuple(
            1 if d in axes else s for d, s in enumerate(x.shape) if keepdim or d not in axes
        )

        def at_ext(idx: tuple[Any, ...]) -> tuple[Any, ...]:
            """Subscripts of ``ext`` from the result's loop variables."""
            it = iter(idx)
            out = []
            for d in range(len(x.shape)):
                if d in axes:
                    out.append(0)
                    if keepdim:
                        next(it)
                else:
                    out.append(next(it))
            return tuple(out)

        def first(test: Callable[[Any, tuple[Any, ...]], Any], name: str) -> Tensor:
            ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}

            def body(*idx: Any) -> Any:
                v = stored(x[reduce_subscripts(len(x.shape), ks, keepdim, idx)], x.dtype)
                pos: Any = 0
                for d in axes:
                    pos = pos * x.shape[d] + ks[d]
                return te.min(te.where(test(v, idx), pos, n), axis=list(ks.values()))

            return te.compute(shape, body, name=op_name(name, None), tag=f"arg{op}")

        hit = first(lambda v, idx: te.equal(v, ext[at_ext(idx)]), f"arg{op}")
        if not dt.is_float(x.dtype):
            return as_dtype(hit, "int64")
        nan = first(lambda v, idx: te.isnan(v), f"arg{op}_nan")
        return te.compute(
            shape,
            lambda *i: te.cast(te.where(nan[i] < n, nan[i], hit[i]), "int64"),
            name=op_name(f"arg{op}", None),
            tag=f"arg{op}",
        )

    return lower


def index(x: Tensor, indices: Sequence[Tensor | None]) -> Tensor:
    """``aten.index.Tensor``: advanced indexing by int32/int64 index tensors on any dims
    (``None`` keeps a dim whole), a gather; negative indices count from the end. The index
    tensors broadcast together; their shape replaces the indexed dims where those are
    adjacent, and leads the result otherwise (numpy's and torch's rule)."""
    ndim = len(x.shape)
    indices = [*indices, *[None] * (ndim - len(indices))]
    pos = [d for d, t in enumerate(indices) if t is not None]
    tensors = [t for t in indices if t is not None]
    rank = max(len(t.shape) for t in tensors)
    full = [1] * rank
    for t in tensors:  # the lowering's node passed torch, so the shapes broadcast
        for d, s in enumerate(t.shape):
            full[rank - len(t.shape) + d] = max(full[rank - len(t.shape) + d], s)
    kept = [d for d in range(ndim) if indices[d] is None]
    adjacent = pos == list(range(pos[0], pos[-1] + 1))
    at = pos[0] if adjacent else 0  # where the broadcast index dims sit in the result
    rest = [x.shape[d] for d in kept]
    shape = (*rest[:at], *full, *rest[at:]) if adjacent else (*full, *rest)

    def body(*idx: Any) -> Any:
        b = idx[at : at + rank]
        others = iter(idx[:at] + idx[at + rank :])
        subs: list[Any] = []
        for d, t in enumerate(indices):
            if t is None:
                subs.append(next(others))
                continue
            i = t[bcast(t.shape, b)]
            subs.append(te.data_index(te.where(i < 0, i + x.shape[d], i)))
        return x[tuple(subs)]

    return te.compute(shape, body, name=op_name("index", None), tag="gather")


def index_select(x: Tensor, dim: int, ids: Tensor) -> Tensor:
    """``aten.index_select``: the rows of dim ``dim`` that the 1-D ``ids`` name."""
    return index(x, [None] * (dim % len(x.shape)) + [ids])

