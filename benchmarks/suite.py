"""The fusion benchmark suite: twelve subgraphs, built with polyfuse's te/ops API.

The subgraphs, shapes and constants are those of ``<repo>/../shared/bench/README.md``. Each
builder returns ``(inputs, outputs, reference)``: the placeholders, the output tensors (in the
order the README lists them) and a numpy function ``reference(*arrays) -> tuple of arrays``
that computes the same outputs from input arrays given in ``inputs`` order. The references are
written directly in numpy (float64 arithmetic, float32 results), independently of
``polyfuse.reference``.

``scale`` divides the non-reduced dimensions so the benchmarks can run on the CPU emulator
while every reduced axis (and every column layout, such as the LSTM gate slices) keeps its
full size. A dimension ``d`` becomes ``max(1, d // scale)``; where several leading dimensions
are scaled together, the factor is taken from the outermost first and what is left of it
carries on to the next one (see :func:`scale_dims`). What each subgraph scales is listed in
:data:`SCALED`.

Primitive counts (one ``te.compute`` each) follow the peers' graphs where the README leaves a
choice: a population variance is one reduction ``sum(d*d)/n`` over the centred values, and
normalisations are written out primitive by primitive, except ``layernorm_lib`` (the library
op ``ops.layer_norm``) and ``bias_gelu_tanh`` (``ops.gelu(approximate="tanh")``, one
primitive). ``lstm_cell`` takes its four gates with ``ops.slice`` (four primitives the peers,
whose slices are views, do not count).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from polyfuse import ops, te
from polyfuse.graph.expr import Tensor

LN_EPS = 1e-5
BN_EPS = 1e-5
RMS_EPS = 1e-6
ADAM_STEP = 10
ADAM_LR = 1e-3
ADAM_B1 = 0.9
ADAM_B2 = 0.999
ADAM_EPS = 1e-8

Reference = Callable[..., tuple[np.ndarray, ...]]
Built = tuple[list[Tensor], list[Tensor], Reference]

#: What ``scale`` divides, per subgraph (reduced axes are never scaled).
SCALED: dict[str, str] = {
    "layernorm": "rows 8192 (x, the output); the 768-wide normalised axis is kept",
    "layernorm_lib": "rows 8192; the 768-wide normalised axis is kept",
    "softmax": "rows 4096; the 1024-wide softmax axis is kept",
    "log_softmax": "rows 4096; the 1024-wide softmax axis is kept",
    "bias_gelu_tanh": "rows 8192 (no reduction); the 3072 bias columns are kept",
    "residual_layernorm": "rows 8192 of x and r; the 768-wide normalised axis is kept",
    "attn_softmax": "batch 16 then heads 12 then query rows 128 (carried); keys 128 kept",
    "lstm_cell": "batch rows 1024 of gates and c; the 2048 gate columns (4 slices) are kept",
    "batchnorm_train_relu": "channels 256 (the only non-reduced axis); N, H, W = 64, 28, 28 kept",
    "adam3": "rows 4096 of every p, g, m, v (no reduction); 1024 columns kept",
    "two_branches": "length of x1 (1048576) and rows of x2 (1024); x2's summed axis kept",
    "rmsnorm_swiglu": "rows 4096 of x, a and b; x's 4096 and a, b's 11008 columns kept",
}

NAMES: tuple[str, ...] = tuple(SCALED)


def scale_dims(dims: tuple[int, ...], scale: int) -> tuple[int, ...]:
    """Divide ``dims`` (outermost first) by ``scale`` in total, carrying what is left over.

    ``(16, 12, 128)`` by 64 gives ``(1, 3, 128)``: 16 absorbs a factor 16, 12 the remaining 4.
    No dimension drops below 1.
    """
    if scale < 1:
        raise ValueError(f"scale must be >= 1, got {scale}")
    out = []
    left = scale
    for d in dims:
        take = min(left, d)
        out.append(max(1, d // take))
        left = math.ceil(left / take)
    return tuple(out)


def _rows(d: int, scale: int) -> int:
    return scale_dims((d,), scale)[0]


#: the storage dtype of every placeholder :func:`build` makes (see its ``dtype``)
_DTYPE = ["float32"]


def _ph(shape: tuple[int, ...], name: str) -> Tensor:
    return te.placeholder(shape, _DTYPE[0], name=name)


def _f32(*arrays: np.ndarray) -> tuple[np.ndarray, ...]:
    return tuple(np.asarray(a, dtype=np.float32) for a in arrays)


def _f64(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float64)


# --------------------------------------------------------------------------- shared pieces


def _layernorm_prims(x: Tensor, gamma: Tensor, beta: Tensor, eps: float, name: str) -> Tensor:
    """Layer norm over the last axis, written out: 8 primitives.

    mean, d = x - mean, var = sum(d*d)/n (population), var + eps, rsqrt, d * rstd, * gamma,
    + beta.
    """
    n = x.shape[-1]
    rows = x.shape[:-1]
    mean = ops.reduce_mean(x, axis=-1, keepdims=True, name=f"{name}_mean")
    d = ops.sub(x, mean, name=f"{name}_d")
    k = te.reduce_axis(n, name="k")
    var = te.compute(
        (*rows, 1),
        lambda *i: te.sum(d[(*i[:-1], k)] * d[(*i[:-1], k)] * (1.0 / n), axis=k),
        name=f"{name}_var",
    )
    ve = ops.add(var, eps, name=f"{name}_var_eps")
    rstd = ops.rsqrt(ve, name=f"{name}_rstd")
    xn = ops.mul(d, rstd, name=f"{name}_xn")
    xg = ops.mul(xn, gamma, name=f"{name}_scale")
    return ops.add(xg, beta, name=name)


def _np_layernorm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    x = _f64(x)
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + eps) * _f64(gamma) + _f64(beta)


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-_f64(x)))


def _np_softmax(x: np.ndarray) -> np.ndarray:
    x = _f64(x)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --------------------------------------------------------------------------- builders


def layernorm(scale: int = 1) -> Built:
    m, n = _rows(8192, scale), 768
    x, gamma, beta = _ph((m, n), "x"), _ph((n,), "gamma"), _ph((n,), "beta")
    y = _layernorm_prims(x, gamma, beta, LN_EPS, "ln")

    def ref(x, gamma, beta):
        return _f32(_np_layernorm(x, gamma, beta, LN_EPS))

    return [x, gamma, beta], [y], ref


def layernorm_lib(scale: int = 1) -> Built:
    m, n = _rows(8192, scale), 768
    x, gamma, beta = _ph((m, n), "x"), _ph((n,), "gamma"), _ph((n,), "beta")
    y = ops.layer_norm(x, gamma, beta, axis=-1, eps=LN_EPS, name="ln")

    def ref(x, gamma, beta):
        return _f32(_np_layernorm(x, gamma, beta, LN_EPS))

    return [x, gamma, beta], [y], ref


def softmax(scale: int = 1) -> Built:
    x = _ph((_rows(4096, scale), 1024), "x")
    y = ops.softmax(x, axis=-1, name="sm")

    def ref(x):
        return _f32(_np_softmax(x))

    return [x], [y], ref


def log_softmax(scale: int = 1) -> Built:
    x = _ph((_rows(4096, scale), 1024), "x")
    y = ops.log_softmax(x, axis=-1, name="lsm")

    def ref(x):
        s = _f64(x) - _f64(x).max(-1, keepdims=True)
        return _f32(s - np.log(np.exp(s).sum(-1, keepdims=True)))

    return [x], [y], ref


def bias_gelu_tanh(scale: int = 1) -> Built:
    m, n = _rows(8192, scale), 3072
    x, b = _ph((m, n), "x"), _ph((n,), "b")
    u = ops.add(x, b, name="u")
    y = ops.gelu(u, approximate="tanh", name="gelu")

    def ref(x, b):
        u = _f64(x) + _f64(b)
        return _f32(0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3))))

    return [x, b], [y], ref


def residual_layernorm(scale: int = 1) -> Built:
    m, n = _rows(8192, scale), 768
    x, r = _ph((m, n), "x"), _ph((m, n), "r")
    gamma, beta = _ph((n,), "gamma"), _ph((n,), "beta")
    h = ops.add(x, r, name="h")
    y = _layernorm_prims(h, gamma, beta, LN_EPS, "ln")

    def ref(x, r, gamma, beta):
        h = (_f64(x) + _f64(r)).astype(np.float32)  # h is a stored float32 tensor
        return _f32(_np_layernorm(h, gamma, beta, LN_EPS))

    return [x, r, gamma, beta], [y], ref


def attn_softmax(scale: int = 1) -> Built:
    b, h, q = scale_dims((16, 12, 128), scale)
    k = 128
    s, mask = _ph((b, h, q, k), "s"), _ph((b, 1, 1, k), "mask")
    z = ops.add(ops.mul(s, 0.125, name="scaled"), mask, name="masked")
    y = ops.softmax(z, axis=-1, name="probs")

    def ref(s, mask):
        z = (_f64(s) * 0.125).astype(np.float32)
        z = (_f64(z) + _f64(mask)).astype(np.float32)
        return _f32(_np_softmax(z))

    return [s, mask], [y], ref


def lstm_cell(scale: int = 1) -> Built:
    m, hd = _rows(1024, scale), 512
    gates, c = _ph((m, 4 * hd), "gates"), _ph((m, hd), "c")
    i, f, g, o = (
        ops.slice(gates, [j * hd], [(j + 1) * hd], axes=[1], name=f"gate_{nm}")
        for j, nm in enumerate("ifgo")
    )
    si = ops.sigmoid(i, name="sig_i")
    sf = ops.sigmoid(f, name="sig_f")
    tg = ops.tanh(g, name="tanh_g")
    so = ops.sigmoid(o, name="sig_o")
    c2 = ops.add(ops.mul(sf, c, name="fc"), ops.mul(si, tg, name="ig"), name="c2")
    h2 = ops.mul(so, ops.tanh(c2, name="tanh_c2"), name="h2")

    def ref(gates, c):
        gt = _f64(gates)
        i, f, g, o = (gt[:, j * hd : (j + 1) * hd] for j in range(4))
        c2 = (_np_sigmoid(f) * _f64(c) + _np_sigmoid(i) * np.tanh(g)).astype(np.float32)
        h2 = _np_sigmoid(o) * np.tanh(_f64(c2))
        return _f32(h2, c2)

    return [gates, c], [h2, c2], ref


def batchnorm_train_relu(scale: int = 1) -> Built:
    n, ch, hh, ww = 64, _rows(256, scale), 28, 28
    x = _ph((n, ch, hh, ww), "x")
    gamma, beta = _ph((ch, 1, 1), "gamma"), _ph((ch, 1, 1), "beta")
    cnt = n * hh * ww
    mu = ops.reduce_mean(x, axis=(0, 2, 3), keepdims=True, name="mu")  # (1, C, 1, 1)
    d = ops.sub(x, mu, name="d")
    rn, rh, rw = (te.reduce_axis(e, name=nm) for e, nm in ((n, "rn"), (hh, "rh"), (ww, "rw")))
    var = te.compute(
        (1, ch, 1, 1),
        lambda _a, c, _b, _c: te.sum(
            d[rn, c, rh, rw] * d[rn, c, rh, rw] * (1.0 / cnt), axis=[rn, rh, rw]
        ),
        name="var",
    )
    rstd = ops.rsqrt(ops.add(var, BN_EPS, name="var_eps"), name="rstd")
    xn = ops.mul(d, rstd, name="xn")
    yb = ops.add(ops.mul(xn, gamma, name="xg"), beta, name="xb")
    y = ops.relu(yb, name="y")

    def ref(x, gamma, beta):
        x = _f64(x)
        mu = x.mean(axis=(0, 2, 3), keepdims=True)
        var = ((x - mu) ** 2).mean(axis=(0, 2, 3), keepdims=True)
        y = (x - mu) / np.sqrt(var + BN_EPS) * _f64(gamma) + _f64(beta)
        return _f32(np.maximum(y, 0.0), mu, var)

    return [x, gamma, beta], [y, mu, var], ref


def adam3(scale: int = 1) -> Built:
    shape = (_rows(4096, scale), 1024)
    bc1 = 1.0 - ADAM_B1**ADAM_STEP
    bc2 = 1.0 - ADAM_B2**ADAM_STEP
    inputs: list[Tensor] = []
    outputs: list[Tensor] = []
    for j in range(3):
        p, g, m, v = (_ph(shape, f"{nm}{j}") for nm in "pgmv")
        inputs += [p, g, m, v]
        m2 = ops.add(
            ops.mul(m, ADAM_B1, name=f"b1m{j}"),
            ops.mul(g, 1.0 - ADAM_B1, name=f"b1g{j}"),
            name=f"m2_{j}",
        )
        gg = ops.mul(g, g, name=f"gg{j}")
        v2 = ops.add(
            ops.mul(v, ADAM_B2, name=f"b2v{j}"),
            ops.mul(gg, 1.0 - ADAM_B2, name=f"b2g{j}"),
            name=f"v2_{j}",
        )
        mhat = ops.div(m2, bc1, name=f"mhat{j}")
        vhat = ops.div(v2, bc2, name=f"vhat{j}")
        den = ops.add(ops.sqrt(vhat, name=f"sqrt{j}"), ADAM_EPS, name=f"den{j}")
        step = ops.mul(ops.div(mhat, den, name=f"ratio{j}"), ADAM_LR, name=f"step{j}")
        p2 = ops.sub(p, step, name=f"p2_{j}")
        outputs += [p2, m2, v2]

    def ref(*arrays):
        out = []
        for j in range(3):
            p, g, m, v = (_f64(a) for a in arrays[4 * j : 4 * j + 4])
            m2 = (ADAM_B1 * m + (1.0 - ADAM_B1) * g).astype(np.float32)
            v2 = (ADAM_B2 * v + (1.0 - ADAM_B2) * g * g).astype(np.float32)
            p2 = p - ADAM_LR * (_f64(m2) / bc1) / (np.sqrt(_f64(v2) / bc2) + ADAM_EPS)
            out += [p2, m2, v2]
        return _f32(*out)

    return inputs, outputs, ref


def two_branches(scale: int = 1) -> Built:
    x1 = _ph((_rows(1048576, scale),), "x1")
    x2 = _ph((_rows(1024, scale), 1024), "x2")
    a = ops.relu(ops.add(ops.mul(x1, 2.0, name="x1_2"), 1.0, name="x1_2p1"), name="a")
    b = ops.reduce_sum(ops.mul(x2, x2, name="x2sq"), axis=-1, name="b")

    def ref(x1, x2):
        return _f32(np.maximum(2.0 * _f64(x1) + 1.0, 0.0), (_f64(x2) ** 2).sum(-1))

    return [x1, x2], [a, b], ref


def rmsnorm_swiglu(scale: int = 1) -> Built:
    m = _rows(4096, scale)
    x, w = _ph((m, 4096), "x"), _ph((4096,), "w")
    a, b = _ph((m, 11008), "a"), _ph((m, 11008), "b")
    ms = ops.reduce_mean(ops.mul(x, x, name="xsq"), axis=-1, keepdims=True, name="ms")
    rstd = ops.rsqrt(ops.add(ms, RMS_EPS, name="ms_eps"), name="rstd")
    y = ops.mul(ops.mul(x, rstd, name="xn"), w, name="y")
    s = ops.mul(ops.mul(a, ops.sigmoid(a, name="sig_a"), name="silu"), b, name="s")

    def ref(x, w, a, b):
        x = _f64(x)
        y = x / np.sqrt((x * x).mean(-1, keepdims=True) + RMS_EPS) * _f64(w)
        a = _f64(a)
        return _f32(y, a * _np_sigmoid(a) * _f64(b))

    return [x, w, a, b], [y, s], ref


BUILDERS: dict[str, Callable[[int], Built]] = {
    "layernorm": layernorm,
    "layernorm_lib": layernorm_lib,
    "softmax": softmax,
    "log_softmax": log_softmax,
    "bias_gelu_tanh": bias_gelu_tanh,
    "residual_layernorm": residual_layernorm,
    "attn_softmax": attn_softmax,
    "lstm_cell": lstm_cell,
    "batchnorm_train_relu": batchnorm_train_relu,
    "adam3": adam3,
    "two_branches": two_branches,
    "rmsnorm_swiglu": rmsnorm_swiglu,
}
assert tuple(BUILDERS) == NAMES


def build(name: str, scale: int = 1, dtype: str = "float32") -> Built:
    """``(inputs, outputs, numpy_reference)`` of subgraph ``name`` with ``scale`` applied;
    ``dtype`` is the placeholders' storage dtype (computes follow the typing rules: a
    bfloat16 graph computes and stores bfloat16 tensors; the numpy reference stays float32)."""
    if name not in BUILDERS:
        raise KeyError(f"unknown subgraph '{name}'; the suite has {', '.join(NAMES)}")
    _DTYPE[0] = dtype
    try:
        return BUILDERS[name](scale)
    finally:
        _DTYPE[0] = "float32"


def random_inputs(name: str, inputs: list[Tensor], seed: int = 0) -> list[np.ndarray]:
    """Random float32 arrays for ``inputs`` of subgraph ``name``.

    Standard normal everywhere except Adam's second moments ``v_j``, drawn non-negative (a
    second moment is a running mean of squares; negative ones would take sqrt of < 0).
    """
    rng = np.random.default_rng(seed)
    out = []
    for t in inputs:
        a = rng.standard_normal(t.shape, dtype=np.float32)
        if name == "adam3" and t.name.startswith("v"):
            a = np.abs(a)
        out.append(a)
    return out
