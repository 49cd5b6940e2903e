"""Conversion of one ONNX node: fold it on the host when everything it reads is known, else run
its operator's handler; errors are re-raised with the node's location."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx

from polyfuse.errors import PolyfuseError, UnsupportedOpError
from polyfuse.graph.expr import Tensor
from polyfuse.onnx.analysis import node_reads
from polyfuse.onnx.common import (
    HANDLERS,
    Ctx,
    InputValueNeeded,
    OnnxImportError,
    Value,
    attrs_of,
    node_label,
)
from polyfuse.onnx.fold import HOST_ONLY_ALWAYS, fold_node


def node_inputs(
    node: onnx.NodeProto, values: Mapping[str, Value], where: str
) -> tuple[list[Any], dict[str, Value]]:
    """The values of ``node``'s inputs (None for an omitted one) and of the outer values its
    subgraphs capture; a name not yet defined is an :class:`OnnxImportError`."""
    for i in node_reads(node):
        if i not in values:
            raise OnnxImportError(f"{where} reads unknown value '{i}'")
    ins = [values[i] if i else None for i in node.input]
    caps = {c: values[c] for c in node_reads(node) if c not in node.input}
    return ins, caps


def convert_node(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], caps: dict[str, Value]
) -> list[Value]:
    """The output values of ``node`` given its inputs ``ins`` and captured values ``caps``.

    A node whose inputs and captured values are all host constants folds (whatever its
    operator); otherwise its handler builds te computes. A node without a run-time form that
    reads a graph input raises :class:`InputValueNeeded` (the backend then specializes on it).
    """
    ctx.node_name = node_label(node)
    read = [*ins, *caps.values()]
    host = bool(node.input or caps) and all(v is None or isinstance(v, np.ndarray) for v in read)
    at = attrs_of(node)
    if not host and (
        node.op_type not in HANDLERS
        or node.op_type in HOST_ONLY_ALWAYS
        or any(isinstance(v, np.ndarray) and v.size == 0 for v in ins)
    ):  # no run-time form (or empty data): fold, specialized on graph-input values
        for v in read:
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
            return HANDLERS[node.op_type](ctx, node, ins, at)
        return fold_node(node, ins, ctx.opset, {k: np.asarray(v) for k, v in caps.items()})
    if node.op_type in HANDLERS:
        return HANDLERS[node.op_type](ctx, node, ins, at)
    raise UnsupportedOpError(f"{node.op_type} needs constant inputs (a run-time input is given)")


@contextmanager
def located(where: str) -> Iterator[None]:
    """Re-raise errors inside with ``where`` (model, node position and name) in front; the
    reference evaluator's own errors (while folding) become :class:`OnnxImportError`."""
    try:
        yield
    except InputValueNeeded as e:
        raise InputValueNeeded(f"{where}: {e}", e.input_name) from None
    except PolyfuseError as e:
        raise type(e)(f"{where}: {e}") from None
    except Exception as e:  # noqa: BLE001  (the reference evaluator while folding)
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise OnnxImportError(f"{where}: cannot evaluate at import time: {msg}") from None
