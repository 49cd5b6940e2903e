"""ONNX index-valued operators: OneHot, EyeLike, GatherND, GatherElements, ScatterND and
ScatterElements.

Run-time indices are tensors of their ONNX integer dtype (int32/int64). Constant GatherND
indices that follow an affine pattern become affine subscripts (isl sees the access);
any other indices are read at run time (``te.data_index``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    host_value,
    iota64,
    optional_input,
    register_op,
    reshape_to,
    storage_dtype,
    str_attr,
)
from polyfuse.ops.scatter import scatter_rows


def _operand(ctx: Ctx, v: Value, k: int) -> Expr:
    """Element ``k`` of a small host or runtime vector (OneHot's ``values``)."""
    if isinstance(v, np.ndarray):
        return te.const(v.reshape(-1)[k].item(), storage_dtype(v.dtype))
    t = ctx.tensor(v)
    return t[(k,)] if t.ndim == 1 else t[tuple(np.unravel_index(k, t.shape))]


@register_op("OneHot")
def _one_hot(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``out[.., d, ..] = on if wrap(indices[..]) == d else off``; ``wrap`` adds ``depth`` to
    negative indices; values outside ``[-depth, depth)`` (or not integral) match no position."""
    idx = ctx.tensor(ins[0])
    depth = host_value(ctx, node, ins[1], "depth").reshape(-1)
    if depth.size != 1 or not math.isfinite(float(depth[0])) or int(depth[0]) < 1:
        raise ExpressionError(f"OneHot: depth {depth.tolist()} must be one positive integer")
    n = int(depth[0])
    vals = ins[2]
    if math.prod(vals.shape) != 2:
        raise ExpressionError(f"OneHot: values has shape {tuple(vals.shape)}; [off, on] expected")
    off, on = _operand(ctx, vals, 0), _operand(ctx, vals, 1)
    r = idx.ndim
    ax = int(at.get("axis", -1))
    if not -(r + 1) <= ax <= r:
        raise ExpressionError(f"OneHot: axis {ax} out of range for indices of rank {r}")
    ax = ax + r + 1 if ax < 0 else ax
    shape = (*idx.shape[:ax], n, *idx.shape[ax:])

    def body(*i: IterVar) -> Expr:
        v = idx[(*i[:ax], *i[ax + 1 :])]
        v = te.where(v < 0, v + n, v)
        return te.where(te.equal(v, iota64(i[ax])), on, off)

    return [ctx.compute(shape, body, "onehot")]


def _index_dtype(ind: np.ndarray) -> type:
    """int32 for in-range constant indices (they address a dimension), else int64."""
    ok = ind.size == 0 or (ind.min() >= -(2**31) and ind.max() < 2**31)
    return np.int32 if ok else np.int64


def _affine_fit(v: np.ndarray) -> tuple[int, list[int]] | None:
    """``(c0, [c_t])`` with ``v[p] == c0 + sum_t c_t * p_t`` at every point, or None."""
    c0 = int(v.reshape(-1)[0]) if v.size else 0
    coef = []
    for t, n in enumerate(v.shape):
        if n == 1:
            coef.append(0)
            continue
        at = [0] * v.ndim
        at[t] = 1
        coef.append(int(v[tuple(at)]) - c0)
    grid = np.indices(v.shape) if v.ndim else np.zeros((0,), np.int64)
    fit = c0 + sum((c * g for c, g in zip(coef, grid, strict=True)), np.zeros(v.shape, np.int64))
    return (c0, coef) if np.array_equal(fit, v) else None


@register_op("GatherND")
def _gather_nd(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``out[b.., q.., s..] = data[b.., idx[b.., q.., 0], .., idx[b.., q.., m-1], s..]``."""
    data = ctx.tensor(ins[0])
    idx = ins[1]
    b = int(at.get("batch_dims", 0))
    r, q = data.ndim, len(idx.shape)
    m = int(idx.shape[-1]) if q else 0
    if q < 1 or not 0 <= b < min(q, r) or not 1 <= m <= r - b:
        raise ExpressionError(
            f"GatherND: indices of shape {tuple(idx.shape)} with batch_dims={b} do not index data "
            f"of shape {data.shape} (need 1 <= indices.shape[-1] <= {r - b})"
        )
    if tuple(idx.shape[:b]) != data.shape[:b]:
        raise ExpressionError(
            f"GatherND: batch dims {tuple(idx.shape[:b])} of indices differ from "
            f"data's {data.shape[:b]}"
        )
    lead = tuple(idx.shape[:-1])  # the batch dims, then the index-tuple positions
    rest = data.shape[b + m :]
    sizes = data.shape[b : b + m]
    subs: list[Any] = []  # per component: (c0, coefs) affine, else None (read at run time)
    if isinstance(idx, np.ndarray):
        ind = np.asarray(idx).astype(np.int64)
        ind = np.where(ind < 0, ind + np.asarray(sizes, np.int64), ind)
        bad = (ind < 0) | (ind >= np.asarray(sizes, np.int64))
        if bad.any():
            pos = tuple(int(p) for p in np.argwhere(bad)[0])
            raise ExpressionError(
                f"GatherND: index {int(np.asarray(idx)[pos])} at indices{list(pos)} is out of "
                f"bounds for data dimension {b + pos[-1]} of size {sizes[pos[-1]]}"
            )
        subs = [_affine_fit(ind[..., j]) for j in range(m)]
        itensor = None if all(subs) else ctx.tensor(ind.astype(_index_dtype(ind)))
    else:
        subs = [None] * m
        itensor = idx

    def body(*i: IterVar) -> Expr:
        pos, tail = i[: len(lead)], i[len(lead) :]
        comps: list[Expr] = []
        for j, fit in enumerate(subs):
            if fit is not None:
                c0, coef = fit
                e: Expr | None = None
                for c, p in zip(coef, pos, strict=True):
                    if c:
                        t = p if c == 1 else p * c
                        e = t if e is None else e + t
                comps.append(as_expr(c0) if e is None else (e + c0 if c0 else e))
                continue
            assert isinstance(itensor, Tensor)
            v = itensor[(*pos, as_expr(j))]
            comps.append(te.data_index(te.where(v < 0, v + sizes[j], v)))
        return data[(*pos[:b], *comps, *tail)]

    return [ctx.compute((*lead, *rest), body, "gathernd")]


def _index_tensor(ctx: Ctx, idx: Value) -> Tensor:
    """Indices as a tensor read at run time (constant ones of int32 where they fit)."""
    if isinstance(idx, np.ndarray):
        ind = np.asarray(idx).astype(np.int64)
        return ctx.tensor(ind.astype(_index_dtype(ind)))
    return idx


def _fits_outside(idx_shape: Sequence[int], shape: Sequence[int], ax: int) -> bool:
    """Indices of ``idx_shape`` address a tensor of ``shape`` element by element: the same
    rank, no larger on the axes but ``ax`` (GatherElements, ScatterElements)."""
    return len(idx_shape) == len(shape) and all(
        q <= d for a, (q, d) in enumerate(zip(idx_shape, shape, strict=True)) if a != ax
    )


@register_op("GatherElements")
def _gather_elements(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """``out[i..] = data[i..]`` with coordinate ``axis`` replaced by ``indices[i..]``
    (``torch.gather``): the output has the indices' shape, each index read at run time
    (negative ones count from the end)."""
    data = ctx.tensor(ins[0])
    idx = ins[1]
    ax = int(at.get("axis", 0)) % data.ndim
    if not _fits_outside(idx.shape, data.shape, ax):
        raise ExpressionError(
            f"GatherElements: indices of shape {tuple(idx.shape)} do not fit data of shape "
            f"{data.shape} outside axis {ax}"
        )
    idx = _index_tensor(ctx, idx)
    n = data.shape[ax]

    def body(*i: IterVar) -> Expr:
        v = idx[i]
        return data[(*i[:ax], te.data_index(te.where(v < 0, v + n, v)), *i[ax + 1 :])]

    return [ctx.compute(tuple(idx.shape), body, "gather_elements")]


@register_op("EyeLike")
def _eye_like(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Ones on diagonal ``k`` of a matrix of the input's shape: a constant (it depends on the
    shape alone), in ``dtype`` or the input's."""
    shape = tuple(int(d) for d in np.shape(ins[0]))
    if len(shape) != 2:
        raise ExpressionError(f"EyeLike: input of shape {shape} is not 2-D")
    code = at.get("dtype")
    if code is not None:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(int(code))
    elif isinstance(ins[0], np.ndarray):
        dtype = ins[0].dtype
    else:
        dtype = numpy_dtype(ins[0].dtype)
    return [np.eye(*shape, k=int(at.get("k", 0)), dtype=dtype)]


def _reduction(node: onnx.NodeProto, at: dict[str, Any]) -> str | None:
    """The node's ``reduction`` as :func:`polyfuse.ops.scatter_rows` takes it."""
    how = str_attr(at, "reduction", "none")
    if how not in ("none", "add", "mul", "max", "min"):
        raise UnsupportedOpError(
            f"{node.op_type} '{node.name or node.output[0]}': reduction '{how}' is not "
            "supported (none, add, mul, max and min are)"
        )
    return None if how == "none" else how


@register_op("ScatterND")
def _scatter_nd(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``out = data`` with each row ``updates[j]`` written at ``data[indices[j]]`` (a KV
    cache's update): per output element, the last ``j`` whose index tuple (negative entries
    from the end) names it (a reduction over the update rows), its update read at run time;
    with ``reduction`` add/mul/max/min, the matching updates combined with the old value.
    ``|data| * rows`` comparisons: cheap for the few rows of a cache update."""
    data = ctx.tensor(ins[0])
    idx, upd = ins[1], ins[2]
    k = int(idx.shape[-1])
    rows = math.prod(idx.shape[:-1])
    rest = data.shape[k:]
    if not 1 <= k <= data.ndim or tuple(upd.shape) != (*idx.shape[:-1], *rest):
        raise ExpressionError(
            f"ScatterND: indices {tuple(idx.shape)} and updates {tuple(upd.shape)} do not fit "
            f"data {data.shape}"
        )
    idx = _index_tensor(ctx, idx)
    ind2 = reshape_to(ctx, idx, (rows, k))
    upd2 = ctx.tensor(reshape_to(ctx, upd, (rows, *rest)))

    def hits(p: Sequence[Expr], j: Expr) -> Expr:
        match: Expr | None = None
        for c in range(k):
            v = ind2[(j, as_expr(c))]
            eq = te.equal(te.where(v < 0, v + data.shape[c], v), iota64(p[c]))
            match = eq if match is None else match & eq
        assert match is not None
        return match

    def update(p: Sequence[Expr], j: Expr) -> Expr:
        return upd2[(j, *p[k:])]

    name = ctx.fresh("scatternd")
    return [scatter_rows(data, rows, hits, update, _reduction(node, at), name)]


@register_op("ScatterElements", "Scatter")
def _scatter_elements(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """``out = data`` with ``out[q with q[axis] = indices[q]] = updates[q]`` for each ``q``
    of ``indices`` (``torch.scatter``; negative indices from the end): per output element,
    the last ``q`` along ``axis`` that names it, where the element lies inside the indices'
    extent on the other axes; with ``reduction`` add/mul/max/min, the matching updates combined
    with the old value."""
    data = ctx.tensor(ins[0])
    idx, upd = ins[1], ins[2]
    ax = int(at.get("axis", 0)) % data.ndim
    if tuple(upd.shape) != tuple(idx.shape) or not _fits_outside(idx.shape, data.shape, ax):
        raise ExpressionError(
            f"ScatterElements: indices {tuple(idx.shape)} and updates {tuple(upd.shape)} do "
            f"not fit data {data.shape} along axis {ax}"
        )
    idx, upd = _index_tensor(ctx, idx), ctx.tensor(upd)
    return [ops.scatter(data, ax, idx, upd, _reduction(node, at), ctx.fresh("scatter"))]


@register_op("ReverseSequence")
def _reverse_sequence(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """The first ``sequence_lens[b]`` steps of batch ``b`` reversed along ``time_axis`` (the
    lengths read at run time; the rest of each sequence stays where it is)."""
    x, lens = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    bax, tax = int(at.get("batch_axis", 1)), int(at.get("time_axis", 0))
    if {bax, tax} != {0, 1} or lens.shape != (x.shape[bax],):
        raise ExpressionError(
            f"ReverseSequence: batch_axis {bax} and time_axis {tax} must be 0 and 1, and "
            f"sequence_lens {lens.shape} one per batch of {x.shape}"
        )

    def body(*i: IterVar) -> Expr:
        n = te.cast(lens[(i[bax],)], "int64")
        t = te.cast(i[tax], "int64")
        src = te.where(t < n, n - 1 - t, t)
        sub = list(i)
        sub[tax] = te.data_index(src)
        return x[tuple(sub)]

    return [ctx.compute(x.shape, body, "reverse_sequence")]


@register_op("TensorScatter")
def _tensor_scatter(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """A cache update: ``update`` written into ``past_cache`` along ``axis`` from
    ``write_indices[b]`` on (per batch, read at run time; ``mode="circular"`` wraps around
    the cache). As a gather: each cache slot reads the update step that lands on it, if any."""
    past, upd = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    w = ctx.tensor(ins[2]) if optional_input(ins, 2) is not None else None
    ax = int(at.get("axis", -2)) % past.ndim
    mode = str_attr(at, "mode", "linear")
    size, steps = past.shape[ax], upd.shape[ax]
    fits = all(
        (p == u) if d != ax else (u <= p)
        for d, (p, u) in enumerate(zip(past.shape, upd.shape, strict=True))
    )
    if ax == 0 or mode not in ("linear", "circular") or upd.ndim != past.ndim or not fits:
        raise ExpressionError(
            f"TensorScatter: update {upd.shape} does not fit cache {past.shape} along axis "
            f"{ax} (mode {mode!r}; axis 0 is the batch)"
        )

    def body(*i: IterVar) -> Expr:
        start = te.cast(w[(i[0],)], "int64") if w is not None else te.const(0, "int64")
        s = te.cast(i[ax], "int64") - start
        if mode == "circular":
            s = (s % size + size) % size
        hit = (s >= 0) & (s < steps)
        sub = list(i)
        sub[ax] = te.data_index(te.minimum(te.maximum(s, 0), steps - 1))
        return te.where(hit, upd[tuple(sub)], past[i])

    return [ctx.compute(past.shape, body, "tensor_scatter")]
