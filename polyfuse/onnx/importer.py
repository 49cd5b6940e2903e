"""ONNX → polyfuse importer: an ONNX graph becomes a te graph built from :mod:`polyfuse.ops`.

Every ONNX value is either a *host constant* (a numpy array: initializers, ``Constant``,
``Shape`` of a static tensor, and anything computed only from constants, folded on the host
with the ONNX reference implementation) or a :class:`~polyfuse.graph.expr.Tensor` of the te
graph. A host constant becomes a placeholder bound through ``compile(constants=...)`` only when
a runtime op reads it as data; shape arguments (``Reshape`` shapes, ``Slice`` starts, axes
inputs, ...) stay on the host and become static attributes.

All runtime tensors are float32: comparisons produce 0/1 floats, and ``Cast`` to an integer or
boolean type truncates in float32. The backend converts outputs back to the ONNX output types.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import polyfuse
from polyfuse import ops, te
from polyfuse.compiled import CompiledGraph
from polyfuse.errors import ExpressionError, PolyfuseError, UnsupportedOpError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr

Value = Tensor | np.ndarray

__all__ = ["OnnxImportError", "OnnxModel", "SUPPORTED_OPS", "load", "unsupported_ops"]


class OnnxImportError(PolyfuseError, ValueError):
    """An ONNX file cannot be read or its graph cannot be imported (bad file, dynamic shape)."""


class InputValueNeeded(OnnxImportError):
    """A graph input feeds an attribute-like input (axes, shape, pads, ...): its value is needed.

    ``input_name`` names it; :func:`load` with ``values={input_name: array}`` specializes the
    graph on that value (the ONNX backend does so at call time, one compile per value).
    """

    def __init__(self, message: str, input_name: str) -> None:
        super().__init__(message)
        self.input_name = input_name


@dataclass
class OnnxModel:
    """An imported ONNX model: a te graph plus the weights bound as constants.

    ``inputs``: placeholders for the graph inputs that are not initializers, in ONNX order
    (``input_names``); ``outputs``: the te tensors of the graph outputs that are computed at run
    time (``output_names`` lists all graph outputs; the ones that fold to host constants are in
    ``constant_outputs``); ``constants``: placeholder → array for every initializer or folded
    constant that the graph reads at run time.
    """

    name: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    constants: dict[Tensor, np.ndarray]
    input_names: list[str] = field(default_factory=list)
    output_names: list[str] = field(default_factory=list)
    output_dtypes: list[np.dtype] = field(default_factory=list)
    #: graph outputs that fold to host constants (name → array); not compiled
    constant_outputs: dict[str, np.ndarray] = field(default_factory=dict)

    def compile(self, **kw: Any) -> CompiledGraph:
        """``polyfuse.compile(self.inputs, self.outputs, constants=self.constants, **kw)``."""
        kw.setdefault("name", _ident(self.name) or "onnx_model")
        return polyfuse.compile(self.inputs, self.outputs, constants=self.constants, **kw)


# --------------------------------------------------------------------------- helpers


def _ident(s: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", s)
    return ("t_" + s) if not s or s[0].isdigit() else s


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _ints(v: Any) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def _bshape(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ExpressionError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def _bidx(shape: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    off = len(idx) - len(shape)
    return tuple(as_expr(0) if s == 1 else idx[off + d] for d, s in enumerate(shape))


class _Ctx:
    """Conversion state: values by ONNX name, constant placeholders, fresh names."""

    def __init__(self, model_name: str, opset: int) -> None:
        self.model_name = model_name
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.constants: dict[Tensor, np.ndarray] = {}
        self._const_tensors: dict[int, Tensor] = {}
        self._n = 0
        self.node_name = "node"
        #: id(placeholder) -> ONNX graph input name (to ask for its value when needed)
        self.graph_inputs: dict[int, str] = {}

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{_ident(self.node_name)}_{hint}{self._n}"

    def tensor(self, v: Value) -> Tensor:
        """A runtime tensor for ``v`` (a host constant becomes a bound placeholder)."""
        if isinstance(v, Tensor):
            return v
        key = id(v)
        if key not in self._const_tensors:
            arr = np.asarray(v, dtype=np.float32, order="C")  # 0-d stays 0-d
            if arr.size == 0:
                raise UnsupportedOpError("empty (zero-size) tensors are not supported")
            t = te.placeholder(arr.shape, "float32", self.fresh("const"))
            self.constants[t] = arr
            self._const_tensors[key] = t
            self._keep = getattr(self, "_keep", [])
            self._keep.append(v)  # keep id() stable
        return self._const_tensors[key]

    def compute(self, shape: Sequence[int], f: Callable[..., Any], hint: str) -> Tensor:
        return te.compute(tuple(int(s) for s in shape), f, name=self.fresh(hint), tag="onnx")


def _scalar(v: Value) -> float | None:
    if isinstance(v, np.ndarray) and v.size == 1:
        return float(v.reshape(-1)[0])
    return None


def _map(ctx: _Ctx, vals: Sequence[Value], f: Callable[..., Expr], hint: str) -> Tensor:
    """Broadcasting elementwise map of runtime tensors and (scalar-inlined) constants."""
    shapes = [tuple(v.shape) for v in vals]
    shape = _bshape(*shapes)
    ops_: list[Any] = []
    for v in vals:
        s = _scalar(v)
        if s is not None and v.ndim <= len(shape):
            ops_.append(s)
        else:
            ops_.append(ctx.tensor(v))

    def body(*idx: IterVar) -> Expr:
        args = [o[_bidx(o.shape, idx)] if isinstance(o, Tensor) else as_expr(o) for o in ops_]
        return as_expr(f(*args))

    if not shape:
        shape = ()
    return ctx.compute(shape, body, hint)


def _as_bool(e: Expr) -> Expr:
    return te.not_equal(e, 0.0)


def _norm_axes(axes: Sequence[int], ndim: int) -> list[int]:
    return sorted({int(a) % ndim if ndim else 0 for a in axes})


# --------------------------------------------------------------------------- op handlers

Handler = Callable[[_Ctx, onnx.NodeProto, list[Any], dict[str, Any]], list[Value]]
HANDLERS: dict[str, Handler] = {}


def _reg(*names: str) -> Callable[[Handler], Handler]:
    def deco(f: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = f
        return f

    return deco


_BINARY: dict[str, Callable[[Expr, Expr], Expr]] = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    "Div": lambda a, b: a / b,
    "Pow": lambda a, b: a**b,
    "Equal": lambda a, b: te.equal(a, b),
    "Less": lambda a, b: a < b,
    "Greater": lambda a, b: a > b,
    "LessOrEqual": lambda a, b: a <= b,
    "GreaterOrEqual": lambda a, b: a >= b,
    "And": lambda a, b: _as_bool(a) & _as_bool(b),
    "Or": lambda a, b: _as_bool(a) | _as_bool(b),
    "Xor": lambda a, b: te.not_equal(_as_bool(a), _as_bool(b)),
    "PRelu": lambda x, s: te.where(x < 0.0, x * s, x),
}


@_reg(*_BINARY)
def _binary(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, s = ins[0], ins[1]
    if node.op_type == "PRelu" and len(s.shape) == 1 and len(x.shape) > 2:
        try:
            _bshape(x.shape, s.shape)
        except ExpressionError:  # legacy per-channel slope (C,)
            shape = (s.shape[0],) + (1,) * (len(x.shape) - 2)
            ins = [x, _reshape_to(ctx, s, shape)]
    return [_map(ctx, ins[:2], _BINARY[node.op_type], node.op_type.lower())]


def _unary_table(at: dict[str, Any]) -> dict[str, Callable[[Expr], Expr]]:
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
        "Relu": lambda x: te.maximum(x, 0.0),
        "LeakyRelu": lambda x: te.where(x < 0.0, x * alpha, x),
        "Elu": lambda x: te.where(x < 0.0, float(at.get("alpha", 1.0)) * (te.exp(x) - 1.0), x),
        "Selu": lambda x: (
            float(at.get("gamma", 1.0507009873554805))
            * te.where(x <= 0.0, float(at.get("alpha", 1.6732632423543772)) * (te.exp(x) - 1.0), x)
        ),
        "Softplus": lambda x: te.log(te.exp(x) + 1.0),
        "Softsign": lambda x: x / (te.abs(x) + 1.0),
        "HardSigmoid": lambda x: te.maximum(
            te.minimum(x * float(at.get("alpha", 0.2)) + float(at.get("beta", 0.5)), 1.0), 0.0
        ),
        "HardSwish": lambda x: x * te.maximum(te.minimum(x * (1.0 / 6.0) + 0.5, 1.0), 0.0),
        "Not": lambda x: te.equal(x, 0.0),
        "Shrink": lambda x: te.where(
            x < -float(at.get("lambd", 0.5)),
            x + float(at.get("bias", 0.0)),
            te.where(x > float(at.get("lambd", 0.5)), x - float(at.get("bias", 0.0)), 0.0),
        ),
        "Sign": lambda x: te.where(x > 0.0, 1.0, te.where(x < 0.0, -1.0, 0.0)),
        "Floor": lambda x: _floor(x),
        "Ceil": lambda x: -_floor(-x),
        "Identity": lambda x: x,
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


def _floor(x: Expr) -> Expr:
    t = te.cast(te.cast(x, "int32"), "float32")  # truncation toward zero
    return te.where(t > x, t - 1.0, t)


_UNARY_NAMES = list(_unary_table({}))


@_reg(*_UNARY_NAMES)
def _unary(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if node.op_type == "Identity":
        return [ins[0]]
    return [_map(ctx, ins[:1], _unary_table(at)[node.op_type], node.op_type.lower())]


@_reg("Clip")
def _clip(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    lo = at.get("min") if len(ins) < 2 or ins[1] is None else _host(ctx, node, ins[1], "min")
    hi = at.get("max") if len(ins) < 3 or ins[2] is None else _host(ctx, node, ins[2], "max")
    lo = None if lo is None else float(np.asarray(lo).reshape(-1)[0])
    hi = None if hi is None else float(np.asarray(hi).reshape(-1)[0])

    def f(x: Expr) -> Expr:
        if lo is not None:
            x = te.maximum(x, lo)
        if hi is not None:
            x = te.minimum(x, hi)
        return x

    return [_map(ctx, ins[:1], f, "clip")]


@_reg("Cast", "CastLike")
def _cast(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if node.op_type == "CastLike":
        to = ins[1].dtype if isinstance(ins[1], np.ndarray) else np.dtype(np.float32)
    else:
        to = helper.tensor_dtype_to_np_dtype(at["to"])
    to = np.dtype(to)
    if to.kind == "f" and to.itemsize >= 2 and to.name in ("float16", "float32", "float64"):
        return [ins[0]]  # the output is converted to the declared type after the run
    if to.kind not in "iub":  # float8/float4/bfloat16: saturation and rounding rules differ
        raise UnsupportedOpError(f"{node.op_type} to {to.name} is not supported (float32 only)")
    if to == np.bool_:
        return [_map(ctx, ins[:1], lambda x: te.not_equal(x, 0.0), "cast")]
    if np.issubdtype(to, np.integer):
        return [_map(ctx, ins[:1], lambda x: te.cast(te.cast(x, "int32"), "float32"), "cast")]
    raise UnsupportedOpError(f"Cast to {to} is not supported (float only)")


@_reg("Where")
def _where(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [_map(ctx, ins[:3], lambda c, a, b: te.where(_as_bool(c), a, b), "where")]


@_reg("Sum", "Mean", "Max", "Min")
def _variadic(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
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
    return [_map(ctx, vals, f, op.lower())]


def _host(ctx: _Ctx, node: onnx.NodeProto, v: Any, what: str) -> np.ndarray:
    """``v`` as a host array: an attribute-like input (axes, shape, pads, ...) must be known."""
    if isinstance(v, Tensor):
        name = ctx.graph_inputs.get(id(v))
        if name is not None:
            raise InputValueNeeded(
                f"{node.op_type} '{node.name or node.output[0]}': input '{what}' is the graph "
                f"input '{name}'; its value is needed at import time (pass values={{'{name}': "
                "...}} to polyfuse.onnx.load; the ONNX backend does this per call)",
                name,
            )
        raise UnsupportedOpError(
            f"{node.op_type} '{node.name or node.output[0]}': input '{what}' is computed at run "
            "time; polyfuse needs it to be a constant (static shapes/attributes)"
        )
    return np.asarray(v)


# ---- reductions, softmax, normalisations


def _reduce_axes(
    ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], ndim: int
) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        axes = _ints(_host(ctx, node, ins[1], "axes"))
    else:
        axes = at.get("axes")
        axes = None if axes is None else list(axes)
    if not axes:
        return [] if at.get("noop_with_empty_axes", 0) else list(range(ndim))
    return _norm_axes(axes, ndim)


def _reduce(
    ctx: _Ctx,
    x: Tensor,
    axes: list[int],
    keep: bool,
    kind: str,
    pre: Callable[[Expr], Expr] | None = None,
    post: Callable[[Expr], Expr] | None = None,
) -> Tensor:
    if not axes:
        return _map(ctx, [x], lambda v: post(pre(v) if pre else v) if post else v, "reduce")
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keep or d not in axes)
    ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}
    red = {"sum": te.sum, "max": te.max, "min": te.min}[kind]

    def body(*idx: IterVar) -> Expr:
        v: Expr = x[ops.reduce_subscripts(x.ndim, ks, keep, idx)]
        return red(pre(v) if pre else v, axis=list(ks.values()))

    r = ctx.compute(shape, body, "reduce")
    return _map(ctx, [r], post, "reduce_post") if post else r


@_reg(
    "ReduceSum",
    "ReduceMean",
    "ReduceMax",
    "ReduceMin",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
)
def _reduce_op(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    axes = _reduce_axes(ctx, node, ins, at, x.ndim)
    keep = bool(at.get("keepdims", 1))
    n = math.prod(x.shape[d] for d in axes) if axes else 1
    op = node.op_type
    if op == "ReduceSum":
        return [_reduce(ctx, x, axes, keep, "sum")]
    if op == "ReduceMean":
        return [_reduce(ctx, x, axes, keep, "sum", pre=lambda v: v * (1.0 / n))]
    if op == "ReduceMax":
        return [_reduce(ctx, x, axes, keep, "max")]
    if op == "ReduceMin":
        return [_reduce(ctx, x, axes, keep, "min")]
    if op == "ReduceSumSquare":
        return [_reduce(ctx, x, axes, keep, "sum", pre=lambda v: v * v)]
    if op == "ReduceL1":
        return [_reduce(ctx, x, axes, keep, "sum", pre=te.abs)]
    if op == "ReduceL2":
        return [_reduce(ctx, x, axes, keep, "sum", pre=lambda v: v * v, post=te.sqrt)]
    if op == "ReduceLogSum":
        return [_reduce(ctx, x, axes, keep, "sum", post=te.log)]
    # ReduceLogSumExp: max-shifted
    m = _reduce(ctx, x, axes, True, "max")
    sh = _map(ctx, [x, m], lambda a, b: te.exp(a - b), "lse_exp")
    s = _reduce(ctx, sh, axes, True, "sum")
    out = _map(ctx, [s, m], lambda a, b: te.log(a) + b, "lse")
    if not keep:
        out = ops.reshape(out, [d for i, d in enumerate(x.shape) if i not in axes] or [1])
        if all(i in axes for i in range(x.ndim)):
            out = _reduce(ctx, out, [0], False, "sum")
    return [out]


@_reg("Softmax", "LogSoftmax")
def _softmax(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    fn = ops.softmax if node.op_type == "Softmax" else ops.log_softmax
    if ctx.opset >= 13:
        return [fn(x, axis=int(at.get("axis", -1)), name=ctx.fresh("softmax"))]
    ax = int(at.get("axis", 1)) % x.ndim
    if ax == x.ndim - 1:
        return [fn(x, axis=-1, name=ctx.fresh("softmax"))]
    flat = ops.reshape(x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])), ctx.fresh("flat"))
    y = fn(flat, axis=-1, name=ctx.fresh("softmax"))
    return [ops.reshape(y, x.shape, ctx.fresh("unflat"))]


@_reg("BatchNormalization")
def _bn(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if at.get("training_mode", 0):
        return _bn_training(ctx, ins, at)
    x, scale, bias, mean, var = (ctx.tensor(v) for v in ins[:5])
    y = ops.batch_norm(
        x, mean, var, scale, bias, eps=float(at.get("epsilon", 1e-5)), name=ctx.fresh("bn")
    )
    return [y]


def _bn_training(ctx: _Ctx, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """training_mode=1: normalize with the batch statistics (over every axis but 1); the
    running mean/var outputs are ``running * momentum + batch * (1 - momentum)``."""
    x = ctx.tensor(ins[0])
    eps, mom = float(at.get("epsilon", 1e-5)), float(at.get("momentum", 0.9))
    axes = [d for d in range(x.ndim) if d != 1]
    n = math.prod(x.shape[d] for d in axes)
    mean = _reduce(ctx, x, axes, True, "sum", pre=lambda v: v * (1.0 / n))
    cen = _map(ctx, [x, mean], lambda a, m: a - m, "bn_cen")
    var = _reduce(ctx, cen, axes, True, "sum", pre=lambda v: v * v * (1.0 / n))
    cshape = (x.shape[1],) + (1,) * (x.ndim - 2)
    sc, bi = (_reshape_to(ctx, v, cshape) for v in ins[1:3])
    y = _map(ctx, [cen, var, sc, bi], lambda c, v, s_, b: c * te.rsqrt(v + eps) * s_ + b, "bn")
    c = x.shape[1]
    m1 = _map(
        ctx, [_reshape_to(ctx, mean, (c,)), ins[3]], lambda m, r: r * mom + m * (1 - mom), "bn_rm"
    )
    v1 = _map(
        ctx, [_reshape_to(ctx, var, (c,)), ins[4]], lambda v, r: r * mom + v * (1 - mom), "bn_rv"
    )
    return [y, m1, v1]


@_reg("LayerNormalization")
def _ln(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    gamma = ctx.tensor(ins[1])
    beta = ctx.tensor(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    ax = int(at.get("axis", -1))
    ax = ax + x.ndim if ax < 0 else ax
    y, mean, rstd = ops.layer_norm_parts(
        x, gamma, beta, axis=ax, eps=float(at.get("epsilon", 1e-5)), name=ctx.fresh("ln")
    )
    stat = (*x.shape[:ax], *([1] * (x.ndim - ax)))  # Mean / InvStdDev keep the normalized dims
    return [y, _reshape_to(ctx, mean, stat), _reshape_to(ctx, rstd, stat)]


@_reg("LRN")
def _lrn(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    size = int(at["size"])
    alpha, beta, bias = (
        float(at.get("alpha", 1e-4)),
        float(at.get("beta", 0.75)),
        float(at.get("bias", 1.0)),
    )
    c = x.shape[1]
    lo = (size - 1) // 2
    r = te.reduce_axis(size, name="rl")

    def sq(*i: IterVar) -> Expr:
        ch = i[1] + r - lo
        sub = (i[0], ch, *i[2:])
        v = te.where((ch >= 0) & (ch < c), x[sub], 0.0)
        return te.sum(v * v, axis=r)

    s = ctx.compute(x.shape, sq, "lrn_sq")
    return [
        _map(ctx, [x, s], lambda a, q: a / (bias + (alpha / size) * q) ** beta, "lrn"),
    ]


@_reg("InstanceNormalization")
def _instnorm(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    axes = list(range(2, x.ndim))
    n = math.prod(x.shape[2:])
    eps = float(at.get("epsilon", 1e-5))
    mean = _reduce(ctx, x, axes, True, "sum", pre=lambda v: v * (1.0 / n))
    cen = _map(ctx, [x, mean], lambda a, m: a - m, "in_cen")
    var = _reduce(ctx, cen, axes, True, "sum", pre=lambda v: v * v * (1.0 / n))
    cshape = (x.shape[1],) + (1,) * (x.ndim - 2)
    sc = np.asarray(ins[1]).reshape(cshape) if isinstance(ins[1], np.ndarray) else ins[1]
    bi = np.asarray(ins[2]).reshape(cshape) if isinstance(ins[2], np.ndarray) else ins[2]
    if isinstance(sc, Tensor):
        sc = ops.reshape(sc, cshape, ctx.fresh("sc"))
    if isinstance(bi, Tensor):
        bi = ops.reshape(bi, cshape, ctx.fresh("bi"))
    return [
        _map(ctx, [cen, var, sc, bi], lambda c_, v, s, b: c_ * te.rsqrt(v + eps) * s + b, "inorm")
    ]


# ---- matmul family


@_reg("MatMul")
def _matmul(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [ops.matmul(ctx.tensor(ins[0]), ctx.tensor(ins[1]), name=ctx.fresh("matmul"))]


@_reg("Gemm")
def _gemm(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
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
        return [y if alpha == 1.0 else _map(ctx, [y], lambda v: v * alpha, "gemm_a")]
    return [_map(ctx, [y, c], lambda v, cv: v * alpha + cv * beta, "gemm_c")]


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


@_reg("Conv")
def _conv(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    bias = ctx.tensor(ins[2]) if len(ins) > 2 and ins[2] is not None else None
    nd = x.ndim - 2
    k = list(at.get("kernel_shape", w.shape[2:]))
    s = list(at.get("strides", [1] * nd))
    d = list(at.get("dilations", [1] * nd))
    lo, hi = _conv_pads(at, x.shape[2:], k, s, d)
    g = int(at.get("group", 1))
    if nd != 2:  # N-D (1-D, 3-D, ...): asymmetric pads are guards of the affine window
        y = ops.conv(x, w, bias, s, [*lo, *hi], d, g, name=ctx.fresh("conv"))
        return [y]
    if lo != hi:
        x = ops.pad(x, [(0, 0), (0, 0), *zip(lo, hi, strict=True)], name=ctx.fresh("cpad"))
        lo = [0, 0]
    y = ops.conv2d(x, w, bias, stride=s, padding=lo, dilation=d, groups=g, name=ctx.fresh("conv"))
    return [y]


@_reg("ConvTranspose")
def _conv_transpose(
    ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
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
    ctx: _Ctx, node: onnx.NodeProto, x: Tensor, at: dict[str, Any], kind: str, indices: bool = False
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
    fill = -math.inf if kind == "max" else 0.0

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

    def body(*idx: IterVar) -> Expr:
        subs, c = window(idx, rs)
        v: Expr = x[tuple(subs)]
        if c is not None:
            v = te.where(c, v, fill)
        return te.max(v, axis=rs) if kind == "max" else te.sum(v, axis=rs)

    y = ctx.compute(shape, body, f"{kind}pool")
    if kind == "max" and indices:  # the first flat (NC...-major) position holding the max
        rs2 = [te.reduce_axis(kk, name=f"q{i}") for i, kk in enumerate(k)]
        strides = [math.prod(x.shape[j + 1 :]) for j in range(x.ndim)]
        if int(at.get("storage_order", 0)):  # column-major spatial dims
            sp = x.shape[2:]
            strides[2:] = [math.prod(sp[:j]) for j in range(nd)]
        big = float(math.prod(x.shape))

        def ibody(*idx: IterVar) -> Expr:
            subs, c = window(idx, rs2)
            hit = te.equal(x[tuple(subs)], y[idx])
            hit = hit if c is None else (c & hit)
            flat = _iota(sum((e * st for e, st in zip(subs, strides, strict=True)), as_expr(0)))
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
    inv = (1.0 / cnt).astype(np.float32)
    if np.all(inv == inv.reshape(-1)[0]):
        return _map(ctx, [y], lambda v: v * float(inv.reshape(-1)[0]), "avgpool_div")
    return _map(ctx, [y, inv], lambda v, c: v * c, "avgpool_div")


@_reg("MaxPool", "AveragePool")
def _pool_op(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    kind = "max" if node.op_type == "MaxPool" else "avg"
    if kind == "max" and len([o for o in node.output if o]) > 1:
        y, idx = _pool(ctx, node, ctx.tensor(ins[0]), at, kind, indices=True)  # type: ignore[misc]
        return [y, idx]
    return [_pool(ctx, node, ctx.tensor(ins[0]), at, kind)]


@_reg("GlobalAveragePool", "GlobalMaxPool")
def _gpool(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    axes = list(range(2, x.ndim))
    if node.op_type == "GlobalMaxPool":
        return [_reduce(ctx, x, axes, True, "max")]
    n = math.prod(x.shape[2:])
    return [_reduce(ctx, x, axes, True, "sum", pre=lambda v: v * (1.0 / n))]


# ---- layout


def _reshape_to(ctx: _Ctx, v: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(s) for s in shape)
    if isinstance(v, np.ndarray):
        return v.reshape(shape)
    if tuple(v.shape) == shape:
        return v
    if not shape:  # to 0-d
        return _reduce(ctx, v, list(range(v.ndim)), False, "sum")
    if not v.shape:
        return ctx.compute(shape, lambda *i: v[()], "reshape")
    return ops.reshape(v, shape, ctx.fresh("reshape"))


@_reg("Reshape")
def _reshape(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    shape = _ints(_host(ctx, node, ins[1], "shape")) if len(ins) > 1 else list(at["shape"])
    allowzero = int(at.get("allowzero", 0))
    dims = [x.shape[i] if (s == 0 and not allowzero) else s for i, s in enumerate(shape)]
    if -1 in dims:
        known = math.prod(v for v in dims if v != -1)
        dims[dims.index(-1)] = math.prod(x.shape) // known
    return [_reshape_to(ctx, x, dims)]


@_reg("Flatten")
def _flatten(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    ax = int(at.get("axis", 1))
    ax = ax + len(x.shape) if ax < 0 else ax  # -1 is the last axis (not ndim)
    return [_reshape_to(ctx, x, (math.prod(x.shape[:ax]), math.prod(x.shape[ax:])))]


def _axes_arg(
    ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        return _ints(_host(ctx, node, ins[1], "axes"))
    return None if "axes" not in at else list(at["axes"])


@_reg("Squeeze")
def _squeeze(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    axes = _axes_arg(ctx, node, ins, at)
    nd = len(x.shape)
    if axes is None:
        axes = [i for i, s in enumerate(x.shape) if s == 1]
    axes = _norm_axes(axes, nd)
    return [_reshape_to(ctx, x, [s for i, s in enumerate(x.shape) if i not in axes])]


@_reg("Unsqueeze")
def _unsqueeze(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ins[0]
    axes = _axes_arg(ctx, node, ins, at) or []
    nd = len(x.shape) + len(axes)
    axes = _norm_axes(axes, nd)
    it = iter(x.shape)
    return [_reshape_to(ctx, x, [1 if i in axes else next(it) for i in range(nd)])]


@_reg("Transpose")
def _transpose(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    perm = at.get("perm")
    return [ops.transpose(x, None if perm is None else list(perm), name=ctx.fresh("transpose"))]


@_reg("Concat")
def _concat(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    vals = [ctx.tensor(v) for v in ins if v is not None and math.prod(v.shape) > 0]
    if len(vals) == 1:
        return [vals[0]]
    return [ops.concat(vals, axis=int(at["axis"]), name=ctx.fresh("concat"))]


def _slice(ctx: _Ctx, x: Tensor, starts, ends, axes, steps) -> Tensor:  # noqa: ANN001
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
        return np.zeros(shape, dtype=np.float32)  # type: ignore[return-value]

    def body(*idx: IterVar) -> Expr:
        subs = []
        for i, k, b in zip(idx, step, begin, strict=True):
            e: Expr = i if k == 1 else i * k
            subs.append(e + b if b else e)
        return x[tuple(subs)]

    return ctx.compute(shape, body, "slice")


@_reg("Slice")
def _slice_op(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    if len(ins) > 1:
        starts = _ints(_host(ctx, node, ins[1], "starts"))
        ends = _ints(_host(ctx, node, ins[2], "ends"))
        axes = (
            _ints(_host(ctx, node, ins[3], "axes"))
            if len(ins) > 3 and ins[3] is not None
            else list(range(len(starts)))
        )
        steps = (
            _ints(_host(ctx, node, ins[4], "steps"))
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


@_reg("Split")
def _split(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", 0)) % x.ndim
    nout = len(node.output)
    if len(ins) > 1 and ins[1] is not None:
        sizes = _ints(_host(ctx, node, ins[1], "split"))
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


@_reg("Pad")
def _pad(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    mode = at.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise UnsupportedOpError(f"Pad mode '{mode}'")
    if len(ins) > 1:
        pads = _ints(_host(ctx, node, ins[1], "pads"))
        value = (
            float(_host(ctx, node, ins[2], "constant_value").reshape(-1)[0])
            if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size
            else 0.0
        )
        axes = (
            _norm_axes(_ints(_host(ctx, node, ins[3], "axes")), x.ndim)
            if len(ins) > 3 and ins[3] is not None
            else list(range(x.ndim))
        )
    else:
        pads = list(at["pads"])
        value = float(at.get("value", 0.0))
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


def _pad_axis(ctx: _Ctx, x: Tensor, d: int, b: int, e: int, mode: str) -> Tensor:
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


@_reg("Expand")
def _expand(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    shape = _bshape(x.shape, _ints(_host(ctx, node, ins[1], "shape")))
    return [ctx.compute(shape, lambda *i: x[_bidx(x.shape, i)], "expand")]


@_reg("Tile")
def _tile(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    reps = _ints(_host(ctx, node, ins[1], "repeats"))
    shape = [s * r for s, r in zip(x.shape, reps, strict=True)]

    def body(*i: IterVar) -> Expr:
        return x[tuple(k % s if r > 1 else k for k, s, r in zip(i, x.shape, reps, strict=True))]

    return [ctx.compute(shape, body, "tile")]


@_reg("Dropout")
def _dropout(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    if len(ins) > 2 and ins[2] is not None and bool(np.asarray(_host(ctx, node, ins[2], "mode"))):
        raise UnsupportedOpError("Dropout training_mode=true")
    return [ins[0], np.ones(ins[0].shape, dtype=np.bool_)]


@_reg("Gather")
def _gather(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
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
            return [_gather_runtime(ctx, x, ctx.tensor(ind.astype(np.float32)), ax)]
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
    return [_reshape_to(ctx, y, out_shape)]


def _gather_runtime(ctx: _Ctx, x: Tensor, idx: Tensor, axis: int) -> Tensor:
    """``x`` gathered along ``axis`` by run-time indices (``te.data_index``)."""
    ax = axis % x.ndim
    n = x.shape[ax]
    shape = (*x.shape[:ax], *idx.shape, *x.shape[ax + 1 :])
    q = idx.ndim

    def body(*i: IterVar) -> Expr:
        v = idx[tuple(i[ax : ax + q])]
        sub = te.data_index(te.where(v < 0.0, v + float(n), v))
        return x[(*i[:ax], sub, *i[ax + q :])]

    return ctx.compute(shape, body, "gather")


@_reg("Shape")
def _shape(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    s = np.asarray(ins[0].shape, dtype=np.int64)
    start, end = at.get("start", 0), at.get("end")
    return [s[start:end]]


@_reg("Size")
def _size(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    return [np.asarray(math.prod(ins[0].shape), dtype=np.int64)]


# ---- index-valued and scan operators


@_reg("Mod")
def _mod(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """``fmod=1``: C ``fmod`` (sign of the dividend); else numpy ``mod`` (sign of the divisor).
    An infinite divisor keeps a finite dividend (numpy: or gives the divisor on a sign flip)."""
    fmod = bool(int(at.get("fmod", 0)))

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

    return [_map(ctx, ins[:2], f, "mod")]


def _iota(k: Expr) -> Expr:
    return te.cast(k, "float32")


def _arg_reduce(
    ctx: _Ctx, x: Tensor, ax: int, largest: bool, last: bool, keep: bool, hint: str
) -> Tensor:
    """Index of the max (min) along ``ax``: the extreme value, then the first (last) position
    holding it; NaN counts as the extreme (as numpy's argmax)."""
    n = x.shape[ax]
    ext = _reduce(ctx, x, [ax], True, "max" if largest else "min")
    shape = tuple(1 if d == ax else s for d, s in enumerate(x.shape) if keep or d != ax)
    k = te.reduce_axis(n, name="ka")

    def body(*i: IterVar) -> Expr:
        full = list(i) if keep else [*i[:ax], as_expr(0), *i[ax:]]
        at_k = list(full)
        at_k[ax] = k
        v, m = x[tuple(at_k)], ext[tuple(as_expr(0) if d == ax else e for d, e in enumerate(full))]
        hit = te.equal(v, m) | (te.not_equal(v, v) & te.not_equal(m, m))
        if last:
            return te.max(te.where(hit, _iota(k), -1.0), axis=k)
        return te.min(te.where(hit, _iota(k), float(n)), axis=k)

    return ctx.compute(shape, body, hint)


@_reg("ArgMax", "ArgMin")
def _argmax(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    ax = int(at.get("axis", 0))
    ax = ax + x.ndim if ax < 0 else ax
    return [
        _arg_reduce(
            ctx,
            x,
            ax,
            node.op_type == "ArgMax",
            bool(at.get("select_last_index", 0)),
            bool(at.get("keepdims", 1)),
            node.op_type.lower(),
        )
    ]


@_reg("CumSum")
def _cumsum(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x = ctx.tensor(ins[0])
    ax = int(_host(ctx, node, ins[1], "axis").reshape(-1)[0])
    ax = ax + x.ndim if ax < 0 else ax
    excl, rev = bool(at.get("exclusive", 0)), bool(at.get("reverse", 0))
    k = te.reduce_axis(x.shape[ax], name="kc")

    def body(*i: IterVar) -> Expr:
        j = i[ax]
        inside = (k > j if excl else k >= j) if rev else (k < j if excl else k <= j)
        return te.sum(te.where(inside, x[(*i[:ax], k, *i[ax + 1 :])], 0.0), axis=k)

    return [ctx.compute(x.shape, body, "cumsum")]


@_reg("TopK")
def _topk(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """k rounds of (extreme value, first index holding it) over the not-yet-chosen positions."""
    x = ctx.tensor(ins[0])
    kk = int(_host(ctx, node, ins[1], "K").reshape(-1)[0])
    ax = int(at.get("axis", -1))
    ax = ax + x.ndim if ax < 0 else ax
    largest = bool(at.get("largest", 1))
    n = x.shape[ax]
    if kk > n or kk < 1:
        raise ExpressionError(f"TopK k={kk} out of range for axis of size {n}")
    fill = -math.inf if largest else math.inf
    rshape = tuple(1 if d == ax else s for d, s in enumerate(x.shape))
    vals: list[Tensor] = []
    idxs: list[Tensor] = []
    for _ in range(kk):
        prev = list(idxs)

        def chosen(i: Sequence[Expr], j: Expr, prev: list[Tensor] = prev) -> Expr | None:
            c: Expr | None = None
            for p in prev:
                e = te.equal(
                    _iota(j), p[tuple(as_expr(0) if d == ax else v for d, v in enumerate(i))]
                )
                c = e if c is None else (c | e)
            return c

        def val_body(*i: IterVar, chosen: Callable[..., Any] = chosen) -> Expr:
            k = te.reduce_axis(n, name="kt")
            v = x[(*i[:ax], k, *i[ax + 1 :])]
            c = chosen(i, k)
            v = v if c is None else te.where(c, fill, v)
            return te.max(v, axis=k) if largest else te.min(v, axis=k)

        v = ctx.compute(rshape, val_body, "topk_val")

        def idx_body(*i: IterVar, chosen: Callable[..., Any] = chosen, v: Tensor = v) -> Expr:
            k = te.reduce_axis(n, name="ki")
            hit = te.equal(x[(*i[:ax], k, *i[ax + 1 :])], v[i])
            c = chosen(i, k)
            if c is not None:
                hit = hit & te.equal(c, 0.0)
            return te.min(te.where(hit, _iota(k), float(n)), axis=k)

        idxs.append(ctx.compute(rshape, idx_body, "topk_idx"))
        vals.append(v)
    if kk == 1:
        return [vals[0], idxs[0]]
    return [
        ops.concat(vals, axis=ax, name=ctx.fresh("topk_values")),
        ops.concat(idxs, axis=ax, name=ctx.fresh("topk_indices")),
    ]


# ---- layout: depth/space, einsum


@_reg("DepthToSpace", "SpaceToDepth")
def _depth_space(
    ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
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


@_reg("Einsum")
def _einsum(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
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


# ---- Resize


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
        _fold(one, [np.zeros(shape, np.float32), *ins[1:]], opset)
    finally:
        ref._interpolate_1d_along_axis = orig
    at = _attrs(node)
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


@_reg("Resize")
def _resize(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Each resized axis: ``c[o] + sum_t w[t, o] * x[.., idx[t, o], ..]`` over the few taps of
    the interpolation (1 nearest, 2 linear, 4 cubic), tables computed on the host."""
    x = ctx.tensor(ins[0])
    host = [
        None if v is None else _host(ctx, node, v, nm)
        for v, nm in zip(ins[1:], ("roi", "scales", "sizes"), strict=False)
    ]
    y: Tensor = x
    for axis, m, c in _resize_axis_maps(node, [None, *host], x.shape, ctx.opset):
        nz = m != 0
        taps = max(1, int(nz.sum(axis=1).max()))
        idx = np.zeros((taps, m.shape[0]), np.float32)
        w = np.zeros((taps, m.shape[0]), np.float32)
        for o in range(m.shape[0]):
            cols = np.flatnonzero(nz[o])
            idx[: len(cols), o] = cols
            w[: len(cols), o] = m[o, cols]
        shape = list(y.shape)
        shape[axis] = m.shape[0]
        src = y
        ones = taps == 1 and bool(np.all(nz.sum(axis=1) == 1) and np.all(w[0] == 1.0))
        cvec = c.astype(np.float32)
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


# ---- recurrent layers, unrolled over the static sequence length

_ACT: dict[str, Callable[[Expr], Expr]] = {
    "sigmoid": te.sigmoid,
    "tanh": te.tanh,
    "relu": lambda v: te.maximum(v, 0.0),
}


def _rnn_acts(at: dict[str, Any], defaults: list[str], ndir: int) -> list[Callable[[Expr], Expr]]:
    names = [a.decode() if isinstance(a, bytes) else a for a in at.get("activations", [])]
    names = names or defaults * ndir
    out = []
    for nm in names:
        if nm.lower() not in _ACT:
            raise UnsupportedOpError(f"recurrent activation '{nm}' (Sigmoid, Tanh, Relu only)")
        out.append(_ACT[nm.lower()])
    return out


def _rnn_common(
    ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], ngates: int
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, int, int, int, int, list[int]]:
    if int(at.get("layout", 0)):
        x = ops.transpose(ctx.tensor(ins[0]), (1, 0, 2), name=ctx.fresh("rnn_x"))
    else:
        x = ctx.tensor(ins[0])
    w, r = ctx.tensor(ins[1]), ctx.tensor(ins[2])
    b = ctx.tensor(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    seq, batch, _ = x.shape
    hidden = r.shape[-1]
    if len(ins) > 4 and ins[4] is not None:
        lens = _ints(_host(ctx, node, ins[4], "sequence_lens"))
        if any(v != seq for v in lens):
            raise UnsupportedOpError("sequence_lens shorter than the sequence (padded batches)")
    if at.get("clip") is not None:
        raise UnsupportedOpError("recurrent clip attribute")
    d = at.get("direction", b"forward")
    d = d.decode() if isinstance(d, bytes) else d
    dirs = {"forward": [0], "reverse": [1], "bidirectional": [0, 1]}[d]
    return x, w, r, b, seq, batch, hidden, ngates, dirs


def _gate_inputs(
    ctx: _Ctx, x: Tensor, w: Tensor, b: Tensor | None, di: int, ngh: int, hint: str
) -> Tensor:
    """``X_t W^T + Wb + Rb`` for every step at once: (seq, batch, gates*hidden)."""
    seq, batch, nin = x.shape
    k = te.reduce_axis(nin, name="kx")
    xw = ctx.compute(
        (seq, batch, ngh), lambda t, i, g: te.sum(x[t, i, k] * w[di, g, k], axis=k), hint
    )
    if b is None:
        return xw
    return ctx.compute(
        (seq, batch, ngh), lambda t, i, g: xw[t, i, g] + b[di, g] + b[di, g + ngh], hint + "_b"
    )


def _recur(ctx: _Ctx, h: Tensor | None, r: Tensor, di: int, ngh: int, hint: str) -> Tensor | None:
    """``H_{t-1} R^T``: (batch, gates*hidden), or None at t=0 without an initial state."""
    if h is None:
        return None
    batch, hid = h.shape
    k = te.reduce_axis(hid, name="kh")
    return ctx.compute((batch, ngh), lambda i, g: te.sum(h[i, k] * r[di, g, k], axis=k), hint)


def _state0(ctx: _Ctx, ins: list[Any], pos: int, di: int, batch: int, hid: int) -> Tensor | None:
    if len(ins) > pos and ins[pos] is not None:
        s = ctx.tensor(ins[pos])
        return ctx.compute((batch, hid), lambda i, j: s[di, i, j], "rnn_init")
    return None


def _rnn_outputs(
    ctx: _Ctx, at: dict[str, Any], hs: list[list[Tensor]], finals: list[list[Tensor]]
) -> list[Value]:
    """Y (seq, dirs, batch, hidden) (layout 1: batch, seq, dirs, hidden) and the final states."""
    seq = len(hs[0])
    batch, hid = hs[0][0].shape
    nd = len(hs)
    layout = int(at.get("layout", 0))
    steps = [h for d in range(nd) for h in hs[d]]

    def ybody(t: IterVar, dd: IterVar, i: IterVar, j: IterVar) -> Expr:
        v: Expr = as_expr(0.0)
        for n, h in enumerate(steps):  # a select over the (static) step and direction
            hit = te.equal(t, n % seq) & te.equal(dd, n // seq)
            v = te.where(hit, h[i, j], v) if n else h[i, j]
        return v

    y = ctx.compute((seq, nd, batch, hid), ybody, "rnn_y")
    if layout:
        y = ops.transpose(y, (2, 0, 1, 3), name=ctx.fresh("rnn_y"))
    outs: list[Value] = [y]
    for k in range(len(finals[0])):
        st = _stack_dirs(ctx, [f[k] for f in finals])
        outs.append(ops.transpose(st, (1, 0, 2), name=ctx.fresh("rnn_st")) if layout else st)
    return outs


def _stack_dirs(ctx: _Ctx, parts: list[Tensor]) -> Tensor:
    """(batch, hidden) states of each direction -> (dirs, batch, hidden)."""

    def body(dd: IterVar, i: IterVar, j: IterVar) -> Expr:
        v: Expr = parts[0][i, j]
        for n, p in enumerate(parts[1:], 1):
            v = te.where(te.equal(dd, n), p[i, j], v)
        return v

    return ctx.compute((len(parts), *parts[0].shape), body, "rnn_state")


@dataclass
class _Cell:
    """One direction of a recurrent layer: its weights, activations and gate-input tensor."""

    xw: Tensor  # X_t W^T (+ biases) for every step: (seq, batch, gates*hidden)
    r: Tensor  # (dirs, gates*hidden, hidden)
    b: Tensor | None  # (dirs, 2*gates*hidden)
    p: Tensor | None  # LSTM peepholes (dirs, 3*hidden)
    dw: int  # direction index into the weights
    hid: int
    acts: list[Callable[[Expr], Expr]]


def _lstm_step(
    ctx: _Ctx, cl: _Cell, t: int, h: Tensor | None, c: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One LSTM step (gates i, o, f, c): the new cell state, then the new hidden state."""
    hid, (f, g, hact) = cl.hid, cl.acts
    batch = cl.xw.shape[1]
    hr = _recur(ctx, h, cl.r, cl.dw, 4 * hid, "lstm_hr")

    def pre(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = cl.xw[t, i, gate * hid + j]
        return v + hr[i, gate * hid + j] if hr is not None else v

    def peep(k: int, cc: Tensor | None, i: IterVar, j: IterVar) -> Expr:
        if cl.p is None or cc is None:
            return as_expr(0.0)
        return cl.p[cl.dw, k * hid + j] * cc[i, j]

    def cbody(i: IterVar, j: IterVar) -> Expr:
        it = f(pre(i, j, 0) + peep(0, c, i, j))
        ft = f(pre(i, j, 2) + peep(2, c, i, j))
        ct = g(pre(i, j, 3))
        return ft * c[i, j] + it * ct if c is not None else it * ct

    c2 = ctx.compute((batch, hid), cbody, "lstm_c")

    def hbody(i: IterVar, j: IterVar) -> Expr:
        return f(pre(i, j, 1) + peep(1, c2, i, j)) * hact(c2[i, j])

    return ctx.compute((batch, hid), hbody, "lstm_h"), c2


@_reg("LSTM")
def _lstm(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w, r, b, seq, batch, hid, _, dirs = _rnn_common(ctx, node, ins, at, 4)
    if int(at.get("input_forget", 0)):
        raise UnsupportedOpError("LSTM input_forget=1")
    acts = _rnn_acts(at, ["Sigmoid", "Tanh", "Tanh"], len(dirs))
    p = ctx.tensor(ins[7]) if len(ins) > 7 and ins[7] is not None else None
    hs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for n, di in enumerate(dirs):
        dw = n
        cl = _Cell(
            _gate_inputs(ctx, x, w, b, dw, 4 * hid, "lstm_xw"),
            r,
            b,
            p,
            dw,
            hid,
            acts[3 * n : 3 * n + 3],
        )
        h = _state0(ctx, ins, 5, dw, batch, hid)
        c = _state0(ctx, ins, 6, dw, batch, hid)
        out: dict[int, Tensor] = {}
        for t in range(seq) if di == 0 else range(seq - 1, -1, -1):
            h, c = _lstm_step(ctx, cl, t, h, c)
            out[t] = h
        hs.append([out[t] for t in range(seq)])
        finals.append([h, c])  # type: ignore[list-item]
    return _rnn_outputs(ctx, at, hs, finals)


def _gru_step(ctx: _Ctx, cl: _Cell, t: int, h: Tensor | None, lbr: bool) -> Tensor:
    """One GRU step (gates z, r, h); ``lbr``: linear_before_reset."""
    hid, (f, g) = cl.hid, cl.acts
    batch = cl.xw.shape[1]
    b, dw = cl.b, cl.dw
    hr = _recur(ctx, h, cl.r, dw, 3 * hid, "gru_hr")

    def wb(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = cl.xw[t, i, gate * hid + j]
        return v + b[dw, gate * hid + j] if b is not None else v

    def rpart(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = hr[i, gate * hid + j] if hr is not None else as_expr(0.0)
        return v + b[dw, 3 * hid + gate * hid + j] if b is not None else v

    hr2: Tensor | None = None
    if not lbr and h is not None:  # (r_t * H_{t-1}) R_h^T: a reduction after the reset gate
        rt = ctx.compute(
            (batch, hid), lambda i, j: f(wb(i, j, 1) + rpart(i, j, 1)) * h[i, j], "gru_rh"
        )
        k = te.reduce_axis(hid, name="kr")
        hr2 = ctx.compute(
            (batch, hid),
            lambda i, j: te.sum(rt[i, k] * cl.r[dw, 2 * hid + j, k], axis=k),
            "gru_rhr",
        )

    def hbody(i: IterVar, j: IterVar) -> Expr:
        zt = f(wb(i, j, 0) + rpart(i, j, 0))
        if lbr:
            ht = g(wb(i, j, 2) + f(wb(i, j, 1) + rpart(i, j, 1)) * rpart(i, j, 2))
        else:
            rec = hr2[i, j] if hr2 is not None else as_expr(0.0)
            rec = rec + b[dw, 5 * hid + j] if b is not None else rec
            ht = g(wb(i, j, 2) + rec)
        prev = h[i, j] if h is not None else as_expr(0.0)
        return (1.0 - zt) * ht + zt * prev

    return ctx.compute((batch, hid), hbody, "gru_h")


@_reg("GRU")
def _gru(ctx: _Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w, r, b, seq, batch, hid, _, dirs = _rnn_common(ctx, node, ins, at, 3)
    acts = _rnn_acts(at, ["Sigmoid", "Tanh"], len(dirs))
    lbr = bool(int(at.get("linear_before_reset", 0)))
    hs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for n, di in enumerate(dirs):
        dw = n
        # the W-side gate inputs without bias: the recurrent bias Rb_h sits inside the reset
        cl = _Cell(
            _gate_inputs(ctx, x, w, None, dw, 3 * hid, "gru_xw"),
            r,
            b,
            None,
            dw,
            hid,
            acts[2 * n : 2 * n + 2],
        )
        h = _state0(ctx, ins, 5, dw, batch, hid)
        out: dict[int, Tensor] = {}
        for t in range(seq) if di == 0 else range(seq - 1, -1, -1):
            h = _gru_step(ctx, cl, t, h, lbr)
            out[t] = h
        hs.append([out[t] for t in range(seq)])
        finals.append([h])  # type: ignore[list-item]
    return _rnn_outputs(ctx, at, hs, finals)


# Ops that fold on the host when all inputs are constants but have no runtime form.
HOST_ONLY = {"Constant", "ConstantOfShape", "Range", "NonZero", "Round"}
HOST_ONLY_ALWAYS = {"Constant", "ConstantOfShape", "Range"}
SUPPORTED_OPS = frozenset(HANDLERS) | HOST_ONLY_ALWAYS


def _fold(node: onnx.NodeProto, ins: list[Any], opset: int) -> list[np.ndarray]:
    """Evaluate one node on host constants with the ONNX reference implementation."""
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Constant":
        at = _attrs(node)
        if "value" in at:
            return [numpy_helper.to_array(at["value"])]
        for k, dt in (
            ("value_float", np.float32),
            ("value_floats", np.float32),
            ("value_int", np.int64),
            ("value_ints", np.int64),
        ):
            if k in at:
                return [np.asarray(at[k], dtype=dt)]
        raise UnsupportedOpError(f"Constant '{node.name}': unsupported value attribute")
    names = [f"in{i}" if n else "" for i, n in enumerate(node.input)]
    outs = [f"out{i}" for i in range(len(node.output))]
    n2 = helper.make_node(node.op_type, names, outs, domain=node.domain)
    n2.attribute.extend(node.attribute)
    feeds = {nm: np.asarray(v) for nm, v in zip(names, ins, strict=True) if nm}
    g = helper.make_graph(
        [n2],
        "fold",
        [
            helper.make_tensor_value_info(
                nm, helper.np_dtype_to_tensor_dtype(feeds[nm].dtype), feeds[nm].shape
            )
            for nm in names
            if nm
        ],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]


def foldable_values(model: onnx.ModelProto, known: Sequence[str] = ()) -> set[str]:
    """Names of the values of ``model`` known at import time (static analysis).

    Initializers, the graph inputs named in ``known``, ``Constant``-like nodes, ``Shape``/``Size``
    (shapes are static) and every node whose inputs are all known: such a node is evaluated on the
    host by the ONNX reference implementation whatever its operator, so it needs no handler.
    """
    vals = {t.name for t in model.graph.initializer} | set(known) | {""}
    for n in model.graph.node:
        if n.domain not in ("", "ai.onnx"):
            continue
        if (
            n.op_type in HOST_ONLY_ALWAYS
            or n.op_type in ("Shape", "Size")
            or (n.input and all(i in vals for i in n.input))
        ):
            vals.update(o for o in n.output if o)
    return vals


def unsupported_ops(model: onnx.ModelProto, known: Sequence[str] = ()) -> Counter[str]:
    """Op types in ``model`` (main graph) that polyfuse cannot import, with counts.

    Nodes that fold at import time (all inputs known, see :func:`foldable_values`) never count.
    """
    vals = foldable_values(model, known)
    c: Counter[str] = Counter()
    for n in model.graph.node:
        std = n.domain in ("", "ai.onnx")
        if std and n.output and all(o in vals for o in n.output if o) and n.input:
            continue
        if not std or n.op_type not in SUPPORTED_OPS:
            c[n.op_type if std else f"{n.domain}.{n.op_type}"] += 1
    return c


# --------------------------------------------------------------------------- entry point


def _read(model: str | os.PathLike[str] | onnx.ModelProto | bytes) -> tuple[onnx.ModelProto, str]:
    """The model and the name errors use for it: the file name, else the graph name."""
    if isinstance(model, onnx.ModelProto):
        return model, model.graph.name or "model"
    if isinstance(model, bytes):
        try:
            return onnx.load_from_string(model), "model"
        except Exception as e:  # noqa: BLE001
            raise OnnxImportError(f"cannot parse ONNX model bytes: {e}") from None
    path = os.fspath(model)
    if not os.path.exists(path):
        raise OnnxImportError(f"ONNX file '{path}' does not exist")
    try:
        m = onnx.load(path)
    except Exception as e:  # noqa: BLE001
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise OnnxImportError(f"cannot read ONNX file '{path}': {msg}") from None
    if not m.graph.node and not m.graph.output:
        raise OnnxImportError(f"cannot read ONNX file '{path}': not an ONNX model (empty graph)")
    return m, os.path.basename(path)


def _input_shape(name: str, vi: onnx.ValueInfoProto, shapes: dict[str, Sequence[int]]) -> tuple:
    tt = vi.type.tensor_type
    if vi.name in shapes:
        return tuple(int(s) for s in shapes[vi.name])
    dims = list(tt.shape.dim) if tt.HasField("shape") else None
    if dims is None or any(not d.HasField("dim_value") or d.dim_value < 0 for d in dims):
        desc = (
            "has no shape"
            if dims is None
            else "has dynamic shape ("
            + ", ".join(d.dim_param or "?" if not d.dim_value else str(d.dim_value) for d in dims)
            + ")"
        )
        raise OnnxImportError(
            f"model '{name}': input '{vi.name}' {desc}; pass shapes={{'{vi.name}': (...)}} to "
            f"polyfuse.onnx.load (on the command line: --shapes {vi.name}=D0,D1,...)"
        )
    return tuple(d.dim_value for d in dims)


def load(
    model: str | os.PathLike[str] | onnx.ModelProto | bytes,
    shapes: dict[str, Sequence[int]] | None = None,
    values: dict[str, np.ndarray] | None = None,
) -> OnnxModel:
    """Import an ONNX model (path, bytes or ``ModelProto``) as a te graph.

    ``shapes`` fixes symbolic or dynamic input dims: ``{"input_name": (1, 3, 224, 224)}``.
    ``values`` specializes the graph on the values of some graph inputs (they become constants
    and leave ``inputs``): needed when a graph input feeds an attribute-like input (axes, shape,
    starts/ends, pads, split, min/max), which :class:`InputValueNeeded` reports.
    Nodes whose inputs are all known at import time are evaluated then, whatever their operator.
    Raises :class:`UnsupportedOpError` listing every unsupported op type (with counts) that
    folding does not remove, before any conversion, and :class:`OnnxImportError` for unreadable
    files or unresolved dynamic shapes.
    """
    m, name = _read(model)
    shapes = dict(shapes or {})
    values = {k: np.asarray(v) for k, v in (values or {}).items()}
    bad = unsupported_ops(m, list(values))
    if bad:
        listing = ", ".join(f"{k} x{v}" for k, v in sorted(bad.items(), key=lambda kv: -kv[1]))
        raise UnsupportedOpError(f"model '{name}' uses unsupported ONNX operators: {listing}")
    opset = next(
        (o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        onnx.defs.onnx_opset_version(),
    )
    ctx = _Ctx(name, opset)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    for k, v in inits.items():
        ctx.values[k] = np.asarray(v)
    inputs: list[Tensor] = []
    input_names: list[str] = []
    all_inputs = {i.name for i in m.graph.input}
    for what, given in (("shapes", shapes), ("values", values)):
        unknown = set(given) - all_inputs
        if unknown:
            raise OnnxImportError(
                f"model '{name}': {what}= names unknown inputs {sorted(unknown)}; inputs are "
                f"{[i.name for i in m.graph.input if i.name not in inits]}"
            )
    for vi in m.graph.input:
        if vi.name in values:
            ctx.values[vi.name] = values[vi.name]
            continue
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = _input_shape(name, vi, shapes)
        np_dt = np.dtype(helper.tensor_dtype_to_np_dtype(tt.elem_type) if tt.elem_type else "f4")
        if 0 in shape:  # a zero-size input has one possible value: a host constant
            ctx.values[vi.name] = np.zeros(shape, dtype=np_dt)
            continue
        if np_dt.kind not in "fiub":
            raise UnsupportedOpError(
                f"model '{name}': input '{vi.name}' has dtype {np_dt.name}; polyfuse compiles "
                "float, integer and boolean inputs (as float32) only"
            )
        t = te.placeholder(shape, "float32", _ident(vi.name))
        ctx.values[vi.name] = t
        ctx.graph_inputs[id(t)] = vi.name
        inputs.append(t)
        input_names.append(vi.name)

    for pos, node in enumerate(m.graph.node):
        ctx.node_name = node.name or f"{node.op_type}_{node.output[0]}"
        where = f"model '{name}', node #{pos} '{ctx.node_name}' ({node.op_type})"
        ins = [ctx.values[i] if i else None for i in node.input]
        for i in node.input:
            if i and i not in ctx.values:
                raise OnnxImportError(f"{where} reads unknown value '{i}'")
        host = bool(node.input) and all(v is None or isinstance(v, np.ndarray) for v in ins)
        at = _attrs(node)
        try:
            if not host and (
                node.op_type not in HANDLERS
                or node.op_type in HOST_ONLY_ALWAYS
                or any(isinstance(v, np.ndarray) and v.size == 0 for v in ins)
            ):  # no run-time form (or empty data): fold, specialized on graph-input values
                for v in ins:
                    if isinstance(v, Tensor) and id(v) in ctx.graph_inputs:
                        gi = ctx.graph_inputs[id(v)]
                        raise InputValueNeeded(
                            f"{node.op_type} is evaluated at import time here; the value of "
                            f"graph input '{gi}' is needed (values={{'{gi}': ...}})",
                            gi,
                        )
            if node.op_type in HOST_ONLY_ALWAYS or (
                host and node.op_type not in ("Shape", "Size", "Dropout", "Identity")
            ):
                big = any(v is not None and v.size > 1 << 22 for v in ins)
                if node.op_type not in HOST_ONLY_ALWAYS and big and node.op_type in HANDLERS:
                    outs = HANDLERS[node.op_type](ctx, node, ins, at)
                else:
                    outs = _fold(node, ins, opset)
            elif node.op_type in HANDLERS:
                outs = HANDLERS[node.op_type](ctx, node, ins, at)
            else:
                raise UnsupportedOpError(
                    f"{node.op_type} needs constant inputs (a run-time input is given)"
                )
        except InputValueNeeded as e:
            raise InputValueNeeded(f"{where}: {e}", e.input_name) from None
        except PolyfuseError as e:
            raise type(e)(f"{where}: {e}") from None
        except Exception as e:  # noqa: BLE001  (the reference evaluator while folding)
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OnnxImportError(f"{where}: cannot evaluate at import time: {msg}") from None
        for o, v in zip(node.output, outs, strict=False):
            if o:
                ctx.values[o] = v

    outputs: list[Tensor] = []
    out_names: list[str] = []
    out_dtypes: list[np.dtype] = []
    const_outs: dict[str, np.ndarray] = {}
    for vi in m.graph.output:
        v = ctx.values[vi.name]
        et = vi.type.tensor_type.elem_type
        out_dtypes.append(
            np.dtype(helper.tensor_dtype_to_np_dtype(et)) if et else np.dtype("float32")
        )
        out_names.append(vi.name)
        if isinstance(v, np.ndarray):
            const_outs[vi.name] = v
            continue
        if v.is_placeholder or any(v is o for o in outputs):
            src = v
            v = ctx.compute(v.shape, lambda *i, s=src: s[i], "out")
        outputs.append(v)
    return OnnxModel(
        name,
        inputs,
        outputs,
        ctx.constants,
        input_names,
        out_names,
        out_dtypes,
        const_outs,
    )
