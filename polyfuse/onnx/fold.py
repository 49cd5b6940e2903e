"""Import-time folding: a node whose inputs are all host constants is evaluated by the ONNX
reference implementation."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from polyfuse.errors import UnsupportedOpError
from polyfuse.onnx.common import attrs_of

# Ops that fold on the host when all inputs are constants but have no runtime form.
HOST_ONLY = {"Constant", "ConstantOfShape", "Range", "NonZero"}
#: operators always evaluated at import time: their outputs are shapes' worth of values made
#: from attributes and scalar inputs (a graph input there is specialized on its value)
HOST_ONLY_ALWAYS = {
    "Constant",
    "ConstantOfShape",
    "Range",
    "HannWindow",
    "HammingWindow",
    "BlackmanWindow",
    "MelWeightMatrix",
}


def fold_node(
    node: onnx.NodeProto,
    ins: list[Any],
    opset: int,
    captured: dict[str, np.ndarray] | None = None,
) -> list[np.ndarray]:
    """Evaluate one node on host constants with the ONNX reference implementation.

    ``captured``: the outer values the node's subgraphs read (a Loop body's captured tensors),
    given to the one-node model as graph inputs under their own names.
    """
    from onnx.reference import ReferenceEvaluator

    if node.op_type == "Constant":
        at = attrs_of(node)
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
    names = [f"__pf_in{i}" if n else "" for i, n in enumerate(node.input)]
    outs = [f"__pf_out{i}" for i in range(len(node.output))]
    n2 = helper.make_node(node.op_type, names, outs, domain=node.domain)
    n2.attribute.extend(node.attribute)
    feeds = {nm: np.asarray(v) for nm, v in zip(names, ins, strict=True) if nm}
    feeds.update({k: np.asarray(v) for k, v in (captured or {}).items()})
    g = helper.make_graph(
        [n2],
        "fold",
        [
            helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            for nm, v in feeds.items()
        ],
        [helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in outs],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]
