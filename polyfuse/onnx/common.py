"""Shared state and helpers of the ONNX importer: the conversion context, errors, the handler
registry, broadcasting maps and the reductions/reshapes several operator families use."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, PolyfuseError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.dtypes import HALF_DTYPES
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.ops._common import highest, lowest, narrow, wide  # noqa: F401  (re-exported)

Value = Tensor | np.ndarray


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


def ident_of(s: str) -> str:
    s = re.sub(r"[^0-9A-Za-z_]", "_", s)
    return ("t_" + s) if not s or s[0].isdigit() else s


def attrs_of(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def str_attr(at: dict[str, Any], name: str, default: str) -> str:
    """A string attribute (ONNX stores bytes), or ``default`` where it is absent."""
    v = at.get(name, default)
    return v.decode() if isinstance(v, bytes) else str(v)


def ints_of(v: Any) -> list[int]:
    return [int(x) for x in np.asarray(v).reshape(-1)]


def bshape(*shapes: Sequence[int]) -> tuple[int, ...]:
    try:
        return tuple(int(s) for s in np.broadcast_shapes(*[tuple(s) for s in shapes]))
    except ValueError:
        raise ExpressionError(f"shapes {', '.join(map(str, shapes))} do not broadcast") from None


def bidx(shape: Sequence[int], idx: Sequence[Expr]) -> tuple[Expr, ...]:
    off = len(idx) - len(shape)
    return tuple(as_expr(0) if s == 1 else idx[off + d] for d, s in enumerate(shape))


class Ctx:
    """Conversion state: values by ONNX name, constant placeholders, fresh names."""

    def __init__(self, model_name: str, opset: int) -> None:
        self.model_name = model_name
        self.opset = opset
        self.values: dict[str, Value] = {}
        self.constants: dict[Tensor, np.ndarray] = {}
        self._const_tensors: dict[tuple[int, str | None], Tensor] = {}
        self._n = 0
        self.node_name = "node"
        #: id(placeholder) -> ONNX graph input name (to ask for its value when needed)
        self.graph_inputs: dict[int, str] = {}
        #: value name -> the numpy dtype ONNX's type inference gives it (the importer's)
        self.types: dict[str, np.dtype] = {}

    def onnx_dtype(self, name: str, v: Value) -> str:
        """The ONNX dtype name of value ``name``: what type inference says, else a host
        array's own, else a run-time tensor's storage dtype (a uint16 held in int32 is only
        known as uint16 from the model's types)."""
        if name in self.types:
            return self.types[name].name
        return v.dtype.name if isinstance(v, np.ndarray) else v.dtype

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{ident_of(self.node_name)}_{hint}{self._n}"

    def tensor(self, v: Value, like: str | None = None) -> Tensor:
        """A runtime tensor for ``v`` (a host constant becomes a bound placeholder).

        A host constant keeps its dtype as :func:`storage_dtype` maps it (float16, bfloat16,
        float32, float64, uint8, int8, int16, int32, int64, bool; uint16 widens to int32). ``like``
        (a dtype name) stores a float32 constant that the importer itself made (pooling
        divisors, index tables) in the dtype of the data it meets instead.
        """
        if isinstance(v, Tensor):
            return v
        key = (id(v), like)
        if key not in self._const_tensors:
            dt = storage_dtype(np.asarray(v).dtype)
            if like is not None and dt == "float32" and like in ("float16", "bfloat16"):
                dt = like
            arr = np.asarray(v, dtype=dtypes.numpy_dtype(dt), order="C")  # 0-d stays 0-d
            if arr.size == 0:
                raise UnsupportedOpError("empty (zero-size) tensors are not supported")
            t = te.placeholder(arr.shape, dt, self.fresh("const"))
            self.constants[t] = arr
            self._const_tensors[key] = t
            self._keep = getattr(self, "_keep", [])
            self._keep.append(v)  # keep id() stable
        return self._const_tensors[key]

    def compute(
        self, shape: Sequence[int], f: Callable[..., Any], hint: str, dtype: str | None = None
    ) -> Tensor:
        """A compute of the body's dtype (a float16 Add stays float16, an int64 Add int64, a
        comparison bool), or of ``dtype`` when given (the body converted as by ``te.cast``)."""
        shape = tuple(int(s) for s in shape)
        return te.compute(shape, f, name=self.fresh(hint), tag="onnx", dtype=dtype)


#: ONNX integer dtypes held in a wider te integer (exact; arithmetic wraps at the te width,
#: the backend wraps results back to the declared dtype, and ``Cast`` to them wraps at once)
WIDENED_INTS = {
    "uint16": "int32",
    "uint32": "int64",
    "uint64": "int64",
}


def wrap_int(v: Expr, name: str) -> Expr:
    """``v`` (int32/int64) wrapped into the range of the narrower ONNX integer ``name`` that
    it stands for (int8 300 → 44, uint8 -1 → 255), as two's-complement arithmetic does."""
    bits = np.iinfo(np.dtype(name)).bits
    if np.dtype(name).kind == "u":
        return v % (1 << bits)
    half = 1 << (bits - 1)
    return (v + half) % (1 << bits) - half


def storage_dtype(dt: Any) -> str:
    """The te dtype that holds an ONNX tensor of numpy dtype ``dt`` at run time: float16,
    bfloat16, float32, float64, uint8, int8, int16, int32, int64 and bool are themselves;
    uint16 is int32 and uint32 is int64 (exact); uint64 is int64 (two's complement: values
    from 2**63 read as negative); the 8- and 4-bit floats and 4/2-bit integers (ml_dtypes)
    are float32, which holds them exactly."""
    d = np.dtype(dt)
    if d == dtypes.numpy_dtype("bfloat16"):
        return "bfloat16"
    if d.kind == "f" and d.name in ("float16", "float32", "float64"):
        return d.name
    if d.kind == "b":
        return "bool"
    if d.kind in "iu" and d.name in ("int32", "int64", *dtypes.NARROW_INTS):
        return d.name
    if d.kind in "iu" and d.name in WIDENED_INTS:
        return WIDENED_INTS[d.name]
    if d.itemsize == 1 and d.name.startswith(
        ("float8", "float4", "int4", "uint4", "int2", "uint2")
    ):  # the 8/4/2-bit types (ml_dtypes) widen to float32 exactly
        return "float32"
    raise UnsupportedOpError(
        f"ONNX tensors of dtype {d.name} are not supported (float16, bfloat16, float32, "
        "float64, integers and bool are)"
    )


def dtype_of(v: Value) -> str:
    """The te dtype of a value: a tensor's own, a host array's :func:`storage_dtype`."""
    return v.dtype if isinstance(v, Tensor) else storage_dtype(np.asarray(v).dtype)


def is_int_value(v: Value) -> bool:
    """Is ``v`` an integer tensor or host array (not bool)?"""
    return dtypes.is_int(dtype_of(v))


def scalar_of(v: Value) -> float | int | bool | None:
    """The one value of a one-element host array, as a Python number of its kind (an int
    stays an int, so ``int64_tensor + 1`` stays int64, exact beyond 2**53); else None."""
    if isinstance(v, np.ndarray) and v.size == 1:
        x = v.reshape(-1)[0]
        if v.dtype.kind == "b":
            return bool(x)
        if v.dtype.kind in "iu":
            return int(x)
        return float(x)
    return None


def map_elementwise(ctx: Ctx, vals: Sequence[Value], f: Callable[..., Expr], hint: str) -> Tensor:
    """Broadcasting elementwise map of runtime tensors and (scalar-inlined) constants; a
    float32 host constant beside float16 (bfloat16) tensors is stored in their dtype, as ONNX
    types it (its operands share one type)."""
    shapes = [tuple(v.shape) for v in vals]
    shape = bshape(*shapes)
    # a float32 array the importer made (a divisor table) meets 16-bit data in its dtype
    halves = {v.dtype for v in vals if isinstance(v, Tensor) and v.dtype in dtypes.HALF_DTYPES}
    like = next(iter(halves)) if len(halves) == 1 else None
    ops_: list[Any] = []
    for v in vals:
        s = scalar_of(v)
        if s is not None and v.ndim <= len(shape):
            ops_.append(s)
        else:
            ops_.append(ctx.tensor(v, like=like))

    def body(*idx: IterVar) -> Expr:
        args = [o[bidx(o.shape, idx)] if isinstance(o, Tensor) else as_expr(o) for o in ops_]
        return as_expr(f(*args))

    if not shape:
        shape = ()
    return ctx.compute(shape, body, hint)


def as_bool(e: Expr) -> Expr:
    """``e`` as a bool expression (``!= 0`` unless it is bool already)."""
    return e if e.dtype == "bool" else te.not_equal(e, 0)


def norm_axes(axes: Sequence[int], ndim: int) -> list[int]:
    return sorted({int(a) % ndim if ndim else 0 for a in axes})


Handler = Callable[[Ctx, onnx.NodeProto, list[Any], dict[str, Any]], list[Value]]
HANDLERS: dict[str, Handler] = {}


#: op type -> static check of one node (before any conversion): None, or why it cannot import
NODE_CHECKS: dict[str, Callable[[onnx.NodeProto], str | None]] = {}


def node_label(node: onnx.NodeProto) -> str:
    """How errors name a node: its name, else ``<op>_<first output>``."""
    return node.name or f"{node.op_type}_{node.output[0] if node.output else ''}"


def optional_input(ins: Sequence[Any], k: int) -> Any:
    """Input ``k`` of a node, or None where it is omitted (absent, or named '')."""
    return ins[k] if len(ins) > k and ins[k] is not None else None


def register_op(*names: str) -> Callable[[Handler], Handler]:
    def deco(f: Handler) -> Handler:
        for n in names:
            HANDLERS[n] = f
        return f

    return deco


def host_value(ctx: Ctx, node: onnx.NodeProto, v: Any, what: str) -> np.ndarray:
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


def reduce_op(
    ctx: Ctx,
    x: Tensor,
    axes: list[int],
    keep: bool,
    kind: str,
    pre: Callable[[Expr], Expr] | None = None,
    post: Callable[[Expr], Expr] | None = None,
) -> Tensor:
    """``kind`` (sum, prod, max, min) of ``pre(x)`` over ``axes``, then ``post`` elementwise.
    A 16-bit float sum that feeds a ``post`` (a log, a square root) stays in float32 until
    ``post``'s result is rounded once: a float16 sum of squares overflows where its root does
    not."""
    if post is not None and x.dtype in HALF_DTYPES:
        up, down, pre_, post_ = wide(x), narrow(x), pre, post

        def pre(v: Expr) -> Expr:
            return pre_(up(v)) if pre_ else up(v)

        def post(v: Expr) -> Expr:
            return down(post_(v))

    if not axes:  # noop_with_empty_axes: the elementwise steps still apply (x*x, |x|, log)

        def each(v: Expr) -> Expr:
            v = pre(v) if pre else v
            return post(v) if post else v

        return map_elementwise(ctx, [x], each, "reduce")
    shape = tuple(1 if d in axes else s for d, s in enumerate(x.shape) if keep or d not in axes)
    ks = {d: te.reduce_axis(x.shape[d], name=f"r{d}") for d in axes}
    red = {"sum": te.sum, "prod": te.prod, "max": te.max, "min": te.min}[kind]

    def body(*idx: IterVar) -> Expr:
        v: Expr = x[ops.reduce_subscripts(x.ndim, ks, keep, idx)]
        return red(pre(v) if pre else v, axis=list(ks.values()))

    r = ctx.compute(shape, body, "reduce")
    return map_elementwise(ctx, [r], post, "reduce_post") if post else r


def reshape_to(ctx: Ctx, v: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(s) for s in shape)
    if isinstance(v, np.ndarray):
        return v.reshape(shape)
    if tuple(v.shape) == shape:
        return v
    if not shape:  # to 0-d (one element: a max keeps a bool a bool, where a sum counts)
        kind = "max" if v.dtype == "bool" else "sum"
        return reduce_op(ctx, v, list(range(v.ndim)), False, kind)
    if not v.shape:
        return ctx.compute(shape, lambda *i: v[()], "reshape")
    return ops.reshape(v, shape, ctx.fresh("reshape"))


def iota64(k: Expr) -> Expr:
    """A loop variable as an int64 value (ONNX's index dtype: ArgMax, TopK indices)."""
    return te.cast(k, "int64")
