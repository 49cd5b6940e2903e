"""Sampling an image at coordinates read from data: ``grid_sample`` (ONNX GridSample,
torch ``F.grid_sample``).

Each output point reads its normalised coordinates (``-1`` .. ``1``, last one first) from the
grid, maps them onto the input's spatial axes, and interpolates the input there: the nearest
element, the ``2**d`` linear neighbours or the ``4**d`` cubic ones (Keys, ``a = -0.75``),
weighted per axis. The neighbours' indices are data (``te.data_index``), always clamped into
the input, so no read leaves it; with ``padding_mode="zeros"`` a neighbour outside reads 0,
with ``"border"`` its index is clamped, with ``"reflection"`` reflected about the edges. A
source coordinate outside the input is first clamped or reflected the same way (also for
cubic: ONNX's definition; torch's bicubic pads only the taps, so ``cubic_pads_source=False``).
A 16-bit input interpolates in float32 and rounds once.
"""

from __future__ import annotations

import itertools
import math

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.ops._common import compute_op, desc, narrow, op_name, wide

MODES = ("linear", "nearest", "cubic")
PADDINGS = ("zeros", "border", "reflection")
_A = -0.75  # the cubic convolution's parameter (Keys; torch and ONNX)


def _unnormalize(g: Expr, size: int, align: bool) -> Expr:
    """A normalised coordinate (-1 .. 1) in elements of an axis of ``size``."""
    if align:
        return (g + 1.0) * (0.5 * (size - 1))
    return ((g + 1.0) * size - 1.0) * 0.5


def _reflect(v: Expr, lo: float, hi: float) -> Expr:
    """``v`` reflected about ``lo`` and ``hi`` until it lies between them."""
    span = hi - lo
    if span <= 0:  # one element, corners aligned: every coordinate reflects onto it
        return as_expr(float(lo))
    below, above = lo - v, v - hi
    d = te.where(v < lo, below, above)
    n = te.floor(d * (1.0 / span))
    r = d - n * span
    odd = n - te.floor(n * 0.5) * 2.0 > 0.5
    from_lo = te.where(odd, hi - r, lo + r)
    from_hi = te.where(odd, lo + r, hi - r)
    return te.where(v < lo, from_lo, te.where(v > hi, from_hi, v))


def _bounds(size: int, align: bool) -> tuple[float, float]:
    return (0.0, size - 1.0) if align else (-0.5, size - 0.5)


def _padded_source(v: Expr, size: int, padding: str, align: bool) -> Expr:
    """A source coordinate outside the input's bounds, clamped (border) or reflected."""
    lo, hi = _bounds(size, align)
    if padding == "border":
        return te.where((v < lo) | (v > hi), te.minimum(te.maximum(v, 0.0), float(size - 1)), v)
    if padding == "reflection":
        return _reflect(v, lo, hi)
    return v


def _cubic_weights(t: Expr) -> list[Expr]:
    """Keys' cubic convolution weights of the taps at -1, 0, 1, 2 from the floor."""

    def near(x: Expr) -> Expr:  # |x| <= 1
        return ((_A + 2.0) * x - (_A + 3.0)) * x * x + 1.0

    def far(x: Expr) -> Expr:  # 1 < |x| < 2
        return ((_A * x - 5.0 * _A) * x + 8.0 * _A) * x - 4.0 * _A

    return [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]


