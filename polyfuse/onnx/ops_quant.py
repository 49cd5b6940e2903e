"""ONNX quantization: ``QuantizeLinear``, ``DequantizeLinear``, ``DynamicQuantizeLinear``,
``MatMulInteger``, ``QLinearMatMul``, ``ConvInteger`` and ``QLinearConv``.

Scales and zero points are per tensor (one value), per axis (one per index of ``axis``) or
blocked (``block_size`` consecutive indices of ``axis`` share one); :func:`_per_element` reads
the one that applies to each element, so nothing is replicated in memory.

- ``DequantizeLinear``: ``(x - zero_point) * scale`` computed in float32, rounded to the
  scale's dtype (or ``output_dtype``).
- ``QuantizeLinear`` to an integer type (8, 16, 4 and 2 bits, signed or not):
  ``clip(rint(x / scale) + zero_point)`` to the type's range, halves to even, the division in
  ``precision`` or the scale's type (a float16 quotient rounded to float16 before ``rint``),
  as the specification says; the result is held as :func:`~polyfuse.onnx.common.storage_dtype` holds
  that type. To float8 (``saturate`` as given) and float4: ``x / scale`` onto their grid
  (:mod:`~polyfuse.onnx.narrow_types`), held in float32.
- The integer products (``MatMulInteger``, ``ConvInteger`` and the two ``QLinear`` forms)
  subtract the zero points and sum exactly in int32 (the byte matmuls as the product of the
  raw bytes on tensor cores less the zero points times row and column sums:
  :func:`_integer_matmul`); ``QLinear*`` then requantize with
  ``a_scale * b_scale / y_scale`` (in float64: the reference multiplies an int32 array by it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import Ctx, Value, optional_input, register_op, storage_dtype
from polyfuse.onnx.narrow_types import FLOAT_FORMATS, round_to_float
from polyfuse.onnx.ops_nn import ConvGeometry, conv_geometry, conv_node
from polyfuse.ops._common import all_of, bcast

#: the integer types a quantization produces, with their ranges
_RANGES = {
    "uint8": (0, 255),
    "int8": (-128, 127),
    "uint16": (0, 65535),
    "int16": (-32768, 32767),
    "uint4": (0, 15),
    "int4": (-8, 7),
    "uint2": (0, 3),
    "int2": (-2, 1),
}

Reader = Callable[[tuple[Expr, ...]], Expr]


def _per_element(
    ctx: Ctx, p: Value | None, shape: tuple[int, ...], axis: int, block: int, what: str
) -> Reader | None:
    """A reader of scale or zero point ``p`` for the element at ``idx`` of a tensor of
    ``shape``: per tensor, per ``axis`` or per block of ``block`` indices along it."""
    if p is None:
        return None
    t = ctx.tensor(p)
    ax = axis % len(shape) if shape else 0
    if t.ndim == 0 or math.prod(t.shape) == 1:
        zero = (as_expr(0),) * t.ndim
        return lambda idx: t[zero]
    if block:
        want = tuple(-(-s // block) if d == ax else s for d, s in enumerate(shape))
        if t.shape != want:
            raise ExpressionError(f"{what} {t.shape} does not block {shape} by {block} on {ax}")
        return lambda idx: t[tuple(i // block if d == ax else i for d, i in enumerate(idx))]
    if t.shape != (shape[ax],):
        raise ExpressionError(
            f"{what} {t.shape} is neither one value nor one per index of axis {ax}"
        )
    return lambda idx: t[(idx[ax],)]


def _attr_dtype(at: dict[str, Any], name: str) -> str | None:
    code = int(at.get(name, 0))
    return np.dtype(helper.tensor_dtype_to_np_dtype(code)).name if code else None


@register_op("DequantizeLinear")
def _dequantize(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    zp_in = optional_input(ins, 2)
    axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0))
    scale = _per_element(ctx, ins[1], x.shape, axis, block, "x_scale")
    zp = _per_element(ctx, zp_in, x.shape, axis, block, "x_zero_point")
    out = storage_dtype(_attr_dtype(at, "output_dtype") or ctx.onnx_dtype(node.input[1], ins[1]))

    def body(*i: IterVar) -> Expr:
        v = te.cast(x[i], "float32")
        if zp is not None:
            v = v - te.cast(zp(i), "float32")
        return te.cast(v * te.cast(scale(i), "float32"), out)  # type: ignore[misc]

    return [ctx.compute(x.shape, body, "dequantize")]


def _requantized(v: Expr, zp: Expr | None, to: str) -> Expr:
    """``clip(rint(v) + zp)`` to the range of integer type ``to``, in its storage dtype."""
    lo, hi = _RANGES[to]
    q = te.round(v)
    if zp is not None:
        q = q + te.cast(zp, q.dtype)
    q = te.minimum(te.maximum(q, float(lo)), float(hi))
    return te.cast(q, storage_dtype(to))


def _quant_type(ctx: Ctx, node: onnx.NodeProto, k: int, at: dict[str, Any], default: str) -> str:
    """The integer type quantized values take: zero point ``k``'s, else ``output_dtype``."""
    has_zp = len(node.input) > k and node.input[k]
    to = _attr_dtype(at, "output_dtype") or default
    if has_zp:
        to = ctx.onnx_dtype(node.input[k], ctx.values[node.input[k]])
    if to not in _RANGES and to not in FLOAT_FORMATS:
        raise UnsupportedOpError(
            f"{node.op_type} to {to} is not supported (to 8-, 16-, 4- and 2-bit integers, "
            "float8 and float4 is)"
        )
    if to in FLOAT_FORMATS and node.op_type != "QuantizeLinear":
        raise UnsupportedOpError(f"{node.op_type} to {to} (integer outputs only)")
    return to


