"""``polyfuse.ops``: composite operators built from :func:`polyfuse.te.compute`.

Every function here returns a float32 :class:`~polyfuse.graph.expr.Tensor` and creates a few
natural primitives (one ``te.compute`` each); every primitive it creates carries
``tag=<composite name>`` (``"softmax"``, ``"layer_norm"``, ...) so that later passes and tests can
tell which composite a loop nest came from. Nothing is fused by hand: the compiler fuses.

The result is named by the ``name=`` keyword (a fresh ``<op><n>`` name when omitted); the
internal primitives of a multi-primitive composite are named ``f"{name}_<part>"`` (for example
``softmax`` named ``"p"`` creates ``p_max``, ``p_sub``, ``p_exp``, ``p_sum`` and ``p``).

Semantics follow numpy / ONNX: binary elementwise ops broadcast like numpy, reductions take
``axis`` (int, tuple or ``None`` for all axes, negative axes allowed) and ``keepdims``, images are
NCHW and convolution weights OIHW. Shape errors raise :class:`polyfuse.errors.ExpressionError`
with a one-line message naming the op, the result and the tensors involved.

Subscripts stay affine in the loop variables: padded reads (``conv2d``, pools, ``pad``) and
``concat`` guard their reads with ``te.where`` on the loop variables instead of clamping
indices, and ``reshape`` maps indices with ``//`` and ``%`` by constants.
"""

from __future__ import annotations

import builtins
import itertools
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.graph.passes.layout import reshape_subscripts

__all__ = [
    "abs",
    "add",
    "avg_pool2d",
    "batch_norm",
    "concat",
    "conv2d",
    "div",
    "exp",
    "gelu",
    "layer_norm",
    "log",
    "log_softmax",
    "matmul",
    "max_pool2d",
    "maximum",
    "minimum",
    "mul",
    "neg",
    "pad",
    "pow",
    "reduce_max",
    "reduce_mean",
    "reduce_sum",
    "relu",
    "reshape",
    "rms_norm",
    "rsqrt",
    "sigmoid",
    "slice",
    "softmax",
    "sqrt",
    "sub",
    "tanh",
    "transpose",
]

Operand = Tensor | float | int
Index = tuple[Expr, ...]

_counter = itertools.count()


# --------------------------------------------------------------------------- helpers


def _name(op: str, name: str | None) -> str:
    return name if name else f"{op}{next(_counter)}"


def _tensor(op: str, name: str, what: str, t: Any) -> Tensor:
    if not isinstance(t, Tensor):
        raise ExpressionError(f"{op} '{name}': {what} must be a Tensor, got {type(t).__name__}")
    return t


def _compute(shape: Sequence[int], fcompute: Callable[..., Any], name: str, tag: str) -> Tensor:
    """``te.compute`` with variadic loop variables (``*idx``) and the composite's tag."""
    return te.compute(tuple(shape), fcompute, name=name, tag=tag)


def _desc(t: Tensor) -> str:
    return f"'{t.name}' {t.shape}"


def _broadcast_shape(
    op: str, name: str, operands: Sequence[tuple[tuple[int, ...], str]]
) -> tuple[int, ...]:
    """numpy broadcasting of ``(shape, tensor name)`` operands, or an error naming them."""
    nd = builtins.max((len(s) for s, _ in operands), default=0)
    out = [1] * nd
    for shape, _ in operands:
        off = nd - len(shape)
        for d, s in enumerate(shape):
            if s == 1:
                continue
            if out[off + d] not in (1, s):
                shapes = " and ".join(f"'{n}' {tuple(sh)}" for sh, n in operands)
                raise ExpressionError(f"{op} '{name}': shapes {shapes} do not broadcast")
            out[off + d] = s
    return tuple(out)


def _bcast(shape: Sequence[int], idx: Sequence[Expr]) -> Index:
    """Subscripts reading a tensor of ``shape`` broadcast (right-aligned) to loop vars ``idx``."""
    off = len(idx) - len(shape)
    return tuple(as_expr(0) if s == 1 else idx[off + d] for d, s in enumerate(shape))


def _norm_axis(op: str, name: str, x: Tensor, axis: int) -> int:
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise ExpressionError(f"{op} '{name}': axis {axis!r} must be an int")
    if not -x.ndim <= axis < x.ndim:
        raise ExpressionError(
            f"{op} '{name}': axis {axis} is out of range for {_desc(x)} ({x.ndim} dims)"
        )
    return axis % x.ndim