def grid_sample(
    x: Tensor,
    grid: Tensor,
    mode: str = "linear",
    padding_mode: str = "zeros",
    align_corners: bool = False,
    name: str | None = None,
    *,
    convention: str = "onnx",
) -> Tensor:
    """``x`` (N, C, *S) sampled at ``grid`` (N, *O, d) -> (N, C, *O); see the module."""
    op = "grid_sample"
    name = op_name(op, name)
    nd = x.ndim - 2
    if mode not in MODES or padding_mode not in PADDINGS or convention not in ("onnx", "torch"):
        raise ExpressionError(
            f"{op} '{name}': mode {mode!r} / padding_mode {padding_mode!r} (modes {MODES}, "
            f"paddings {PADDINGS})"
        )
    if nd < 1 or grid.ndim != nd + 2 or grid.shape[0] != x.shape[0] or grid.shape[-1] != nd:
        raise ExpressionError(
            f"{op} '{name}': grid {desc(grid)} must be (N, *out, {nd}) for input {desc(x)}"
        )
    sizes = x.shape[2:]
    up, down = wide(x), narrow(x)
    gup = wide(grid)
    outs = grid.shape[1:-1]
    k_taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    # per axis: the source coordinate, then the taps' indices (-1: outside, reads 0) and
    # weights; tables, so that the sum over the taps reads loads, not copies of the maths
    idx_t: list[Tensor] = []
    w_t: list[Tensor] = []
    for i, size in enumerate(sizes):

        def coord(n: IterVar, *o: IterVar, i: int = i, size: int = size) -> Expr:
            v = _unnormalize(gup(grid[(n, *o, nd - 1 - i)]), size, align_corners)
            torch_order = convention == "torch"
            if mode == "nearest" and not torch_order:
                v = te.round(v)
            if mode != "cubic" or not torch_order:
                v = _padded_source(v, size, padding_mode, align_corners)
            if mode == "nearest" and torch_order:
                v = te.round(v)
            return v

        src = compute_op((grid.shape[0], *outs), coord, f"{name}_src{i}", op)

        def tap(n: IterVar, *ok: IterVar, size: int = size, src: Tensor = src) -> Expr:
            *o, k = ok
            f = te.floor(src[(n, *o)])
            pos = f + (te.cast(k, "float32") - (1.0 if mode == "cubic" else 0.0))
            if padding_mode == "border":
                return te.cast(te.minimum(te.maximum(pos, 0.0), float(size - 1)), "int32")
            if padding_mode == "reflection":
                return te.cast(te.floor(_reflect(pos, *_bounds(size, align_corners))), "int32")
            inside = (pos >= 0.0) & (pos <= float(size - 1))
            return te.where(inside, te.cast(pos, "int32"), -1)

        shape_k = (grid.shape[0], *outs, k_taps)
        idx_t.append(compute_op(shape_k, tap, f"{name}_tap{i}", op))
        if mode == "nearest":
            continue

        def weight(n: IterVar, *ok: IterVar, src: Tensor = src) -> Expr:
            *o, k = ok
            v = src[(n, *o)]
            t = v - te.floor(v)
            ws = [1.0 - t, t] if mode == "linear" else _cubic_weights(t)
            w = ws[-1]
            for j in range(len(ws) - 2, -1, -1):
                w = te.where(te.equal(k, j), ws[j], w)
            return w

        w_t.append(compute_op(shape_k, weight, f"{name}_w{i}", op))

    def body(n: IterVar, c: IterVar, *o: IterVar) -> Expr:
        total: Expr | None = None
        for combo in itertools.product(range(k_taps), repeat=nd):
            subs, ok, weight = [], None, None
            for i, k in enumerate(combo):
                j = idx_t[i][(n, *o, k)]
                subs.append(te.data_index(te.maximum(j, 0)))
                if padding_mode == "zeros":
                    ok = j >= 0 if ok is None else ok & (j >= 0)
                if w_t:
                    w = w_t[i][(n, *o, k)]
                    weight = w if weight is None else weight * w
            v = up(x[(n, c, *subs)])
            if ok is not None:
                v = te.where(ok, v, 0.0)
            term = v if weight is None else v * weight
            total = term if total is None else total + term
        assert total is not None
        return down(total)

    shape = (x.shape[0], x.shape[1], *grid.shape[1:-1])
    if math.prod(shape) == 0:
        raise ExpressionError(f"{op} '{name}': an empty output {shape}")
    return compute_op(shape, body, name, op)
