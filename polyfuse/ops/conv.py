"""Contractions and windows: matmul, convolutions (``conv2d``, N-d ``conv``,
``conv_transpose``) and 2-d max / average pooling."""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.ops._common import (
    affine_expr,
    all_of,
    as_operand,
    bcast,
    broadcast_shape,
    compute_op,
    desc,
    int_pair,
    op_name,
)


def _check_dtype(op: str, name: str, dtype: str | None) -> None:
    """An unknown ``dtype`` of an op's products refused, naming the op."""
    if dtype is not None and dtype not in dt.DTYPES:
        raise ExpressionError(f"{op} '{name}': unknown dtype {dtype!r}")


def matmul(a: Tensor, b: Tensor, name: str | None = None, dtype: str | None = None) -> Tensor:
    """Matrix product with ``np.matmul`` semantics; one primitive (a sum over ``k``).

    ``a``: ``(..., M, K)``, ``b``: ``(..., K, N)`` -> ``(..., M, N)``, batch dims broadcast. A 1-D
    ``a`` is a row vector ``(K,)`` and a 1-D ``b`` a column vector; their unit dim is dropped.
    ``dtype``: both factors converted to it first, the products summed in it (``"int32"`` for
    int8/uint8 operands: the exact integer GEMM of quantized models, on ``m16n8k32`` tensor
    cores; without it a byte product wraps at 8 bits, as numpy's and torch's do).
    """
    op = "matmul"
    name = op_name(op, name)
    a = as_operand(op, name, "first operand", a)
    b = as_operand(op, name, "second operand", b)
    _check_dtype(op, name, dtype)
    if a.ndim == 0 or b.ndim == 0:
        raise ExpressionError(f"{op} '{name}': operands {desc(a)} and {desc(b)} must be >= 1-D")
    a2 = a.shape if a.ndim >= 2 else (1, *a.shape)
    b2 = b.shape if b.ndim >= 2 else (*b.shape, 1)
    m, ka = a2[-2:]
    kb, n = b2[-2:]
    if ka != kb:
        raise ExpressionError(
            f"{op} '{name}': inner dimensions differ: {desc(a)} has K={ka}, {desc(b)} has K={kb}"
        )
    try:
        batch = broadcast_shape(op, name, [(a2[:-2], a.name), (b2[:-2], b.name)])
    except ExpressionError:
        raise ExpressionError(
            f"{op} '{name}': batch dims of {desc(a)} and {desc(b)} do not broadcast"
        ) from None
    nb = len(batch)
    shape = (*batch, *((m,) if a.ndim >= 2 else ()), *((n,) if b.ndim >= 2 else ()))
    k = te.reduce_axis(ka, name="k")

    def body(*idx: IterVar) -> Expr:
        bidx = idx[:nb]
        rest = list(idx[nb:])
        i = rest.pop(0) if a.ndim >= 2 else None
        j = rest.pop(0) if b.ndim >= 2 else None
        asub = (*bcast(a2[:-2], bidx), i, k) if a.ndim >= 2 else (k,)
        bsub = (*bcast(b2[:-2], bidx), k, j) if b.ndim >= 2 else (k,)
        if dtype is None:
            return te.sum(a[asub] * b[bsub], axis=k)
        return te.sum(te.cast(a[asub], dtype) * te.cast(b[bsub], dtype), axis=k)

    return compute_op(shape, body, name, op)


def _window(
    o: Expr, r: Expr, stride: int, dil: int, pad_lo: int, out_n: int, k: int, n: int
) -> tuple[Expr, list[Expr]]:
    """Input index ``o*stride + r*dil - pad_lo`` and the guards it needs to stay in ``[0, n)``."""
    i = affine_expr(o, stride, [(r, dil)], -pad_lo)
    conds: list[Expr] = []
    if pad_lo > 0:
        conds.append(i >= 0)
    if (out_n - 1) * stride + (k - 1) * dil - pad_lo >= n:
        conds.append(i < n)
    return i, conds


def _product(xv: Expr, wv: Expr, conds: list[Expr], axes: list, dtype: str | None) -> Expr:
    """A convolution's sum of ``x * w`` over ``axes``, ``x`` zero outside ``conds`` (padding),
    both factors converted to ``dtype`` first where one is given."""
    if dtype is not None:
        xv, wv = te.cast(xv, dtype), te.cast(wv, dtype)
    cond = all_of(conds)
    if cond is not None:
        xv = te.where(cond, xv, 0 if dt.is_int(xv.dtype) else 0.0)  # an int conv stays int
    return te.sum(xv * wv, axis=axes)