def _norm_axes(op: str, name: str, x: Tensor, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    norm = tuple(_norm_axis(op, name, x, a) for a in axes)
    if len(set(norm)) != len(norm):
        raise ExpressionError(f"{op} '{name}': axis {axis!r} names a dimension twice")
    return tuple(sorted(norm))


def _pair(op: str, name: str, what: str, v: int | Sequence[int], lo: int) -> tuple[int, int]:
    p = (v, v) if isinstance(v, int) else tuple(v)
    if len(p) != 2 or not all(isinstance(e, int) and e >= lo for e in p):
        raise ExpressionError(
            f"{op} '{name}': {what} {v!r} must be an int or a pair of ints >= {lo}"
        )
    return int(p[0]), int(p[1])


def _affine(base: Expr, scale: int, terms: Sequence[tuple[Expr, int]], offset: int) -> Expr:
    """``base*scale + sum(v*c) + offset`` without trivial ``*1`` and ``+0`` nodes."""
    e: Expr = base if scale == 1 else base * scale
    for v, c in terms:
        e = e + (v if c == 1 else v * c)
    if offset > 0:
        e = e + offset
    elif offset < 0:
        e = e - (-offset)
    return e


def _all(conds: Sequence[Expr]) -> Expr | None:
    out: Expr | None = None
    for c in conds:
        out = c if out is None else out & c
    return out


# --------------------------------------------------------------------------- elementwise


def _binary(
    op: str, fn: Callable[[Any, Any], Expr], a: Operand, b: Operand, name: str | None
) -> Tensor:
    name = _name(op, name)
    tensors = [t for t in (a, b) if isinstance(t, Tensor)]
    if not tensors:
        raise ExpressionError(f"{op} '{name}': at least one operand must be a Tensor")
    for what, v in (("first operand", a), ("second operand", b)):
        if not isinstance(v, Tensor) and (isinstance(v, bool) or not isinstance(v, numbers.Real)):
            raise ExpressionError(
                f"{op} '{name}': {what} must be a Tensor or a Python number, got {type(v).__name__}"
            )
    shape = _broadcast_shape(op, name, [(t.shape, t.name) for t in tensors])

    def operand(v: Operand, idx: Index) -> Any:
        if isinstance(v, Tensor):
            return v[_bcast(v.shape, idx)]
        return float(v)

    return _compute(shape, lambda *idx: fn(operand(a, idx), operand(b, idx)), name, op)


def add(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a + b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("add", lambda x, y: x + y, a, b, name)


def sub(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a - b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("sub", lambda x, y: x - y, a, b, name)


def mul(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a * b`` with numpy broadcasting; either operand may be a Python number."""
    return _binary("mul", lambda x, y: x * y, a, b, name)


def div(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """``a / b`` (true division) with numpy broadcasting."""
    return _binary("div", lambda x, y: x / y, a, b, name)


def maximum(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """Elementwise maximum with numpy broadcasting (``np.maximum``)."""
    return _binary("maximum", te.maximum, a, b, name)


def minimum(a: Operand, b: Operand, name: str | None = None) -> Tensor:
    """Elementwise minimum with numpy broadcasting (``np.minimum``)."""
    return _binary("minimum", te.minimum, a, b, name)


def pow(a: Operand, b: Operand, name: str | None = None) -> Tensor:  # noqa: A001
    """``a ** b`` (float power, ``np.power`` on float32) with numpy broadcasting."""
    return _binary("pow", lambda x, y: as_expr(x) ** y, a, b, name)


def _unary(op: str, fn: Callable[[Expr], Expr], x: Tensor, name: str | None) -> Tensor:
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    return _compute(x.shape, lambda *idx: fn(x[idx]), name, op)


def neg(x: Tensor, name: str | None = None) -> Tensor:
    """``-x`` elementwise."""
    return _unary("neg", lambda v: -v, x, name)


def exp(x: Tensor, name: str | None = None) -> Tensor:
    """``e ** x`` elementwise."""
    return _unary("exp", te.exp, x, name)


def log(x: Tensor, name: str | None = None) -> Tensor:
    """Natural logarithm elementwise."""
    return _unary("log", te.log, x, name)


def sqrt(x: Tensor, name: str | None = None) -> Tensor:
    """Square root elementwise."""
    return _unary("sqrt", te.sqrt, x, name)


def rsqrt(x: Tensor, name: str | None = None) -> Tensor:
    """``1 / sqrt(x)`` elementwise."""
    return _unary("rsqrt", te.rsqrt, x, name)


def tanh(x: Tensor, name: str | None = None) -> Tensor:
    """Hyperbolic tangent elementwise."""
    return _unary("tanh", te.tanh, x, name)


def sigmoid(x: Tensor, name: str | None = None) -> Tensor:
    """Logistic sigmoid ``1 / (1 + exp(-x))`` elementwise."""
    return _unary("sigmoid", te.sigmoid, x, name)


def relu(x: Tensor, name: str | None = None) -> Tensor:
    """``max(x, 0)`` elementwise."""
    return _unary("relu", lambda v: te.maximum(v, 0.0), x, name)


def abs(x: Tensor, name: str | None = None) -> Tensor:  # noqa: A001
    """``|x|`` elementwise."""
    return _unary("abs", te.abs, x, name)


def gelu(x: Tensor, approximate: str = "none", name: str | None = None) -> Tensor:
    """Gaussian error linear unit, one primitive (as ``torch.nn.functional.gelu``).

    ``approximate="none"``: ``0.5 * x * (1 + erf(x / sqrt(2)))``;
    ``approximate="tanh"``: ``0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x**3)))``.
    """
    name = _name("gelu", name)
    if approximate == "none":
        c = 1.0 / math.sqrt(2.0)
        return _unary("gelu", lambda v: 0.5 * v * (1.0 + te.erf(v * c)), x, name)
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return _unary(
            "gelu", lambda v: 0.5 * v * (1.0 + te.tanh(c * (v + 0.044715 * (v * v * v)))), x, name
        )
    raise ExpressionError(
        f"gelu '{name}': approximate={approximate!r} is not one of 'none', 'tanh'"
    )


# --------------------------------------------------------------------------- reductions


def reduce_subscripts(
    ndim: int, ks: dict[int, IterVar], keepdims: bool, idx: tuple[IterVar, ...]
) -> tuple[Expr, ...]:
    """Subscripts of the reduced input: reduce axes where reduced, output loop variables
    elsewhere (skipping the size-1 output dims ``keepdims`` leaves)."""
    it = iter(idx)
    subs: list[Expr] = []
    for d in range(ndim):
        if d in ks:
            subs.append(ks[d])
            if keepdims:
                next(it)
        else:
            subs.append(next(it))
    return tuple(subs)


def _reduce(
    op: str,
    kind: str,
    x: Tensor,
    axis: int | Sequence[int] | None,
    keepdims: bool,
    name: str | None,
    scale: float | None = None,
) -> Tensor:
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    axes = _norm_axes(op, name, x, axis)
    if keepdims:
        shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape))
    else:
        shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    if not axes:  # nothing to reduce (a 0-d input with axis=None): a copy
        return _compute(shape, lambda *idx: x[idx], name, op)
    ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}
    reducer = {"sum": te.sum, "max": te.max}[kind]

    def body(*idx: IterVar) -> Expr:
        v = x[reduce_subscripts(x.ndim, ks, keepdims, idx)]
        return reducer(v if scale is None else v * scale, axis=list(ks.values()))

    return _compute(shape, body, name, op)


def reduce_sum(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Sum over ``axis`` (int, tuple, or None for all axes) like ``np.sum``; one primitive."""
    return _reduce("reduce_sum", "sum", x, axis, keepdims, name)


def reduce_mean(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Mean over ``axis`` like ``np.mean``; one primitive ``sum(x * (1/n))``."""
    name = _name("reduce_mean", name)
    xt = _tensor("reduce_mean", name, "input", x)
    n = math.prod(xt.shape[d] for d in _norm_axes("reduce_mean", name, xt, axis))
    return _reduce("reduce_mean", "sum", x, axis, keepdims, name, scale=1.0 / n)


def reduce_max(
    x: Tensor,
    axis: int | Sequence[int] | None = None,
    keepdims: bool = False,
    name: str | None = None,
) -> Tensor:
    """Maximum over ``axis`` like ``np.max``; one primitive."""
    return _reduce("reduce_max", "max", x, axis, keepdims, name)


def _insert(idx: Sequence[Expr], axis: int, k: Expr) -> Index:
    return (*idx[:axis], k, *idx[axis:])


def _drop(idx: Sequence[Expr], axis: int) -> Index:
    return (*idx[:axis], *idx[axis + 1 :])


def _softmax_parts(op: str, x: Tensor, axis: int, name: str) -> tuple[Tensor, Tensor, Tensor, int]:
    """max, x - max, exp, sum: the common head of softmax and log_softmax."""
    x = _tensor(op, name, "input", x)
    ax = _norm_axis(op, name, x, axis)
    n = x.shape[ax]
    red = _drop(x.shape, ax)
    k1 = te.reduce_axis(n, name="r")
    mx = _compute(red, lambda *i: te.max(x[_insert(i, ax, k1)], axis=k1), f"{name}_max", op)
    sh = _compute(x.shape, lambda *i: x[i] - mx[_drop(i, ax)], f"{name}_sub", op)
    ex = _compute(x.shape, lambda *i: te.exp(sh[i]), f"{name}_exp", op)
    k2 = te.reduce_axis(n, name="r")
    sm = _compute(red, lambda *i: te.sum(ex[_insert(i, ax, k2)], axis=k2), f"{name}_sum", op)
    return sh, ex, sm, ax


def softmax(x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis``.

    Five primitives: ``max`` (reduce), ``sub`` (x - max), ``exp``, ``sum`` (reduce), ``div``.
    """
    name = _name("softmax", name)
    _, ex, sm, ax = _softmax_parts("softmax", x, axis, name)
    return _compute(ex.shape, lambda *i: ex[i] / sm[_drop(i, ax)], name, "softmax")


def log_softmax(x: Tensor, axis: int = -1, name: str | None = None) -> Tensor:
    """``(x - max) - log(sum(exp(x - max)))`` along ``axis``.

    Six primitives: ``max``, ``sub``, ``exp``, ``sum``, ``log`` (of the sum), final ``sub``.
    """
    name = _name("log_softmax", name)
    sh, _, sm, ax = _softmax_parts("log_softmax", x, axis, name)
    lg = _compute(sm.shape, lambda *i: te.log(sm[i]), f"{name}_log", "log_softmax")
    return _compute(sh.shape, lambda *i: sh[i] - lg[_drop(i, ax)], name, "log_softmax")


# --------------------------------------------------------------------------- normalisation


def _check_param(op: str, name: str, what: str, p: Tensor | None, shape: tuple[int, ...]) -> None:
    """``p`` must broadcast (right-aligned) to ``shape`` without growing it."""
    if p is None:
        return
    _tensor(op, name, what, p)
    ok = p.ndim <= len(shape) and all(
        s in (1, t) for s, t in zip(p.shape, shape[len(shape) - p.ndim :], strict=True)
    )
    if not ok:
        raise ExpressionError(
            f"{op} '{name}': {what} {_desc(p)} does not broadcast to the normalized shape {shape}"
        )


def _norm_head(
    op: str, x: Tensor, axis: int, name: str
) -> tuple[Tensor, int, tuple[int, ...], list[IterVar], float]:
    x = _tensor(op, name, "input", x)
    ax = _norm_axis(op, name, x, axis)
    norm = x.shape[ax:]
    ks = [te.reduce_axis(s, name=f"r{d}") for d, s in enumerate(norm)]
    return x, ax, norm, ks, 1.0 / math.prod(norm)


def layer_norm(
    x: Tensor,
    gamma: Tensor | None = None,
    beta: Tensor | None = None,
    axis: int = -1,
    eps: float = 1e-5,
    name: str | None = None,
) -> Tensor:
    """Layer normalisation over the dims ``axis..ndim-1`` (ONNX ``LayerNormalization``).

    ``axis=-1`` normalises over the last dim (``normalized_shape = x.shape[-1:]``), ``axis=-2``
    over the last two, and so on. ``gamma``/``beta`` (optional) broadcast to
    ``x.shape[axis:]``. Variance is the population (biased) variance. Five primitives: ``mean``,
    ``centered`` (x - mean), ``var``, ``rstd`` (``rsqrt(var + eps)``), and the scale/shift.
    """
    return layer_norm_parts(x, gamma, beta, axis, eps, name)[0]


def layer_norm_parts(
    x: Tensor,
    gamma: Tensor | None = None,
    beta: Tensor | None = None,
    axis: int = -1,
    eps: float = 1e-5,
    name: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`layer_norm` plus its ``mean`` and ``rstd`` (1/sqrt(var+eps)) over ``x.shape[:axis]``.

    ONNX ``LayerNormalization`` has these as its optional outputs ``Mean`` and ``InvStdDev``.
    """
    name = _name("layer_norm", name)
    op = "layer_norm"
    x, ax, norm, ks, inv_n = _norm_head(op, x, axis, name)
    _check_param(op, name, "gamma", gamma, norm)
    _check_param(op, name, "beta", beta, norm)
    red = x.shape[:ax]
    mean = _compute(red, lambda *i: te.sum(x[(*i, *ks)] * inv_n, axis=ks), f"{name}_mean", op)
    cen = _compute(x.shape, lambda *i: x[i] - mean[i[:ax]], f"{name}_centered", op)
    k2 = [te.reduce_axis(s, name=f"r{d}") for d, s in enumerate(norm)]

    def var_body(*i: IterVar) -> Expr:
        c = cen[(*i, *k2)]
        return te.sum(c * c * inv_n, axis=k2)

    var = _compute(red, var_body, f"{name}_var", op)
    rstd = _compute(red, lambda *i: te.rsqrt(var[i] + eps), f"{name}_rstd", op)

    def out_body(*i: IterVar) -> Expr:
        y = cen[i] * rstd[i[:ax]]
        if gamma is not None:
            y = y * gamma[_bcast(gamma.shape, i)]
        if beta is not None:
            y = y + beta[_bcast(beta.shape, i)]
        return y

    return _compute(x.shape, out_body, name, op), mean, rstd


def rms_norm(
    x: Tensor,
    weight: Tensor | None = None,
    eps: float = 1e-6,
    axis: int = -1,
    name: str | None = None,
) -> Tensor:
    """RMS normalisation: ``x * rsqrt(mean(x**2 over dims axis..) + eps) * weight``.

    ``weight`` (optional) broadcasts to ``x.shape[axis:]``. Three primitives: ``ms`` (mean of
    squares), ``rstd``, and the scaled output.
    """
    name = _name("rms_norm", name)
    op = "rms_norm"
    x, ax, norm, ks, inv_n = _norm_head(op, x, axis, name)
    _check_param(op, name, "weight", weight, norm)
    red = x.shape[:ax]

    def ms_body(*i: IterVar) -> Expr:
        v = x[(*i, *ks)]
        return te.sum(v * v * inv_n, axis=ks)

    ms = _compute(red, ms_body, f"{name}_ms", op)
    rstd = _compute(red, lambda *i: te.rsqrt(ms[i] + eps), f"{name}_rstd", op)

    def out_body(*i: IterVar) -> Expr:
        y = x[i] * rstd[i[:ax]]
        return y * weight[_bcast(weight.shape, i)] if weight is not None else y

    return _compute(x.shape, out_body, name, op)


def batch_norm(
    x: Tensor,
    mean: Tensor,
    var: Tensor,
    gamma: Tensor | None = None,
    beta: Tensor | None = None,
    eps: float = 1e-5,
    name: str | None = None,
) -> Tensor:
    """Inference batch normalisation on channel axis 1 (NCHW, or any ``(N, C, ...)``).

    ``(x - mean[c]) / sqrt(var[c] + eps) * gamma[c] + beta[c]`` with running statistics; all
    parameters have shape ``(C,)``. Two primitives: ``scale = gamma * rsqrt(var + eps)`` over
    channels, then ``(x - mean) * scale + beta``.
    """
    name = _name("batch_norm", name)
    op = "batch_norm"
    x = _tensor(op, name, "input", x)
    if x.ndim < 2:
        raise ExpressionError(f"{op} '{name}': input {_desc(x)} needs a channel axis 1 (N, C, ...)")
    c = x.shape[1]
    for what, p in (("mean", mean), ("var", var), ("gamma", gamma), ("beta", beta)):
        if p is None and what in ("gamma", "beta"):
            continue
        _tensor(op, name, what, p)
        if p.shape != (c,):
            raise ExpressionError(
                f"{op} '{name}': {what} {_desc(p)} must have shape ({c},) for input {_desc(x)}"
            )

    def scale_body(ch: IterVar) -> Expr:
        r = te.rsqrt(var[ch] + eps)
        return gamma[ch] * r if gamma is not None else r

    scale = _compute((c,), scale_body, f"{name}_scale", op)

    def out_body(*i: IterVar) -> Expr:
        y = (x[i] - mean[i[1]]) * scale[i[1]]
        return y + beta[i[1]] if beta is not None else y

    return _compute(x.shape, out_body, name, op)


# --------------------------------------------------------------------------- matmul


def matmul(a: Tensor, b: Tensor, name: str | None = None) -> Tensor:
    """Matrix product with ``np.matmul`` semantics; one primitive (a sum over ``k``).

    ``a``: ``(..., M, K)``, ``b``: ``(..., K, N)`` -> ``(..., M, N)``, batch dims broadcast. A 1-D
    ``a`` is a row vector ``(K,)`` and a 1-D ``b`` a column vector; their unit dim is dropped.
    """
    op = "matmul"
    name = _name(op, name)
    a = _tensor(op, name, "first operand", a)
    b = _tensor(op, name, "second operand", b)
    if a.ndim == 0 or b.ndim == 0:
        raise ExpressionError(f"{op} '{name}': operands {_desc(a)} and {_desc(b)} must be >= 1-D")
    a2 = a.shape if a.ndim >= 2 else (1, *a.shape)
    b2 = b.shape if b.ndim >= 2 else (*b.shape, 1)
    m, ka = a2[-2:]
    kb, n = b2[-2:]
    if ka != kb:
        raise ExpressionError(
            f"{op} '{name}': inner dimensions differ: {_desc(a)} has K={ka}, {_desc(b)} has K={kb}"
        )
    try:
        batch = _broadcast_shape(op, name, [(a2[:-2], a.name), (b2[:-2], b.name)])
    except ExpressionError:
        raise ExpressionError(
            f"{op} '{name}': batch dims of {_desc(a)} and {_desc(b)} do not broadcast"
        ) from None
    nb = len(batch)
    shape = (*batch, *((m,) if a.ndim >= 2 else ()), *((n,) if b.ndim >= 2 else ()))
    k = te.reduce_axis(ka, name="k")

    def body(*idx: IterVar) -> Expr:
        bidx = idx[:nb]
        rest = list(idx[nb:])
        i = rest.pop(0) if a.ndim >= 2 else None
        j = rest.pop(0) if b.ndim >= 2 else None
        asub = (*_bcast(a2[:-2], bidx), i, k) if a.ndim >= 2 else (k,)
        bsub = (*_bcast(b2[:-2], bidx), k, j) if b.ndim >= 2 else (k,)
        return te.sum(a[asub] * b[bsub], axis=k)

    return _compute(shape, body, name, op)


# --------------------------------------------------------------------------- layout


def transpose(x: Tensor, perm: Sequence[int] | None = None, name: str | None = None) -> Tensor:
    """Permute dims like ``np.transpose``: ``out.shape[i] = x.shape[perm[i]]``; default reverses."""
    op = "transpose"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    p = tuple(range(x.ndim - 1, -1, -1)) if perm is None else tuple(perm)
    if sorted(d % x.ndim if x.ndim and -x.ndim <= d < x.ndim else -1 for d in p) != list(
        range(x.ndim)
    ):
        raise ExpressionError(
            f"{op} '{name}': perm {perm!r} is not a permutation of the {x.ndim} dims of {_desc(x)}"
        )
    p = tuple(d % x.ndim for d in p)
    inv = [0] * x.ndim
    for i, d in enumerate(p):
        inv[d] = i
    shape = tuple(x.shape[d] for d in p)
    return _compute(shape, lambda *idx: x[tuple(idx[inv[d]] for d in range(x.ndim))], name, op)


def reshape(x: Tensor, shape: Sequence[int], name: str | None = None) -> Tensor:
    """Row-major reshape like ``np.reshape`` (one dim may be ``-1``); one primitive.

    Each read subscript is ``flat // stride % extent`` of the output's flattened index, computed
    per group of dims whose sizes multiply to the same product, so dims that are unchanged keep
    plain subscripts.
    """
    op = "reshape"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    dims = [shape] if isinstance(shape, int) else list(shape)
    if not all(isinstance(d, int) and (d > 0 or d == -1) for d in dims) or dims.count(-1) > 1:
        raise ExpressionError(
            f"{op} '{name}': shape {tuple(dims)} must hold positive ints and at most one -1"
        )
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if x.size % known:
            raise ExpressionError(
                f"{op} '{name}': cannot reshape {_desc(x)} ({x.size} elements) to {tuple(dims)}"
            )
        dims[dims.index(-1)] = x.size // known
    out = tuple(dims)
    if math.prod(out) != x.size:
        raise ExpressionError(
            f"{op} '{name}': cannot reshape {_desc(x)} ({x.size} elements) to {out}"
        )
    shape_in = x.shape

    def body(*idx: IterVar) -> Expr:
        return x[reshape_subscripts(shape_in, idx, out)]

    return _compute(out, body, name, op)


def concat(tensors: Sequence[Tensor], axis: int = 0, name: str | None = None) -> Tensor:
    """Join tensors along ``axis`` like ``np.concatenate``; one primitive (a chain of where)."""
    op = "concat"
    name = _name(op, name)
    ts = list(tensors)
    if not ts:
        raise ExpressionError(f"{op} '{name}': needs at least one tensor")
    for t in ts:
        _tensor(op, name, "every input", t)
    first = ts[0]
    ax = _norm_axis(op, name, first, axis)
    for t in ts[1:]:
        if t.ndim != first.ndim or any(
            d != ax and s != r for d, (s, r) in enumerate(zip(t.shape, first.shape, strict=True))
        ):
            raise ExpressionError(
                f"{op} '{name}': {_desc(t)} does not match {_desc(first)} "
                f"in the dims other than axis {ax}"
            )
    offsets = list(itertools.accumulate((t.shape[ax] for t in ts), initial=0))
    shape = tuple(offsets[-1] if d == ax else s for d, s in enumerate(first.shape))

    def part(n: int, idx: Sequence[Expr]) -> Expr:
        i = idx[ax] if offsets[n] == 0 else idx[ax] - offsets[n]
        return ts[n][(*idx[:ax], i, *idx[ax + 1 :])]

    def body(*idx: IterVar) -> Expr:
        e = part(len(ts) - 1, idx)
        for n in range(len(ts) - 2, -1, -1):
            e = te.where(idx[ax] < offsets[n + 1], part(n, idx), e)
        return e

    return _compute(shape, body, name, op)


def slice(  # noqa: A001
    x: Tensor,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    name: str | None = None,
) -> Tensor:
    """ONNX ``Slice``: ``x[starts:ends:steps]`` on ``axes`` (default ``0..len(starts)-1``).

    Negative starts/ends count from the end, out-of-range values are clamped (so a huge ``end``
    means "to the end"); steps must be positive. One primitive reading ``x[start + i*step]``.
    """
    op = "slice"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    st, en = list(starts), list(ends)
    ax = list(range(len(st))) if axes is None else list(axes)
    sp = [1] * len(st) if steps is None else list(steps)
    if not len(st) == len(en) == len(ax) == len(sp):
        raise ExpressionError(
            f"{op} '{name}': starts, ends, axes and steps must have the same length"
        )
    ax = [_norm_axis(op, name, x, a) for a in ax]
    if len(set(ax)) != len(ax):
        raise ExpressionError(f"{op} '{name}': axes {axes!r} name a dimension twice")
    begin = [0] * x.ndim
    step = [1] * x.ndim
    shape = list(x.shape)
    for a, s, e, k in zip(ax, st, en, sp, strict=True):
        if not isinstance(k, int) or k <= 0:
            raise ExpressionError(f"{op} '{name}': step {k!r} on axis {a} must be a positive int")
        n = x.shape[a]
        s = builtins.min(builtins.max(s + n if s < 0 else s, 0), n)
        e = builtins.min(builtins.max(e + n if e < 0 else e, 0), n)
        length = (e - s + k - 1) // k if e > s else 0
        if length <= 0:
            raise ExpressionError(
                f"{op} '{name}': axis {a} of {_desc(x)} selects no elements "
                f"(start {s}, end {e}, step {k})"
            )
        begin[a], step[a], shape[a] = s, k, length

    def body(*idx: IterVar) -> Expr:
        return x[tuple(_affine(i, k, (), b) for i, k, b in zip(idx, step, begin, strict=True))]

    return _compute(tuple(shape), body, name, op)


def pad(
    x: Tensor,
    pads: int | Sequence[int] | Sequence[Sequence[int]],
    value: float = 0.0,
    name: str | None = None,
) -> Tensor:
    """Constant padding like ``np.pad(x, pads, constant_values=value)``; one primitive.

    ``pads`` is numpy's ``pad_width``: an int, one ``(before, after)`` pair for every dim, or a
    list of ``(before, after)`` pairs, one per dim. Reads are guarded by ``te.where``.
    """
    op = "pad"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    bad = ExpressionError(
        f"{op} '{name}': pads {pads!r} must be an int, a (before, after) pair or one pair "
        f"per dim of {_desc(x)}, all >= 0"
    )
    if isinstance(pads, int):
        pw = [(pads, pads)] * x.ndim
    else:
        seq = list(pads)
        if len(seq) == 2 and all(isinstance(v, int) for v in seq):
            pw = [(seq[0], seq[1])] * x.ndim
        else:
            try:
                pw = [(int(p[0]), int(p[1])) for p in seq if len(p) == 2]  # type: ignore[index,arg-type]
            except (TypeError, IndexError):
                raise bad from None
            if len(pw) != len(seq):
                raise bad
            if len(pw) == 1:
                pw = pw * x.ndim
    if len(pw) != x.ndim or any(b < 0 or a < 0 for b, a in pw):
        raise bad
    shape = tuple(s + b + a for s, (b, a) in zip(x.shape, pw, strict=True))

    def body(*idx: IterVar) -> Expr:
        subs = tuple(_affine(i, 1, (), -b) for i, (b, _) in zip(idx, pw, strict=True))
        conds = []
        for i, s, (b, a) in zip(idx, x.shape, pw, strict=True):
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < b + s)
        cond = _all(conds)
        return x[subs] if cond is None else te.where(cond, x[subs], float(value))

    return _compute(shape, body, name, op)


# --------------------------------------------------------------------------- convolution, pooling


def _window(
    o: Expr, r: Expr, stride: int, dil: int, pad_lo: int, out_n: int, k: int, n: int
) -> tuple[Expr, list[Expr]]:
    """Input index ``o*stride + r*dil - pad_lo`` and the guards it needs to stay in ``[0, n)``."""
    i = _affine(o, stride, [(r, dil)], -pad_lo)
    conds: list[Expr] = []
    if pad_lo > 0:
        conds.append(i >= 0)
    if (out_n - 1) * stride + (k - 1) * dil - pad_lo >= n:
        conds.append(i < n)
    return i, conds


def conv2d(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    padding: int | Sequence[int] = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    name: str | None = None,
) -> Tensor:
    """2-D convolution (cross-correlation) like ``torch.nn.functional.conv2d``.

    ``x``: ``(N, C, H, W)``, ``w``: ``(O, C // groups, KH, KW)``, ``bias``: ``(O,)`` -> ``(N, O,
    OH, OW)`` with ``OH = (H + 2*ph - dh*(KH-1) - 1) // sh + 1``. Zero padding is a ``te.where``
    guard on the loop variables (subscripts stay affine). One primitive (a sum over input
    channel and kernel window), plus one for the bias add (the conv is then ``f"{name}_conv"``).
    """
    op = "conv2d"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    w = _tensor(op, name, "weight", w)
    if x.ndim != 4 or w.ndim != 4:
        raise ExpressionError(
            f"{op} '{name}': input {_desc(x)} must be NCHW and weight {_desc(w)} OIHW (4-D)"
        )
    sh, sw = _pair(op, name, "stride", stride, 1)
    ph, pw = _pair(op, name, "padding", padding, 0)
    dh, dw = _pair(op, name, "dilation", dilation, 1)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups:
        raise ExpressionError(
            f"{op} '{name}': groups={groups!r} must divide the input channels of {_desc(x)} "
            f"and the output channels of {_desc(w)}"
        )
    if cg * groups != c:
        raise ExpressionError(
            f"{op} '{name}': input {_desc(x)} has {c} channels but weight {_desc(w)} with "
            f"groups={groups} expects {cg * groups}"
        )
    if bias is not None:
        _tensor(op, name, "bias", bias)
        if bias.shape != (o,):
            raise ExpressionError(f"{op} '{name}': bias {_desc(bias)} must have shape ({o},)")
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    if oh <= 0 or ow <= 0:
        raise ExpressionError(
            f"{op} '{name}': kernel {_desc(w)} does not fit input {_desc(x)} "
            f"with padding {(ph, pw)} and dilation {(dh, dw)}"
        )
    og = o // groups
    rc = te.reduce_axis(cg, name="rc")
    rh = te.reduce_axis(kh, name="rh")
    rw = te.reduce_axis(kw, name="rw")

    def body(b: IterVar, oc: IterVar, y: IterVar, xx: IterVar) -> Expr:
        ih, ch = _window(y, rh, sh, dh, ph, oh, kh, h)
        iw, cw = _window(xx, rw, sw, dw, pw, ow, kw, wd)
        chan: Expr = rc if groups == 1 else _affine(oc if og == 1 else oc // og, cg, [(rc, 1)], 0)
        v: Expr = x[b, chan, ih, iw]
        cond = _all(ch + cw)
        if cond is not None:
            v = te.where(cond, v, 0.0)
        return te.sum(v * w[oc, rc, rh, rw], axis=[rc, rh, rw])

    shape = (n, o, oh, ow)
    if bias is None:
        return _compute(shape, body, name, op)
    conv = _compute(shape, body, f"{name}_conv", op)
    return _compute(shape, lambda b, oc, y, xx: conv[b, oc, y, xx] + bias[oc], name, op)


def _ints_n(op: str, name: str, what: str, v: int | Sequence[int], nd: int, lo: int) -> list[int]:
    p = [v] * nd if isinstance(v, int) else list(v)
    if len(p) != nd or not all(isinstance(e, int) and e >= lo for e in p):
        raise ExpressionError(f"{op} '{name}': {what} {v!r} must be {nd} ints >= {lo}")
    return [int(e) for e in p]


def conv(
    x: Tensor,
    w: Tensor,
    bias: Tensor | None = None,
    stride: int | Sequence[int] = 1,
    pads: Sequence[int] | int = 0,
    dilation: int | Sequence[int] = 1,
    groups: int = 1,
    name: str | None = None,
) -> Tensor:
    """N-D convolution (cross-correlation), ONNX ``Conv`` semantics, any number of spatial dims.

    ``x``: ``(N, C, *S)``, ``w``: ``(O, C // groups, *K)``, ``bias``: ``(O,)``. ``pads`` is an
    int or ONNX-style ``[lo_0, .., lo_{d-1}, hi_0, .., hi_{d-1}]`` (negative pads crop). Output
    size per dim: ``(S + lo + hi - dil*(K-1) - 1) // stride + 1``. The input subscript
    ``o*stride + r*dil - lo`` is affine; padding is a ``te.where`` guard.
    """
    op = "conv"
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    w = _tensor(op, name, "weight", w)
    nd = x.ndim - 2
    if nd < 1 or w.ndim != x.ndim:
        raise ExpressionError(
            f"{op} '{name}': input {_desc(x)} must be (N, C, *spatial) and weight {_desc(w)} "
            "(O, C/groups, *kernel) of the same rank"
        )
    st = _ints_n(op, name, "stride", stride, nd, 1)
    dl = _ints_n(op, name, "dilation", dilation, nd, 1)
    pp = [pads] * (2 * nd) if isinstance(pads, int) else [int(v) for v in pads]
    if len(pp) != 2 * nd:
        raise ExpressionError(f"{op} '{name}': pads {pads!r} must hold {2 * nd} ints")
    lo, hi = pp[:nd], pp[nd:]
    n, c, *sp = x.shape
    o, cg, *k = w.shape
    if not isinstance(groups, int) or groups < 1 or c % groups or o % groups or cg * groups != c:
        raise ExpressionError(
            f"{op} '{name}': groups={groups!r} must divide the channels of input {_desc(x)} and "
            f"weight {_desc(w)} with weight.shape[1] * groups == {c}"
        )
    if bias is not None:
        _tensor(op, name, "bias", bias)
        if bias.shape != (o,):
            raise ExpressionError(f"{op} '{name}': bias {_desc(bias)} must have shape ({o},)")
    out = [(sp[i] + lo[i] + hi[i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(nd)]
    if any(v <= 0 for v in out):
        raise ExpressionError(
            f"{op} '{name}': kernel {_desc(w)} does not fit input {_desc(x)} with pads {pp} and "
            f"dilation {dl}"
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
        chan: Expr = rc if groups == 1 else _affine(oc if og == 1 else oc // og, cg, [(rc, 1)], 0)
        v: Expr = x[(b, chan, *subs)]
        cond = _all(conds)
        if cond is not None:
            v = te.where(cond, v, 0.0)
        return te.sum(v * w[(oc, rc, *rs)], axis=[rc, *rs])

    shape = (n, o, *out)
    if bias is None:
        return _compute(shape, body, name, op)
    cv = _compute(shape, body, f"{name}_conv", op)
    return _compute(shape, lambda *i: cv[i] + bias[i[1]], name, op)


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
    name = _name(op, name)
    x = _tensor(op, name, "input", x)
    w = _tensor(op, name, "weight", w)
    nd = x.ndim - 2
    if nd < 1 or w.ndim != x.ndim:
        raise ExpressionError(
            f"{op} '{name}': input {_desc(x)} must be (N, C, *spatial) and weight {_desc(w)} "
            "(C, O/groups, *kernel) of the same rank"
        )
    st = _ints_n(op, name, "stride", stride, nd, 1)
    dl = _ints_n(op, name, "dilation", dilation, nd, 1)
    opad = _ints_n(op, name, "output_padding", output_padding, nd, 0)
    pp = [pads] * (2 * nd) if isinstance(pads, int) else [int(v) for v in pads]
    lo, hi = pp[:nd], pp[nd:]
    n, c, *sp = x.shape
    cw, og, *k = w.shape
    if cw != c or not isinstance(groups, int) or groups < 1 or c % groups:
        raise ExpressionError(
            f"{op} '{name}': weight {_desc(w)} must have {c} input channels (input {_desc(x)}) "
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
            cond = _all(conds)
            return v if cond is None else te.where(cond, v, 0.0)

        x = _compute((n, c, *size), dilate, f"{name}_zero_insert", op)

    def flip(*idx: IterVar) -> Expr:
        oc, ic, r = idx[0], idx[1], idx[2:]
        g_in: Expr = ic if groups == 1 else _affine(oc // og, cg, [(ic, 1)], 0)
        g_out: Expr = oc if groups == 1 else oc % og
        return w[(g_in, g_out, *[(k[i] - 1) - r[i] for i in range(nd)])]

    wf = _compute((og * groups, cg, *k), flip, f"{name}_flipped", op)
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
) -> tuple[Tensor, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, ...]]:
    x = _tensor(op, name, "input", x)
    if x.ndim < 2:
        raise ExpressionError(f"{op} '{name}': input {_desc(x)} needs two spatial (last) dims")
    k = _pair(op, name, "kernel", kernel, 1)
    s = k if stride is None else _pair(op, name, "stride", stride, 1)
    p = _pair(op, name, "padding", padding, 0)
    if p[0] > k[0] // 2 or p[1] > k[1] // 2:
        raise ExpressionError(f"{op} '{name}': padding {p} must be at most half the kernel {k}")
    h, w = x.shape[-2:]
    out_hw = tuple(
        (n + 2 * pp - kk) // ss + 1 for n, pp, kk, ss in zip((h, w), p, k, s, strict=True)
    )
    if builtins.min(out_hw) <= 0:
        raise ExpressionError(
            f"{op} '{name}': kernel {k} does not fit input {_desc(x)} with padding {p}"
        )
    return x, k, s, p, (*x.shape[:-2], *out_hw)


def _pool_read(
    x: Tensor,
    idx: Sequence[Expr],
    rh: IterVar,
    rw: IterVar,
    k: tuple[int, int],
    s: tuple[int, int],
    p: tuple[int, int],
    out_shape: tuple[int, ...],
    fill: float,
) -> Expr:
    h, w = x.shape[-2:]
    ih, ch = _window(idx[-2], rh, s[0], 1, p[0], out_shape[-2], k[0], h)
    iw, cw = _window(idx[-1], rw, s[1], 1, p[1], out_shape[-1], k[1], w)
    v: Expr = x[(*idx[:-2], ih, iw)]
    cond = _all(ch + cw)
    return v if cond is None else te.where(cond, v, fill)


def max_pool2d(
    x: Tensor,
    kernel: int | Sequence[int],
    stride: int | Sequence[int] | None = None,
    padding: int | Sequence[int] = 0,
    name: str | None = None,
) -> Tensor:
    """Max pooling over the last two dims (NCHW), like ``torch.nn.functional.max_pool2d``.

    ``stride`` defaults to ``kernel``; padding (at most half the kernel) reads as ``-inf``;
    output size ``(H + 2p - k) // s + 1``. One primitive.
    """
    op = "max_pool2d"
    name = _name(op, name)
    x, k, s, p, shape = _pool_setup(op, name, x, kernel, stride, padding)
    rh = te.reduce_axis(k[0], name="rh")
    rw = te.reduce_axis(k[1], name="rw")
    return _compute(
        shape,
        lambda *i: te.max(_pool_read(x, i, rh, rw, k, s, p, shape, -math.inf), axis=[rh, rw]),
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
) -> Tensor:
    """Average pooling over the last two dims (NCHW), like ``torch.nn.functional.avg_pool2d``.

    Padding reads as 0; with ``count_include_pad=True`` the divisor is ``kh*kw``, otherwise the
    number of in-bounds elements of each window. Two primitives: the window sum
    (``f"{name}_sum"``) and the division.
    """
    op = "avg_pool2d"
    name = _name(op, name)
    x, k, s, p, shape = _pool_setup(op, name, x, kernel, stride, padding)
    rh = te.reduce_axis(k[0], name="rh")
    rw = te.reduce_axis(k[1], name="rw")
    total = _compute(
        shape,
        lambda *i: te.sum(_pool_read(x, i, rh, rw, k, s, p, shape, 0.0), axis=[rh, rw]),
        f"{name}_sum",
        op,
    )
    h, w = x.shape[-2:]

    def count(o: Expr, kk: int, ss: int, pp: int, n: int, out_n: int) -> Expr | int:
        lo = _affine(o, ss, (), -pp)
        hi = _affine(o, ss, (), kk - pp)
        clip_lo = pp > 0
        clip_hi = (out_n - 1) * ss + kk - pp > n
        if not clip_lo and not clip_hi:
            return kk
        e_hi = te.minimum(hi, n) if clip_hi else hi
        e_lo = te.maximum(lo, 0) if clip_lo else lo
        return e_hi - e_lo

    def body(*i: IterVar) -> Expr:
        if count_include_pad:
            return total[i] / float(k[0] * k[1])
        ch = count(i[-2], k[0], s[0], p[0], h, shape[-2])
        cw = count(i[-1], k[1], s[1], p[1], w, shape[-1])
        if isinstance(ch, int) and isinstance(cw, int):
            return total[i] / float(ch * cw)
        return total[i] / te.cast(as_expr(ch) * cw, "float32")

    return _compute(shape, body, name, op)
