"""ONNX Resize: per-axis affine maps taken from the reference implementation."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import te
from polyfuse.graph.expr import Expr, IterVar, Tensor
from polyfuse.onnx.common import (
    Ctx,
    Value,
    attrs_of,
    host_value,
    register_op,
)
from polyfuse.onnx.fold import fold_node


def _resize_axis_maps(
    node: onnx.NodeProto, ins: list[Any], shape: Sequence[int], opset: int
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Per resized axis: ``(axis, M, c)`` with ``out = M @ in + c`` along that axis.

    Resize is separable and affine along each axis (nearest, linear, cubic, antialias,
    extrapolation). The ONNX reference resizes one axis at a time; its 1-D step is run on an
    identity matrix (giving ``M``) and on zeros (giving ``c``), so every mode and coordinate
    transformation is exactly the reference's.
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
    try:
        fold_node(one, [np.zeros(shape, np.float32), *ins[1:]], opset)
    finally:
        ref._interpolate_1d_along_axis = orig
    at = attrs_of(node)
    axes = [int(a) % len(shape) for a in at["axes"]] if "axes" in at else None
    maps: list[tuple[int, np.ndarray, np.ndarray]] = []
    seen: set[int] = set()
    for n_in, axis, a, k in calls:
        real = axes[axis] if axes is not None else axis
        if real in seen:  # the reference repeats the axes for every slice
            continue
        seen.add(real)
        m = np.asarray(orig(np.eye(n_in), 0, *a, **k), dtype=np.float64)
        c = np.asarray(orig(np.zeros((n_in, 1)), 0, *a, **k), dtype=np.float64)[:, 0]
        maps.append((real, m - c[:, None], c))
    return maps


@register_op("Resize")
def _resize(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Each resized axis: ``c[o] + sum_t w[t, o] * x[.., idx[t, o], ..]`` over the few taps of
    the interpolation (1 nearest, 2 linear, 4 cubic), tables computed on the host."""
    x = ctx.tensor(ins[0])
    host = [
        None if v is None else host_value(ctx, node, v, nm)
        for v, nm in zip(ins[1:], ("roi", "scales", "sizes"), strict=False)
    ]
    y: Tensor = x
    # weights in float64 for float64 data (float32 ones are 1e-7 off there)
    wdt = np.float64 if x.dtype == "float64" else np.float32
    for axis, m, c in _resize_axis_maps(node, [None, *host], x.shape, ctx.opset):
        nz = m != 0
        taps = max(1, int(nz.sum(axis=1).max()))
        idx = np.zeros((taps, m.shape[0]), np.float32)
        w = np.zeros((taps, m.shape[0]), wdt)
        for o in range(m.shape[0]):
            cols = np.flatnonzero(nz[o])
            idx[: len(cols), o] = cols
            w[: len(cols), o] = m[o, cols]
        shape = list(y.shape)
        shape[axis] = m.shape[0]
        src = y
        ones = taps == 1 and bool(np.all(nz.sum(axis=1) == 1) and np.all(w[0] == 1.0))
        cvec = c.astype(wdt)
        it, wt = ctx.tensor(idx), ctx.tensor(w)
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
    return [y]
