"""ONNX layout operators: reshapes, transposes, slices, pads, gathers, depth/space, Trilu,
Einsum."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import onnx

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    bidx,
    bshape,
    host_value,
    ints_of,
    norm_axes,
    register_op,
    reshape_to,
)


@register_op("Reshape")
def _reshape(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    shape = ints_of(host_value(ctx, node, ins[1], "shape")) if len(ins) > 1 else list(at["shape"])
    allowzero = int(at.get("allowzero", 0))
    dims = [x.shape[i] if (s == 0 and not allowzero) else s for i, s in enumerate(shape)]
    if -1 in dims:
        known = math.prod(v for v in dims if v != -1)
        dims[dims.index(-1)] = math.prod(x.shape) // known
    return [reshape_to(ctx, x, dims)]


@register_op("Flatten")
def _flatten(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    ax = int(at.get("axis", 1))
    ax = ax + len(x.shape) if ax < 0 else ax  # -1 is the last axis (not ndim)
    return [reshape_to(ctx, x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])))]


def _axes_arg(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        return ints_of(host_value(ctx, node, ins[1], "axes"))
    return None if "axes" not in at else list(at["axes"])


@register_op("Squeeze")
def _squeeze(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    axes = _axes_arg(ctx, node, ins, at)
    nd = len(x.shape)
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    axes = norm_axes(axes, nd)
    return [reshape_to(ctx, x, [s for i, s in enumerate(x.shape) if i not in axes])]


@register_op("Unsqueeze")
def _unsqueeze(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    axes = _axes_arg(ctx, node, ins, at) or []
    nd = len(x.shape) + len(axes)
    axes = norm_axes(axes, nd)
    it = iter(x.shape)
    return [reshape_to(ctx, x, [1 if i in axes else next(it) for i in range(nd)])]


@register_op("Transpose")
def _transpose(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    perm = at.get("perm")
    return [ops.transpose(x, None if perm is None else list(perm), name=ctx.fresh("transpose"))]


@register_op("Concat")
def _concat(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    vals = [ctx.tensor(v) for v in ins if v is not None and math.prod(v.shape) > 0]
    if len(vals) == 1:
        return [vals[0]]
    return [ops.concat(vals, axis=int(at["axis"]), name=ctx.fresh("concat"))]


def _slice(ctx: Ctx, x: Tensor, starts, ends, axes, steps) -> Tensor:  # noqa: ANN001
    begin = [0] * x.ndim
    step = [1] * x.ndim
    shape = list(x.shape)
    for a, st, en, sp in zip(axes, starts, ends, steps, strict=True):
        a = a % x.ndim
        n = x.shape[a]
        if sp == 0:
            raise ExpressionError("Slice step 0")
        st = st + n if st < 0 else st
        en = en + n if en < 0 else en
        if sp > 0:
            st, en = min(max(st, 0), n), min(max(en, 0), n)
            length = max(0, -(-(en - st) // sp))
        else:
            st, en = min(max(st, 0), n - 1), min(max(en, -1), n - 1)
            length = max(0, -(-(st - en) // -sp))
        if length <= 0:  # an empty result has no data: a host constant
            shape[a] = 0
            continue
        begin[a], step[a], shape[a] = st, sp, length
    if 0 in shape:
        return np.zeros(shape, dtype=dtypes.numpy_dtype(x.dtype))  # type: ignore[return-value]

    def body(*idx: IterVar) -> Expr:
        subs = []
        for i, k, b in zip(idx, step, begin, strict=True):
            e: Expr = i if k == 1 else i * k
            subs.append(e + b if b else e)
        return x[tuple(subs)]

    return ctx.compute(shape, body, "slice")


@register_op("Slice")
def _slice_op(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    if len(ins) > 1:
        starts = ints_of(host_value(ctx, node, ins[1], "starts"))
        ends = ints_of(host_value(ctx, node, ins[2], "ends"))
        axes = (
            ints_of(host_value(ctx, node, ins[3], "axes"))
            if len(ins) > 3 and ins[3] is not None
            else list(range(len(starts)))
        )
        steps = (
            ints_of(host_value(ctx, node, ins[4], "steps"))
            if len(ins) > 4 and ins[4] is not None
            else [1] * len(starts)
        )
    else:
        starts, ends = list(at["starts"]), list(at["ends"])
        axes = list(at.get("axes", range(len(starts))))
        steps = [1] * len(starts)
    big = 2**62
    starts = [max(min(s, big), -big) for s in starts]
    ends = [max(min(e, big), -big) for e in ends]
    return [_slice(ctx, x, starts, ends, axes, steps)]


@register_op("Split")
def _split(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", 0)) % x.ndim
    nout = len(node.output)
    if len(ins) > 1 and ins[1] is not None:
        sizes = ints_of(host_value(ctx, node, ins[1], "split"))
    elif "split" in at:
        sizes = list(at["split"])
    else:
        n = x.shape[ax]
        nparts = int(at.get("num_outputs", nout))
        chunk = -(-n // nparts)
        sizes = [min(chunk, n - i * chunk) for i in range(nparts)]
    outs: list[Value] = []
    off = 0
    for sz in sizes:
        outs.append(_slice(ctx, x, [off], [off + sz], [ax], [1]))
        off += sz
    return outs


@register_op("Pad")
def _pad(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    mode = at.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise UnsupportedOpError(f"Pad mode '{mode}'")
    if len(ins) > 1:
        pads = ints_of(host_value(ctx, node, ins[1], "pads"))
        value = (
            host_value(ctx, node, ins[2], "constant_value").reshape(-1)[0].item()
            if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size
            else 0.0
        )
        axes = (
            norm_axes(ints_of(host_value(ctx, node, ins[3], "axes")), x.ndim)
            if len(ins) > 3 and ins[3] is not None
            else list(range(x.ndim))
        )
    else:
        pads = list(at["pads"])
        value = at.get("value", 0.0)
        axes = list(range(x.ndim))
    na = len(axes)
    pw = [(0, 0)] * x.ndim
    for i, a in enumerate(axes):
        pw[a] = (pads[i], pads[na + i])
    if any(b < 0 or e < 0 for b, e in pw):  # negative pads crop
        x = _slice(
            ctx,
            x,
            [max(-b, 0) for b, _ in pw],
            [x.shape[d] - max(-e, 0) for d, (_, e) in enumerate(pw)],
            list(range(x.ndim)),
            [1] * x.ndim,
        )
        pw = [(max(b, 0), max(e, 0)) for b, e in pw]
    if all(b == 0 and e == 0 for b, e in pw):
        return [x]
    if mode == "constant":
        return [ops.pad(x, pw, value=value, name=ctx.fresh("pad"))]
    for d, (b, e) in enumerate(pw):  # one axis at a time: every read stays affine
        if b or e:
            x = _pad_axis(ctx, x, d, b, e, mode)
    return [x]


def _pad_axis(ctx: Ctx, x: Tensor, d: int, b: int, e: int, mode: str) -> Tensor:
    n = x.shape[d]
    if mode == "reflect" and (b >= n or e >= n):
        raise UnsupportedOpError("reflect Pad wider than the input")
    if mode == "wrap" and (b > n or e > n):
        raise UnsupportedOpError("wrap Pad wider than the input")
    shape = list(x.shape)
    shape[d] = n + b + e

    def at(i: tuple[IterVar, ...], sub: Expr) -> Expr:
        return x[(*i[:d], sub, *i[d + 1 :])]

    def body(*i: IterVar) -> Expr:
        k = i[d]
        mid = at(i, k - b if b else k)
        if mode == "edge":
            lo, hi = at(i, as_expr(0)), at(i, as_expr(n - 1))
        elif mode == "reflect":
            lo, hi = at(i, b - k), at(i, (2 * (n - 1) + b) - k)
        else:
            lo, hi = at(i, k + (n - b)), at(i, k - (b + n))
        v = mid
        if e:
            v = te.where(k < b + n, v, hi)
        if b:
            v = te.where(k >= b, v, lo)
        return v

    return ctx.compute(shape, body, "pad")


@register_op("Expand")
def _expand(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    shape = bshape(x.shape, ints_of(host_value(ctx, node, ins[1], "shape")))
    return [ctx.compute(shape, lambda *i: x[bidx(x.shape, i)], "expand")]


@register_op("Tile")
def _tile(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    reps = ints_of(host_value(ctx, node, ins[1], "repeats"))
    shape = [s * r for s, r in zip(x.shape, reps, strict=True)]

    def body(*i: IterVar) -> Expr:
        return x[tuple(k % s if r > 1 else k for k, s, r in zip(i, x.shape, reps, strict=True))]

    return [ctx.compute(shape, body, "tile")]


@register_op("Dropout")
def _dropout(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if (
        len(ins) > 2
        and ins[2] is not None
        and bool(np.asarray(host_value(ctx, node, ins[2], "mode")))
    ):
        raise UnsupportedOpError("Dropout training_mode=true")
    return [ins[0], np.ones(ins[0].shape, dtype=np.bool_)]


@register_op("Gather")
def _gather(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    data, idx = ins[0], ins[1]
    if isinstance(idx, Tensor):
        return [_gather_runtime(ctx, ctx.tensor(data), idx, int(at.get("axis", 0)))]
    x = ctx.tensor(data)
    ax = int(at.get("axis", 0)) % x.ndim
    ind = np.asarray(idx).astype(np.int64)
    ind = np.where(ind < 0, ind + x.shape[ax], ind)
    flat = ind.reshape(-1)
    if flat.size > 1:
        st = int(flat[1] - flat[0])
        if st == 0 or np.any(np.diff(flat) != st):  # arbitrary constant indices
            return [_gather_runtime(ctx, x, ctx.tensor(ind.astype(np.int32)), ax)]
    else:
        st = 1
    start = int(flat[0])
    n = flat.size
    shape = (*x.shape[:ax], n, *x.shape[ax + 1 :])

    def body(*i: IterVar) -> Expr:
        e: Expr = i[ax] if st == 1 else i[ax] * st
        return x[(*i[:ax], e + start if start else e, *i[ax + 1 :])]

    y = ctx.compute(shape, body, "gather")
    out_shape = (*x.shape[:ax], *ind.shape, *x.shape[ax + 1 :])
    return [reshape_to(ctx, y, out_shape)]


def _gather_runtime(ctx: Ctx, x: Tensor, idx: Tensor, axis: int) -> Tensor:
    """``x`` gathered along ``axis`` by run-time indices (``te.data_index``)."""
    ax = axis % x.ndim
    n = x.shape[ax]
    shape = (*x.shape[:ax], *idx.shape, *x.shape[ax + 1 :])
    q = idx.ndim

    def body(*i: IterVar) -> Expr:
        v = idx[tuple(i[ax : ax + q])]
        sub = te.data_index(te.where(v < 0, v + n, v))
        return x[(*i[:ax], sub, *i[ax + q :])]

    return ctx.compute(shape, body, "gather")


@register_op("Shape")
def _shape(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    s = np.asarray(ins[0].shape, dtype=np.int64)
    start, end = at.get("start", 0), at.get("end")
    return [s[start:end]]


@register_op("Size")
def _size(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [np.asarray(math.prod(ins[0].shape), dtype=np.int64)]


@register_op("DepthToSpace", "SpaceToDepth")
def _depth_space(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    bs = int(at["blocksize"])
    b, c, h, w = x.shape
    mode = at.get("mode", b"DCR")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if node.op_type == "SpaceToDepth":
        y = ops.reshape(x, (b, c, h // bs, bs, w // bs, bs), ctx.fresh("s2d"))
        perm = (0, 1, 3, 5, 2, 4) if mode == "CRD" else (0, 3, 5, 1, 2, 4)
        y = ops.transpose(y, perm, ctx.fresh("s2d"))
        return [ops.reshape(y, (b, c * bs * bs, h // bs, w // bs), ctx.fresh("s2d"))]
    co = c // (bs * bs)
    if mode == "DCR":
        y = ops.reshape(x, (b, bs, bs, co, h, w), ctx.fresh("d2s"))
        y = ops.transpose(y, (0, 3, 4, 1, 5, 2), ctx.fresh("d2s"))
    else:
        y = ops.reshape(x, (b, co, bs, bs, h, w), ctx.fresh("d2s"))
        y = ops.transpose(y, (0, 1, 4, 2, 5, 3), ctx.fresh("d2s"))
    return [ops.reshape(y, (b, co, h * bs, w * bs), ctx.fresh("d2s"))]


@register_op("Trilu")
def _trilu(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The upper (``upper=1``: ``j - i >= k``) or lower (``j - i <= k``) triangle of the last
    two dims, zeros elsewhere: an affine guard."""
    x = ctx.tensor(ins[0])
    k = 0
    if len(ins) > 1 and ins[1] is not None:
        k = int(host_value(ctx, node, ins[1], "k").reshape(-1)[0])
    upper = bool(at.get("upper", 1))
    if x.ndim < 2:
        raise ExpressionError(f"Trilu: input of shape {x.shape} needs two dims")

    def body(*i: IterVar) -> Expr:
        d = i[-1] - i[-2]
        keep = d >= k if upper else d <= k
        return te.where(keep, x[i], te.const(0, x.dtype))

    return [ctx.compute(x.shape, body, "trilu")]


