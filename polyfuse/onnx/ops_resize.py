"""ONNX Resize (and the deprecated Upsample): per-axis taps taken from the reference
implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import ops, te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    attrs_of,
    host_value,
    ints_of,
    register_op,
    str_attr,
)
from polyfuse.onnx.fold import fold_node


def _resize_axis_taps(
    node: onnx.NodeProto, ins: list[Any], shape: Sequence[int], opset: int
) -> list[tuple[int, np.ndarray, np.ndarray, np.ndarray]]:
    """Per resized axis: ``(axis, idx, w, c)`` with ``out[o] = c[o] + sum_t w[t, o] *
    in[idx[t, o]]`` along that axis.

    Resize is separable and affine along each axis (nearest, linear, cubic, antialias,
    extrapolation). The ONNX reference resizes one axis at a time; its 1-D step is probed
    (:func:`_taps`), so every mode and coordinate transformation is exactly the reference's.
    """
    import onnx.reference.ops.op_resize as ref

    calls: list[tuple[int, int, tuple[Any, ...], dict[str, Any]]] = []
    orig = ref._interpolate_1d_along_axis

    def spy(data: np.ndarray, axis: int, *a: Any, **k: Any) -> np.ndarray:
        calls.append((int(data.shape[axis]), axis, a, k))
        return orig(data, axis, *a, **k)

    one = helper.make_node(node.op_type, list(node.input), [node.output[0]], domain=node.domain)
    one.attribute.extend(node.attribute)
    ref._interpolate_1d_along_axis = spy
    try:  # (one row per axis is enough to record the calls: their sizes are the axes')
        fold_node(one, [np.zeros(shape, np.float32), *ins[1:]], opset)
    finally:
        ref._interpolate_1d_along_axis = orig
    at = attrs_of(node)
    axes = [int(a) % len(shape) for a in at["axes"]] if "axes" in at else None
    out: list[tuple[int, np.ndarray, np.ndarray, np.ndarray]] = []
    seen: set[int] = set()
    for n_in, axis, a, k in calls:
        real = axes[axis] if axes is not None else axis
        if real in seen:  # the reference repeats the axes for every slice
            continue
        seen.add(real)
        out.append((real, *_taps(lambda d, a=a, k=k: orig(d, 0, *a, **k), n_in)))
    return out


def _taps(step: Any, n_in: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The taps ``(idx, w, c)`` of the 1-D affine map ``step`` (columns of an ``(n_in, k)``
    array in, ``(n_out, k)`` out), without its dense ``n_out x n_in`` matrix (an axis of
    66 690 made that 33 GiB; onnx fuzz seed 25241).

    Probe with ``P`` columns, column ``p`` the indicator of the inputs ``j = p (mod P)``, and
    the same times ``j``: an output's window of fewer than ``P`` contiguous inputs puts each
    tap in its own column, whose first probe gives the weight and whose ratio of the two gives
    ``j``. The taps are checked against a random input, ``P`` growing until they agree (at
    ``P = n_in`` the probe is the identity)."""
    c = np.asarray(step(np.zeros((n_in, 1))), np.float64)[:, 0]
    x = np.random.default_rng(0).standard_normal((n_in, 1))
    want = np.asarray(step(x), np.float64)[:, 0] - c
    j = np.arange(n_in)
    period = 8
    while True:
        period = min(period, n_in)
        ind = (j[:, None] % period == np.arange(period)[None, :]).astype(np.float64)
        a = np.asarray(step(ind), np.float64) - c[:, None]
        b = np.asarray(step(ind * j[:, None]), np.float64) - c[:, None]
        nz = a != 0
        cols = np.rint(b / np.where(nz, a, 1.0))
        order = np.argsort(~nz, axis=1, kind="stable")[:, : max(1, int(nz.sum(axis=1).max()))]
        w = np.take_along_axis(np.where(nz, a, 0.0), order, 1).T
        idx = np.clip(np.take_along_axis(np.where(nz, cols, 0.0), order, 1).T, 0, n_in - 1)
        idx = idx.astype(np.int64)
        if period >= n_in or np.allclose((w * x[idx, 0]).sum(axis=0), want, rtol=1e-9, atol=1e-9):
            return idx, w, c
        period *= 4


