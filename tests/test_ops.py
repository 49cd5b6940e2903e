"""Composite operators (polyfuse.ops) checked against numpy through polyfuse.reference."""

from __future__ import annotations

import math

import numpy as np
import pytest

from polyfuse import ops, te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Reduce, Tensor, walk
from polyfuse.reference import evaluate

RTOL = 1e-5
ATOL = 1e-6

rng = np.random.default_rng(0)


def rand(*shape: int, lo: float = -1.0, hi: float = 1.0) -> np.ndarray:
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def computes(out: Tensor) -> list[Tensor]:
    """Every compute tensor ``out`` depends on (including itself)."""
    seen: dict[int, Tensor] = {}
    stack = [out]
    while stack:
        t = stack.pop()
        if t.op is None or t.uid in seen:
            continue
        seen[t.uid] = t
        stack.extend(t.op.inputs())
    return list(seen.values())


def run(out: Tensor, feeds: dict[Tensor, np.ndarray], expected: np.ndarray, tag: str) -> None:
    """Evaluate, compare with numpy, and check every primitive is tagged ``tag``."""
    (got,) = evaluate([out], feeds)
    assert got.dtype == np.float32
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_allclose(got, expected, rtol=RTOL, atol=ATOL)
    for t in computes(out):
        assert t.op is not None and t.op.tag == tag, (t.name, t.op.tag if t.op else None)
        assert all(c.isalnum() or c == "_" for c in t.name), t.name
        red = [n for n in walk(t.op.body) if isinstance(n, Reduce)]
        assert not red or red == [t.op.body], f"{t.name}: reduction is not outermost"


def ph(shape: tuple[int, ...], name: str) -> Tensor:
    return te.placeholder(shape, name=name)


# --------------------------------------------------------------------------- elementwise

BINARY = [
    ("add", ops.add, np.add),
    ("sub", ops.sub, np.subtract),
    ("mul", ops.mul, np.multiply),
    ("div", ops.div, np.divide),
    ("maximum", ops.maximum, np.maximum),
    ("minimum", ops.minimum, np.minimum),
    ("pow", ops.pow, np.power),
]

BCAST_SHAPES = [
    ((3, 4), (3, 4)),
    ((3, 4), (4,)),
    ((3, 4), (3, 1)),
    ((1, 4), (3, 1)),
    ((2, 3, 4), (1, 3, 1)),
    ((2, 1, 4), (3, 1)),
    ((4,), (2, 3, 4)),
    ((), (2, 3)),
]


@pytest.mark.parametrize("op,fn,npfn", BINARY, ids=[b[0] for b in BINARY])
@pytest.mark.parametrize("sa,sb", BCAST_SHAPES)
def test_binary_broadcast(op, fn, npfn, sa, sb):
    a, b = ph(sa, "a"), ph(sb, "b")
    av = rand(*sa, lo=0.5, hi=2.0)
    bv = rand(*sb, lo=0.5, hi=2.0)
    if op in ("sub", "maximum", "minimum"):
        av, bv = av - 1.2, bv - 1.2
    out = fn(a, b, name="y")
    assert out.name == "y"
    run(out, {a: av, b: bv}, npfn(av, bv).astype(np.float32), op)
    assert len(computes(out)) == 1


@pytest.mark.parametrize("op,fn,npfn", BINARY, ids=[b[0] for b in BINARY])
def test_binary_scalar(op, fn, npfn):
    a = ph((2, 3), "a")
    av = rand(2, 3, lo=0.5, hi=2.0)
    run(fn(a, 3), {a: av}, npfn(av, np.float32(3.0)), op)
    run(fn(2.5, a), {a: av}, npfn(np.float32(2.5), av), op)


def test_binary_errors():
    a, b = ph((4, 8), "a"), ph((3,), "b")
    with pytest.raises(ExpressionError, match=r"add 'y'.*\(4, 8\).*\(3,\).*do not broadcast"):
        ops.add(a, b, name="y")
    with pytest.raises(ExpressionError, match=r"^mul 'z': at least one operand"):
        ops.mul(1.0, 2.0, name="z")
    with pytest.raises(ExpressionError, match=r"^sub 'w':"):
        ops.sub(a, "x", name="w")


def _np_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


UNARY = [
    ("neg", ops.neg, np.negative, (-2, 2)),
    ("exp", ops.exp, np.exp, (-2, 2)),
    ("log", ops.log, np.log, (0.1, 3)),
    ("sqrt", ops.sqrt, np.sqrt, (0.1, 3)),
    ("rsqrt", ops.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 3)),
    ("tanh", ops.tanh, np.tanh, (-3, 3)),
    ("sigmoid", ops.sigmoid, _np_sigmoid, (-5, 5)),
    ("relu", ops.relu, lambda x: np.maximum(x, 0), (-2, 2)),
    ("abs", ops.abs, np.abs, (-2, 2)),
]