@register_op("Einsum")
def _einsum(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """One te reduction: output letters are loop variables, the others reduce axes; a repeated
    letter in one operand (a diagonal) reuses its variable. Covers matmul, batched matmul,
    transposes, traces and sums."""
    xs = [ctx.tensor(v) for v in ins]
    eq = at["equation"]
    eq = (eq.decode() if isinstance(eq, bytes) else eq).replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(xs):
        raise ExpressionError(
            f"Einsum '{eq}': {len(terms)} operands in the equation, {len(xs)} given"
        )
    free = [ch for ch in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if ch not in eq]
    ell_rank = max(
        (x.ndim - (len(t) - 3) for t, x in zip(terms, xs, strict=True) if "..." in t), default=0
    )
    ell = "".join(free[:ell_rank])
    subs = []
    for t, x in zip(terms, xs, strict=True):
        if "..." in t:
            r = x.ndim - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - r :])
        if len(t) != x.ndim:
            raise ExpressionError(f"Einsum '{eq}': term '{t}' for an operand of rank {x.ndim}")
        subs.append(t)
    sizes: dict[str, int] = {}
    for t, x in zip(subs, xs, strict=True):
        for ch, s in zip(t, x.shape, strict=True):
            if sizes.get(ch, 1) != 1 and s != 1 and sizes[ch] != s:
                raise ExpressionError(f"Einsum '{eq}': '{ch}' has sizes {sizes[ch]} and {s}")
            sizes[ch] = max(sizes.get(ch, 1), s)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        letters = sorted(
            ch for ch in set("".join(subs)) if "".join(subs).count(ch) == 1 and ch not in ell
        )
        out = ell + "".join(letters)
    red = [ch for ch in dict.fromkeys("".join(subs)) if ch not in out]
    raxes = {ch: te.reduce_axis(sizes[ch], name=f"e{ch}") for ch in red}

    def body(*i: IterVar) -> Expr:
        var: dict[str, Expr] = {**dict(zip(out, i, strict=True)), **raxes}
        prod: Expr | None = None
        for t, x in zip(subs, xs, strict=True):
            v = x[
                tuple(
                    as_expr(0) if s == 1 and sizes[ch] != 1 else var[ch]
                    for ch, s in zip(t, x.shape, strict=True)
                )
            ]
            prod = v if prod is None else prod * v
        assert prod is not None
        return te.sum(prod, axis=list(raxes.values())) if raxes else prod

    return [ctx.compute(tuple(sizes[ch] for ch in out), body, "einsum")]


