"""uint64 tensors: held in int64 with the same bits (:func:`~polyfuse.onnx.common.storage_dtype`).

Wrapping arithmetic (Add, Sub, Mul, sums, MatMul), Equal, Where and the layout operators are the
same on the bits; what reads them as numbers is converted here, from the uint64 types ONNX's
type inference gives the node's values:

- ordered operators (comparisons, Max, Min, Clip, ArgMax/ArgMin, TopK, ReduceMax/ReduceMin,
  max pooling) run on their operands with the top bit flipped (``x + 2**63``, wrapping), which
  maps the unsigned order onto the signed one; uint64 results are flipped back;
- Div and Mod divide unsigned (:func:`~polyfuse.onnx.intmath.uint64_div`); Abs is the
  identity and Sign is ``x != 0``;
- Cast from uint64 to a float converts the bits from 2**63 as ``2 * ((x >> 1) | (x & 1))``
  (rounded once, as compilers convert unsigned 64-bit integers); Cast from a float to uint64
  subtracts 2**63 before converting values from 2**63;
- other operators that read the values as signed (ReduceMean, ReduceL1, ...) are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx

from polyfuse import te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, Tensor
from polyfuse.onnx.common import Ctx, Value, map_elementwise, node_label, storage_dtype
from polyfuse.onnx.intmath import flip_sign_bit, uint64_div, uint64_mod

U64 = np.dtype(np.uint64)
ORDERED = frozenset(
    ("Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Max", "Min", "Clip", "ArgMax")
    + ("ArgMin", "TopK", "ReduceMax", "ReduceMin", "MaxPool", "GlobalMaxPool")
)
#: operators on uint64 values that are the same on their int64 bits
SAME_BITS = frozenset(
    ("Add", "Sub", "Mul", "Sum", "MatMul", "Einsum", "Equal", "Where", "Identity", "Pow")
    + ("ReduceSum", "CumSum", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")
    + ("Concat", "Slice", "Split", "Pad", "Expand", "Tile", "Gather", "GatherND", "OneHot")
    + ("Dropout", "DepthToSpace", "SpaceToDepth", "Shape", "Size", "GatherElements", "Trilu")
    + ("BitwiseAnd", "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift")
)


def reads_uint64(node: onnx.NodeProto, types: dict[str, np.dtype]) -> bool:
    """Does ``node`` read a uint64 value, or Cast to uint64?"""
    if any(i and types.get(i) == U64 for i in node.input):
        return True
    return node.op_type == "Cast" and any(types.get(o) == U64 for o in node.output)


def _host_flip(v: np.ndarray) -> np.ndarray:
    return (np.asarray(v).astype(np.uint64) ^ np.uint64(1 << 63)).view(np.int64)


def convert_uint64(
    ctx: Ctx,
    node: onnx.NodeProto,
    ins: list[Any],
    types: dict[str, np.dtype],
    convert: Any,
) -> list[Value]:
    """The outputs of ``node`` (which reads uint64 run-time values); ``convert(node, ins)``
    converts a node as usual."""
    op, label = node.op_type, f"{node.op_type} '{node_label(node)}'"
    is_u = [bool(i) and types.get(i) == U64 for i in node.input]
    if op in ("Div", "Mod"):
        f = uint64_div if op == "Div" else uint64_mod
        return [map_elementwise(ctx, ins[:2], f, op.lower())]
    if op == "Abs":
        return [ins[0]]
    if op == "Sign":
        return [
            map_elementwise(ctx, ins[:1], lambda x: te.cast(te.not_equal(x, 0), "int64"), "sign")
        ]
    if op in ("Cast", "CastLike"):
        return [_cast(ctx, node, ins, types, is_u[0], convert)]
    if op in ORDERED:
        flipped = [
            _flip_value(ctx, v) if u and v is not None else v
            for v, u in zip(ins, is_u, strict=False)
        ]
        outs = convert(node, flipped)
        return [
            _flip_value(ctx, v) if o and types.get(o) == U64 else v
            for o, v in zip(node.output, outs, strict=False)
        ]
    if op in SAME_BITS:
        return convert(node, ins)
    raise UnsupportedOpError(
        f"{label} of uint64 values is not supported (they are held in int64; values from "
        "2**63 would read as negative)"
    )


def _flip_value(ctx: Ctx, v: Value) -> Value:
    if isinstance(v, np.ndarray):
        return _host_flip(v)
    t: Tensor = ctx.tensor(v)
    return ctx.compute(t.shape, lambda *i: flip_sign_bit(t[i]), "flip")


def _cast(
    ctx: Ctx,
    node: onnx.NodeProto,
    ins: list[Any],
    types: dict[str, np.dtype],
    from_u: bool,
    convert: Any,
) -> Value:
    to = types.get(node.output[0])
    x = ctx.tensor(ins[0])
    floating = to is not None and (to.kind == "f" or to == dtypes.numpy_dtype("bfloat16"))
    if from_u and floating:
        want = storage_dtype(to)

        def f(v: Expr) -> Expr:
            h = flip_sign_bit(v // 2)  # v >> 1 (unsigned)
            odd = te.cast(te.equal(h % 2, 0) & te.equal(v % 2, 1), "int64")
            hi = te.cast(h + odd, want) * 2  # ((v >> 1) | (v & 1)) * 2: rounded once
            return te.where(v < 0, hi, te.cast(v, want))

        return map_elementwise(ctx, [x], f, "cast")
    if to == U64 and dtypes.is_float(x.dtype):
        lim = 2.0**63

        def g(v: Expr) -> Expr:
            top = flip_sign_bit(te.cast(v - lim, "int64"))
            return te.where(v >= lim, top, te.cast(v, "int64"))

        return map_elementwise(ctx, [x], g, "cast")
    return convert(node, ins)[0]
