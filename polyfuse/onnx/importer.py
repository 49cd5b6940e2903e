"""ONNX → polyfuse importer: an ONNX graph becomes a te graph built from :mod:`polyfuse.ops`.

Every ONNX value is either a *host constant* (a numpy array: initializers, ``Constant``,
``Shape`` of a static tensor, and anything computed only from constants, folded on the host
with the ONNX reference implementation) or a :class:`~polyfuse.graph.expr.Tensor` of the te
graph. A host constant becomes a placeholder bound through ``compile(constants=...)`` only when
a runtime op reads it as data; shape arguments (``Reshape`` shapes, ``Slice`` starts, axes
inputs, ...) stay on the host and become static attributes.

Runtime tensors keep their dtype: float16, bfloat16, float32, float64, uint8, int8, int16,
int32, int64 and bool inputs, initializers and constants become te tensors of that dtype
(uint16 is held in int32, uint32/uint64 in int64: :func:`~polyfuse.onnx.common.storage_dtype`), and
an operator's result has the dtype ONNX gives it: te's rules for its operands (a float16 Add
is float16, an int64 Mul int64 and exact, a comparison bool), integer ``Div``/``Mod`` by ONNX's
rules (:mod:`~polyfuse.onnx.intmath`), ``Cast`` by ONNX's. float64 compiles as float64 (never
downcast). After each node the result is checked against the dtype ONNX's type inference
gives it (:func:`_settle`): an integer result that a handler could only compute in floats is
refused, never rounded. The backend converts outputs back to the ONNX output types.

The operators live in modules by family (``ops_elementwise``, ``ops_reduce``, ``ops_nn``,
``ops_attention``, ``ops_loss``, ``ops_quant``, ``ops_layout``, ``ops_index``, ``ops_resize``,
``ops_rnn``, ``ops_loop``), each registering its handlers in ``HANDLERS``;
:mod:`~polyfuse.onnx.analysis` decides before any conversion what folds and what cannot be
imported (values captured by Loop/If/Scan bodies count as node inputs), and
:mod:`~polyfuse.onnx.convert` converts one node.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

import polyfuse
from polyfuse import te
from polyfuse.compiled import CompiledGraph
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Tensor

# the operator families register their handlers in HANDLERS on import
from polyfuse.onnx import (
    ops_attention,
    ops_elementwise,
    ops_index,
    ops_layout,
    ops_loop,
    ops_loss,
    ops_nn,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_rnn,
)
from polyfuse.onnx.analysis import describe_unsupported, foldable_values, unsupported_nodes
from polyfuse.onnx.common import (
    HANDLERS,
    WIDENED_INTS,
    Ctx,
    InputValueNeeded,
    OnnxImportError,
    Value,
    ident_of,
    node_label,
    storage_dtype,
    wrap_int,
)
from polyfuse.onnx.convert import convert_node, located, node_inputs
from polyfuse.onnx.fold import HOST_ONLY_ALWAYS
from polyfuse.onnx.unsigned import convert_uint64, reads_uint64

_FAMILIES = (
    ops_attention,
    ops_elementwise,
    ops_index,
    ops_layout,
    ops_loop,
    ops_loss,
    ops_nn,
    ops_quant,
    ops_reduce,
    ops_resize,
    ops_rnn,
)

__all__ = [
    "InputValueNeeded",
    "OnnxImportError",
    "OnnxModel",
    "SUPPORTED_OPS",
    "Value",
    "foldable_values",
    "load",
    "unsupported_nodes",
    "unsupported_ops",
]


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
        kw.setdefault("name", ident_of(self.name) or "onnx_model")
        return polyfuse.compile(self.inputs, self.outputs, constants=self.constants, **kw)


SUPPORTED_OPS = frozenset(HANDLERS) | HOST_ONLY_ALWAYS


def unsupported_ops(model: onnx.ModelProto, known: Sequence[str] = ()) -> Counter[str]:
    """Op types in ``model`` (main graph) that polyfuse cannot import, with counts.

    Nodes that fold at import time (inputs and captured values known, see
    :func:`~polyfuse.onnx.analysis.foldable_values`) never count;
    :func:`~polyfuse.onnx.analysis.unsupported_nodes` lists the nodes themselves.
    """
    return Counter(n.op for n in unsupported_nodes(model, known))


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


def _inferred_types(m: onnx.ModelProto) -> dict[str, np.dtype]:
    """Value name → the numpy dtype ONNX's type inference gives it (empty where it fails)."""
    try:
        inf = onnx.shape_inference.infer_shapes(m)
    except Exception:  # noqa: BLE001  (inference is a check here, not a requirement)
        return {}
    out: dict[str, np.dtype] = {
        t.name: np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)) for t in m.graph.initializer
    }
    for vi in [*inf.graph.input, *inf.graph.value_info, *inf.graph.output]:
        et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
        if et:
            try:
                out[vi.name] = np.dtype(helper.tensor_dtype_to_np_dtype(et))
            except (KeyError, TypeError, ValueError):
                continue
    return out


