"""``polyfuse.onnx``: import ONNX models into polyfuse and run them through the ONNX backend API.

Example::

    import polyfuse.onnx
    m = polyfuse.onnx.load("model.onnx", shapes={"input": (1, 3, 224, 224)})
    fn = m.compile()                       # polyfuse.compile(m.inputs, m.outputs, constants=...)
    (y,) = fn(x, device="emulate")

Needs the ``onnx`` package (``pip install 'polyfuse[onnx]'``).
"""

from polyfuse.onnx.importer import (
    SUPPORTED_OPS,
    InputValueNeeded,
    OnnxImportError,
    OnnxModel,
    load,
    unsupported_nodes,
    unsupported_ops,
)

__all__ = [
    "SUPPORTED_OPS",
    "InputValueNeeded",
    "OnnxImportError",
    "OnnxModel",
    "load",
    "unsupported_nodes",
    "unsupported_ops",
]
