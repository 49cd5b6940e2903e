"""ONNX elementwise operators: unary and binary maps, comparisons, Clip, Cast, Where, the
variadic Sum/Mean/Max/Min and Mod."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr
from polyfuse.onnx.common import (
    WIDENED_INTS,
    Ctx,
    Value,
    as_bool,
    bshape,
    host_value,
    is_int_value,
    map_elementwise,
    node_label,
    register_op,
    reshape_to,
    storage_dtype,
    str_attr,
    wrap_int,
)
from polyfuse.onnx.intmath import int_div, int_mod
from polyfuse.onnx.narrow_types import FLOAT_FORMATS, INT_BITS, round_to_float, wrap_to_int


def _div(a: Expr, b: Expr) -> Expr:
    """ONNX ``Div``: of integers truncating toward zero (:func:`int_div`), else ``/``."""
    if dtypes.is_int(a.dtype) and dtypes.is_int(b.dtype):
        return int_div(a, b)
    return a / b


def _pow(a: Expr, b: Expr) -> Expr:
    """ONNX ``Pow``: the base's type. Integer ``**`` integer is exact (te wraps it); an integer
    base with a float exponent is computed in float64 and truncated (the reference's numpy)."""
    if dtypes.is_float(a.dtype) or not dtypes.is_float(b.dtype):
        return a**b
    return te.cast(te.cast(a, "float64") ** te.cast(b, "float64"), a.dtype)


BINARY_OPS: dict[str, Callable[[Expr, Expr], Expr]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": _div,
    "Pow": _pow,
    "Equal": lambda a, b: te.equal(a, b),
    "Less": lambda a, b: a < b,
    "Greater": lambda a, b: a > b,
    "LessOrEqual": lambda a, b: a <= b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "And": lambda a, b: as_bool(a) & as_bool(b),
    "Or": lambda a, b: as_bool(a) | as_bool(b),
    "Xor": lambda a, b: te.not_equal(as_bool(a), as_bool(b)),
    "PRelu": lambda x, s: te.where(x < 0, x * s, x),
    "BitwiseAnd": te.bitwise_and,
    "BitwiseOr": te.bitwise_or,
    "BitwiseXor": te.bitwise_xor,
}


@register_op(*BINARY_OPS)
def _binary(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, s = ins[0], ins[1]
    if node.op_type == "PRelu" and len(s.shape) == 1 and len(x.shape) > 2:
        try:
            bshape(x.shape, s.shape)
        except ExpressionError:  # legacy per-channel slope (C,)
            shape = (s.shape[0],) + (1,) * (len(x.shape) - 2)
            ins = [x, reshape_to(ctx, s, shape)]
    return [map_elementwise(ctx, ins[:2], BINARY_OPS[node.op_type], node.op_type.lower())]


def _softplus(x: Expr) -> Expr:
    """``log(1 + exp(x))`` without overflow: ``max(x, 0) + log1p(exp(-|x|))``."""
    return te.maximum(x, 0.0) + te.log1p(te.exp(-te.abs(x)))


def unary_table(at: dict[str, Any]) -> dict[str, Callable[[Expr], Expr]]:
    alpha = float(at.get("alpha", 0.01))
    return {
        "Neg": lambda x: -x,
        "Abs": te.abs,
        "Sqrt": te.sqrt,
        "Reciprocal": lambda x: 1.0 / x,
        "Exp": te.exp,
        "Log": te.log,
        "Tanh": te.tanh,
        "Sigmoid": te.sigmoid,
        "Erf": te.erf,
        "Sin": te.sin,
        "Cos": te.cos,
        "Tan": te.tan,
        "Asin": te.asin,
        "Acos": te.acos,
        "Atan": te.atan,
        "Sinh": te.sinh,
        "Cosh": te.cosh,
        "Asinh": te.asinh,
        "Acosh": te.acosh,
        "Atanh": te.atanh,
        "Relu": lambda x: te.maximum(x, 0),  # an int 0 takes x's dtype (int or float)
        "LeakyRelu": lambda x: te.where(x < 0.0, x * alpha, x),
        "Elu": lambda x: te.where(x < 0.0, float(at.get("alpha", 1.0)) * (te.exp(x) - 1.0), x),
        "Selu": lambda x: (
            float(at.get("gamma", 1.0507009873554805))
            * te.where(x <= 0.0, float(at.get("alpha", 1.6732632423543772)) * (te.exp(x) - 1.0), x)
        ),
        "Softplus": _softplus,  # stable where exp(x) overflows (as onnxruntime)
        "Softsign": lambda x: x / (te.abs(x) + 1.0),
        "HardSigmoid": lambda x: te.maximum(
            te.minimum(x * float(at.get("alpha", 0.2)) + float(at.get("beta", 0.5)), 1.0), 0.0
        ),
        "HardSwish": lambda x: x * te.maximum(te.minimum(x * (1.0 / 6.0) + 0.5, 1.0), 0.0),
        "Mish": lambda x: x * te.tanh(_softplus(x)),
        "Swish": lambda x: x * te.sigmoid(x * float(at.get("alpha", 1.0))),
        "Celu": lambda x: (
            te.maximum(x, 0.0)
            + te.minimum(
                float(at.get("alpha", 1.0)) * te.expm1(x / float(at.get("alpha", 1.0))), 0.0
            )
        ),
        "ThresholdedRelu": lambda x: te.where(x > float(at.get("alpha", 1.0)), x, 0.0),
        "Not": lambda x: te.equal(x, 0),
        "BitwiseNot": te.bitwise_not,
        "Shrink": lambda x: te.where(
            x < -float(at.get("lambd", 0.5)),
            x + float(at.get("bias", 0.0)),
            te.where(x > float(at.get("lambd", 0.5)), x - float(at.get("bias", 0.0)), 0.0),
        ),
        "Sign": lambda x: te.cast(te.where(x > 0, 1, te.where(x < 0, -1, 0)), x.dtype),
        "Floor": te.floor,
        "Ceil": te.ceil,
        "Identity": lambda x: x,
        "Round": te.round,  # halves to even (rintf), as the ONNX reference's numpy.round
        # bool outputs, as comparisons
        "IsNaN": te.isnan,
        "IsInf": lambda x: te.isinf(
            x, bool(at.get("detect_positive", 1)), bool(at.get("detect_negative", 1))
        ),
        "Gelu": (
            (lambda x: 0.5 * x * (1.0 + te.erf(x * (1.0 / math.sqrt(2.0)))))
            if at.get("approximate", b"none") in (b"none", "none")
            else (
                lambda x: (
                    0.5
                    * x
                    * (1.0 + te.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))
                )
            )
        ),
    }


UNARY_NAMES = list(unary_table({}))


@register_op(*UNARY_NAMES)
def _unary(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if node.op_type == "Identity":
        return [ins[0]]
    return [map_elementwise(ctx, ins[:1], unary_table(at)[node.op_type], node.op_type.lower())]


@register_op("Clip")
def _clip(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    lo = at.get("min") if len(ins) < 2 or ins[1] is None else host_value(ctx, node, ins[1], "min")
    hi = at.get("max") if len(ins) < 3 or ins[2] is None else host_value(ctx, node, ins[2], "max")
    num = int if is_int_value(ins[0]) else float  # integer bounds for integer data (exact)
    lo = None if lo is None else num(np.asarray(lo).reshape(-1)[0])
    hi = None if hi is None else num(np.asarray(hi).reshape(-1)[0])

    def f(x: Expr) -> Expr:
        if lo is not None:
            x = te.maximum(x, lo)
        if hi is not None:
            x = te.minimum(x, hi)
        return x

    return [map_elementwise(ctx, ins[:1], f, "clip")]


@register_op("Cast", "CastLike")
def _cast(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """ONNX ``Cast``/``CastLike`` of a run-time tensor (a host constant folds on the host).

    To float16, bfloat16, float32 or float64: ``te.cast`` (round to nearest even). To an
    integer: a float truncates toward zero (``te.cast``; out of range saturates, NaN gives 0:
    ONNX leaves both undefined), an integer keeps its low bits (two's complement: int16 200
    → int8 -56, as the spec says), held in its :func:`storage_dtype`; to bool: ``!= 0``. To
    float8/float4 (``saturate`` as given) and 4/2-bit integers: onto their grids, held in
    float32 (:mod:`~polyfuse.onnx.narrow_types`). Others (float8e8m0, strings) are refused.
    """
    if node.op_type == "CastLike":
        like = ins[1]
        to = like.dtype if isinstance(like, np.ndarray) else dtypes.numpy_dtype(like.dtype)
    else:
        to = helper.tensor_dtype_to_np_dtype(at["to"])
    to = np.dtype(to)
    x = ctx.tensor(ins[0])
    if to == dtypes.numpy_dtype("bfloat16") or to.name in ("float16", "float32", "float64"):
        want = storage_dtype(to)
        if x.dtype == want:
            return [x]
        return [map_elementwise(ctx, [x], lambda v: te.cast(v, want), "cast")]
    if to == np.bool_:
        return [map_elementwise(ctx, [x], as_bool, "cast")]
    if to.kind in "iu" and to.name in ("int32", "int64", *dtypes.NARROW_INTS, *WIDENED_INTS):
        want = storage_dtype(to)
        narrow = to.name in WIDENED_INTS and to.name not in ("uint64",)

        def f(v: Expr) -> Expr:
            if dtypes.is_float(v.dtype) and (narrow or want in dtypes.NARROW_INTS):
                v = te.cast(v, "int64")  # through int64: then wrap like an int
            v = te.cast(v, want) if v.dtype != want else v
            return wrap_int(v, to.name) if narrow else v

        if x.dtype == want and not narrow:
            return [x]
        return [map_elementwise(ctx, [x], f, "cast")]
    if to.name in FLOAT_FORMATS:
        sat = bool(int(at.get("saturate", 1)))
        return [map_elementwise(ctx, [x], lambda v: round_to_float(v, to.name, sat), "cast")]
    if to.name in INT_BITS:
        return [map_elementwise(ctx, [x], lambda v: wrap_to_int(v, to.name), "cast")]
    raise UnsupportedOpError(
        f"{node.op_type} to {to.name} is not supported (to float16, bfloat16, float32, float64, "
        "float8, float4, integers and bool are)"
    )


@register_op("Where")
def _where(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [map_elementwise(ctx, ins[:3], lambda c, a, b: te.where(as_bool(c), a, b), "where")]


@register_op("Sum", "Mean", "Max", "Min")
def _variadic(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    vals = [v for v in ins if v is not None]
    op = node.op_type

    def f(*xs: Expr) -> Expr:
        acc = xs[0]
        for x in xs[1:]:
            if op in ("Sum", "Mean"):
                acc = acc + x
            elif op == "Max":
                acc = te.maximum(acc, x)
            else:
                acc = te.minimum(acc, x)
        return acc * (1.0 / len(xs)) if op == "Mean" else acc

    if len(vals) == 1:
        return [vals[0]]
    return [map_elementwise(ctx, vals, f, op.lower())]


@register_op("Mod")
def _mod(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``fmod=1``: C ``fmod`` (sign of the dividend); else numpy ``mod`` (sign of the divisor).
    An infinite divisor keeps a finite dividend (numpy: or gives the divisor on a sign flip).
    Integers: exact (:mod:`~polyfuse.onnx.intmath`)."""
    fmod = bool(int(at.get("fmod", 0)))
    if all(is_int_value(v) for v in ins[:2]):
        what = f"Mod '{node_label(node)}' (fmod={int(fmod)})"
        return [map_elementwise(ctx, ins[:2], lambda a, b: int_mod(a, b, fmod, what), "mod")]

    def f(a: Expr, b: Expr) -> Expr:
        q = a / b
        fl = q // 1.0  # floorf: exact for every float
        if fmod:
            r = a - b * te.where(q < 0.0, -((-q) // 1.0), fl)
            inf_b = a
        else:
            r = a - b * fl
            same_sign = te.equal(te.cast(a < 0.0, "float32"), te.cast(b < 0.0, "float32"))
            inf_b = te.where(te.equal(a, 0.0) | same_sign, a, b)
        big = te.equal(te.abs(b), math.inf) & te.not_equal(te.abs(a), math.inf)
        return te.where(big, inf_b, r)

    return [map_elementwise(ctx, ins[:2], f, "mod")]


@register_op("SwiGLU")
def _swiglu(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``a * sigmoid(alpha * a) * b`` (a gated linear unit with a Swish gate)."""
    alpha = float(at.get("alpha", 1.0))
    if tuple(np.shape(ins[0])) != tuple(np.shape(ins[1])):
        raise ExpressionError(
            f"SwiGLU: A {tuple(np.shape(ins[0]))} and B {tuple(np.shape(ins[1]))} must have one "
            "shape (the operator does not broadcast)"
        )
    return [map_elementwise(ctx, ins[:2], lambda a, b: a * te.sigmoid(a * alpha) * b, "swiglu")]


@register_op("BitShift")
def _bit_shift(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``x << y`` or ``x >> y`` of integers (``te.shift_left``/``shift_right``): a left shift
    wraps at the declared type's width (uint8 1 << 8 is 0); a right shift is logical for
    unsigned types and arithmetic for signed ones (``te.shift_right_arithmetic``); a
    shift outside ``[0, width)`` gives 0 (a signed right shift: its sign, -1 or 0)."""
    d = str_attr(at, "direction", "")
    name = ctx.onnx_dtype(node.input[0], ins[0])
    if d not in ("LEFT", "RIGHT") or np.dtype(name).kind not in "iu":
        raise UnsupportedOpError(f"BitShift direction {d!r} of {name} (LEFT or RIGHT of integers)")
    bits = np.iinfo(np.dtype(name)).bits
    narrow = name in WIDENED_INTS and name != "uint64"
    signed = np.dtype(name).kind == "i"

    def f(x: Expr, y: Expr) -> Expr:
        out = (y < 0) | (y >= bits)
        if d == "LEFT":
            v = te.shift_left(x, y)
            v = wrap_int(v, name) if narrow else v
            return te.where(out, te.const(0, x.dtype), v)
        if not signed:
            return te.where(out, te.const(0, x.dtype), te.shift_right(x, y))
        return te.shift_right_arithmetic(x, y)

    return [map_elementwise(ctx, ins[:2], f, "bitshift")]