@register_op("Resize")
def _resize(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Each resized axis: ``c[o] + sum_t w[t, o] * x[.., idx[t, o], ..]`` over the few taps of
    the interpolation (1 nearest, 2 linear, 4 cubic), tables computed on the host."""
    x = ctx.tensor(ins[0])
    host = [
        None if v is None else host_value(ctx, node, v, nm)
        for v, nm in zip(ins[1:], ("roi", "scales", "sizes"), strict=False)
    ]
    return [_resized(ctx, node, x, host, ctx.opset)]


@register_op("Upsample")
def _upsample(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The deprecated Upsample (opsets 7-9, older detectors' exports): a Resize by ``scales``
    (an input from opset 9, an attribute before) in ``nearest`` (floor) or ``linear`` mode
    with the ``asymmetric`` coordinates it defines."""
    x = ctx.tensor(ins[0])
    scales = at.get("scales") if len(ins) < 2 else host_value(ctx, node, ins[1], "scales")
    mode = str_attr(at, "mode", "nearest")
    resize = helper.make_node(
        "Resize", ["x", "", "scales"], [node.output[0]], name=node.name, mode=mode,
        coordinate_transformation_mode="asymmetric", nearest_mode="floor",
    )  # fmt: skip
    host = [None, np.asarray(scales, np.float32).reshape(-1)]
    return [_resized(ctx, resize, x, host, max(ctx.opset, 13))]


def _resized(ctx: Ctx, node: onnx.NodeProto, x: Tensor, host: list[Any], opset: int) -> Tensor:
    """``x`` resized as Resize ``node`` with host ``roi``/``scales``/``sizes`` asks."""
    y: Tensor = x
    # weights in float64 for float64 data (float32 ones are 1e-7 off there)
    wdt = np.float64 if x.dtype == "float64" else np.float32
    for axis, idx, w64, c in _resize_axis_taps(node, [None, *host], x.shape, opset):
        taps, n_out = idx.shape
        w = w64.astype(wdt)
        shape = list(y.shape)
        shape[axis] = n_out
        src = y
        ones = taps == 1 and bool(np.all(w[0] == 1.0))
        cvec = c.astype(wdt)
        it, wt = ctx.tensor(idx.astype(np.int32)), ctx.tensor(w)
        ct = ctx.tensor(cvec) if np.any(cvec != 0) else None

        def body(
            *i: IterVar,
            src: Tensor = src,
            axis: int = axis,
            it: Tensor = it,
            wt: Tensor = wt,
            taps: int = taps,
            ones: bool = ones,
            ct: Tensor | None = ct,
        ) -> Expr:
            o = i[axis]
            acc: Expr | None = None
            for t in range(taps):
                v = src[(*i[:axis], te.data_index(it[t, o]), *i[axis + 1 :])]
                v = v if ones else v * wt[t, o]
                acc = v if acc is None else acc + v
            assert acc is not None
            return acc + ct[o] if ct is not None else acc

        y = ctx.compute(shape, body, "resize")
    return y


@register_op("GridSample")
def _grid_sample(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``ops.grid_sample``: opset 20's modes linear/nearest/cubic (opset 16's bilinear and
    bicubic are the same), zeros/border/reflection padding, ``align_corners``."""
    mode = at.get("mode", b"linear" if ctx.opset >= 20 else b"bilinear")
    mode = mode.decode() if isinstance(mode, bytes) else str(mode)
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
    pad = str_attr(at, "padding_mode", "zeros")
    x, grid = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    align = bool(int(at.get("align_corners", 0)))
    return [ops.grid_sample(x, grid, mode, pad, align, name=ctx.fresh("grid_sample"))]


@register_op("AffineGrid")
def _affine_grid(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The sampling grid of affine maps ``theta`` (N, d, d+1) over an output of ``size``
    (N, C, *S): each point's normalised coordinates (last axis first, then 1) times
    ``theta``; the grid ``GridSample`` reads."""
    theta = ctx.tensor(ins[0])
    size = ints_of(host_value(ctx, node, ins[1], "size"))
    nd = len(size) - 2
    if nd not in (2, 3) or theta.shape != (size[0], nd, nd + 1):
        raise ExpressionError(
            f"AffineGrid: theta {theta.shape} must be (N, {nd}, {nd + 1}) for size {size}"
        )
    sp = size[2:]
    align = bool(int(at.get("align_corners", 0)))

    def base(i: Expr, s: int) -> Expr:  # the normalised coordinate of index i of s
        if s == 1:
            return as_expr(-1.0 if align else 0.0)
        v = te.cast(i, "float32")
        return v * (2.0 / (s - 1)) - 1.0 if align else (v * 2.0 + 1.0) * (1.0 / s) - 1.0

    def body(n: IterVar, *rest: IterVar) -> Expr:
        *pts, c = rest
        total: Expr = theta[n, c, nd]
        for j in range(nd):  # component j runs along spatial axis nd - 1 - j
            total = total + theta[n, c, j] * base(pts[nd - 1 - j], sp[nd - 1 - j])
        return total

    return [ctx.compute((size[0], *sp, nd), body, "affine_grid")]
