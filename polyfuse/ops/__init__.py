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

The composites live in modules by concern (:mod:`~polyfuse.ops.elementwise`,
:mod:`~polyfuse.ops.reductions`, :mod:`~polyfuse.ops.norms`, :mod:`~polyfuse.ops.layout`,
:mod:`~polyfuse.ops.conv`, :mod:`~polyfuse.ops.sampling`, :mod:`~polyfuse.ops.sorting`,
:mod:`~polyfuse.ops.scatter`); every name is imported here, so ``polyfuse.ops.softmax`` is
the one spelling users and the front ends need.
"""

from __future__ import annotations

from polyfuse.ops._common import Index, Operand  # noqa: F401  (annotation types)
from polyfuse.ops.conv import (
    avg_pool2d,
    conv,  # noqa: F401  (public, not in __all__)
    conv2d,
    conv_transpose,  # noqa: F401  (public, not in __all__)
    matmul,
    max_pool2d,
)
from polyfuse.ops.elementwise import (
    abs,
    add,
    div,
    exp,
    gelu,
    log,
    maximum,
    minimum,
    mul,
    neg,
    pow,
    relu,
    rsqrt,
    sigmoid,
    sqrt,
    sub,
    tanh,
)
from polyfuse.ops.layout import concat, pad, reshape, slice, transpose
from polyfuse.ops.norms import (
    batch_norm,
    layer_norm,
    layer_norm_parts,  # noqa: F401  (public, not in __all__)
    rms_norm,
)
from polyfuse.ops.reductions import (
    log_softmax,
    reduce_max,
    reduce_mean,
    reduce_subscripts,  # noqa: F401  (public, not in __all__)
    reduce_sum,
    softmax,
)
from polyfuse.ops.sampling import grid_sample  # noqa: F401  (public, not in __all__)
from polyfuse.ops.scatter import index_put, scatter  # noqa: F401  (public, not in __all__)
from polyfuse.ops.sorting import sort, topk  # noqa: F401  (public, not in __all__)

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
