"""ONNX reductions, softmax, normalisations, ArgMax/ArgMin, Hardmax, CumSum and TopK."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from polyfuse import ops, te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    host_value,
    ints_of,
    iota64,
    is_int_value,
    map_elementwise,
    norm_axes,
    reduce_op,
    register_op,
    reshape_to,
)
from polyfuse.onnx.intmath import int_div
from polyfuse.ops._common import narrow, wide


def _reduce_axes(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], ndim: int
) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        axes = ints_of(host_value(ctx, node, ins[1], "axes"))
    else:
        axes = at.get("axes")
        axes = None if axes is None else list(axes)
    if not axes:
        return [] if at.get("noop_with_empty_axes", 0) else list(range(ndim))
    return norm_axes(axes, ndim)


REDUCE_OPS = (
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceProd",
)


@register_op(*REDUCE_OPS)
def _reduce_op(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    axes = _reduce_axes(ctx, node, ins, at, x.ndim)
    keep = bool(at.get("keepdims", 1))
    n = math.prod(x.shape[d] for d in axes) if axes else 1
    op = node.op_type
    if op == "ReduceSum":
        return [reduce_op(ctx, x, axes, keep, "sum")]
    if op == "ReduceMean" and is_int_value(x):  # the exact sum, divided toward zero
        return [reduce_op(ctx, x, axes, keep, "sum", post=lambda v: int_div(v, as_expr(n)))]
    if op == "ReduceMean":
        return [reduce_op(ctx, x, axes, keep, "sum", pre=lambda v: v * (1.0 / n))]
    if op == "ReduceMax":
        return [reduce_op(ctx, x, axes, keep, "max")]
    if op == "ReduceMin":
        return [reduce_op(ctx, x, axes, keep, "min")]
    if op == "ReduceProd":
        return [reduce_op(ctx, x, axes, keep, "prod")]
    if op == "ReduceSumSquare":
        return [reduce_op(ctx, x, axes, keep, "sum", pre=lambda v: v * v)]
    if op == "ReduceL1":
        return [reduce_op(ctx, x, axes, keep, "sum", pre=te.abs)]
    if op == "ReduceL2":
        return [reduce_op(ctx, x, axes, keep, "sum", pre=lambda v: v * v, post=te.sqrt)]
    if op == "ReduceLogSum":
        return [reduce_op(ctx, x, axes, keep, "sum", post=te.log)]
    # ReduceLogSumExp: max-shifted, a 16-bit input's exponentials and sum in float32
    up, down = wide(x), narrow(x)
    m = reduce_op(ctx, x, axes, True, "max")
    sh = map_elementwise(ctx, [x, m], lambda a, b: te.exp(up(a) - up(b)), "lse_exp")
    s = reduce_op(ctx, sh, axes, True, "sum")
    out = map_elementwise(ctx, [s, m], lambda a, b: down(te.log(a) + up(b)), "lse")
    if not keep:
        out = ops.reshape(out, [d for i, d in enumerate(x.shape) if i not in axes] or [1])
        if all(i in axes for i in range(x.ndim)):
            out = reduce_op(ctx, out, [0], False, "sum")
    return [out]


@register_op("Softmax", "LogSoftmax")
def _softmax(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    fn = ops.softmax if node.op_type == "Softmax" else ops.log_softmax
    if ctx.opset >= 13:
        return [fn(x, axis=int(at.get("axis", -1)), name=ctx.fresh("softmax"))]
    ax = int(at.get("axis", 1)) % x.ndim
    if ax == x.ndim - 1:
        return [fn(x, axis=-1, name=ctx.fresh("softmax"))]
    flat = ops.reshape(x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])), ctx.fresh("flat"))
    y = fn(flat, axis=-1, name=ctx.fresh("softmax"))
    return [ops.reshape(y, x.shape, ctx.fresh("unflat"))]


@register_op("BatchNormalization")
def _bn(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if at.get("training_mode", 0):
        return _bn_training(ctx, ins, at)
    x, scale, bias, mean, var = (ctx.tensor(v) for v in ins[:5])
    y = ops.batch_norm(
        x, mean, var, scale, bias, eps=float(at.get("epsilon", 1e-5)), name=ctx.fresh("bn")
    )
    return [y]


def _bn_training(ctx: Ctx, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """training_mode=1: normalize with the batch statistics (over every axis but 1); the
    running mean/var outputs are ``running * momentum + batch * (1 - momentum)``."""
    x = ctx.tensor(ins[0])
    eps, mom = float(at.get("epsilon", 1e-5)), float(at.get("momentum", 0.9))
    axes = [d for d in range(x.ndim) if d != 1]
    up, down = wide(x), narrow(x)
    mean, cen, var = _moments(ctx, x, axes, "bn_cen")
    cshape = (x.shape[1],) + (1,) * (x.ndim - 2)
    sc, bi = (reshape_to(ctx, v, cshape) for v in ins[1:3])
    y = _normalized(ctx, x, cen, var, sc, bi, eps, "bn")
    c = x.shape[1]
    running = [
        map_elementwise(
            ctx,
            [reshape_to(ctx, batch, (c,)), old],
            lambda b, r: down(up(r) * mom + b * (1 - mom)),
            hint,
        )  # fmt: skip
        for batch, old, hint in ((mean, ins[3], "bn_rm"), (var, ins[4], "bn_rv"))
    ]
    return [y, *running]


def _moments(ctx: Ctx, x: Tensor, axes: list[int], hint: str) -> tuple[Tensor, Tensor, Tensor]:
    """The mean, the centred values and the (biased) variance of ``x`` over ``axes``; of a
    16-bit ``x`` in float32, so a normalization rounds once, at its result (fuzz seed 21813:
    float16 statistics over 3 values put an InstanceNormalization 8 units off)."""
    up, n = wide(x), math.prod(x.shape[d] for d in axes)
    mean = reduce_op(ctx, x, axes, True, "sum", pre=lambda v: up(v) * (1.0 / n))
    cen = map_elementwise(ctx, [x, mean], lambda a, m: up(a) - m, hint)
    var = reduce_op(ctx, cen, axes, True, "sum", pre=lambda v: v * v * (1.0 / n))
    return mean, cen, var


def _normalized(
    ctx: Ctx, x: Tensor, cen: Tensor, var: Tensor, sc: Value, bi: Value, eps: float, hint: str
) -> Tensor:
    """``cen / sqrt(var + eps) * sc + bi`` (the :func:`_moments` of ``x``), in float32 for a
    16-bit ``x`` and rounded once to its dtype."""
    up, down = wide(x), narrow(x)

    def body(c: Expr, v: Expr, s: Expr, b: Expr) -> Expr:
        return down(c * te.rsqrt(v + eps) * up(s) + up(b))

    return map_elementwise(ctx, [cen, var, sc, bi], body, hint)


@register_op("LayerNormalization")
def _ln(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """A 16-bit input computes in float32 (:func:`polyfuse.ops.layer_norm_parts`), as the
    default ``stash_type`` 1 asks; Mean and InvStdDev are float32 then."""
    x = ctx.tensor(ins[0])
    gamma = ctx.tensor(ins[1])
    beta = ctx.tensor(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    ax = int(at.get("axis", -1))
    ax = ax + x.ndim if ax < 0 else ax
    y, mean, rstd = ops.layer_norm_parts(
        x, gamma, beta, axis=ax, eps=float(at.get("epsilon", 1e-5)), name=ctx.fresh("ln")
    )
    stat = (*x.shape[:ax], *([1] * (x.ndim - ax)))  # Mean / InvStdDev keep the normalized dims
    return [y, reshape_to(ctx, mean, stat), reshape_to(ctx, rstd, stat)]


@register_op("RMSNormalization")
def _rms(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``x * rsqrt(mean(x**2 over dims axis..) + epsilon) * scale`` (:func:`ops.rms_norm`: a
    16-bit input computes in float32 and rounds once, the default ``stash_type``)."""
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", -1))
    ax = ax + x.ndim if ax < 0 else ax
    scale = reshape_to(ctx, ctx.tensor(ins[1]), _trailing(ins[1], x.ndim - ax))
    eps = float(at.get("epsilon", 1e-5))
    return [ops.rms_norm(x, scale, eps=eps, axis=ax, name=ctx.fresh("rms"))]


