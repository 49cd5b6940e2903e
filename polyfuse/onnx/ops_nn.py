"""ONNX matrix products, convolutions and pooling."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    host_value,
    ints_of,
    iota64,
    map_elementwise,
    optional_input,
    reduce_op,
    register_op,
    str_attr,
)


@register_op("MatMul")
def _matmul(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [ops.matmul(ctx.tensor(ins[0]), ctx.tensor(ins[1]), name=ctx.fresh("matmul"))]


@register_op("Gemm")
def _gemm(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    a, b = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    ta, tb = int(at.get("transA", 0)), int(at.get("transB", 0))
    alpha, beta = float(at.get("alpha", 1.0)), float(at.get("beta", 1.0))
    m, k = (a.shape[1], a.shape[0]) if ta else a.shape
    n = b.shape[0] if tb else b.shape[1]
    kk = te.reduce_axis(k, name="k")

    def body(i: IterVar, j: IterVar) -> Expr:
        av = a[kk, i] if ta else a[i, kk]
        bv = b[j, kk] if tb else b[kk, j]
        return te.sum(av * bv, axis=kk)

    y = ctx.compute((m, n), body, "gemm")
    c = ins[2] if len(ins) > 2 else None
    if c is None or beta == 0.0:
        return [y if alpha == 1.0 else map_elementwise(ctx, [y], lambda v: v * alpha, "gemm_a")]
    return [map_elementwise(ctx, [y, c], lambda v, cv: v * alpha + cv * beta, "gemm_c")]


# ---- convolution and pooling


def _conv_pads(
    at: dict[str, Any], spatial: Sequence[int], k: Sequence[int], s: Sequence[int], d: Sequence[int]
) -> tuple[list[int], list[int]]:
    nd = len(spatial)
    ap = at.get("auto_pad", b"NOTSET")
    ap = ap.decode() if isinstance(ap, bytes) else ap
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        lo, hi = [], []
        for n, kk, ss, dd in zip(spatial, k, s, d, strict=True):
            out = -(-n // ss)
            total = max((out - 1) * ss + (kk - 1) * dd + 1 - n, 0)
            small, big = total // 2, total - total // 2
            lo.append(small if ap == "SAME_UPPER" else big)
            hi.append(big if ap == "SAME_UPPER" else small)
        return lo, hi
    if ap == "VALID":
        return [0] * nd, [0] * nd
    pads = list(at.get("pads", [0] * (2 * nd)))
    return [int(p) for p in pads[:nd]], [int(p) for p in pads[nd:]]


@register_op("Conv")
def _conv(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    bias = ctx.tensor(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    return [conv_node(ctx, x, w, bias, at)]


class ConvGeometry(NamedTuple):
    """An ONNX convolution's window: kernel, strides, dilations, pads before and after (per
    spatial dim) and groups."""

    kernel: list[int]
    strides: list[int]
    dilations: list[int]
    lo: list[int]
    hi: list[int]
    groups: int


def conv_geometry(at: dict[str, Any], x: Tensor, w: Tensor) -> ConvGeometry:
    """The window of a ``Conv``-like node's attributes (pads or auto_pad, strides, dilations,
    group) over input ``x`` and weight ``w``."""
    nd = x.ndim - 2
    k = [int(v) for v in at.get("kernel_shape", w.shape[2:])]
    s = [int(v) for v in at.get("strides", [1] * nd)]
    d = [int(v) for v in at.get("dilations", [1] * nd)]
    lo, hi = _conv_pads(at, x.shape[2:], k, s, d)
    return ConvGeometry(k, s, d, lo, hi, int(at.get("group", 1)))


def conv_node(
    ctx: Ctx, x: Tensor, w: Tensor, bias: Tensor | None, at: dict[str, Any],
    dtype: str | None = None,
) -> Tensor:  # fmt: skip
    """The convolution of an ONNX ``Conv``-like node's attributes (ConvInteger and QLinearConv
    share them), the factors converted to ``dtype`` first where one is given. Asymmetric 2-D
    pads of a plain convolution pad the input; the others are guards of the window (the
    padding of an integer convolution reads no padded copy: its zero points are summed over
    the input's own bounds, :mod:`polyfuse.onnx.ops_quant`)."""
    k, s, d, lo, hi, g = conv_geometry(at, x, w)
    if x.ndim != 4 or (lo != hi and dtype is not None):
        return ops.conv(x, w, bias, s, [*lo, *hi], d, g, name=ctx.fresh("conv"), dtype=dtype)
    if lo != hi:
        x = ops.pad(x, [(0, 0), (0, 0), *zip(lo, hi, strict=True)], name=ctx.fresh("cpad"))
        lo = [0, 0]
    return ops.conv2d(
        x, w, bias, stride=s, padding=lo, dilation=d, groups=g, name=ctx.fresh("conv"),
        dtype=dtype,
    )


@register_op("ConvTranspose")
def _conv_transpose(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    x, w = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    bias = ctx.tensor(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    nd = x.ndim - 2
    k = [int(v) for v in at.get("kernel_shape", w.shape[2:])]
    s = [int(v) for v in at.get("strides", [1] * nd)]
    d = [int(v) for v in at.get("dilations", [1] * nd)]
    op_ = [int(v) for v in at.get("output_padding", [0] * nd)]
    out = at.get("output_shape")
    out = None if out is None else [int(v) for v in out][-nd:]
    ap = at.get("auto_pad", b"NOTSET")
    ap = ap.decode() if isinstance(ap, bytes) else ap
    full = [s[i] * (x.shape[2 + i] - 1) + op_[i] + (k[i] - 1) * d[i] + 1 for i in range(nd)]
    if ap in ("SAME_UPPER", "SAME_LOWER"):
        target = out or [x.shape[2 + i] * s[i] for i in range(nd)]
        tot = [full[i] - target[i] for i in range(nd)]
        small = [t // 2 for t in tot]
        lo = small if ap == "SAME_UPPER" else [t - h for t, h in zip(tot, small, strict=True)]
        pads = lo + [t - v for t, v in zip(tot, lo, strict=True)]
    else:
        pads = [int(v) for v in at.get("pads", [0] * (2 * nd))]
    y = ops.conv_transpose(
        x, w, bias, s, pads, d, int(at.get("group", 1)), op_, out, name=ctx.fresh("convt")
    )
    return [y]


def _pool(
    ctx: Ctx, node: onnx.NodeProto, x: Tensor, at: dict[str, Any], kind: str, indices: bool = False
) -> Tensor:
    nd = x.ndim - 2
    k = [int(v) for v in at["kernel_shape"]]
    s = [int(v) for v in at.get("strides", [1] * nd)]
    d = [int(v) for v in at.get("dilations", [1] * nd)]
    lo, hi = _conv_pads(at, x.shape[2:], k, s, d)
    ceil = int(at.get("ceil_mode", 0))
    out = []
    for n, kk, ss, dd, pl, ph in zip(x.shape[2:], k, s, d, lo, hi, strict=True):
        span = n + pl + ph - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil else span // ss) + 1
        if ceil and (o - 1) * ss >= n + pl:
            o -= 1
        out.append(o)
    shape = (*x.shape[:2], *out)
    rs = [te.reduce_axis(kk, name=f"r{i}") for i, kk in enumerate(k)]
    fill: float | int = -math.inf if kind == "max" else 0.0
    if dtypes.is_int(x.dtype):  # integer data pads with its dtype's least value (or 0): exact
        fill = int(np.iinfo(np.dtype(x.dtype)).min) if kind == "max" else 0

    def window(idx: Sequence[IterVar], rs: Sequence[IterVar]) -> tuple[list[Expr], Expr | None]:
        subs: list[Expr] = list(idx[:2])
        conds: list[Expr] = []
        for i in range(nd):
            e = (
                idx[2 + i] * s[i] + rs[i] * d[i] - lo[i]
                if lo[i]
                else idx[2 + i] * s[i] + rs[i] * d[i]
            )
            subs.append(e)
            if lo[i]:
                conds.append(e >= 0)
            if (out[i] - 1) * s[i] + (k[i] - 1) * d[i] - lo[i] >= x.shape[2 + i]:
                conds.append(e < x.shape[2 + i])
        c = conds[0] if conds else None
        for cc in conds[1:]:
            c = c & cc
        return subs, c

    p = float(at.get("p", 2))

    def body(*idx: IterVar) -> Expr:
        subs, c = window(idx, rs)
        v: Expr = x[tuple(subs)]
        if c is not None:
            v = te.where(c, v, fill)
        if kind == "lp":  # sum |v|^p (padding adds 0)
            v = v * v if p == 2 else te.abs(v) ** p
        return te.max(v, axis=rs) if kind == "max" else te.sum(v, axis=rs)

    y = ctx.compute(shape, body, f"{kind}pool")
    if kind == "lp":
        return map_elementwise(ctx, [y], lambda v: te.sqrt(v) if p == 2 else v ** (1.0 / p), "lp")
    if kind == "max" and indices:  # the first flat (NC...-major) position holding the max
        rs2 = [te.reduce_axis(kk, name=f"q{i}") for i, kk in enumerate(k)]
        strides = [math.prod(x.shape[j + 1 :]) for j in range(x.ndim)]
        if int(at.get("storage_order", 0)):  # column-major spatial dims
            sp = x.shape[2:]
            strides[2:] = [math.prod(sp[:j]) for j in range(nd)]
        big = te.const(math.prod(x.shape), "int64")

        def ibody(*idx: IterVar) -> Expr:
            subs, c = window(idx, rs2)
            hit = te.equal(x[tuple(subs)], y[idx])
            hit = hit if c is None else (c & hit)
            flat = iota64(sum((e * st for e, st in zip(subs, strides, strict=True)), as_expr(0)))
            return te.min(te.where(hit, flat, big), axis=rs2)

        return y, ctx.compute(shape, ibody, "maxpool_idx")  # type: ignore[return-value]
    if kind == "max":
        return y
    include = int(at.get("count_include_pad", 0))
    # divisor per output position (host): in-bounds window elements (or incl. padding)
    cnt = np.ones(out, dtype=np.float64)
    for i in range(nd):
        o = np.arange(out[i])[:, None] * s[i] + np.arange(k[i])[None, :] * d[i] - lo[i]
        lim = x.shape[2 + i] + (hi[i] if include else 0)
        lo_lim = -lo[i] if include else 0
        c1 = ((o >= lo_lim) & (o < lim)).sum(axis=1).astype(np.float64)
        cnt = cnt * c1.reshape([-1 if j == i else 1 for j in range(nd)])
    # a division by the count, as the definition: a product with a float32 reciprocal is a
    # unit off in float32 and 1e-8 off in float64 (counts are small integers: exact in any dtype)
    if np.all(cnt == cnt.reshape(-1)[0]):
        return map_elementwise(ctx, [y], lambda v: v / float(cnt.reshape(-1)[0]), "avgpool_div")
    return map_elementwise(ctx, [y, cnt.astype(np.float32)], lambda v, c: v / c, "avgpool_div")


@register_op("MaxPool", "AveragePool", "LpPool")
def _pool_op(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    kind = {"MaxPool": "max", "AveragePool": "avg", "LpPool": "lp"}[node.op_type]
    if kind == "max" and len([o for o in node.output if o]) > 1:
        y, idx = _pool(ctx, node, ctx.tensor(ins[0]), at, kind, indices=True)  # type: ignore[misc]
        return [y, idx]
    return [_pool(ctx, node, ctx.tensor(ins[0]), at, kind)]


@register_op("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool")
def _gpool(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    axes = list(range(2, x.ndim))
    if node.op_type == "GlobalMaxPool":
        return [reduce_op(ctx, x, axes, True, "max")]
    if node.op_type == "GlobalLpPool":
        p = float(at.get("p", 2))
        return [
            reduce_op(ctx, x, axes, True, "sum", pre=lambda v: te.abs(v) ** p,
                      post=lambda v: v ** (1.0 / p))
        ]  # fmt: skip
    n = math.prod(x.shape[2:])
    return [reduce_op(ctx, x, axes, True, "sum", pre=lambda v: v * (1.0 / n))]


@register_op("CausalConvWithState")
def _causal_conv_with_state(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """A depthwise causal 1-D convolution over ``past_state`` (zeros when absent) followed by
    the input, optionally Swish-activated; also the new state (the last ``k - 1`` steps)."""
    x, w = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    bias = ctx.tensor(ins[2]) if optional_input(ins, 2) is not None else None
    past = ctx.tensor(ins[3]) if optional_input(ins, 3) is not None else None
    act = str_attr(at, "activation", "none")
    nb, ch, n = x.shape
    k = w.shape[2]
    if x.ndim != 3 or w.shape != (ch, 1, k) or act not in ("none", "silu", "swish"):
        raise ExpressionError(
            f"CausalConvWithState: input {x.shape} and weight {w.shape} must be (N, C, L) and "
            f"(C, 1, k); activation {act!r} none, silu or swish"
        )
    if past is not None and past.shape != (nb, ch, k - 1):
        raise ExpressionError(
            f"CausalConvWithState: past_state {past.shape} is not {(nb, ch, k - 1)}"
        )

    def padded(b: Expr, c: Expr, t: Expr) -> Expr:  # position t of [past, x]
        cur = x[b, c, t - (k - 1)]
        if k == 1:
            return cur
        old = past[b, c, t] if past is not None else 0.0
        return te.where(t >= k - 1, cur, old)

    r = te.reduce_axis(k, name="rk")
    conv = ctx.compute(
        (nb, ch, n), lambda b, c, t: te.sum(padded(b, c, t + r) * w[c, 0, r], axis=r), "causal_conv"
    )

    def out(b: IterVar, c: IterVar, t: IterVar) -> Expr:
        v = conv[b, c, t] + bias[c] if bias is not None else conv[b, c, t]
        return v * te.sigmoid(v) if act != "none" else v

    y = ctx.compute((nb, ch, n), out, "causal_conv_out")
    if k == 1:  # no state to carry: an empty host array
        return [y, np.zeros((nb, ch, 0), dtypes.numpy_dtype(x.dtype))]
    state = ctx.compute((nb, ch, k - 1), lambda b, c, t: padded(b, c, t + n), "conv_state")
    return [y, state]


#: the largest twiddle table (input length x output length) a DFT builds
DFT_MAX_TABLE = 1 << 22


def _twiddles(
    ctx: Ctx, dtype: str, j_in: int, k_out: int, n: int, inverse: bool, real_out: bool
) -> tuple[Tensor, Tensor]:
    """``cos`` and ``sin`` of ``2 pi j k / n`` (j < ``j_in`` inputs, k < ``k_out`` outputs), made
    on the host in float64: scaled by ``1/n`` for an inverse, doubled for the inner
    frequencies of a Hermitian spectrum (``real_out``); constants of ``dtype``."""
    if j_in * k_out > DFT_MAX_TABLE:
        raise UnsupportedOpError(
            f"a DFT of length {n}: its {j_in} x {k_out} twiddle table exceeds {DFT_MAX_TABLE} "
            "entries (the transform is a sum against a table, not an FFT)"
        )
    jj, kk = np.arange(j_in)[:, None], np.arange(k_out)[None, :]
    theta = 2.0 * np.pi * ((jj * kk) % n) / n
    cos, sin = np.cos(theta), np.sin(theta)
    if real_out:  # Hermitian: the inner frequencies stand for two
        w = np.where((jj == 0) | ((n % 2 == 0) & (jj == n // 2)), 1.0, 2.0)
        cos, sin = cos * w, sin * w
    if inverse:
        cos, sin = cos / n, sin / n
    wide = np.float64 if dtype == "float64" else np.float32
    like = dtype if dtype != "float64" else None
    return ctx.tensor(cos.astype(wide), like=like), ctx.tensor(sin.astype(wide), like=like)


@register_op("DFT")
def _dft(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The discrete Fourier transform along ``axis`` as sums against twiddle tables
    (``cos``/``sin`` of ``2 pi k j / n``, made on the host in float64): real or complex
    (trailing 2) input, ``dft_length`` padding or truncating it, ``onesided`` halves,
    ``inverse`` (scaled by ``1/n``; one-sided: the real signal of a Hermitian spectrum)."""
    x = ctx.tensor(ins[0])
    if optional_input(ins, 2) is not None:  # opset 20: the axis is an input
        axis = int(np.asarray(host_value(ctx, node, ins[2], "axis")).reshape(-1)[0])
    else:
        axis = int(at.get("axis", 1 if ctx.opset < 20 else -2))
    axis %= x.ndim
    inverse, onesided = bool(int(at.get("inverse", 0))), bool(int(at.get("onesided", 0)))
    if x.ndim < 2 or x.shape[-1] not in (1, 2) or axis == x.ndim - 1:
        raise ExpressionError(
            f"DFT: input {x.shape} must end in 1 (real) or 2 (complex) components and "
            f"transform another axis than that (axis {axis})"
        )
    if onesided and x.shape[-1] != (2 if inverse else 1):
        raise ExpressionError(
            f"DFT: a one-sided {'inverse' if inverse else 'forward'} transform needs a "
            f"{'complex' if inverse else 'real'} input (it is {x.shape})"
        )
    m = x.shape[axis]
    if optional_input(ins, 1) is not None:
        n = int(np.asarray(host_value(ctx, node, ins[1], "dft_length")).reshape(-1)[0])
    else:
        n = 2 * (m - 1) if inverse and onesided else m
    real_out = inverse and onesided
    k_out = n if (inverse or not onesided) else n // 2 + 1
    j_in = min(m, n // 2 + 1) if real_out else min(m, n)
    c_t, s_t = _twiddles(ctx, x.dtype, j_in, k_out, n, inverse, real_out)
    cplx = x.shape[-1] == 2
    r = te.reduce_axis(j_in, name="rj")
    sign = 1.0 if inverse else -1.0  # e^{-i theta} forward, e^{+i theta} inverse

    def body(*idx: IterVar) -> Expr:
        src = list(idx)
        src[axis] = r
        xr = x[(*src[:-1], 0)]
        xi = x[(*src[:-1], 1)] if cplx else None
        c, s = c_t[r, idx[axis]], s_t[r, idx[axis]]
        re = xr * c - xi * s * sign if xi is not None else xr * c
        im = (xi * c if xi is not None else 0.0) + xr * s * sign
        if real_out:
            return te.sum(re, axis=r)
        return te.sum(te.where(te.equal(idx[-1], 0), re, im), axis=r)

    shape = list(x.shape)
    shape[axis], shape[-1] = k_out, 1 if real_out else 2
    return [ctx.compute(shape, body, "dft")]


@register_op("STFT")
def _stft(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The short-time Fourier transform: frames of ``frame_length`` every ``frame_step``
    samples, weighted by ``window`` (ones when absent), each a DFT against twiddle tables
    (``onesided``: the first ``n // 2 + 1`` frequencies). (B, L, 1|2) -> (B, frames, K, 2)."""
    x = ctx.tensor(ins[0])
    step = int(np.asarray(host_value(ctx, node, ins[1], "frame_step")).reshape(-1)[0])
    win = ctx.tensor(ins[2]) if optional_input(ins, 2) is not None else None
    if optional_input(ins, 3) is not None:
        n = int(np.asarray(host_value(ctx, node, ins[3], "frame_length")).reshape(-1)[0])
    else:
        n = win.shape[0] if win is not None else x.shape[1]
    if x.ndim != 3 or x.shape[2] not in (1, 2) or step < 1 or n > x.shape[1]:
        raise ExpressionError(
            f"STFT: signal {x.shape} must be (B, L, 1|2) with frames of {n} <= L every "
            f"{step} >= 1 samples"
        )
    if win is not None and win.shape != (n,):
        raise ExpressionError(f"STFT: window {win.shape} is not one weight per sample ({n})")
    onesided = bool(int(at.get("onesided", 1)))
    k_out = n // 2 + 1 if onesided else n
    frames = 1 + (x.shape[1] - n) // step
    c_t, s_t = _twiddles(ctx, x.dtype, n, k_out, n, False, False)
    r = te.reduce_axis(n, name="rj")
    cplx = x.shape[2] == 2

    def body(b: IterVar, f: IterVar, k: IterVar, part: IterVar) -> Expr:
        t = f * step + r
        w = win[r] if win is not None else None
        xr = x[b, t, 0] if w is None else x[b, t, 0] * w
        xi = (x[b, t, 1] if w is None else x[b, t, 1] * w) if cplx else None
        c, s = c_t[r, k], s_t[r, k]
        re = xr * c + xi * s if xi is not None else xr * c
        im = (xi * c if xi is not None else 0.0) - xr * s
        return te.sum(te.where(te.equal(part, 0), re, im), axis=r)

    return [ctx.compute((x.shape[0], frames, k_out, 2), body, "stft")]


@register_op("Col2Im")
def _col2im(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The inverse of an unfold: each image element sums the columns' entries of the block
    offsets that land on it (a gather with static block offsets: an offset lands where
    ``pixel + pad - offset * dilation`` is a multiple of the stride inside the positions)."""
    x = ctx.tensor(ins[0])
    image = ints_of(host_value(ctx, node, ins[1], "image_shape"))
    block = ints_of(host_value(ctx, node, ins[2], "block_shape"))
    nd = len(image)
    dil = [int(v) for v in at.get("dilations", [1] * nd)]
    st = [int(v) for v in at.get("strides", [1] * nd)]
    pads = [int(v) for v in at.get("pads", [0] * (2 * nd))]
    lo, hi = pads[:nd], pads[nd:]
    pos = [(image[d] + lo[d] + hi[d] - dil[d] * (block[d] - 1) - 1) // st[d] + 1 for d in range(nd)]
    nb = math.prod(block)
    if x.ndim != 3 or x.shape[1] % nb or x.shape[2] != math.prod(pos) or min(pos) < 1:
        raise ExpressionError(
            f"Col2Im: input {x.shape} must be (N, C*{nb}, {math.prod(pos)}) for image {image}, "
            f"block {block}, pads {pads}, strides {st}, dilations {dil}"
        )
    chans = x.shape[1] // nb
    blocks = list(itertools.product(*[range(b) for b in block]))

    def body(n: IterVar, c: IterVar, *pix: IterVar) -> Expr:
        total: Expr | None = None
        for off, bo in enumerate(blocks):
            conds, col = [], as_expr(0)
            for d in range(nd):
                t = pix[d] + (lo[d] - bo[d] * dil[d])
                if st[d] > 1:
                    conds.append(te.equal(t % st[d], 0))
                conds += [t >= 0, t < pos[d] * st[d]]
                col = col * pos[d] + (t // st[d] if st[d] > 1 else t)
            ok = conds[0]
            for cc in conds[1:]:
                ok = ok & cc
            v = te.where(ok, x[n, c * nb + off, col], 0.0)
            total = v if total is None else total + v
        assert total is not None
        return total

    return [ctx.compute((x.shape[0], chans, *image), body, "col2im")]