@pytest.mark.parametrize("op,fn,npfn,rng_", UNARY, ids=[u[0] for u in UNARY])
def test_unary(op, fn, npfn, rng_):
    x = ph((3, 5), "x")
    xv = rand(3, 5, lo=rng_[0], hi=rng_[1])
    out = fn(x, name="u")
    run(out, {x: xv}, npfn(xv.astype(np.float64)).astype(np.float32), op)
    assert len(computes(out)) == 1


def test_gelu():
    x = ph((4, 7), "x")
    xv = rand(4, 7, lo=-4, hi=4)
    x64 = xv.astype(np.float64)
    erf = np.vectorize(math.erf)
    exact = 0.5 * x64 * (1 + erf(x64 / math.sqrt(2)))
    approx = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    run(ops.gelu(x), {x: xv}, exact.astype(np.float32), "gelu")
    run(ops.gelu(x, approximate="tanh"), {x: xv}, approx.astype(np.float32), "gelu")
    assert np.abs(exact - approx).max() > 1e-5  # the two forms really differ
    with pytest.raises(ExpressionError, match="gelu 'g'"):
        ops.gelu(x, approximate="fast", name="g")


# --------------------------------------------------------------------------- reductions

RED_AXES = [0, 1, 2, -1, (0, 2), (1, 2), None, (0, 1, 2)]


@pytest.mark.parametrize("axis", RED_AXES)
@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize(
    "op,fn,npfn",
    [
        ("reduce_sum", ops.reduce_sum, np.sum),
        ("reduce_mean", ops.reduce_mean, np.mean),
        ("reduce_max", ops.reduce_max, np.max),
    ],
    ids=["sum", "mean", "max"],
)
def test_reductions(op, fn, npfn, axis, keepdims):
    x = ph((2, 3, 5), "x")
    xv = rand(2, 3, 5)
    out = fn(x, axis=axis, keepdims=keepdims, name="r")
    exp = npfn(xv.astype(np.float64), axis=axis, keepdims=keepdims).astype(np.float32)
    run(out, {x: xv}, np.asarray(exp), op)
    assert len(computes(out)) == 1


def test_reduction_errors():
    x = ph((2, 3), "x")
    with pytest.raises(ExpressionError, match=r"reduce_sum 's': axis 2 is out of range"):
        ops.reduce_sum(x, axis=2, name="s")
    with pytest.raises(ExpressionError, match=r"reduce_max 'm': axis .* twice"):
        ops.reduce_max(x, axis=(1, -1), name="m")


def np_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_softmax(axis):
    x = ph((4, 6), "x")
    xv = rand(4, 6, lo=-3, hi=3)
    out = ops.softmax(x, axis=axis, name="p")
    run(out, {x: xv}, np_softmax(xv, axis).astype(np.float32), "softmax")
    names = sorted(t.name for t in computes(out))
    assert names == ["p", "p_exp", "p_max", "p_sub", "p_sum"]
    assert len(computes(out)) == 5


def test_softmax_3d_and_1d():
    x = ph((2, 3, 4), "x")
    xv = rand(2, 3, 4, lo=-3, hi=3)
    run(ops.softmax(x, axis=1), {x: xv}, np_softmax(xv, 1).astype(np.float32), "softmax")
    v = ph((7,), "v")
    vv = rand(7, lo=-3, hi=3)
    out = ops.softmax(v)
    run(out, {v: vv}, np_softmax(vv, 0).astype(np.float32), "softmax")
    assert len(computes(out)) == 5


@pytest.mark.parametrize("axis", [0, -1])
def test_log_softmax(axis):
    x = ph((4, 6), "x")
    xv = rand(4, 6, lo=-3, hi=3)
    out = ops.log_softmax(x, axis=axis, name="q")
    run(out, {x: xv}, np.log(np_softmax(xv, axis)).astype(np.float32), "log_softmax")
    assert len(computes(out)) == 6


# --------------------------------------------------------------------------- normalisation


def np_layer_norm(x, gamma, beta, axis, eps):
    x = x.astype(np.float64)
    dims = tuple(range(axis % x.ndim, x.ndim))
    mu = x.mean(axis=dims, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=dims, keepdims=True)
    y = (x - mu) / np.sqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y.astype(np.float32)


def test_layer_norm_last_axis():
    x, g, b = ph((3, 4, 16), "x"), ph((16,), "g"), ph((16,), "b")
    xv, gv, bv = rand(3, 4, 16, lo=-2, hi=3), rand(16, lo=0.5, hi=1.5), rand(16)
    out = ops.layer_norm(x, g, b, name="ln")
    run(out, {x: xv, g: gv, b: bv}, np_layer_norm(xv, gv, bv, -1, 1e-5), "layer_norm")
    assert sorted(t.name for t in computes(out)) == [
        "ln",
        "ln_centered",
        "ln_mean",
        "ln_rstd",
        "ln_var",
    ]