@register_op("CenterCropPad")
def _center_crop_pad(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """Each named axis cropped or zero-padded to its new size, centred (an odd difference
    puts the extra element at the end)."""
    x = ctx.tensor(ins[0])
    want = ints_of(host_value(ctx, node, ins[1], "shape"))
    axes = [a % x.ndim for a in at.get("axes", range(x.ndim))]
    if len(axes) != len(want):
        raise ExpressionError(f"CenterCropPad: shape {want} does not name axes {axes}")
    shape, shift = list(x.shape), [0] * x.ndim
    padded = [a for a, n in zip(axes, want, strict=True) if n > x.shape[a]]
    for a, n in zip(axes, want, strict=True):
        shape[a], shift[a] = (
            n,
            (x.shape[a] - n) // 2 if n < x.shape[a] else -((n - x.shape[a]) // 2),
        )

    def body(*i: IterVar) -> Expr:
        sub = [v + s if s else v for v, s in zip(i, shift, strict=True)]
        conds = [(sub[d] >= 0) & (sub[d] < x.shape[d]) for d in padded]
        v = x[tuple(sub)]
        if conds:  # one guard on the read: every padded axis at once
            ok = conds[0]
            for c in conds[1:]:
                ok = ok & c
            v = te.where(ok, v, 0)
        return v

    return [ctx.compute(shape, body, "center_crop_pad")]