def conv2d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    name: str | None = None,
    dtype: str | None = None,
) -> Tensor:
    """2-D convolution (cross-correlation) like ``torch.nn.functional.conv2d``.

    ``x``: ``(N, C, H, W)``, ``w``: ``(O, C // groups, KH, KW)``, ``bias``: ``(O,)`` -> ``(N, O,
    OH, OW)`` with ``OH = (H + 2*ph - dh*(KH-1) - 1) // sh + 1``. Zero padding is a ``te.where``
    guard on the loop variables (subscripts stay affine). One primitive (a sum over input
    channel and kernel window), plus one for the bias add (the conv is then ``f"{name}_conv"``).
    ``dtype``: both factors converted to it first, the products summed in it (``"int32"`` for
    int8/uint8 operands: a quantized model's exact integer convolution, on ``m16n8k32`` tensor
    cores), as :func:`matmul`'s.
    """
    op = "conv2d"
    name = op_name(op, name)
    x = as_operand(op, name, "input", x)
    w = as_operand(op, name, "weight", w)
    if x.ndim != 4 or w.ndim != 4:
        raise ExpressionError(
            f"{op} '{name}': input {desc(x)} must be NCHW and weight {desc(w)} OIHW (4-D)"
        )
    _check_dtype(op, name, dtype)
    sh, sw = int_pair(op, name, "stride", stride, 1)
    ph, pw = int_pair(op, name, "padding", padding, 0)
    dh, dw = int_pair(op, name, "dilation", dilation, 1)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups:
        raise ExpressionError(
            f"{op} '{name}': groups={groups!r} must divide the input channels of {desc(x)} "
            f"and the output channels of {desc(w)}"
        )
    if cg * groups != c:
        raise ExpressionError(
            f"{op} '{name}': input {desc(x)} has {c} channels but weight {desc(w)} with "
            f"groups={groups} expects {cg * groups}"
        )
    if bias is not None:
        as_operand(op, name, "bias", bias)
        if bias.shape != (o,):
            raise ExpressionError(f"{op} '{name}': bias {desc(bias)} must have shape ({o},)")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ExpressionError(
            f"{op} '{name}': kernel {desc(w)} does not fit input {desc(x)} "
            f"with padding {(ph, pw)} and dilation {(dh, dw)}"
        )
    og = o // groups
    rc = te.reduce_axis(cg, name="rc")
    rh = te.reduce_axis(kh, name="rh")
    rw = te.reduce_axis(kw, name="rw")

    def body(b: IterVar, oc: IterVar, y: IterVar, xx: IterVar) -> Expr:
        ih, ch = _window(y, rh, sh, dh, ph, oh, kh, h)
        iw, cw = _window(xx, rw, sw, dw, pw, ow, kw, wd)
        chan: Expr = (
            rc if groups == 1 else affine_expr(oc if og == 1 else oc // og, cg, [(rc, 1)], 0)
        )
        return _product(x[b, chan, ih, iw], w[oc, rc, rh, rw], ch + cw, [rc, rh, rw], dtype)

    shape = (n, o, oh, ow)
    if bias is None:
        return compute_op(shape, body, name, op)
    conv = compute_op(shape, body, f"{name}_conv", op)
    return compute_op(shape, lambda b, oc, y, xx: conv[b, oc, y, xx] + bias[oc], name, op)


def _ints_n(op: str, name: str, what: str, v: int | Sequence[int], nd: int, lo: int) -> list[int]:
    p = [v] * nd if isinstance(v, int) else list(v)
    if len(p) != nd or not all(isinstance(e, int) and e >= lo for e in p):
        raise ExpressionError(f"{op} '{name}': {what} {v!r} must be {nd} ints >= {lo}")
    return [int(e) for e in p]


def _conv_args(op: str, name: str, x, w, weight_layout: str, stride, dilation, pads):
    """The checked operands and geometry of a convolution: ``(x, w, spatial dims, strides,
    dilations, pads before, pads after)``; ``pads`` is an int or ``2 * nd`` ints."""
    x = as_operand(op, name, "input", x)
    w = as_operand(op, name, "weight", w)
    nd = x.ndim - 2
    if nd < 1 or w.ndim != x.ndim:
        raise ExpressionError(
            f"{op} '{name}': input {desc(x)} must be (N, C, *spatial) and weight {desc(w)} "
            f"{weight_layout} of the same rank"
        )
    st = _ints_n(op, name, "stride", stride, nd, 1)
    dl = _ints_n(op, name, "dilation", dilation, nd, 1)
    pp = [pads] * (2 * nd) if isinstance(pads, int) else [int(v) for v in pads]
    if len(pp) != 2 * nd:
        raise ExpressionError(f"{op} '{name}': pads {pads!r} must hold {2 * nd} ints")
    return x, w, nd, st, dl, pp[:nd], pp[nd:]


def conv(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    pads: Sequence[int] | int = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    name: str | None = None,
    dtype: str | None = None,
) -> Tensor:
    """N-D convolution (cross-correlation), ONNX ``Conv`` semantics, any number of spatial dims.

    ``x``: ``(N, C, *S)``, ``w``: ``(O, C // groups, *K)``, ``bias``: ``(O,)``. ``pads`` is an
    int or ONNX-style ``[lo_0, .., lo_{d-1}, hi_0, .., hi_{d-1}]`` (negative pads crop). Output
    size per dim: ``(S + lo + hi - dil*(K-1) - 1) // stride + 1``. The input subscript
    ``o*stride + r*dil - lo`` is affine; padding is a ``te.where`` guard. ``dtype``: the
    factors' conversion and the products' sum (``"int32"`` for int8/uint8), as
    :func:`conv2d`'s.
    """
    op = "conv"
    name = op_name(op, name)
    x, w, nd, st, dl, lo, hi = _conv_args(
        op, name, x, w, "(O, C/groups, *kernel)", stride, dilation, pads
    )
    _check_dtype(op, name, dtype)
    n, c, *sp = x.shape
    o, cg, *k = w.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups or cg * groups != c:
        raise ExpressionError(
            f"{op} '{name}': groups={groups!r} must divide the channels of input {desc(x)} and "
            f"weight {desc(w)} with weight.shape[1] * groups == {c}"
        )
    if bias is not None:
        as_operand(op, name, "bias", bias)
        if bias.shape != (o,):
            raise ExpressionError(f"{op} '{name}': bias {desc(bias)} must have shape ({o},)")
    out = [(sp[i] + lo[i] + hi[i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    if any(v <= 0 for v in out):
        raise ExpressionError(
            f"{op} '{name}': kernel {desc(w)} does not fit input {desc(x)} with pads "
            f"{lo + hi} and dilation {dl}"
        )
    og = o // groups
    rc = te.reduce_axis(cg, name="rc")
    rs = [te.reduce_axis(kk, name=f"rk{i}") for i, kk in enumerate(k)]

    def body(*idx: IterVar) -> Expr:
        b, oc, ys = idx[0], idx[1], idx[2:]
        subs: list[Expr] = []
        conds: list[Expr] = []
        for i in range(nd):
            e, cs = _window(ys[i], rs[i], st[i], dl[i], lo[i], out[i], k[i], sp[i])
            subs.append(e)
            conds += cs
        chan: Expr = (
            rc if groups == 1 else affine_expr(oc if og == 1 else oc // og, cg, [(rc, 1)], 0)
        )
        return _product(x[(b, chan, *subs)], w[(oc, rc, *rs)], conds, [rc, *rs], dtype)

    shape = (n, o, *out)
    if bias is None:
        return compute_op(shape, body, name, op)
    cv = compute_op(shape, body, f"{name}_conv", op)
    return compute_op(shape, lambda *i: cv[i] + bias[i[1]], name, op)


def conv_transpose(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    pads: Sequence[int] | int = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    output_padding: int | Sequence[int] = 0,
    output_shape: Sequence[int] | None = None,
    name: str | None = None,
) -> Tensor:
    """N-D transposed convolution, ONNX ``ConvTranspose`` semantics (``w``: ``(C, O/groups, *K)``).

    Built from affine pieces: the input with ``stride - 1`` zeros inserted between elements
    (``j % s == 0`` guard, ``j // s`` subscript: quasi-affine), the kernel flipped and its in/out
    channels swapped per group, and a stride-1 :func:`conv` with dilation ``dil`` and padding
    ``dil*(K-1) - lo`` before and ``dil*(K-1) - hi + output_padding`` after. Output size per dim:
    ``stride*(S-1) + output_padding + dil*(K-1) + 1 - lo - hi`` (or ``output_shape``).
    """
    op = "conv_transpose"
    name = op_name(op, name)
    x, w, nd, st, dl, lo, hi = _conv_args(
        op, name, x, w, "(C, O/groups, *kernel)", stride, dilation, pads
    )
    opad = _ints_n(op, name, "output_padding", output_padding, nd, 0)
    n, c, *sp = x.shape
    cw, og, *k = w.shape
    if cw != c or not isinstance(groups, int) or groups < 1 or c % groups:
        raise ExpressionError(
            f"{op} '{name}': weight {desc(w)} must have {c} input channels (input {desc(x)}) "
            f"divisible by groups={groups!r}"
        )
    full = [st[i] * (sp[i] - 1) + opad[i] + dl[i] * (k[i] - 1) + 1 for i in range(nd)]
    if output_shape is not None:
        hi = [full[i] - lo[i] - int(output_shape[i]) for i in range(nd)]
    cg = c // groups
    if any(s_ > 1 for s_ in st):
        size = [(sp[i] - 1) * st[i] + 1 for i in range(nd)]

        def dilate(*idx: IterVar) -> Expr:
            b, ch, j = idx[0], idx[1], idx[2:]
            subs = [j[i] if st[i] == 1 else j[i] // st[i] for i in range(nd)]
            conds = [te.equal(j[i] % st[i], 0) for i in range(nd) if st[i] > 1]
            v: Expr = x[(b, ch, *subs)]
            cond = all_of(conds)
            return v if cond is None else te.where(cond, v, 0.0)

        x = compute_op((n, c, *size), dilate, f"{name}_zero_insert", op)

    def flip(*idx: IterVar) -> Expr:
        oc, ic, r = idx[0], idx[1], idx[2:]
        g_in: Expr = ic if groups == 1 else affine_expr(oc // og, cg, [(ic, 1)], 0)
        g_out: Expr = oc if groups == 1 else oc % og
        return w[(g_in, g_out, *[(k[i] - 1) - r[i] for i in range(nd)])]

    wf = compute_op((og * groups, cg, *k), flip, f"{name}_flipped", op)
    cpads = [dl[i] * (k[i] - 1) - lo[i] for i in range(nd)]
    cpads += [dl[i] * (k[i] - 1) - hi[i] + opad[i] for i in range(nd)]
    return conv(x, wf, bias, 1, cpads, dl, groups, name=name)


def _pool_setup(
    op: str,
    name: str,
    x: Tensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None,
    padding: int | Sequence[int],
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> tuple[Tensor, _Window, tuple[int, ...]]:
    x = as_operand(op, name, "input", x)
    if x.ndim < 2:
        raise ExpressionError(f"{op} '{name}': input {desc(x)} needs two spatial (last) dims")
    k = int_pair(op, name, "kernel", kernel, 1)
    s = k if stride is None else int_pair(op, name, "stride", stride, 1)
    p = int_pair(op, name, "padding", padding, 0)
    d = int_pair(op, name, "dilation", dilation, 1)
    span = tuple((kk - 1) * dd + 1 for kk, dd in zip(k, d, strict=True))
    if p[0] > span[0] // 2 or p[1] > span[1] // 2:
        raise ExpressionError(f"{op} '{name}': padding {p} must be at most half the kernel {k}")
    out_hw = []
    for n, pp, sp, ss in zip(x.shape[-2:], p, span, s, strict=True):
        o = (n + 2 * pp - sp + (ss - 1 if ceil_mode else 0)) // ss + 1
        if ceil_mode and (o - 1) * ss >= n + pp:  # the last window must start inside
            o -= 1
        out_hw.append(o)
    if builtins.min(out_hw) <= 0:
        raise ExpressionError(
            f"{op} '{name}': kernel {k} does not fit input {desc(x)} with padding {p}"
        )
    return x, _Window(k, s, p, d), (*x.shape[:-2], *out_hw)


@dataclass(frozen=True)
class _Window:
    """A pooling window: kernel, stride, padding and dilation per spatial dim."""

    k: tuple[int, int]
    s: tuple[int, int]
    p: tuple[int, int]
    d: tuple[int, int]


def _pool_read(
    x: Tensor,
    idx: Sequence[Expr],
    rh: IterVar,
    rw: IterVar,
    win: _Window,
    out_shape: tuple[int, ...],
    fill: float,
) -> Expr:
    h, w = x.shape[-2:]
    k, s, p, d = win.k, win.s, win.p, win.d
    ih, ch = _window(idx[-2], rh, s[0], d[0], p[0], out_shape[-2], k[0], h)
    iw, cw = _window(idx[-1], rw, s[1], d[1], p[1], out_shape[-1], k[1], w)
    v: Expr = x[(*idx[:-2], ih, iw)]
    cond = all_of(ch + cw)
    return v if cond is None else te.where(cond, v, fill)


def max_pool2d(
    x: Tensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    name: str | None = None,
    *,
    dilation: int | Sequence[int] = 1,
    ceil_mode: bool = False,
) -> Tensor:
    """Max pooling over the last two dims (NCHW), like ``torch.nn.functional.max_pool2d``.

    ``stride`` defaults to ``kernel``; padding (at most half the dilated kernel) reads as
    ``-inf``; output size ``(H + 2p - d(k-1) - 1) // s + 1``, rounded up with ``ceil_mode``
    (a last window that would start in the right padding is dropped, as torch). One
    primitive.
    """
    op = "max_pool2d"
    name = op_name(op, name)
    x, win, shape = _pool_setup(op, name, x, kernel, stride, padding, dilation, ceil_mode)
    rh = te.reduce_axis(win.k[0], name="rh")
    rw = te.reduce_axis(win.k[1], name="rw")
    return compute_op(
        shape,
        lambda *i: te.max(_pool_read(x, i, rh, rw, win, shape, -math.inf), axis=[rh, rw]),
        name,
        op,
    )


def avg_pool2d(
    x: Tensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    count_include_pad: bool = True,
    name: str | None = None,
    *,
    ceil_mode: bool = False,
    divisor_override: int | None = None,
) -> Tensor:
    """Average pooling over the last two dims (NCHW), like ``torch.nn.functional.avg_pool2d``.

    Padding reads as 0. The divisor of each window: ``divisor_override`` where given; else
    with ``count_include_pad=True`` its elements inside the padded input (``kh*kw``, less
    for a ``ceil_mode`` window that overhangs the right padding, as torch), otherwise its
    in-bounds elements. Two primitives: the window sum (``f"{name}_sum"``) and the division.
    """
    op = "avg_pool2d"
    name = op_name(op, name)
    x, win, shape = _pool_setup(op, name, x, kernel, stride, padding, 1, ceil_mode)
    k, s, p = win.k, win.s, win.p
    rh = te.reduce_axis(k[0], name="rh")
    rw = te.reduce_axis(k[1], name="rw")
    total = compute_op(
        shape,
        lambda *i: te.sum(_pool_read(x, i, rh, rw, win, shape, 0.0), axis=[rh, rw]),
        f"{name}_sum",
        op,
    )
    h, w = x.shape[-2:]

    def count(o: Expr, kk: int, ss: int, pp: int, n: int, out_n: int) -> Expr | int:
        """Elements of window ``o`` inside ``[0, n)`` (with the padding: ``[-pp, n + pp)``)."""
        lo = affine_expr(o, ss, (), -pp)
        hi = affine_expr(o, ss, (), kk - pp)
        top = n + pp if count_include_pad else n
        clip_lo = pp > 0 and not count_include_pad
        clip_hi = (out_n - 1) * ss + kk - pp > top
        if not clip_lo and not clip_hi:
            return kk
        e_hi = te.minimum(hi, top) if clip_hi else hi
        e_lo = te.maximum(lo, 0) if clip_lo else lo
        return e_hi - e_lo

    def body(*i: IterVar) -> Expr:
        if divisor_override:
            return total[i] / float(divisor_override)
        ch = count(i[-2], k[0], s[0], p[0], h, shape[-2])
        cw = count(i[-1], k[1], s[1], p[1], w, shape[-1])
        if isinstance(ch, int) and isinstance(cw, int):
            return total[i] / float(ch * cw)
        return total[i] / te.cast(as_expr(ch) * cw, "float32")

    return compute_op(shape, body, name, op)
