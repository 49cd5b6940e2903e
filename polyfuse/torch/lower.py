"""Core ATen operators → polyfuse ops: which FX nodes polyfuse can take, and how.

The torch.compile backend sees FX graphs after AOT autograd has decomposed them to core ATen
(``aten.addmm``, ``aten.native_layer_norm``, ``aten.convolution``, ...). :data:`LOWERINGS`
maps each supported overload to a function building the same computation from
:mod:`polyfuse.ops`; :func:`unsupported_reason` says why a node must stay in PyTorch (an
operator not in the table, a dtype polyfuse lacks, an argument polyfuse does not
implement — an adaptive pool of uneven windows, ...). :func:`lower_graph` turns a
whole FX graph of supported nodes into polyfuse tensors.

Dtypes: nodes whose tensors are float16, bfloat16, float32, float64, uint8, int8, int16, int32,
int64 or bool (:data:`STORED_DTYPES`) are taken. The elementwise operators, comparisons,
``where``, division, casts and reductions follow torch's type promotion (:mod:`.typed`); each
lowered node has the dtype of its FX value (``meta["val"]``), and where a float operator's ops
give another float (``_softmax(half_to_float=True)``, ``sum(dtype=...)``) an explicit
``te.cast`` makes it so — an integer or bool is never converted after the fact. What polyfuse
cannot compute exactly (integer division by a constant 0, ``&`` of integers, a float ``div``
with a rounding mode) and dtypes it lacks (uint16 and wider unsigned, complex, float8) stay in
PyTorch; the backend logs them at WARNING, counted.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from polyfuse import ops, te
from polyfuse.errors import DtypeError, UnsupportedOpError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Tensor
from polyfuse.ops._common import op_name as fresh_name

from . import order, reduce, scatter, typed
from .typed import STORED_DTYPES, te_dtype
from .typed import as_dtype as _as_dtype

__all__ = [
    "LOWERINGS",
    "LoweredGraph",
    "STORED_DTYPES",
    "lower_graph",
    "op_name",
    "te_dtype",
    "unsupported_reason",
]

aten = torch.ops.aten


def op_name(node: torch.fx.Node) -> str:
    """``aten.addmm.default``-style name of a call_function node's target."""
    t = node.target
    if t is operator.getitem:
        return "getitem"
    return str(t)


# --------------------------------------------------------------------------------------------
# Lowerings: (converted args, converted kwargs) -> polyfuse Tensor (or tuple)
# --------------------------------------------------------------------------------------------


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(x.shape)


def _broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    """numpy ``broadcast_to`` as one te.compute (unit dims read at index 0)."""
    shape = tuple(int(s) for s in shape)
    if tuple(x.shape) == shape:
        return x
    off = len(shape) - len(x.shape)

    def body(*i: Any) -> Any:
        return x[tuple(0 if s == 1 else i[off + d] for d, s in enumerate(x.shape))]

    return te.compute(shape, body, name=f"{x.name}_expand")


def _reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
    shape = list(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = math.prod(x.shape) // max(known, 1)
    if tuple(shape) == tuple(x.shape):
        return x
    return ops.reshape(x, shape)


def _axes(x: Tensor, dims: Any) -> list[int] | None:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0) or not x.shape:
        return None
    dims = [dims] if isinstance(dims, int) else list(dims)
    return [d % len(x.shape) for d in dims]


