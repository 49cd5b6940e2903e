"""Built-in example graphs, each with a numpy reference.

Every example is a function returning ``(inputs, outputs, reference)``:

``inputs``
    the ``te.placeholder`` tensors, in the order the compiled graph takes its arrays;
``outputs``
    the tensors to compute;
``reference``
    a numpy function taking one float32 array per input (same order) and returning a tuple with
    one array per output, computed in float64.

Shapes are small, so that each example runs on the CPU emulator in a few seconds, and
deliberately not multiples of 32 (the usual tile size), so that partial tiles are exercised.
``polyfuse demo`` compiles and checks all of them; ``examples/*.py`` are the same graphs
written out as standalone scripts.

Example::

    from polyfuse import examples
    inputs, outputs, reference = examples.softmax()
    fn = polyfuse.compile(inputs=inputs, outputs=outputs)
    arrays = examples.random_inputs(inputs)
    error = examples.max_error(fn(*arrays), reference(*arrays))
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from polyfuse import ops, te
from polyfuse.graph.expr import Tensor

__all__ = [
    "EXAMPLES",
    "Example",
    "attention",
    "conv2d_relu",
    "layer_norm",
    "matmul_bias_gelu",
    "max_error",
    "random_inputs",
    "softmax",
]

#: ``(inputs, outputs, reference)``: what every example function returns.
Built = tuple[list[Tensor], list[Tensor], Callable[..., tuple[np.ndarray, ...]]]


# --------------------------------------------------------------------------- numpy helpers


def _np_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _np_gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _np_conv2d(x: np.ndarray, w: np.ndarray, padding: int) -> np.ndarray:
    """Stride-1 cross-correlation with zero padding (NCHW input, OIHW weight)."""
    n, _c, h, wd = x.shape
    o, _c, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    oh, ow = h + 2 * padding - kh + 1, wd + 2 * padding - kw + 1
    out = np.zeros((n, o, oh, ow), np.float64)
    for a in range(kh):
        for b in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, a : a + oh, b : b + ow], w[:, :, a, b])
    return out


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [np.asarray(a, dtype=np.float64) for a in arrays]


# --------------------------------------------------------------------------- the examples


def softmax(rows: int = 10, cols: int = 100) -> Built:
    """Softmax over the rows of a matrix (``ops.softmax``: max, subtract, exp, sum, divide)."""
    x = te.placeholder((rows, cols), name="x")
    y = ops.softmax(x, axis=-1, name="softmax")

    def reference(x: np.ndarray) -> tuple[np.ndarray, ...]:
        (x,) = _f64(x)
        return (_np_softmax(x),)

    return [x], [y], reference


def layer_norm(rows: int = 12, features: int = 72, eps: float = 1e-5) -> Built:
    """Layer norm over the last dim with learned scale ``gamma`` and shift ``beta``."""
    x = te.placeholder((rows, features), name="x")
    gamma = te.placeholder((features,), name="gamma")
    beta = te.placeholder((features,), name="beta")
    y = ops.layer_norm(x, gamma, beta, axis=-1, eps=eps, name="layer_norm")

    def reference(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray) -> tuple[np.ndarray, ...]:
        x, gamma, beta = _f64(x, gamma, beta)
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return ((x - mean) / np.sqrt(var + eps) * gamma + beta,)

    return [x, gamma, beta], [y], reference


def matmul_bias_gelu(m: int = 33, k: int = 40, n: int = 50, dtype: str = "float32") -> Built:
    """A dense layer: ``gelu(a @ w + bias)`` (exact, erf-based GELU); every tensor ``dtype``
    (16-bit floats run on tensor cores)."""
    a = te.placeholder((m, k), dtype, name="a")
    w = te.placeholder((k, n), dtype, name="w")
    bias = te.placeholder((n,), dtype, name="bias")
    y = ops.gelu(ops.add(ops.matmul(a, w, name="matmul"), bias, name="bias_add"), name="gelu")

    def reference(a: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, ...]:
        a, w, bias = _f64(a, w, bias)
        return (_np_gelu(a @ w + bias),)

    return [a, w, bias], [y], reference


def conv2d_relu(
    batch: int = 1,
    channels: int = 3,
    size: int = 14,
    filters: int = 8,
    kernel: int = 3,
    dtype: str = "float32",
) -> Built:
    """``relu(conv2d(x, w) + bias)``, NCHW, stride 1, zero padding 1; every tensor ``dtype``."""
    x = te.placeholder((batch, channels, size, size), dtype, name="x")
    w = te.placeholder((filters, channels, kernel, kernel), dtype, name="w")
    bias = te.placeholder((filters,), dtype, name="bias")
    y = ops.relu(ops.conv2d(x, w, bias, stride=1, padding=1, name="conv2d"), name="relu")

    def reference(x: np.ndarray, w: np.ndarray, bias: np.ndarray) -> tuple[np.ndarray, ...]:
        x, w, bias = _f64(x, w, bias)
        return (np.maximum(_np_conv2d(x, w, 1) + bias[None, :, None, None], 0.0),)

    return [x, w, bias], [y], reference


def attention(
    batch: int = 1, heads: int = 2, seq: int = 16, dim: int = 8, dtype: str = "float32"
) -> Built:
    """Scaled dot-product attention: ``softmax(Q·Kᵀ / sqrt(D)) · V`` on ``[B, H, S, D]``;
    every tensor ``dtype``."""
    shape = (batch, heads, seq, dim)
    q = te.placeholder(shape, dtype, name="q")
    k = te.placeholder(shape, dtype, name="k")
    v = te.placeholder(shape, dtype, name="v")
    scale = 1.0 / math.sqrt(dim)
    kt = ops.transpose(k, (0, 1, 3, 2), name="k_t")
    scores = ops.mul(ops.matmul(q, kt, name="qk"), scale, name="scores")
    probs = ops.softmax(scores, axis=-1, name="probs")
    out = ops.matmul(probs, v, name="attn")

    def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
        q, k, v = _f64(q, k, v)
        return (_np_softmax(q @ k.transpose(0, 1, 3, 2) * scale) @ v,)

    return [q, k, v], [out], reference


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class Example:
    """A named built-in example: ``build()`` returns ``(inputs, outputs, reference)``."""

    name: str
    build: Callable[[], Built]

    @property
    def description(self) -> str:
        """The first line of the example function's docstring."""
        return (self.build.__doc__ or self.name).strip().splitlines()[0].replace("``", "")


#: Every built-in example by name, in the order ``polyfuse demo`` runs them.
EXAMPLES: dict[str, Example] = {
    f.__name__: Example(f.__name__, f)
    for f in (softmax, layer_norm, matmul_bias_gelu, conv2d_relu, attention)
}


def random_inputs(inputs: Sequence[Tensor], seed: int = 0) -> list[np.ndarray]:
    """One standard-normal float32 array per input tensor, reproducible from ``seed``."""
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]


def max_error(
    got: np.ndarray | Sequence[np.ndarray], want: np.ndarray | Sequence[np.ndarray]
) -> float:
    """Largest absolute difference over all outputs (``inf`` on a shape mismatch or NaN)."""
    got_t = (got,) if isinstance(got, np.ndarray) else tuple(got)
    want_t = (want,) if isinstance(want, np.ndarray) else tuple(want)
    if len(got_t) != len(want_t):
        return math.inf
    worst = 0.0
    for g, w in zip(got_t, want_t, strict=True):
        g, w = np.asarray(g, np.float64), np.asarray(w, np.float64)
        if g.shape != w.shape:
            return math.inf
        if g.size:
            d = float(np.max(np.abs(g - w)))
            worst = math.inf if math.isnan(d) else max(worst, d)
    return worst
