"""Normalisation composites: layer norm, RMS norm and batch norm (inference)."""

from __future__ import annotations

import math

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor
from polyfuse.ops._common import (
    as_operand,
    bcast,
    compute_op,
    desc,
    narrow,
    norm_axis,
    op_name,
    wide,
)


def _check_param(op: str, name: str, what: str, p: Tensor | None, shape: tuple[int, ...]) -> None:
    """``p`` must broadcast (right-aligned) to ``shape`` without growing it."""
    if p is None:
        return
    as_operand(op, name, what, p)
    ok = p.ndim <= len(shape) and all(
        s in (1, t) for s, t in zip(p.shape, shape[len(shape) - p.ndim :], strict=True)
    )
    if not ok:
        raise ExpressionError(
            f"{op} '{name}': {what} {desc(p)} does not broadcast to the normalized shape {shape}"
        )


def _norm_head(
    op: str, x: Tensor, axis: int, name: str
) -> tuple[Tensor, int, tuple[int, ...], list[IterVar], float]:
    x = as_operand(op, name, "input", x)
    ax = norm_axis(op, name, x, axis)
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
    A float16/bfloat16 ``x`` computes in float32 (``mean``, ``rstd`` and the centred values
    float32, as torch's kernels and ONNX's default ``stash_type``), its result rounded once:
    a 16-bit mean would round before it is subtracted (1000.125 to 1000 in float16, the row
    normalised 0.28 off).
    """
    name = op_name("layer_norm", name)
    op = "layer_norm"
    x, ax, norm, ks, inv_n = _norm_head(op, x, axis, name)
    _check_param(op, name, "gamma", gamma, norm)
    _check_param(op, name, "beta", beta, norm)
    red = x.shape[:ax]
    w, back = wide(x), narrow(x)
    mean = compute_op(red, lambda *i: te.sum(w(x[(*i, *ks)]) * inv_n, axis=ks),
                      f"{name}_mean", op)  # fmt: skip
    cen = compute_op(x.shape, lambda *i: w(x[i]) - mean[i[:ax]], f"{name}_centered", op)
    k2 = [te.reduce_axis(s, name=f"r{d}") for d, s in enumerate(norm)]

    def var_body(*i: IterVar) -> Expr:
        c = cen[(*i, *k2)]
        return te.sum(c * c * inv_n, axis=k2)

    var = compute_op(red, var_body, f"{name}_var", op)
    rstd = compute_op(red, lambda *i: te.rsqrt(var[i] + eps), f"{name}_rstd", op)

    def out_body(*i: IterVar) -> Expr:
        y = cen[i] * rstd[i[:ax]]
        if gamma is not None:
            y = y * w(gamma[bcast(gamma.shape, i)])
        if beta is not None:
            y = y + w(beta[bcast(beta.shape, i)])
        return back(y)

    return compute_op(x.shape, out_body, name, op), mean, rstd


def rms_norm(
    x: Tensor,
    weight: Tensor | None = None,
    eps: float = 1e-6,
    axis: int = -1,
    name: str | None = None,
) -> Tensor:
    """RMS normalisation: ``x * rsqrt(mean(x**2 over dims axis..) + eps) * weight``.

    ``weight`` (optional) broadcasts to ``x.shape[axis:]``. Three primitives: ``ms`` (mean of
    squares), ``rstd``, and the scaled output. A float16/bfloat16 ``x`` computes in float32
    (``ms`` and ``rstd`` float32) and its result, weight included, is rounded once, as ONNX's
    default ``stash_type`` (torch rounds before the weight too): a 16-bit ``rstd`` alone is
    up to half a unit off.
    """
    name = op_name("rms_norm", name)
    op = "rms_norm"
    x, ax, norm, ks, inv_n = _norm_head(op, x, axis, name)
    _check_param(op, name, "weight", weight, norm)
    red = x.shape[:ax]

    w, back = wide(x), narrow(x)

    def ms_body(*i: IterVar) -> Expr:
        v = w(x[(*i, *ks)])
        return te.sum(v * v * inv_n, axis=ks)

    ms = compute_op(red, ms_body, f"{name}_ms", op)
    rstd = compute_op(red, lambda *i: te.rsqrt(ms[i] + eps), f"{name}_rstd", op)

    def out_body(*i: IterVar) -> Expr:
        y = w(x[i]) * rstd[i[:ax]]
        return back(y * w(weight[bcast(weight.shape, i)]) if weight is not None else y)

    return compute_op(x.shape, out_body, name, op)


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
    name = op_name("batch_norm", name)
    op = "batch_norm"
    x = as_operand(op, name, "input", x)
    if x.ndim < 2:
        raise ExpressionError(f"{op} '{name}': input {desc(x)} needs a channel axis 1 (N, C, ...)")
    c = x.shape[1]
    for what, p in (("mean", mean), ("var", var), ("gamma", gamma), ("beta", beta)):
        if p is None and what in ("gamma", "beta"):
            continue
        as_operand(op, name, what, p)
        if p.shape != (c,):
            raise ExpressionError(
                f"{op} '{name}': {what} {desc(p)} must have shape ({c},) for input {desc(x)}"
            )

    def scale_body(ch: IterVar) -> Expr:
        r = te.rsqrt(var[ch] + eps)
        return gamma[ch] * r if gamma is not None else r

    scale = compute_op((c,), scale_body, f"{name}_scale", op)

    def out_body(*i: IterVar) -> Expr:
        y = (x[i] - mean[i[1]]) * scale[i[1]]
        return y + beta[i[1]] if beta is not None else y

    return compute_op(x.shape, out_body, name, op)