def test_layer_norm_two_axes_no_affine():
    x, g = ph((3, 4, 6), "x"), ph((4, 6), "g")
    xv, gv = rand(3, 4, 6, lo=-2, hi=3), rand(4, 6)
    exp = np_layer_norm(xv, gv, None, -2, 1e-3)
    run(ops.layer_norm(x, g, axis=-2, eps=1e-3), {x: xv, g: gv}, exp, "layer_norm")
    run(ops.layer_norm(x, axis=1), {x: xv}, np_layer_norm(xv, None, None, 1, 1e-5), "layer_norm")
    with pytest.raises(ExpressionError, match=r"layer_norm 'l': gamma 'g' \(4, 6\)"):
        ops.layer_norm(x, g, name="l")


def test_rms_norm():
    x, w = ph((5, 8), "x"), ph((8,), "w")
    xv, wv = rand(5, 8, lo=-2, hi=2), rand(8)
    x64 = xv.astype(np.float64)
    exp = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * wv
    out = ops.rms_norm(x, w, name="rn")
    run(out, {x: xv, w: wv}, exp.astype(np.float32), "rms_norm")
    assert len(computes(out)) == 3


def test_batch_norm():
    shape = (2, 3, 4, 5)
    x = ph(shape, "x")
    m, v, g, b = (ph((3,), n) for n in "mvgb")
    xv = rand(*shape, lo=-2, hi=2)
    mv, vv, gv, bv = rand(3), rand(3, lo=0.1, hi=2), rand(3, lo=0.5, hi=1.5), rand(3)
    c = (slice(None), None, None)
    exp = (xv - mv[c]) / np.sqrt(vv[c] + 1e-5) * gv[c] + bv[c]
    out = ops.batch_norm(x, m, v, g, b, name="bn")
    run(out, {x: xv, m: mv, v: vv, g: gv, b: bv}, exp.astype(np.float32), "batch_norm")
    assert len(computes(out)) == 2
    with pytest.raises(ExpressionError, match=r"batch_norm 'bad': mean 'w' \(4,\)"):
        ops.batch_norm(x, ph((4,), "w"), v, name="bad")


# --------------------------------------------------------------------------- matmul


@pytest.mark.parametrize(
    "sa,sb",
    [
        ((5, 7), (7, 3)),
        ((1, 13), (13, 9)),
        ((4, 5, 6), (4, 6, 3)),
        ((2, 1, 5, 6), (3, 6, 2)),
        ((5, 6), (2, 6, 4)),
        ((6,), (6, 4)),
        ((3, 6), (6,)),
        ((2, 3, 6), (6,)),
        ((6,), (6,)),
    ],
)
def test_matmul(sa, sb):
    a, b = ph(sa, "a"), ph(sb, "b")
    av, bv = rand(*sa), rand(*sb)
    out = ops.matmul(a, b, name="mm")
    run(out, {a: av, b: bv}, np.matmul(av.astype(np.float64), bv).astype(np.float32), "matmul")
    assert len(computes(out)) == 1


def test_matmul_errors():
    with pytest.raises(ExpressionError, match=r"matmul 'mm': inner dimensions differ.*'a'.*'b'"):
        ops.matmul(ph((4, 5), "a"), ph((6, 3), "b"), name="mm")
    with pytest.raises(ExpressionError, match=r"matmul 'mm': batch dims"):
        ops.matmul(ph((2, 4, 5), "a"), ph((3, 5, 3), "b"), name="mm")


# --------------------------------------------------------------------------- layout


@pytest.mark.parametrize("perm", [None, (0, 2, 1), (2, 0, 1), (1, 0, 2), (-1, 0, 1)])
def test_transpose(perm):
    x = ph((2, 3, 4), "x")
    xv = rand(2, 3, 4)
    np_perm = None if perm is None else tuple(p % 3 for p in perm)
    run(ops.transpose(x, perm), {x: xv}, np.transpose(xv, np_perm), "transpose")
    with pytest.raises(ExpressionError, match=r"transpose 't': perm"):
        ops.transpose(x, (0, 0, 1), name="t")


