"""Two interchangeable op backends for the zoo's model definitions.

Every zoo model is written once, as a function ``model(b, cfg)`` over a backend ``b``:

* :class:`TeBackend` builds the polyfuse graph: ``b.input`` creates a ``te.placeholder`` that
  becomes a call argument, ``b.param`` a placeholder bound to an array in ``constants`` (a
  weight), both of the backend's dtype (float32, or bfloat16 / float16: the model on tensor
  cores), and every op is the matching :mod:`polyfuse.ops` composite;
* :class:`NumpyBackend` evaluates the same definition eagerly in float64 numpy, with its own
  implementation of each op (no polyfuse code), given the input arrays and the very same
  weight arrays. That is the numpy reference the tiny models are checked against.

Weights are never real: they are seeded random arrays (``weights="random"``, small values so
deep stacks stay finite) or lazily allocated zeros (``weights="zeros"``: ``np.zeros`` does not
touch memory, so a full-size BERT-base costs nothing until the emulator reads it). Compilation
only needs their shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from polyfuse import ops, te
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import Tensor

__all__ = ["FLOAT_DTYPES", "INPUT_KINDS", "NumpyBackend", "TeBackend"]

#: the dtypes a zoo model's inputs and weights may take (``build(..., dtype=)``): float32, or
#: the 16-bit types whose GEMMs and convolutions run on tensor cores
FLOAT_DTYPES = ("float32", "bfloat16", "float16")

#: How :meth:`polyfuse.zoo.ZooModel.sample_inputs` fills an input of each kind.
INPUT_KINDS = ("normal", "causal_mask", "positive")


class TeBackend:
    """Builds the te graph; records inputs (in creation order) and weight constants."""

    def __init__(self, seed: int = 0, weights: str = "random", dtype: str = "float32") -> None:
        if weights not in ("random", "zeros"):
            raise ValueError(f"weights must be 'random' or 'zeros', not {weights!r}")
        if dtype not in FLOAT_DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(FLOAT_DTYPES)}, not {dtype!r}")
        self.rng = np.random.default_rng(seed)
        self.weights = weights
        self.dtype = dtype
        self.inputs: list[Tensor] = []
        self.input_kinds: dict[str, str] = {}
        self.constants: dict[Tensor, np.ndarray] = {}
        self.params: dict[str, np.ndarray] = {}

    # ---------------------------------------------------------------- leaves

    def input(self, name: str, shape: Sequence[int], kind: str = "normal") -> Tensor:
        """A graph input (call argument); ``kind`` says how sample inputs are drawn."""
        assert kind in INPUT_KINDS, kind
        t = te.placeholder(tuple(shape), dtype=self.dtype, name=name)
        self.inputs.append(t)
        self.input_kinds[name] = kind
        return t

    def param(self, name: str, shape: Sequence[int], init: str = "weight") -> Tensor:
        """A weight: a placeholder bound to a constant array.

        ``init``: ``"weight"`` (normal / sqrt(fan_in)), ``"one"`` (1 + small noise: norm scales),
        ``"zero"`` (small noise: biases), ``"var"`` (positive: running variances).
        """
        shape = tuple(shape)
        t = te.placeholder(shape, dtype=self.dtype, name=name)
        if self.weights == "zeros":
            a = np.zeros(shape, numpy_dtype(self.dtype))
        else:
            fan_in = math.prod(shape[1:]) if len(shape) == 4 else (shape[0] if shape else 1)
            r = self.rng.standard_normal(shape).astype(np.float32)
            if init == "weight":
                a = r / np.float32(math.sqrt(max(fan_in, 1)))
            elif init == "one":
                a = 1.0 + 0.1 * r
            elif init == "var":
                a = 1.0 + 0.5 * np.abs(r)
            else:
                a = 0.1 * r
            a = a.astype(numpy_dtype(self.dtype))
        self.constants[t] = a
        self.params[name] = a
        return t

    # ---------------------------------------------------------------- elementwise

    add = staticmethod(ops.add)
    sub = staticmethod(ops.sub)
    mul = staticmethod(ops.mul)
    div = staticmethod(ops.div)
    maximum = staticmethod(ops.maximum)
    minimum = staticmethod(ops.minimum)
    relu = staticmethod(ops.relu)
    tanh = staticmethod(ops.tanh)
    sigmoid = staticmethod(ops.sigmoid)

    @staticmethod
    def gelu(x: Tensor, approximate: str = "none") -> Tensor:
        return ops.gelu(x, approximate=approximate)

    # ---------------------------------------------------------------- reductions, norms

    @staticmethod
    def reduce_sum(x: Tensor, axis: int | Sequence[int], keepdims: bool = False) -> Tensor:
        return ops.reduce_sum(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def reduce_mean(x: Tensor, axis: int | Sequence[int], keepdims: bool = False) -> Tensor:
        return ops.reduce_mean(x, axis=axis, keepdims=keepdims)

    @staticmethod
    def softmax(x: Tensor, axis: int = -1) -> Tensor:
        return ops.softmax(x, axis=axis)

    @staticmethod
    def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5) -> Tensor:
        return ops.layer_norm(x, gamma, beta, eps=eps)

    @staticmethod
    def batch_norm(
        x: Tensor, mean: Tensor, var: Tensor, gamma: Tensor, beta: Tensor, eps: float = 1e-5
    ) -> Tensor:
        return ops.batch_norm(x, mean, var, gamma, beta, eps=eps)

    # ---------------------------------------------------------------- linear algebra, layout

    matmul = staticmethod(ops.matmul)

    @staticmethod
    def transpose(x: Tensor, perm: Sequence[int]) -> Tensor:
        return ops.transpose(x, perm)

    @staticmethod
    def reshape(x: Tensor, shape: Sequence[int]) -> Tensor:
        return ops.reshape(x, shape)

    @staticmethod
    def concat(xs: Sequence[Tensor], axis: int) -> Tensor:
        return ops.concat(xs, axis=axis)

    @staticmethod
    def slice(x: Tensor, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]) -> Tensor:
        return ops.slice(x, starts, ends, axes)

    @staticmethod
    def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
        """numpy ``broadcast_to`` as one te.compute (reads unit dims at index 0)."""
        shape = tuple(shape)
        off = len(shape) - x.ndim

        def body(*i: Any) -> Any:
            return x[tuple(0 if s == 1 else i[off + d] for d, s in enumerate(x.shape))]

        return te.compute(shape, body, name=f"{x.name}_bcast")

    # ---------------------------------------------------------------- convolution, pooling

    @staticmethod
    def conv2d(
        x: Tensor,
        w: Tensor,
        bias: Tensor | None = None,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
    ) -> Tensor:
        return ops.conv2d(x, w, bias, stride=stride, padding=padding, groups=groups)

    @staticmethod
    def max_pool2d(x: Tensor, kernel: int, stride: int, padding: int = 0) -> Tensor:
        return ops.max_pool2d(x, kernel, stride, padding)

    @staticmethod
    def shape(x: Tensor) -> tuple[int, ...]:
        return tuple(x.shape)


_erf = np.vectorize(math.erf, otypes=[np.float64])


class NumpyBackend:
    """Evaluates a zoo model eagerly in float64 numpy (the reference)."""

    def __init__(self, inputs: dict[str, np.ndarray], params: dict[str, np.ndarray]) -> None:
        self.inputs = {k: np.asarray(v, np.float64) for k, v in inputs.items()}
        self.params = {k: np.asarray(v, np.float64) for k, v in params.items()}

    def input(self, name: str, shape: Sequence[int], kind: str = "normal") -> np.ndarray:
        a = self.inputs[name]
        assert a.shape == tuple(shape), (name, a.shape, shape)
        return a

    def param(self, name: str, shape: Sequence[int], init: str = "weight") -> np.ndarray:
        return self.params[name]

    add = staticmethod(np.add)
    sub = staticmethod(np.subtract)
    mul = staticmethod(np.multiply)
    div = staticmethod(np.divide)
    maximum = staticmethod(np.maximum)
    minimum = staticmethod(np.minimum)
    tanh = staticmethod(np.tanh)
    matmul = staticmethod(np.matmul)
    transpose = staticmethod(np.transpose)
    reshape = staticmethod(np.reshape)
    broadcast_to = staticmethod(np.broadcast_to)

    @staticmethod
    def relu(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0.0)

    @staticmethod
    def sigmoid(x: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-x))

    @staticmethod
    def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
        if approximate == "tanh":
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))

    @staticmethod
    def reduce_sum(x: np.ndarray, axis: int | Sequence[int], keepdims: bool = False) -> np.ndarray:
        ax = axis if isinstance(axis, int) else tuple(axis)
        return np.sum(x, axis=ax, keepdims=keepdims)

    @staticmethod
    def reduce_mean(x: np.ndarray, axis: int | Sequence[int], keepdims: bool = False) -> np.ndarray:
        ax = axis if isinstance(axis, int) else tuple(axis)
        return np.mean(x, axis=ax, keepdims=keepdims)

    @staticmethod
    def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        return e / e.sum(axis=axis, keepdims=True)

    @staticmethod
    def layer_norm(
        x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float = 1e-5
    ) -> np.ndarray:
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / np.sqrt(v + eps) * gamma + beta

    @staticmethod
    def batch_norm(
        x: np.ndarray,
        mean: np.ndarray,
        var: np.ndarray,
        gamma: np.ndarray,
        beta: np.ndarray,
        eps: float = 1e-5,
    ) -> np.ndarray:
        c = (slice(None), *([None] * (x.ndim - 2)))
        return (x - mean[c]) / np.sqrt(var[c] + eps) * gamma[c] + beta[c]

    @staticmethod
    def concat(xs: Sequence[np.ndarray], axis: int) -> np.ndarray:
        return np.concatenate(list(xs), axis=axis)

    @staticmethod
    def slice(
        x: np.ndarray, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int]
    ) -> np.ndarray:
        idx: list[Any] = [slice(None)] * x.ndim
        for s, e, a in zip(starts, ends, axes, strict=True):
            idx[a] = slice(s, e)
        return x[tuple(idx)]

    @staticmethod
    def conv2d(
        x: np.ndarray,
        w: np.ndarray,
        bias: np.ndarray | None = None,
        stride: int = 1,
        padding: int = 0,
        groups: int = 1,
    ) -> np.ndarray:
        n, c, h, wd = x.shape
        o, cg, kh, kw = w.shape
        xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
        oh = (h + 2 * padding - kh) // stride + 1
        ow = (wd + 2 * padding - kw) // stride + 1
        og = o // groups
        out = np.zeros((n, o, oh, ow))
        for g in range(groups):
            xs = xp[:, g * cg : (g + 1) * cg]
            ws = w[g * og : (g + 1) * og]
            for a in range(kh):
                for b in range(kw):
                    win = xs[:, :, a : a + stride * oh : stride, b : b + stride * ow : stride]
                    out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", win, ws[:, :, a, b])
        return out if bias is None else out + bias[None, :, None, None]

    @staticmethod
    def max_pool2d(x: np.ndarray, kernel: int, stride: int, padding: int = 0) -> np.ndarray:
        n, c, h, w = x.shape
        xp = np.pad(
            x, ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=-np.inf
        )
        oh = (h + 2 * padding - kernel) // stride + 1
        ow = (w + 2 * padding - kernel) // stride + 1
        out = np.full((n, c, oh, ow), -np.inf)
        for a in range(kernel):
            for b in range(kernel):
                win = xp[:, :, a : a + stride * oh : stride, b : b + stride * ow : stride]
                out = np.maximum(out, win)
        return out

    @staticmethod
    def shape(x: np.ndarray) -> tuple[int, ...]:
        return tuple(x.shape)