@register_op("QuantizeLinear")
def _quantize(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    zp_in = optional_input(ins, 2)
    to = _quant_type(ctx, node, 2, at, "uint8")
    axis, block = int(at.get("axis", 1)), int(at.get("block_size", 0))
    scale = _per_element(ctx, ins[1], x.shape, axis, block, "y_scale")
    zp = _per_element(ctx, zp_in, x.shape, axis, block, "y_zero_point")
    # the division's precision: the attribute's, else the scale's type (the specification);
    # a 16-bit quotient is the float32 one rounded to it
    prec = storage_dtype(_attr_dtype(at, "precision") or ctx.onnx_dtype(node.input[1], ins[1]))
    work = "float64" if prec == "float64" else "float32"

    sat = bool(int(at.get("saturate", 1)))

    def body(*i: IterVar) -> Expr:
        v = te.cast(x[i], work) / te.cast(scale(i), work)  # type: ignore[misc]
        if prec in dtypes.HALF_DTYPES:
            v = te.cast(te.cast(v, prec), work)
        if to in FLOAT_FORMATS:  # a float8 zero point is 0; float4's is added
            return round_to_float(v + zp(i) if zp is not None else v, to, sat)
        return _requantized(v, zp(i) if zp is not None else None, to)

    return [ctx.compute(x.shape, body, "quantize")]


@register_op("DynamicQuantizeLinear")
def _dynamic_quantize(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """uint8 quantization of ``x`` over its range widened to hold 0: ``scale = (max - min) /
    255``, ``zero_point = clip(rint(-min / scale))``."""
    x = ctx.tensor(ins[0])
    if x.dtype != "float32":
        raise UnsupportedOpError(f"DynamicQuantizeLinear of {x.dtype} (float32 only)")
    axes = [te.reduce_axis(s, name=f"r{d}") for d, s in enumerate(x.shape)]
    lo = ctx.compute((), lambda: te.min(x[tuple(axes)], axis=axes), "dq_min")
    axes2 = [te.reduce_axis(s, name=f"r{d}") for d, s in enumerate(x.shape)]
    hi = ctx.compute((), lambda: te.max(x[tuple(axes2)], axis=axes2), "dq_max")
    scale = ctx.compute(
        (), lambda: (te.maximum(hi[()], 0.0) - te.minimum(lo[()], 0.0)) / 255.0, "dq_scale"
    )
    zp = ctx.compute(
        (), lambda: _requantized(-te.minimum(lo[()], 0.0) / scale[()], None, "uint8"), "dq_zp"
    )
    y = ctx.compute(x.shape, lambda *i: _requantized(x[i] / scale[()], zp[()], "uint8"), "dq")
    return [y, scale, zp]


def _shifted(ctx: Ctx, v: Value, zp: Value | None, axis: int | None, what: str) -> Tensor:
    """``v - zero_point`` in int32 (the zero point one value, or one per index of ``axis``)."""
    t = ctx.tensor(v)
    if not dtypes.is_int(t.dtype):
        raise UnsupportedOpError(f"{what} of {t.dtype} (integers only)")
    if zp is None:
        return (
            t
            if t.dtype == "int32"
            else ctx.compute(t.shape, lambda *i: te.cast(t[i], "int32"), what)
        )
    z = _per_element(ctx, zp, t.shape, axis if axis is not None else 0, 0, f"{what} zero point")
    assert z is not None
    return ctx.compute(t.shape, lambda *i: te.cast(t[i], "int32") - te.cast(z(i), "int32"), what)


def _is_zero(zp: Value | None) -> bool:
    """An omitted zero point, or a host constant of zeros (symmetric quantization)."""
    return zp is None or (not isinstance(zp, Tensor) and not np.asarray(zp).any())


def _integer_matmul(ctx: Ctx, av: Value, bv: Value, za: Value | None, zb: Value | None,
                    hint: str) -> Tensor:  # fmt: skip
    """``(a - za) @ (b - zb)`` summed exactly in int32. With byte operands of two or more dims
    as ``a @ b - zb * rowsum(a) - za * colsum(b) + K * za * zb`` (gemmlowp's expansion; the
    zero points are one per row of ``a`` and one per column of ``b`` at most): the product of
    the raw bytes is an int8 GEMM on ``m16n8k32`` tensor cores, the sums are cheap rows and
    columns (a constant weight's columns fold at import), and int32 arithmetic wraps alike in
    both forms. Otherwise the zero points are subtracted first."""
    a, b = ctx.tensor(av), ctx.tensor(bv)
    byte = {a.dtype, b.dtype} <= {"int8", "uint8"}
    if not byte or a.ndim < 2 or b.ndim < 2:
        a = _shifted(ctx, av, za, -2 if a.ndim >= 2 else -1, "a")
        b = _shifted(ctx, bv, zb, -1, "b")
        return ops.matmul(a, b, name=ctx.fresh(hint))
    prod = ops.matmul(a, b, name=ctx.fresh(hint), dtype="int32")
    z_a = None if _is_zero(za) else _per_element(ctx, za, a.shape, -2, 0, "a zero point")
    z_b = None if _is_zero(zb) else _per_element(ctx, zb, b.shape, -1, 0, "b zero point")
    if z_a is None and z_b is None:
        return prod
    kk = a.shape[-1]

    def row_sums(*i: IterVar) -> Expr:
        k = te.reduce_axis(kk, name="k")
        return te.sum(te.cast(a[(*i, k)], "int32"), axis=k)

    def col_sums(*i: IterVar) -> Expr:
        k = te.reduce_axis(kk, name="k")
        return te.sum(te.cast(b[(*i[:-1], k, i[-1])], "int32"), axis=k)

    rows = cols = None
    if z_b is not None:
        rows = ctx.compute(a.shape[:-1], row_sums, "a_row_sums")
    if z_a is not None:
        cols = ctx.compute((*b.shape[:-2], b.shape[-1]), col_sums, "b_col_sums")

    def body(*o: IterVar) -> Expr:
        *batch, m, n = o
        ab, bb = bcast(a.shape[:-2], batch), bcast(b.shape[:-2], batch)
        v: Expr = prod[o]
        za_ = te.cast(z_a((*ab, m, as_expr(0))), "int32") if z_a is not None else None
        zb_ = te.cast(z_b((*bb, as_expr(0), n)), "int32") if z_b is not None else None
        if zb_ is not None and rows is not None:
            v = v - zb_ * rows[(*ab, m)]
        if za_ is not None and cols is not None:
            v = v - za_ * cols[(*bb, n)]
        if za_ is not None and zb_ is not None:
            v = v + za_ * zb_ * kk
        return v

    return ctx.compute(prod.shape, body, f"{hint}_zero_points")


@register_op("MatMulInteger")
def _matmul_integer(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    za, zb = optional_input(ins, 2), optional_input(ins, 3)
    return [_integer_matmul(ctx, ins[0], ins[1], za, zb, "matmul_int")]


def _requant_factor(ctx: Ctx, scales: list[Value], axes: list[int]) -> Reader:
    """``s0 * s1 / s2`` per output element (a vector scale ``k`` runs along output axis
    ``axes[k]``), in float64; the product and the quotient are rounded in the scales' dtype
    first, as the reference computes them."""
    ts = [ctx.tensor(s) for s in scales]
    dt = ts[0].dtype

    def one(k: int, idx: tuple[Expr, ...]) -> Expr:
        t = ts[k]
        if math.prod(t.shape) == 1:
            return t[(as_expr(0),) * t.ndim]
        return t[(idx[axes[k]],)]

    def f(idx: tuple[Expr, ...]) -> Expr:
        s = te.cast(one(0, idx) * one(1, idx), dt)
        return te.cast(te.cast(s / one(2, idx), dt), "float64")

    return f


@register_op("QLinearMatMul")
def _qlinear_matmul(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    to = _quant_type(ctx, node, 7, at, ctx.onnx_dtype(node.input[0], ins[0]))
    acc = _integer_matmul(ctx, ins[0], ins[3], ins[2], ins[5], "qmatmul")
    rows, cols = acc.ndim - 2, acc.ndim - 1
    factor = _requant_factor(ctx, [ins[1], ins[4], ins[6]], [rows, cols, cols])
    zp = _per_element(ctx, ins[7], acc.shape, -1, 0, "y_zero_point")

    def body(*i: IterVar) -> Expr:
        v = te.cast(acc[i], "float64") * factor(i)
        return _requantized(v, zp(i) if zp is not None else None, to)

    return [ctx.compute(acc.shape, body, "qlinear_matmul")]


def _conv_int(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any],
              x_at: tuple[int, int], w_at: tuple[int, int]) -> Tensor:  # fmt: skip
    """The int32 convolution of ``x - x_zero_point`` and ``w - w_zero_point`` (per output
    channel); padding reads the zero point, i.e. contributes 0. Byte operands as
    :func:`_integer_conv`; others with the zero points subtracted first."""
    xv, wv = ins[x_at[0]], ins[w_at[0]]
    zx, zw = optional_input(ins, x_at[1]), optional_input(ins, w_at[1])
    x, w = ctx.tensor(xv), ctx.tensor(wv)
    if {x.dtype, w.dtype} <= {"int8", "uint8"}:
        return _integer_conv(ctx, xv, wv, zx, zw, conv_geometry(at, x, w))
    return conv_node(ctx, _shifted(ctx, xv, zx, 1, "x"), _shifted(ctx, wv, zw, 0, "w"), None, at)


def _integer_conv(ctx: Ctx, xv: Value, wv: Value, zx: Value | None, zw: Value | None,
                  geo: ConvGeometry) -> Tensor:  # fmt: skip
    """``conv(x - zx, w - zw)`` of byte operands as the convolution of the raw bytes (an int8
    implicit GEMM on ``m16n8k32`` tensor cores) less the zero points' terms, summed over each
    window's in-bounds offsets ``r`` (padding contributes nothing, as it reads the zero point):
    ``P - zw[o] * Sx[b, g, y] - zx * sum_r (wsum[o, r] - zw[o] * C_g)``, with ``Sx`` the window
    sums of the input's per-group channel sums (:func:`_input_window_sums`) and ``wsum`` the
    weight's channel sums (:func:`_weight_window_sums`). int32 arithmetic wraps alike in both
    forms."""
    k, s, d, lo, hi, g = geo
    x, w = ctx.tensor(xv), ctx.tensor(wv)
    prod = ops.conv(x, w, None, s, [*lo, *hi], d, g, name=ctx.fresh("conv_int"), dtype="int32")
    if not _is_zero(zx) and math.prod(ctx.tensor(zx).shape) != 1:
        raise ExpressionError(f"ConvInteger: x zero point {ctx.tensor(zx).shape} must be one value")
    z_x = None if _is_zero(zx) else _per_element(ctx, zx, x.shape, 1, 0, "x zero point")
    z_w = None if _is_zero(zw) else _per_element(ctx, zw, w.shape, 0, 0, "w zero point")
    if z_x is None and z_w is None:
        return prod
    zero = (as_expr(0),) * (len(k) + 1)
    og = w.shape[0] // g
    x_sums = None if z_w is None else _input_window_sums(ctx, x, geo, prod.shape[2:])
    w_sums = (
        None
        if z_x is None
        else _weight_window_sums(ctx, wv, zw, z_w, geo, x.shape[2:], prod.shape[2:])
    )

    def body(b: IterVar, oc: IterVar, *ys: IterVar) -> Expr:
        v: Expr = prod[(b, oc, *ys)]
        if z_w is not None and x_sums is not None:
            v = v - te.cast(z_w((oc, *zero)), "int32") * x_sums[(b, oc // og, *ys)]
        if z_x is not None and w_sums is not None:
            v = v - te.cast(z_x(zero), "int32") * w_sums((oc, *ys))
        return v

    return ctx.compute(prod.shape, body, "conv_int_zero_points")


def _window_sum(ys: tuple[IterVar, ...], geo: ConvGeometry, sp: tuple[int, ...],
                read: Callable[[list[Expr], list[IterVar]], Expr]) -> Expr:  # fmt: skip
    """``read(input position, window offset)`` summed over the offsets of output position
    ``ys``' window that fall inside the input's spatial extent ``sp``."""
    k, s, d, lo, _, _ = geo
    rs = [te.reduce_axis(kk, name=f"zr{i}") for i, kk in enumerate(k)]
    pos = [ys[i] * s[i] + rs[i] * d[i] - lo[i] for i in range(len(k))]
    cond = all_of([c for i, p in enumerate(pos) for c in (p >= 0, p < sp[i])])
    assert cond is not None
    return te.sum(te.where(cond, read(pos, rs), 0), axis=rs)


def _input_window_sums(ctx: Ctx, x: Tensor, geo: ConvGeometry, out: tuple[int, ...]) -> Tensor:
    """``Sx[b, g, y]``: the sum of group ``g``'s input channels over output position ``y``'s
    window (its in-bounds part), in int32; channel sums first, then the window."""
    n, c, *sp = x.shape
    g = geo.groups
    cg = c // g

    def chan_sums(b: IterVar, gi: IterVar, *p: IterVar) -> Expr:
        rc = te.reduce_axis(cg, name="zc")
        return te.sum(te.cast(x[(b, gi * cg + rc, *p)], "int32"), axis=rc)

    cs = ctx.compute((n, g, *sp), chan_sums, "x_chan_sums")
    return ctx.compute(
        (n, g, *out),
        lambda b, gi, *ys: _window_sum(ys, geo, tuple(sp), lambda pos, rs: cs[(b, gi, *pos)]),
        "x_window_sums",
    )


def _weight_window_sums(
    ctx: Ctx, wv: Value, zw: Value | None, z_w: Reader | None, geo: ConvGeometry,
    sp: tuple[int, ...], out: tuple[int, ...],
) -> Reader:  # fmt: skip
    """A reader of ``sum_r (sum_c w[o, c, r] - zw[o] * C_g)`` over the in-bounds window
    offsets ``r`` of output position ``y`` at ``(o, *y)`` (``sp``, ``out``: the input's and
    the output's spatial shapes). A constant weight's is one int32 table (wrapped) computed at
    import (a reduction read by the epilogue would keep the epilogue off the GEMM's fragments),
    with a dim of 1 wherever no window along it leaves the input; else two reductions."""
    k = geo.kernel
    w = ctx.tensor(wv)
    o, cg = w.shape[:2]
    if isinstance(wv, Tensor) or isinstance(zw, Tensor):
        def w_chan(oc: IterVar, *r: IterVar) -> Expr:
            rc = te.reduce_axis(cg, name="zc")
            v = te.sum(te.cast(w[(oc, rc, *r)], "int32"), axis=rc)
            zero = (as_expr(0),) * len(k)
            return v if z_w is None else v - te.cast(z_w((oc, *zero)), "int32") * cg

        wc = ctx.compute((o, *k), w_chan, "w_chan_sums")
        sums = ctx.compute(
            (o, *out),
            lambda oc, *ys: _window_sum(ys, geo, sp, lambda pos, rs: wc[(oc, *rs)]),
            "w_window_sums",
        )
        return lambda i: sums[i]
    wc64 = np.asarray(wv).astype(np.int64).sum(axis=1)
    if zw is not None:
        wc64 -= np.asarray(zw, np.int64).reshape(-1, *([1] * len(k))) * cg
    table = np.zeros((o, *out), np.int64)
    for r in np.ndindex(*k):
        inside = np.ones(out, bool)
        for i, ri in enumerate(r):
            pos = np.arange(out[i]) * geo.strides[i] + ri * geo.dilations[i] - geo.lo[i]
            shape = [1] * len(out)
            shape[i] = out[i]
            inside = inside & ((pos >= 0) & (pos < sp[i])).reshape(shape)
        table += wc64[(slice(None), *r)].reshape(o, *([1] * len(out))) * inside
    for i in range(len(out)):
        if np.all(table == table.take([0], axis=1 + i)):
            table = table.take([0], axis=1 + i)
    t = ctx.tensor(table.astype(np.int32))
    return lambda i: t[tuple(v if e > 1 else as_expr(0) for v, e in zip(i, t.shape, strict=True))]


@register_op("ConvInteger")
def _conv_integer(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    return [_conv_int(ctx, node, ins, at, (0, 2), (1, 3))]


@register_op("QLinearConv")
def _qlinear_conv(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    acc = _conv_int(ctx, node, ins, at, (0, 2), (3, 5))
    to = _quant_type(ctx, node, 7, at, ctx.onnx_dtype(node.input[0], ins[0]))
    bias = ctx.tensor(ins[8]) if optional_input(ins, 8) is not None else None
    factor = _requant_factor(ctx, [ins[1], ins[4], ins[6]], [1, 1, 1])
    zp = _per_element(ctx, ins[7], acc.shape, 1, 0, "y_zero_point")

    def body(*i: IterVar) -> Expr:
        v: Expr = acc[i] if bias is None else acc[i] + te.cast(bias[(i[1],)], "int32")
        v = te.cast(v, "float64") * factor(i)
        return _requantized(v, zp(i) if zp is not None else None, to)

    return [ctx.compute(acc.shape, body, "qlinear_conv")]