@pytest.mark.parametrize(
    "src,dst",
    [
        ((2, 3, 4), (6, 4)),
        ((2, 3, 4), (4, -1)),
        ((2, 3, 4), (-1,)),
        ((24,), (2, 3, 4)),
        ((2, 12), (3, 8)),
        ((6, 4), (4, 3, 2)),
        ((2, 3, 4), (1, 2, 1, 12, 1)),
        ((1, 5), (5,)),
        ((4, 1, 6), (3, -1, 2)),
    ],
)
def test_reshape(src, dst):
    x = ph(src, "x")
    xv = rand(*src)
    out = ops.reshape(x, dst)
    run(out, {x: xv}, xv.reshape(dst), "reshape")


def test_reshape_keeps_unchanged_dims_plain():
    x = ph((2, 3, 4, 5), "x")
    out = ops.reshape(x, (6, 4, 5))
    (read,) = out.op.reads()
    i0, i1, i2 = out.op.axes
    assert read.indices[2] is i1 and read.indices[3] is i2


def test_reshape_errors():
    with pytest.raises(ExpressionError, match=r"reshape 'r': cannot reshape 'x' \(2, 3\)"):
        ops.reshape(ph((2, 3), "x"), (4, -1), name="r")
    with pytest.raises(ExpressionError, match=r"reshape 'r': shape"):
        ops.reshape(ph((2, 3), "x"), (-1, -1), name="r")


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_concat(axis):
    shapes = [[2, 3, 4] for _ in range(3)]
    for s, n in zip(shapes, (1, 2, 3), strict=True):
        s[axis] = n
    ts = [ph(tuple(s), f"t{i}") for i, s in enumerate(shapes)]
    vs = [rand(*s) for s in shapes]
    out = ops.concat(ts, axis=axis, name="c")
    run(out, dict(zip(ts, vs, strict=True)), np.concatenate(vs, axis=axis), "concat")
    assert len(computes(out)) == 1
    single = ops.concat(ts[:1], axis=axis)
    run(single, {ts[0]: vs[0]}, vs[0], "concat")


def test_concat_errors():
    with pytest.raises(ExpressionError, match=r"concat 'c': 'b' \(2, 4\) does not match 'a'"):
        ops.concat([ph((2, 3), "a"), ph((2, 4), "b")], axis=0, name="c")
    with pytest.raises(ExpressionError, match=r"concat 'c': needs at least one"):
        ops.concat([], name="c")


@pytest.mark.parametrize(
    "starts,ends,axes,steps",
    [
        ([1], [3], None, None),
        ([0, 1], [4, 5], [1, 2], [2, 3]),
        ([-3], [100], [2], [2]),
        ([1, 0, 2], [-1, 3, 6], None, [1, 2, 1]),
        ([0], [-1], [-1], [3]),
    ],
)
def test_slice(starts, ends, axes, steps):
    x = ph((4, 5, 6), "x")
    xv = rand(4, 5, 6)
    idx = [slice(None)] * 3
    ax = list(range(len(starts))) if axes is None else axes
    st = steps or [1] * len(starts)
    for a, s, e, k in zip(ax, starts, ends, st, strict=True):
        idx[a] = slice(s, e, k)
    run(ops.slice(x, starts, ends, axes, steps), {x: xv}, xv[tuple(idx)], "slice")


def test_slice_errors():
    x = ph((4, 5), "x")
    with pytest.raises(ExpressionError, match=r"slice 's': step -1"):
        ops.slice(x, [3], [0], steps=[-1], name="s")
    with pytest.raises(ExpressionError, match=r"slice 's': axis 0 .* selects no elements"):
        ops.slice(x, [3], [2], name="s")


@pytest.mark.parametrize(
    "pads", [1, (1, 2), [(0, 0), (2, 1)], [(1, 0), (0, 3)], [(2, 2)], [(0, 0), (0, 0)]]
)
def test_pad(pads):
    x = ph((3, 4), "x")
    xv = rand(3, 4)
    run(ops.pad(x, pads, value=-0.5), {x: xv}, np.pad(xv, pads, constant_values=-0.5), "pad")
    with pytest.raises(ExpressionError, match=r"pad 'p': pads"):
        ops.pad(x, [(1, 1)] * 3, name="p")


@pytest.mark.parametrize(("dtype", "value"), [("int64", 7), ("int32", -2.0), ("bool", True)])
def test_pad_keeps_an_integer_or_bool_tensor_s_dtype(dtype, value):
    """Regression: ops.pad padded with a float, so an int64 or bool tensor's pad was float32
    (torch's constant_pad_nd of an int64 tensor failed its dtype check)."""
    x = te.placeholder((2, 3), dtype, name="x")
    xv = (np.arange(6).reshape(2, 3) % 2).astype(dtype)
    y = ops.pad(x, [(1, 0), (0, 2)], value=value)
    assert y.dtype == dtype
    (got,) = evaluate([y], {x: xv})
    want = np.pad(xv, [(1, 0), (0, 2)], constant_values=value)
    assert got.dtype == want.dtype and np.array_equal(got, want)