def _output_dtype(vi: onnx.ValueInfoProto, v: Value, types: dict[str, np.dtype]) -> np.dtype:
    """The dtype graph output ``vi`` is returned in: its declared type; undeclared, the
    value's own (an integer: the type ONNX infers, int32 held for uint16 going back to
    uint16). It was float32 whatever the value: an int64 ArgMax came back as floats."""
    et = vi.type.tensor_type.elem_type if vi.type.HasField("tensor_type") else 0
    if et:
        return np.dtype(helper.tensor_dtype_to_np_dtype(et))
    own = v.dtype if isinstance(v, np.ndarray) else np.dtype(dtypes.numpy_dtype(v.dtype))
    inferred = types.get(vi.name)
    if inferred is not None and inferred.kind in "iu" and own.kind in "iu":
        return inferred
    return own


#: operators whose integer result can leave the range of its ONNX type (int8 100 + 100)
_OVERFLOWING = frozenset(
    ("Add", "Sub", "Mul", "Neg", "Abs", "Pow", "Sum", "Div", "CumSum", "ReduceSum")
    + ("ReduceSumSquare", "MatMul", "Einsum", "BitwiseNot")
)


def _settle(ctx: Ctx, node: onnx.NodeProto, name: str, v: Value, want: np.dtype | None) -> Value:
    """``v`` in the te dtype that holds ONNX's type of it: a bool or float result where ONNX
    says bool becomes ``!= 0``, integers of another width convert (two's complement), an
    integer or bool result where ONNX says float converts; an integer value that the handler
    computed in floats is refused (it would be exact only to 2**24). An arithmetic result of
    an integer type held in a wider one (uint16 in int32) wraps to its type's range, as ONNX's
    uint16 arithmetic does, so a later comparison or division sees ONNX's value."""
    if not isinstance(v, Tensor) or want is None:
        return v
    try:
        dt = storage_dtype(want)
    except UnsupportedOpError:
        return v
    narrow = want.name in WIDENED_INTS and want.name != "uint64"
    if v.dtype == dt and narrow and node.op_type in _OVERFLOWING:
        return ctx.compute(v.shape, lambda *i: wrap_int(v[i], want.name), "wrap")
    if v.dtype == dt or (dtypes.is_float(v.dtype) and dtypes.is_float(dt)):
        return v
    if dtypes.is_float(v.dtype) and dtypes.is_int(dt):
        raise UnsupportedOpError(
            f"output '{name}' is {want.name} in ONNX but polyfuse computes {node.op_type} of "
            f"these operands in {v.dtype}, exact only to 2**24; integer {node.op_type} is "
            "not supported (Cast its inputs to a float type in the model)"
        )
    return ctx.compute(
        v.shape,
        lambda *i: te.not_equal(v[i], 0) if dt == "bool" else te.cast(v[i], dt),
        "as_" + dt,
    )


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
    Raises :class:`UnsupportedOpError` listing every unsupported op type (with counts and the
    position and name of its nodes) that folding does not remove, before any conversion, and
    :class:`OnnxImportError` for unreadable files or unresolved dynamic shapes.
    """
    m, name = _read(model)
    shapes = dict(shapes or {})
    values = {k: np.asarray(v) for k, v in (values or {}).items()}
    bad = unsupported_nodes(m, list(values))
    if bad:
        raise UnsupportedOpError(describe_unsupported(name, bad))
    opset = next(
        (o.version for o in m.opset_import if o.domain in ("", "ai.onnx")),
        onnx.defs.onnx_opset_version(),
    )
    ctx = Ctx(name, opset)
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
        try:
            dt = storage_dtype(np_dt)
        except UnsupportedOpError:
            raise UnsupportedOpError(
                f"model '{name}': input '{vi.name}' has dtype {np_dt.name}; polyfuse imports "
                "float16, bfloat16, float32, float64, integer and boolean inputs"
            ) from None
        t = te.placeholder(shape, dt, ident_of(vi.name))
        ctx.values[vi.name] = t
        ctx.graph_inputs[id(t)] = vi.name
        inputs.append(t)
        input_names.append(vi.name)

    types = _inferred_types(m)
    ctx.types = types
    for pos, node in enumerate(m.graph.node):
        where = f"model '{name}', node #{pos} '{node_label(node)}' ({node.op_type})"
        ins, caps = node_inputs(node, ctx.values, where)
        with located(where):
            if reads_uint64(node, types) and any(isinstance(v, Tensor) for v in ins):
                outs = convert_uint64(
                    ctx, node, ins, types, lambda n, i, c=caps: convert_node(ctx, n, i, c)
                )
            else:
                outs = convert_node(ctx, node, ins, caps)
            outs = [
                _settle(ctx, node, o, v, types.get(o)) if o else v
                for o, v in zip(node.output, outs, strict=False)
            ]
        for o, v in zip(node.output, outs, strict=False):
            if o:
                ctx.values[o] = v

    outputs: list[Tensor] = []
    out_names: list[str] = []
    out_dtypes: list[np.dtype] = []
    const_outs: dict[str, np.ndarray] = {}
    for vi in m.graph.output:
        v = ctx.values[vi.name]
        out_dtypes.append(_output_dtype(vi, v, types))
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