def _addmm(bias: Tensor, a: Tensor, b: Tensor, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    y = ops.matmul(a, b)
    if alpha != 1:
        y = typed.mul(y, alpha)
    if beta == 0:  # torch ignores the bias then, NaN and inf included
        return y
    if beta != 1:
        bias = typed.mul(bias, beta)
    return typed.add(y, bias)


def _opmath(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A normalisation's lowering that computes a float16/bfloat16 input in float32 and
    rounds its result once, as torch's kernels do (their "opmath" type, and inductor's
    upcast): lowered in the 16-bit dtype, every intermediate (the centred values, the
    exponentials) would be rounded too, a unit or two of the result apart from eager."""

    def lower(x: Tensor, *args: Any, **kwargs: Any) -> Any:
        if x.dtype not in dt.HALF_DTYPES:
            return fn(x, *args, **kwargs)
        out = fn(_as_dtype(x, "float32"), *args, **kwargs)
        if isinstance(out, tuple):
            return (_as_dtype(out[0], x.dtype), *out[1:])
        return _as_dtype(out, x.dtype)

    return lower


def _softmax_of(fn: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``aten._softmax``/``_log_softmax``: a 16-bit input computes in float32, its result
    rounded back unless ``half_to_float`` keeps it float32."""

    def lower(x: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
        if not x.shape:  # a scalar: its softmax over dim 0 (or -1) as a 1-element row's
            return _reshape(lower(_reshape(x, [1]), 0, half_to_float), [])
        y = fn(_as_dtype(x, "float32") if x.dtype in dt.HALF_DTYPES else x, axis=dim)
        return y if half_to_float else _as_dtype(y, x.dtype)

    return lower


@_opmath
def _group_norm(x, weight, bias, n, c, hw, groups, eps):
    """``aten.native_group_norm``: a layer norm over each group's channels and positions
    (the input viewed as (N, G, C/G * HW)), then the per-channel scale and shift."""
    shape = x.shape
    y = _reshape(ops.layer_norm(_reshape(x, [n, groups, -1]), axis=-1, eps=eps), shape)
    per_channel = [c] + [1] * (len(shape) - 2)
    if weight is not None:
        y = typed.mul(y, _reshape(weight, per_channel))
    if bias is not None:
        y = typed.add(y, _reshape(bias, per_channel))
    return (y, None, None)


def _var(x, dims=None, *, correction=None, keepdim=False):
    """``aten.var.correction``: the mean of squared deviations over ``dims``, divided by
    (count - correction) as torch does (correction 1 when not given)."""
    dtype = x.dtype
    if dtype in dt.HALF_DTYPES:  # torch's opmath: 16-bit inputs compute in float32
        x = _as_dtype(x, "float32")
    axes = _axes(x, dims) or list(range(len(x.shape)))
    count = math.prod(x.shape[d] for d in axes)
    mean = ops.reduce_mean(x, axis=axes, keepdims=True)
    dev = typed.sub(x, mean)
    total = ops.reduce_sum(typed.mul(dev, dev), axis=axes, keepdims=bool(keepdim))
    dof = count - (1 if correction is None else correction)
    # torch divides by max(0, dof): a zero gives inf, or NaN where every deviation is 0
    return _as_dtype(typed.div(total, dof) if dof > 0 else typed.mul(total, math.inf), dtype)


def _var_mean(x, dims=None, *, correction=None, keepdim=False):
    """``aten.var_mean.correction``: :func:`_var` and the mean over the same dims."""
    mean = x if x.dtype not in dt.HALF_DTYPES else _as_dtype(x, "float32")
    mean = ops.reduce_mean(mean, axis=_axes(x, dims), keepdims=bool(keepdim))
    var = _var(x, dims, correction=correction, keepdim=keepdim)
    return var, _as_dtype(mean, x.dtype)


def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):  # noqa: A002
    """``aten.linalg_vector_norm`` (``F.normalize``, ``cosine_similarity``): ``ord`` 2 the
    root of the sum of squares, 1 the sum of magnitudes, inf/-inf their max/min, 0 the count
    of nonzeros, any other p ``sum(|x|**p) ** (1/p)``; a 16-bit input sums in float32 and
    rounds once (its sum of squares overflows float16 where the root does not), as torch."""
    if dtype is not None:
        x = _as_dtype(x, te_dtype(dtype))
    out = x.dtype
    if out in dt.HALF_DTYPES:
        x = _as_dtype(x, "float32")
    axes, keep, p = _axes(x, dim) or list(range(len(x.shape))), bool(keepdim), float(ord)
    mag = ops.abs(x)
    if math.isinf(p):
        y = reduce.reduce("max" if p > 0 else "min", mag, axes, keep, x.dtype)
    elif p == 0:
        nonzero = typed.elementwise("ne", lambda v: te.cast(te.not_equal(v, 0), x.dtype), [x],
                                    x.dtype)  # fmt: skip
        y = reduce.reduce("sum", nonzero, axes, keep, x.dtype)
    elif p == 1:
        y = reduce.reduce("sum", mag, axes, keep, x.dtype)
    elif p == 2:
        y = ops.sqrt(reduce.reduce("sum", typed.mul(x, x), axes, keep, x.dtype))
    else:
        total = reduce.reduce("sum", typed.pow_(mag, p), axes, keep, x.dtype)
        y = typed.pow_(total, 1.0 / p)
    return _as_dtype(y, out)


def _round_decimals(x, *, decimals=0):
    """``torch.round(x, decimals=d)``: ``rint(x * 10**d) / 10**d`` (for d < 0,
    ``rint(x / 10**-d) * 10**-d``), in ``x``'s dtype, as torch computes it."""
    if decimals == 0:
        return typed.elementwise("round", _round, [x], x.dtype)
    scale = te.const(10.0 ** abs(decimals), x.dtype)
    if decimals > 0:
        return typed.elementwise("round", lambda v: te.round(v * scale) / scale, [x], x.dtype)
    return typed.elementwise("round", lambda v: te.round(v / scale) * scale, [x], x.dtype)


def _diagonal(x, offset=0, dim1=0, dim2=1):
    """``aten.diagonal``: ``dim1`` and ``dim2`` dropped, the diagonal (shifted by ``offset``)
    appended as the last dim: an affine read."""
    n = len(x.shape)
    d1, d2 = dim1 % n, dim2 % n
    r0, c0 = max(0, -offset), max(0, offset)
    length = max(0, min(x.shape[d1] - r0, x.shape[d2] - c0))
    if length == 0:
        raise UnsupportedOpError(f"diagonal of {x.name}: offset {offset} leaves no elements")
    rest = [d for d in range(n) if d not in (d1, d2)]

    def body(*i: Any) -> Any:
        at = dict(zip(rest, i[:-1], strict=True))
        at[d1], at[d2] = i[-1] + r0, i[-1] + c0
        return x[tuple(at[d] for d in range(n))]

    shape = (*(x.shape[d] for d in rest), length)
    return te.compute(shape, body, name=f"{x.name}_diagonal", tag="diagonal")


def _extreme_dim(op: str) -> Callable[..., Any]:
    """``aten.max.dim``/``min.dim``: the extreme values and the first index holding each (a
    NaN is the extreme and its first index the index, as in torch)."""

    def lower(x, dim, keepdim=False):
        values = reduce.reduce(op, x, [dim], bool(keepdim), x.dtype)
        return values, reduce.arg_extreme(op)(x, dim, keepdim)

    return lower


def _flip(x, dims):
    """``aten.flip``: each of ``dims`` read backwards (an affine subscript)."""
    if not x.shape:
        return x
    flipped = {d % len(x.shape) for d in dims}

    def body(*i: Any) -> Any:
        return x[tuple(x.shape[d] - 1 - v if d in flipped else v for d, v in enumerate(i))]

    return te.compute(x.shape, body, name=f"{x.name}_flip", tag="flip")


def _gather(x, dim, index, sparse_grad=False):
    """``aten.gather``: ``out[i] = x[i with i[dim] = index[i]]`` (a data subscript)."""
    ax = dim % len(x.shape)

    def body(*i: Any) -> Any:
        at = te.data_index(index[i])
        return x[tuple(at if d == ax else v for d, v in enumerate(i))]

    return te.compute(index.shape, body, name=f"{x.name}_gather", tag="gather")


def _repeat(x, repeats):
    """``aten.repeat``: ``x`` tiled ``repeats`` times per dim (leading repeats add dims);
    the subscript ``i % size`` is quasi-affine."""
    shape = [1] * (len(repeats) - len(x.shape)) + list(x.shape)
    x = _reshape(x, shape)
    out = [s * r for s, r in zip(shape, repeats, strict=True)]

    def body(*i: Any) -> Any:
        return x[tuple(v % s if r > 1 else v for v, s, r in zip(i, shape, repeats, strict=True))]

    return te.compute(out, body, name=f"{x.name}_repeat", tag="repeat")


@_opmath
def _instance_stats_norm(x, weight, bias, training, momentum, eps):
    """``aten._native_batch_norm_legit.no_stats`` (InstanceNorm, batch norm without running
    statistics): normalised by the biased statistics over every dim but the channels (1)."""
    axes = [d for d in range(len(x.shape)) if d != 1]
    mean = ops.reduce_mean(x, axis=axes, keepdims=True)
    dev = typed.sub(x, mean)
    var = ops.reduce_mean(typed.mul(dev, dev), axis=axes, keepdims=True)
    y = typed.mul(dev, ops.rsqrt(typed.add(var, float(eps))))
    per_channel = [x.shape[1]] + [1] * (len(x.shape) - 2)
    if weight is not None:
        y = typed.mul(y, _reshape(weight, per_channel))
    if bias is not None:
        y = typed.add(y, _reshape(bias, per_channel))
    return (y, None, None)


def _adaptive_pool(kind: str) -> Callable[..., Tensor]:
    """``aten._adaptive_avg_pool2d`` / ``adaptive_max_pool2d`` (its values): output ``i`` of
    ``o`` along an axis of ``n`` covers ``[floor(i n / o), ceil((i + 1) n / o))``; windows of
    different sizes are one reduction over the largest, guarded (quasi-affine bounds), an
    average dividing by its own window's size."""

    def lower(x: Tensor, output_size: Any) -> Any:
        y = _adaptive(x, output_size)
        return y if kind == "avg" else (y, None)  # max: its indices are not computed

    def _adaptive(x: Tensor, output_size: Any) -> Tensor:
        *lead, h, w = x.shape
        oh, ow = (int(v) for v in output_size)
        span = [max(-(-((i + 1) * n) // o) - (i * n) // o for i in range(o))
                for n, o in ((h, oh), (w, ow))]  # fmt: skip
        kh, kw = te.reduce_axis(span[0], name="ah"), te.reduce_axis(span[1], name="aw")

        def bounds(i: Any, n: int, o: int) -> tuple[Any, Any]:
            return (i * n) // o, ((i + 1) * n + o - 1) // o

        def body(*idx: Any) -> Any:
            *b, i, j = idx
            (h0, h1), (w0, w1) = bounds(i, h, oh), bounds(j, w, ow)
            inside = (h0 + kh < h1) & (w0 + kw < w1)
            v = x[(*b, h0 + kh, w0 + kw)]
            if kind == "max":
                return te.max(te.where(inside, v, te.const(-math.inf, x.dtype)), axis=[kh, kw])
            acc = te.sum(te.where(inside, v, 0.0), axis=[kh, kw])
            return acc / te.cast((h1 - h0) * (w1 - w0), "float32")

        return te.compute((*lead, oh, ow), body, name=fresh_name(f"adaptive_{kind}_pool", None))

    return lower


def _constant_pad(x, pad, value=0):
    """``aten.constant_pad_nd``: ``pad`` lists (before, after) from the last dim backwards;
    a negative amount crops."""
    pairs = [(0, 0)] * len(x.shape)
    for k in range(len(pad) // 2):
        pairs[len(x.shape) - 1 - k] = (pad[2 * k], pad[2 * k + 1])
    for d, (b, e) in enumerate(pairs):
        if b < 0 or e < 0:
            x = _slice(x, d, max(-b, 0), x.shape[d] - max(-e, 0))
    return ops.pad(x, [(max(b, 0), max(e, 0)) for b, e in pairs], value)


def _elu(x, alpha=1.0, scale=1.0, input_scale=1.0):
    """``aten.elu`` (selu and celu decompose to it): ``scale * x`` above 0, else
    ``scale * alpha * expm1(input_scale * x)``."""
    neg, pos, inner = float(alpha) * float(scale), float(scale), float(input_scale)

    def body(v: Any) -> Any:
        return te.where(v <= 0, te.expm1(v * inner) * neg, v * pos)

    return typed.elementwise("elu", body, [x], x.dtype)


def _leaky_relu(x, negative_slope=0.01):
    slope = float(negative_slope)
    return typed.elementwise("leaky_relu", lambda v: te.where(v > 0, v, v * slope), [x], x.dtype)


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``aten.native_layer_norm``: a 16-bit input computes in float32 and rounds once inside
    :func:`ops.layer_norm` itself."""
    return (ops.layer_norm(x, weight, bias, axis=-len(normalized_shape), eps=eps), None, None)


def _batch_norm(x, weight, bias, mean, var, momentum, eps):
    return (ops.batch_norm(x, mean, var, weight, bias, eps=eps), None, None)


def _convolution(x, w, bias, stride, padding, dilation, transposed, output_padding, groups):
    """``aten.convolution``: 2-D through :func:`ops.conv2d`; 1-D, 3-D and transposed ones
    through ONNX's :func:`ops.conv`/:func:`ops.conv_transpose` (torch's symmetric padding is
    ONNX's ``pads`` with the same amount before and after; the weight layouts agree)."""
    if not transposed and len(x.shape) == 4:
        return ops.conv2d(
            x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups
        )
    pads = [*padding, *padding]
    if transposed:
        return ops.conv_transpose(
            x, w, bias, stride, pads, dilation, groups, output_padding=list(output_padding)
        )
    return ops.conv(x, w, bias, stride, pads, dilation, groups)


def _grid_sampler(
    x: Tensor, grid: Tensor, interpolation: int, padding: int, align_corners: bool
) -> Tensor:
    """``F.grid_sample`` (``aten.grid_sampler_2d/3d``: 0 bilinear, 1 nearest, 2 bicubic; 0
    zeros, 1 border, 2 reflection) in torch's order of steps."""
    mode = ("linear", "nearest", "cubic")[interpolation]
    pad = ("zeros", "border", "reflection")[padding]
    return ops.grid_sample(x, grid, mode, pad, bool(align_corners), convention="torch")


def _max_pool(x, kernel, stride=(), padding=0, dilation=1, ceil_mode=False):
    y = ops.max_pool2d(
        x, kernel, list(stride) or None, padding, dilation=dilation, ceil_mode=bool(ceil_mode)
    )
    return (y, None)


def _avg_pool(x, kernel, stride=(), padding=0, ceil_mode=False, count_include_pad=True, div=None):
    return ops.avg_pool2d(x, kernel, list(stride) or None, padding, count_include_pad,
                          ceil_mode=bool(ceil_mode), divisor_override=div)  # fmt: skip


def _slice(x, dim=0, start=None, end=None, step=1):
    n = x.shape[dim]
    start = 0 if start is None else start
    end = n if end is None else min(end, n)
    if start == 0 and end >= n and step == 1:
        return x
    return ops.slice(x, [start], [end], [dim % len(x.shape)], [step])


def _select(x, dim, index):
    dim = dim % len(x.shape)
    index = index % x.shape[dim]
    part = ops.slice(x, [index], [index + 1], [dim], [1])
    return _reshape(part, [s for i, s in enumerate(x.shape) if i != dim])


def _split_with_sizes(x, sizes, dim=0):
    out, at = [], 0
    for s in sizes:
        out.append(_slice(x, dim, at, at + s))
        at += s
    return tuple(out)


def _split(x, size, dim=0):
    n = x.shape[dim]
    return _split_with_sizes(x, [min(size, n - i) for i in range(0, n, size)], dim)


def _squeeze(x, dims=None):
    dims = range(len(x.shape)) if dims is None else ([dims] if isinstance(dims, int) else dims)
    drop = {d % len(x.shape) for d in dims if x.shape[d % len(x.shape)] == 1}
    return _reshape(x, [s for i, s in enumerate(x.shape) if i not in drop])


def _unsqueeze(x, dim):
    shape = list(x.shape)
    shape.insert(dim % (len(shape) + 1), 1)
    return _reshape(x, shape)


def _transpose(x, d0, d1):
    perm = list(range(len(x.shape)))
    d0, d1 = d0 % len(perm), d1 % len(perm)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return ops.transpose(x, perm)


def _safe_softmax(x: Tensor, dim: int, dtype: Any = None) -> Tensor:
    """``aten._safe_softmax``: softmax, but a row that is all ``-inf`` (fully masked
    attention) gives zeros instead of NaN; ``dtype`` converts the input first, as torch does."""
    if dtype is not None:
        x = _as_dtype(x, te_dtype(dtype))
    elif x.dtype in dt.HALF_DTYPES:  # torch's opmath: computed in float32, rounded once
        return _as_dtype(_safe_softmax(_as_dtype(x, "float32"), dim), x.dtype)
    ax = dim % len(x.shape)
    y = ops.softmax(x, axis=ax)
    mx = ops.reduce_max(x, axis=[ax], keepdims=True)

    def body(*i: Any) -> Any:
        row = tuple(0 if d == ax else v for d, v in enumerate(i))
        return te.where(te.isinf(mx[row], positive=False), 0.0, y[i])

    return te.compute(y.shape, body, name=f"{y.name}_safe", tag="softmax")


def _round(x: Any) -> Any:
    """``torch.round``: halves to even; an integer is its own rounding."""
    return te.round(x) if x.dtype.startswith(("float", "bfloat")) else x


def _sign(x: Any) -> Any:
    """``torch.sign``: 1, -1 or 0 in ``x``'s dtype (0 for NaN and -0.0, as torch); a bool is
    its own sign."""
    if x.dtype == "bool":
        return x
    return te.cast(te.where(x > 0, 1, te.where(x < 0, -1, 0)), x.dtype)


def _trunc(x: Any) -> Any:
    """``torch.trunc``: toward zero (``floor`` above 0, ``ceil`` below; NaN passes)."""
    return te.where(x < 0, te.ceil(x), te.floor(x))


def _identity(x, *args, **kwargs):
    return x


def _reduce(fn: Callable) -> Callable:
    def lower(x, dims=None, keepdim=False, *, dtype=None):
        if dtype is not None:  # torch converts the input first (sum(x, dtype=torch.float32))
            x = _as_dtype(x, te_dtype(dtype))
        return fn(x, axis=_axes(x, dims), keepdims=bool(keepdim))

    return lower


#: Supported core ATen overloads and how each becomes polyfuse ops.
LOWERINGS: dict[Any, Callable[..., Any]] = {
    aten.add.Tensor: typed.add,
    aten.add.Scalar: typed.add,
    aten.sub.Tensor: typed.sub,
    aten.sub.Scalar: typed.sub,
    aten.rsub.Scalar: typed.rsub,
    aten.rsub.Tensor: typed.rsub,
    aten.mul.Tensor: typed.mul,
    aten.mul.Scalar: typed.mul,
    aten.div.Tensor: typed.div,
    aten.div.Scalar: typed.div,
    aten.div.Tensor_mode: typed.div,
    aten.div.Scalar_mode: typed.div,
    aten.floor_divide.default: lambda a, b: typed.div(a, b, rounding_mode="floor"),
    aten.floor_divide.Scalar: lambda a, b: typed.div(a, b, rounding_mode="floor"),
    aten.remainder.Tensor: typed.remainder,
    aten.remainder.Scalar: typed.remainder,
    aten.fmod.Tensor: typed.fmod,
    aten.fmod.Scalar: typed.fmod,
    aten.pow.Tensor_Scalar: typed.pow_,
    aten.pow.Tensor_Tensor: typed.pow_,
    aten.maximum.default: typed.maximum,
    aten.atan2.default: lambda a, b: typed.elementwise(
        "atan2", te.atan2, [a, b], typed.te_dtype(typed.result_dtype(a, b, int_to_float=True))
    ),
    aten.minimum.default: typed.minimum,
    **{getattr(aten, c).Tensor: typed.compare(c) for c in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{getattr(aten, c).Scalar: typed.compare(c) for c in ("eq", "ne", "lt", "le", "gt", "ge")},
    aten.where.self: typed.where,
    aten.scalar_tensor.default: typed.scalar_tensor,
    aten.full.default: typed.full,
    aten.arange.default: typed.arange,
    aten.arange.start: typed.arange,
    aten.arange.start_step: typed.arange,
    aten.full_like.default: typed.full_like,
    aten.logical_and.default: typed.logical("and"),
    aten.logical_or.default: typed.logical("or"),
    aten.logical_xor.default: typed.logical("xor"),
    aten.logical_not.default: typed.logical("not"),
    aten.bitwise_and.Tensor: typed.bitwise("and"),
    aten.bitwise_and.Scalar: typed.bitwise("and"),
    aten.bitwise_or.Tensor: typed.bitwise("or"),
    aten.bitwise_or.Scalar: typed.bitwise("or"),
    aten.bitwise_xor.Tensor: typed.bitwise("xor"),
    aten.bitwise_xor.Scalar: typed.bitwise("xor"),
    aten.bitwise_not.default: typed.bitwise("not"),
    **{
        getattr(getattr(aten, name), overload): typed.shift(direction)
        for name, direction in (("bitwise_left_shift", "left"), ("bitwise_right_shift", "right"),
                                ("__lshift__", "left"), ("__rshift__", "right"))
        for overload in ("Tensor", "Tensor_Scalar", "Scalar")
        if hasattr(getattr(aten, name), overload)
    },  # fmt: skip
    aten.neg.default: ops.neg,
    aten.exp.default: typed.float_math(ops.exp),
    aten.log.default: typed.float_math(ops.log),
    aten.sqrt.default: typed.float_math(ops.sqrt),
    aten.rsqrt.default: typed.float_math(ops.rsqrt),
    aten.tanh.default: typed.float_math(ops.tanh),
    aten.sigmoid.default: typed.float_math(ops.sigmoid),
    aten.erf.default: typed.float_math(lambda x: typed.elementwise("erf", te.erf, [x], x.dtype)),
    aten.leaky_relu.default: _leaky_relu,
    aten.elu.default: _elu,
    aten.log1p.default: typed.float_math(
        lambda x: typed.elementwise("log1p", te.log1p, [x], x.dtype)
    ),
    aten.expm1.default: typed.float_math(
        lambda x: typed.elementwise("expm1", te.expm1, [x], x.dtype)
    ),
    **{
        getattr(aten, f).default: typed.float_math(
            lambda x, f=f: typed.elementwise(f, getattr(te, f), [x], x.dtype)
        )
        for f in ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh")
        + ("acosh", "atanh", "exp2", "log2", "log10")
    },
    aten.reciprocal.default: typed.float_math(
        lambda x: typed.elementwise("reciprocal", lambda v: 1 / v, [x], x.dtype)
    ),
    aten.isnan.default: lambda x: typed.elementwise("isnan", te.isnan, [x], x.dtype),
    aten.sign.default: lambda x: typed.elementwise("sign", _sign, [x], x.dtype),
    aten.relu.default: typed.relu,
    aten.abs.default: ops.abs,
    aten.floor.default: lambda x: typed.elementwise("floor", te.floor, [x], x.dtype),
    aten.ceil.default: lambda x: typed.elementwise("ceil", te.ceil, [x], x.dtype),
    aten.round.default: lambda x: typed.elementwise("round", _round, [x], x.dtype),
    aten.round.decimals: _round_decimals,
    aten.trunc.default: lambda x: typed.elementwise("trunc", _trunc, [x], x.dtype),
    aten.gelu.default: lambda x, approximate="none": ops.gelu(x, approximate=approximate),
    aten.clamp.default: typed.clamp,
    aten.clamp.Tensor: typed.clamp,
    aten.clamp_min.default: lambda x, lo: typed.clamp(x, lo, None),
    aten.clamp_max.default: lambda x, hi: typed.clamp(x, None, hi),
    aten.hardtanh.default: typed.hardtanh,
    aten.mm.default: ops.matmul,
    aten.bmm.default: ops.matmul,
    # int8 x int8 summed exactly in int32 (m16n8k32 tensor cores)
    aten._int_mm.default: lambda a, b: ops.matmul(a, b, dtype="int32"),
    aten.addmm.default: _addmm,
    aten.permute.default: lambda x, dims: ops.transpose(x, [d % len(x.shape) for d in dims]),
    aten.t.default: lambda x: ops.transpose(x, [1, 0]) if len(x.shape) == 2 else x,
    aten.transpose.int: _transpose,
    aten.view.default: _reshape,
    aten._unsafe_view.default: _reshape,
    aten.reshape.default: _reshape,
    aten.expand.default: lambda x, shape, implicit=False: _broadcast_to(
        x, [x.shape[i - (len(shape) - len(x.shape))] if s == -1 else s for i, s in enumerate(shape)]
    ),
    aten.unsqueeze.default: _unsqueeze,
    aten.squeeze.dim: _squeeze,
    aten.squeeze.dims: _squeeze,
    aten.squeeze.default: _squeeze,
    aten.clone.default: _identity,
    aten.alias.default: _identity,
    aten.detach.default: _identity,
    aten.lift_fresh_copy.default: _identity,  # torch.tensor([...]) in the traced code
    aten._to_copy.default: lambda x, *, dtype=None, **kw: (
        x if dtype is None else _as_dtype(x, te_dtype(dtype))
    ),
    aten.sum.dim_IntList: reduce.sum_,
    aten.cumsum.default: reduce.cumsum,
    aten.cumprod.default: lambda x, dim, *, dtype=None: reduce.cumsum(
        x, dim, dtype=dtype, op="prod"
    ),
    aten.prod.dim_int: lambda x, dim, keepdim=False, *, dtype=None: reduce.sum_(
        x, [dim], keepdim, dtype=dtype, op="prod"
    ),
    aten.prod.default: lambda x, *, dtype=None: reduce.sum_(x, None, False, dtype=dtype, op="prod"),
    aten.sum.default: lambda x, *, dtype=None: reduce.sum_(x, None, False, dtype=dtype),
    aten.mean.dim: _reduce(ops.reduce_mean),
    aten.mean.default: lambda x, *, dtype=None: _reduce(ops.reduce_mean)(x, None, dtype=dtype),
    aten.amax.default: lambda x, dims=(), keepdim=False: reduce.reduce(
        "max", x, dims, keepdim, x.dtype
    ),
    aten.amin.default: lambda x, dims=(), keepdim=False: reduce.reduce(
        "min", x, dims, keepdim, x.dtype
    ),
    aten.max.default: lambda x: reduce.reduce("max", x, None, False, x.dtype),
    aten.min.default: lambda x: reduce.reduce("min", x, None, False, x.dtype),
    aten.max.dim: _extreme_dim("max"),
    aten.min.dim: _extreme_dim("min"),
    aten.var_mean.correction: _var_mean,
    aten.flip.default: _flip,
    aten.repeat.default: _repeat,
    aten.gather.default: _gather,
    aten._native_batch_norm_legit.no_stats: _instance_stats_norm,
    aten._adaptive_avg_pool2d.default: _adaptive_pool("avg"),
    aten.adaptive_max_pool2d.default: _adaptive_pool("max"),
    aten.any.default: reduce.any_all("max"),
    aten.any.dim: reduce.any_all("max"),
    aten.any.dims: reduce.any_all("max"),
    aten.all.default: reduce.any_all("min"),
    aten.all.dim: reduce.any_all("min"),
    aten.all.dims: reduce.any_all("min"),
    aten.index.Tensor: reduce.index,
    aten.index_select.default: reduce.index_select,
    aten.argmax.default: reduce.arg_extreme("max"),
    aten.argmin.default: reduce.arg_extreme("min"),
    aten.embedding.default: lambda w, ids, *args: reduce.index(w, [ids]),
    aten._softmax.default: _softmax_of(ops.softmax),
    aten._log_softmax.default: _softmax_of(ops.log_softmax),
    aten._safe_softmax.default: _safe_softmax,
    aten.native_layer_norm.default: _layer_norm,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten.native_group_norm.default: _group_norm,
    aten.var.correction: _var,
    aten.linalg_vector_norm.default: _vector_norm,
    aten.diagonal.default: _diagonal,
    aten.constant_pad_nd.default: _constant_pad,
    aten.convolution.default: _convolution,
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.grid_sampler_2d.default: _grid_sampler,
    aten.grid_sampler_3d.default: _grid_sampler,
    aten.avg_pool2d.default: _avg_pool,
    aten.cat.default: typed.cat,
    aten.slice.Tensor: _slice,
    aten.select.int: _select,
    aten.split_with_sizes.default: _split_with_sizes,
    aten.split.Tensor: _split,
    operator.getitem: lambda xs, i: xs[i],
    **scatter.LOWERINGS,
    **order.LOWERINGS,
}

#: Multi-output operators of which only output 0 is computed (the others are statistics or
#: indices a forward pass in inference does not use).
_FIRST_OUTPUT_ONLY = {
    aten.native_layer_norm.default,
    aten._native_batch_norm_legit.no_stats,
    aten.native_group_norm.default,
    aten._native_batch_norm_legit_no_training.default,
    aten.max_pool2d_with_indices.default,
    aten.adaptive_max_pool2d.default,
}


def _vals(node: torch.fx.Node) -> list[Any]:
    val = node.meta.get("val")
    if isinstance(val, (list, tuple)):
        return list(val)
    return [val]


def _dtype_reason(dtype: torch.dtype) -> str:
    """Shared by every node of that dtype: polyfuse has no such dtype (uint16 and the other
    unsigned types past uint8, complex, float8; :data:`STORED_DTYPES` lists those it has)."""
    have = ", ".join(str(d).removeprefix("torch.") for d in STORED_DTYPES)
    return f"dtype {str(dtype).removeprefix('torch.')} (polyfuse stores {have})"


#: Why a node reading or writing a tensor of no elements stays in PyTorch: kernels need one
#: (a batch of 0 rows is a shape eager handles for free; there is nothing to fuse).
_EMPTY = "a tensor with no elements"


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """None when polyfuse can compute ``node`` (a call_function), else why it cannot.

    Reasons are short and shared by every node they apply to ("op aten.cumsum.default not
    supported", "dtype float16 not supported yet"), so a report can count nodes per
    reason."""
    if node.op != "call_function":
        return f"{node.op} node"
    target = node.target
    if target not in LOWERINGS:
        return f"op {op_name(node)} not supported"
    if target is operator.getitem:
        src = node.args[0]
        if isinstance(src, torch.fx.Node) and src.target in _FIRST_OUTPUT_ONLY:
            if node.args[1] != 0:
                return f"output {node.args[1]} of {op_name(src)} is not computed"
        return unsupported_reason(src) if isinstance(src, torch.fx.Node) else None
    vals = _vals(node)
    if target in _FIRST_OUTPUT_ONLY:
        vals = vals[:1]
        for user in node.users:
            if user.target is not operator.getitem or user.args[1] != 0:
                return f"an output other than the first of {op_name(node)} is used"
    for v in vals:
        if not isinstance(v, torch.Tensor):
            return "no static tensor metadata"
        if v.dtype not in STORED_DTYPES:
            return _dtype_reason(v.dtype)
        if any(not isinstance(s, int) for s in v.shape):
            return "dynamic shape"
        if v.numel() == 0:
            return _EMPTY
    for a in node.all_input_nodes:
        for v in _vals(a):
            if isinstance(v, torch.Tensor) and v.dtype not in STORED_DTYPES:
                return _dtype_reason(v.dtype)
            if isinstance(v, torch.Tensor) and v.numel() == 0:
                return _EMPTY
    args, kwargs = node.args, node.kwargs
    why = typed.dtype_reason(node)
    if why is not None:
        return why
    if target in scatter.LOWERINGS:
        return scatter.unsupported_reason(node)
    if target in order.LOWERINGS:
        return order.unsupported_reason(node)
    if target is aten._to_copy.default:
        src = _vals(args[0])[0] if isinstance(args[0], torch.fx.Node) else None
        dev = kwargs.get("device")
        if (dev is not None and (src is None or torch.device(dev) != src.device)) or kwargs.get(
            "memory_format"
        ) not in (None, torch.contiguous_format, torch.preserve_format):
            return "a device or memory-format conversion"
        if kwargs.get("layout") not in (None, torch.strided):
            return "a layout conversion"
    return None


# --------------------------------------------------------------------------------------------
# Whole graphs
# --------------------------------------------------------------------------------------------


def _fit(node: torch.fx.Node, out: Tensor, want: torch.dtype) -> Tensor:
    """``out`` in the dtype torch gives. Between floats a ``te.cast`` rounds
    (``_softmax(half_to_float=True)`` of a float16 input is float32); an integer or bool on
    either side would be a wrong lowering, never converted after the fact."""
    dtype = te_dtype(want)
    if out.dtype == dtype:
        return out
    if not (dt.is_float(out.dtype) and dt.is_float(dtype)):
        raise DtypeError(
            f"{op_name(node)} ({node.name}): lowered to {out.dtype} where torch computes "
            f"{dtype}; a lowering that does not follow torch's promotion (a polyfuse bug)"
        )
    return _as_dtype(out, dtype)


def _with_dtypes(node: torch.fx.Node, out: Any) -> Any:
    """``out`` (a lowered node's tensor, or tuple of them) with each tensor in the dtype of the
    FX value it stands for (:func:`_fit`)."""
    vals = _vals(node)
    if isinstance(out, Tensor):
        v = vals[0]
        return _fit(node, out, v.dtype) if isinstance(v, torch.Tensor) else out
    if isinstance(out, tuple):
        return tuple(
            _fit(node, o, v.dtype)
            if isinstance(o, Tensor) and isinstance(v, torch.Tensor) and v.dtype in STORED_DTYPES
            else o
            for o, v in zip(out, vals, strict=False)
        )
    return out


class LoweredGraph:
    """A lowered FX graph: ``inputs`` (one te placeholder per FX placeholder, in order),
    ``outputs`` (distinct polyfuse tensors), and ``structure``: how to rebuild the FX
    graph's output value (a flat list, each entry an index into ``outputs`` or ``("input",
    i)`` for a placeholder returned as is)."""

    def __init__(
        self, inputs: list[Tensor], outputs: list[Tensor], structure: list[Any], single: bool
    ) -> None:
        self.inputs = inputs
        self.outputs = outputs
        self.structure = structure
        self.single = single


def lower_graph(gm: torch.fx.GraphModule, input_shapes: Sequence[Any] = ()) -> LoweredGraph:
    """Build polyfuse tensors for every node of ``gm`` (all nodes must be supported).

    ``input_shapes`` gives the placeholders' shapes where their nodes carry no metadata.
    """
    env: dict[torch.fx.Node, Any] = {}
    inputs: list[Tensor] = []
    placeholders: dict[int, int] = {}
    result: Any = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if val is None and len(inputs) < len(input_shapes):
                shape = tuple(int(s) for s in input_shapes[len(inputs)])
            else:
                shape = tuple(int(s) for s in val.shape) if val is not None else None
            if shape is None:
                raise UnsupportedOpError(f"placeholder {node.name}: no shape metadata")
            if val is not None and val.dtype not in STORED_DTYPES:
                raise UnsupportedOpError(f"placeholder {node.name}: {_dtype_reason(val.dtype)}")
            dt = te_dtype(val.dtype) if val is not None else "float32"
            t = te.placeholder(shape, dtype=dt, name=f"in_{len(inputs)}_{node.name}")
            placeholders[id(t)] = len(inputs)
            inputs.append(t)
            env[node] = t
        elif node.op == "call_function":
            reason = unsupported_reason(node)
            if reason is not None:
                raise UnsupportedOpError(f"{op_name(node)} ({node.name}): {reason}")
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            env[node] = _with_dtypes(node, LOWERINGS[node.target](*args, **kwargs))
        elif node.op == "output":
            result = node.args[0]
        else:
            raise UnsupportedOpError(f"{node.op} node {node.name} in a polyfuse region")
    single = not isinstance(result, (list, tuple))
    flat = [result] if single else list(result)
    outputs: list[Tensor] = []
    index: dict[int, int] = {}
    structure: list[Any] = []
    for n in flat:
        t = env[n]
        if id(t) in placeholders:
            structure.append(("input", placeholders[id(t)]))
            continue
        if id(t) not in index:
            index[id(t)] = len(outputs)
            outputs.append(t)
        structure.append(index[id(t)])
    return LoweredGraph(inputs, outputs, structure, single)