def _trailing(v: Any, n: int) -> tuple[int, ...]:
    """``v``'s shape with leading 1s dropped or added to ``n`` dims (a scale that broadcasts
    against the normalized dims)."""
    shape = tuple(int(d) for d in np.shape(v))
    while len(shape) > n and shape[0] == 1:
        shape = shape[1:]
    return (1,) * (n - len(shape)) + shape


@register_op("GroupNormalization")
def _group_norm(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Each (sample, group of ``C / num_groups`` channels) normalized over its channels and
    spatial dims, then scaled and shifted per channel (opset 21; opset 18's per-group
    ``scale``/``bias`` are repeated over each group's channels)."""
    x = ctx.tensor(ins[0])
    g = int(at["num_groups"])
    n, c, *sp = x.shape
    if g < 1 or c % g:
        raise ExpressionError(f"GroupNormalization: {c} channels do not split into {g} groups")
    eps = float(at.get("epsilon", 1e-5))
    xg = reshape_to(ctx, x, (n, g, c // g, *sp))
    axes = list(range(2, xg.ndim))
    _, cen, var = _moments(ctx, xg, axes, "gn_cen")
    params = []
    for v in ins[1:3]:
        per_group = int(np.prod(np.shape(v))) == g and g != c
        shape = (1, g, 1) if per_group else (1, g, c // g)
        params.append(reshape_to(ctx, v, shape + (1,) * len(sp)))
    y = _normalized(ctx, xg, cen, var, params[0], params[1], eps, "gnorm")
    return [reshape_to(ctx, y, x.shape)]


@register_op("MeanVarianceNormalization")
def _mvn(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``(x - mean) / (sqrt(var) + 1e-9)`` over ``axes`` (default 0, 2, 3), the function
    ONNX defines it by (the variance of the centred values)."""
    x = ctx.tensor(ins[0])
    axes = sorted(a % x.ndim for a in at.get("axes", [0, 2, 3]))
    _, cen, var = _moments(ctx, x, axes, "mvn_cen")
    down = narrow(x)
    return [map_elementwise(ctx, [cen, var], lambda a, v: down(a / (te.sqrt(v) + 1e-9)), "mvn")]


@register_op("LpNormalization")
def _lp_norm(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``x / ||x||_p`` along ``axis`` (p 1: the sum of magnitudes, 2: the root of the sum
    of squares), 0 where the norm is 0 (as ONNX's reference); a 16-bit ``x`` in float32,
    rounded once."""
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", -1)) % x.ndim
    p = int(at.get("p", 2))
    if p not in (1, 2):
        raise ExpressionError(f"LpNormalization: p={p} (ONNX allows 1 and 2)")
    up, down = wide(x), narrow(x)
    total = reduce_op(ctx, x, [ax], True, "sum",
                      pre=lambda v: up(te.abs(v)) if p == 1 else up(v) * up(v))  # fmt: skip

    def body(a: Expr, t: Expr) -> Expr:
        return down(te.where(te.equal(t, 0), 0.0, up(a) / (t if p == 1 else te.sqrt(t))))

    return [map_elementwise(ctx, [x, total], body, "lpnorm")]


@register_op("Hardmax")
def _hardmax(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """1 at the first maximum along ``axis`` (a NaN counts as the maximum, as numpy's
    argmax), 0 elsewhere, in ``x``'s dtype."""
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", -1)) % x.ndim
    idx = _arg_reduce(ctx, x, ax, True, False, True, "hardmax_idx")

    def body(*i: IterVar) -> Expr:
        at_row = tuple(as_expr(0) if d == ax else v for d, v in enumerate(i))
        hit = te.equal(iota64(i[ax]), idx[at_row])
        return te.where(hit, te.const(1, x.dtype), te.const(0, x.dtype))

    return [ctx.compute(x.shape, body, "hardmax")]


@register_op("LRN")
def _lrn(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    size = int(at["size"])
    alpha, beta, bias = (
        float(at.get("alpha", 1e-4)),
        float(at.get("beta", 0.75)),
        float(at.get("bias", 1.0)),
    )
    c = x.shape[1]
    lo = (size - 1) // 2
    r = te.reduce_axis(size, name="rl")

    def sq(*i: IterVar) -> Expr:
        ch = i[1] + r - lo
        sub = (i[0], ch, *i[2:])
        v = te.where((ch >= 0) & (ch < c), x[sub], 0.0)
        return te.sum(v * v, axis=r)

    s = ctx.compute(x.shape, sq, "lrn_sq")
    return [
        map_elementwise(ctx, [x, s], lambda a, q: a / (bias + (alpha / size) * q) ** beta, "lrn"),
    ]


@register_op("InstanceNormalization")
def _instnorm(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    eps = float(at.get("epsilon", 1e-5))
    _, cen, var = _moments(ctx, x, list(range(2, x.ndim)), "in_cen")
    cshape = (x.shape[1],) + (1,) * (x.ndim - 2)
    sc = np.asarray(ins[1]).reshape(cshape) if isinstance(ins[1], np.ndarray) else ins[1]
    bi = np.asarray(ins[2]).reshape(cshape) if isinstance(ins[2], np.ndarray) else ins[2]
    if isinstance(sc, Tensor):
        sc = ops.reshape(sc, cshape, ctx.fresh("sc"))
    if isinstance(bi, Tensor):
        bi = ops.reshape(bi, cshape, ctx.fresh("bi"))
    return [_normalized(ctx, x, cen, var, sc, bi, eps, "inorm")]


def _arg_reduce(
    ctx: Ctx, x: Tensor, ax: int, largest: bool, last: bool, keep: bool, hint: str
) -> Tensor:
    """Index of the max (min) along ``ax``: the extreme value, then the first (last) position
    holding it; NaN counts as the extreme (as numpy's argmax)."""
    n = x.shape[ax]
    ext = reduce_op(ctx, x, [ax], True, "max" if largest else "min")
    shape = tuple(1 if d == ax else s for d, s in enumerate(x.shape) if keep or d != ax)
    k = te.reduce_axis(n, name="ka")

    def body(*i: IterVar) -> Expr:
        full = list(i) if keep else [*i[:ax], as_expr(0), *i[ax:]]
        at_k = list(full)
        at_k[ax] = k
        v, m = x[tuple(at_k)], ext[tuple(as_expr(0) if d == ax else e for d, e in enumerate(full))]
        hit = te.equal(v, m) | (te.not_equal(v, v) & te.not_equal(m, m))
        if last:  # int64 positions: ONNX's index dtype
            return te.max(te.where(hit, iota64(k), te.const(-1, "int64")), axis=k)
        return te.min(te.where(hit, iota64(k), te.const(n, "int64")), axis=k)

    return ctx.compute(shape, body, hint)


@register_op("ArgMax", "ArgMin")
def _argmax(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", 0))
    ax = ax + x.ndim if ax < 0 else ax
    return [
        _arg_reduce(
            ctx,
            x,
            ax,
            node.op_type == "ArgMax",
            bool(at.get("select_last_index", 0)),
            bool(at.get("keepdims", 1)),
            node.op_type.lower(),
        )
    ]


@register_op("CumSum", "CumProd")
def _cumsum(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Running sums (products) along an axis: one reduction per element over the positions
    before it (``exclusive``: strictly), from the end with ``reverse``."""
    x = ctx.tensor(ins[0])
    prod = node.op_type == "CumProd"
    ax = int(host_value(ctx, node, ins[1], "axis").reshape(-1)[0])
    ax = ax + x.ndim if ax < 0 else ax
    excl, rev = bool(at.get("exclusive", 0)), bool(at.get("reverse", 0))
    k = te.reduce_axis(x.shape[ax], name="kc")

    def body(*i: IterVar) -> Expr:
        j = i[ax]
        inside = (k > j if excl else k >= j) if rev else (k < j if excl else k <= j)
        v = x[(*i[:ax], k, *i[ax + 1 :])]
        if prod:
            return te.prod(te.where(inside, v, 1), axis=k)
        return te.sum(te.where(inside, v, 0), axis=k)

    return [ctx.compute(x.shape, body, "cumsum")]


@register_op("TopK")
def _topk(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The ``k`` first elements along the axis and their indices (:func:`polyfuse.ops.topk`:
    ties by index, NaN the largest, as ONNX's reference)."""
    x = ctx.tensor(ins[0])
    kk = int(host_value(ctx, node, ins[1], "K").reshape(-1)[0])
    largest = bool(at.get("largest", 1))
    values, idx = ops.topk(x, kk, int(at.get("axis", -1)), largest, name=ctx.fresh("topk"))
    return [values, idx]
