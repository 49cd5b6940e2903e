"""ONNX index-valued operators: OneHot, EyeLike, GatherND and GatherElements.

Run-time indices are tensors of their ONNX integer dtype (int32/int64). Constant GatherND
indices that follow an affine pattern become affine subscripts (isl sees the access);
any other indices are read at run time (``te.data_index``).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import Ctx, Value, host_value, iota64, register_op, storage_dtype


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
    if len(idx.shape) != data.ndim or any(
        q > d for a, (q, d) in enumerate(zip(idx.shape, data.shape, strict=True)) if a != ax
    ):
        raise ExpressionError(
            f"GatherElements: indices of shape {tuple(idx.shape)} do not fit data of shape "
            f"{data.shape} outside axis {ax}"
        )
    if isinstance(idx, np.ndarray):
        ind = np.asarray(idx).astype(np.int64)
        idx = ctx.tensor(ind.astype(_index_dtype(ind)))
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
