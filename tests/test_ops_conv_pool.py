"""Tests of the conv and pooling ops and the reference evaluator (continued from test_ops.py):
each op compiled, run on the CPU emulator and compared with numpy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_ops import ATOL, RTOL, computes, np_layer_norm, np_softmax, ph, rand, run  # noqa: F401

from polyfuse import ops, te
from polyfuse.errors import CallError, ExpressionError
from polyfuse.reference import evaluate

# --------------------------------------------------------------------------- conv and pools


def np_conv2d(x, w, bias, stride, padding, dilation, groups):
    x = x.astype(np.float64)
    w = w.astype(np.float64)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph_, pw), (dh, dw) = stride, padding, dilation
    xp = np.zeros((n, c, h + 2 * ph_, wd + 2 * pw))
    xp[:, :, ph_ : ph_ + h, pw : pw + wd] = x
    oh = (h + 2 * ph_ - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for oc in range(o):
        g = oc // og
        for y in range(oh):
            for z in range(ow):
                win = xp[
                    :,
                    g * cg : (g + 1) * cg,
                    y * sh : y * sh + dh * (kh - 1) + 1 : dh,
                    z * sw : z * sw + dw * (kw - 1) + 1 : dw,
                ]
                out[:, oc, y, z] = (win * w[oc]).sum(axis=(1, 2, 3))
    if bias is not None:
        out += bias[None, :, None, None]
    return out.astype(np.float32)


CONV_CASES = [
    # x shape, w shape, stride, padding, dilation, groups, bias
    ((1, 3, 7, 7), (4, 3, 3, 3), (1, 1), (0, 0), (1, 1), 1, False),
    ((2, 3, 7, 8), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1, True),
    ((1, 2, 9, 9), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), 1, True),
    ((1, 2, 9, 10), (3, 2, 3, 2), (2, 3), (2, 1), (1, 1), 1, False),
    ((1, 2, 9, 9), (2, 2, 3, 3), (1, 1), (2, 2), (2, 2), 1, False),
    ((1, 4, 6, 6), (6, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2, True),
    ((2, 4, 6, 6), (4, 1, 3, 3), (2, 2), (1, 1), (1, 1), 4, False),  # depthwise
    ((1, 6, 5, 5), (6, 2, 1, 1), (1, 1), (0, 0), (1, 1), 3, False),
]


@pytest.mark.parametrize("xs,ws,stride,padding,dilation,groups,has_bias", CONV_CASES)
def test_conv2d(xs, ws, stride, padding, dilation, groups, has_bias):
    x, w = ph(xs, "x"), ph(ws, "w")
    xv, wv = rand(*xs), rand(*ws)
    feeds = {x: xv, w: wv}
    bias = None
    bv = None
    if has_bias:
        bias = ph((ws[0],), "bias")
        bv = rand(ws[0])
        feeds[bias] = bv
    out = ops.conv2d(
        x, w, bias, stride=stride, padding=padding, dilation=dilation, groups=groups, name="conv"
    )
    exp = np_conv2d(xv, wv, bv, stride, padding, dilation, groups)
    run(out, feeds, exp, "conv2d")
    assert len(computes(out)) == (2 if has_bias else 1)


def test_conv2d_scalar_args():
    x, w = ph((1, 2, 6, 6), "x"), ph((3, 2, 3, 3), "w")
    xv, wv = rand(1, 2, 6, 6), rand(3, 2, 3, 3)
    out = ops.conv2d(x, w, stride=2, padding=1, dilation=1)
    run(out, {x: xv, w: wv}, np_conv2d(xv, wv, None, (2, 2), (1, 1), (1, 1), 1), "conv2d")


def test_conv2d_errors():
    x = ph((1, 4, 6, 6), "x")
    with pytest.raises(ExpressionError, match=r"conv2d 'c': input 'x' .* has 4 channels"):
        ops.conv2d(x, ph((3, 3, 3, 3), "w"), name="c")
    with pytest.raises(ExpressionError, match=r"conv2d 'c': groups=3"):
        ops.conv2d(x, ph((3, 2, 3, 3), "w"), groups=3, name="c")
    with pytest.raises(ExpressionError, match=r"conv2d 'c': groups=2"):
        ops.conv2d(x, ph((3, 2, 3, 3), "w"), groups=2, name="c")
    with pytest.raises(ExpressionError, match=r"conv2d 'c': bias"):
        ops.conv2d(x, ph((3, 4, 3, 3), "w"), ph((4,), "b"), name="c")
    with pytest.raises(ExpressionError, match=r"conv2d 'c': kernel"):
        ops.conv2d(x, ph((3, 4, 7, 7), "w"), name="c")


def np_pool(x, kernel, stride, padding, mode, count_include_pad=True):
    (kh, kw), (sh, sw), (ph_, pw) = kernel, stride, padding
    *lead, h, w = x.shape
    fill = -np.inf if mode == "max" else 0.0
    xp = np.full((*lead, h + 2 * ph_, w + 2 * pw), fill)
    xp[..., ph_ : ph_ + h, pw : pw + w] = x
    ones = np.zeros((h + 2 * ph_, w + 2 * pw))
    ones[ph_ : ph_ + h, pw : pw + w] = 1
    oh = (h + 2 * ph_ - kh) // sh + 1
    ow = (w + 2 * pw - kw) // sw + 1
    out = np.zeros((*lead, oh, ow))
    for y in range(oh):
        for z in range(ow):
            win = xp[..., y * sh : y * sh + kh, z * sw : z * sw + kw]
            if mode == "max":
                out[..., y, z] = win.max(axis=(-2, -1))
            else:
                cnt = ones[y * sh : y * sh + kh, z * sw : z * sw + kw].sum()
                if count_include_pad:
                    cnt = kh * kw
                out[..., y, z] = win.sum(axis=(-2, -1)) / cnt
    return out.astype(np.float32)


POOL_CASES = [
    ((1, 2, 6, 6), (2, 2), None, (0, 0)),
    ((2, 3, 7, 7), (3, 3), (2, 2), (1, 1)),
    ((1, 2, 8, 7), (3, 2), (1, 2), (1, 1)),
    ((1, 1, 5, 5), (3, 3), (1, 1), (1, 1)),
    ((1, 1, 9, 9), (5, 5), (2, 2), (2, 2)),
]


@pytest.mark.parametrize("xs,kernel,stride,padding", POOL_CASES)
def test_max_pool2d(xs, kernel, stride, padding):
    x = ph(xs, "x")
    xv = rand(*xs)
    out = ops.max_pool2d(x, kernel, stride, padding, name="mp")
    exp = np_pool(xv, kernel, stride or kernel, padding, "max")
    run(out, {x: xv}, exp, "max_pool2d")
    assert len(computes(out)) == 1


@pytest.mark.parametrize("xs,kernel,stride,padding", POOL_CASES)
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d(xs, kernel, stride, padding, count_include_pad):
    x = ph(xs, "x")
    xv = rand(*xs)
    out = ops.avg_pool2d(x, kernel, stride, padding, count_include_pad, name="ap")
    exp = np_pool(xv, kernel, stride or kernel, padding, "avg", count_include_pad)
    run(out, {x: xv}, exp, "avg_pool2d")
    assert len(computes(out)) == 2


def test_pool_errors():
    x = ph((1, 1, 4, 4), "x")
    with pytest.raises(ExpressionError, match=r"max_pool2d 'm': padding \(2, 2\)"):
        ops.max_pool2d(x, 3, padding=2, name="m")
    with pytest.raises(ExpressionError, match=r"avg_pool2d 'a': kernel"):
        ops.avg_pool2d(x, 5, name="a")


# --------------------------------------------------------------------------- composition, reference


def test_composed_graph():
    """A small transformer-ish block built from several composites."""
    x, w, g, b = ph((4, 8), "x"), ph((8, 6), "w"), ph((6,), "g"), ph((6,), "b")
    xv, wv, gv, bv = rand(4, 8), rand(8, 6), rand(6), rand(6)
    h = ops.matmul(x, w, name="h")
    n = ops.layer_norm(h, g, b, name="n")
    y = ops.gelu(n, approximate="tanh", name="y")
    s = ops.softmax(ops.add(y, 1.0), axis=0, name="s")
    got_y, got_s = evaluate([y, s], {"x": xv, "w": wv, "g": gv, "b": bv})
    hv = xv.astype(np.float64) @ wv
    nv = np_layer_norm(hv, gv, bv, -1, 1e-5).astype(np.float64)
    yv = 0.5 * nv * (1 + np.tanh(math.sqrt(2 / math.pi) * (nv + 0.044715 * nv**3)))
    np.testing.assert_allclose(got_y, yv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got_s, np_softmax(yv + 1, 0), rtol=1e-4, atol=1e-5)


def test_reference_feed_errors():
    x = ph((2, 3), "x")
    y = ops.exp(x, name="y")
    with pytest.raises(CallError, match=r"no value fed for input 'x'"):
        evaluate([y], {})
    with pytest.raises(CallError, match=r"input 'x' expects shape \(2, 3\), got \(3, 2\)"):
        evaluate([y], {x: np.zeros((3, 2))})
    with pytest.raises(CallError, match=r"'y' is a compute tensor"):
        evaluate([y], {y: np.zeros((2, 3))})
    (got,) = evaluate([x], {"x": np.ones((2, 3))})  # a placeholder as output
    np.testing.assert_array_equal(got, np.ones((2, 3), np.float32))


def test_reference_out_of_bounds_read_is_an_error():
    x = ph((4,), "x")
    # an affine out-of-bounds read is refused when the compute is built (graph/bounds.py) ...
    with pytest.raises(ExpressionError, match=r"compute 'bad' reads tensor 'x' out of bounds"):
        te.compute((4,), lambda i: x[i + 1], name="bad")
    # ... a data-dependent one when the reference evaluates it
    idx = ph((4,), "idx")
    bad = te.compute((4,), lambda i: x[te.data_index(idx[i])], name="bad")
    with pytest.raises(ExpressionError, match=r"compute 'bad' reads 'x' out of bounds"):
        evaluate([bad], {x: np.zeros(4), idx: np.array([0, 1, 2, 4])})
    ok = te.compute((4,), lambda i: te.where(i < 3, x[i + 1], 0.0), name="ok")
    (got,) = evaluate([ok], {x: np.arange(4.0)})
    np.testing.assert_array_equal(got, [1, 2, 3, 0])


def test_reference_chunked_reduction(monkeypatch):
    import polyfuse.reference as ref

    monkeypatch.setattr(ref, "CHUNK_ELEMENTS", 7)
    a, b = ph((5, 6), "a"), ph((6, 4), "b")
    av, bv = rand(5, 6), rand(6, 4)
    mm = ops.matmul(a, b)
    mx = ops.reduce_max(a, axis=None)
    got_mm, got_mx = evaluate([mm, mx], {a: av, b: bv})
    np.testing.assert_allclose(got_mm, av.astype(np.float64) @ bv, rtol=RTOL, atol=ATOL)
    assert got_mx == av.max()
    x = ph((3, 9, 9), "x")
    xv = rand(3, 9, 9)
    (got,) = evaluate([ops.softmax(x, axis=1)], {x: xv})
    np.testing.assert_allclose(got, np_softmax(xv, 1), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("fn", [ops.conv, ops.conv_transpose])
def test_conv_pads_of_the_wrong_length_are_an_expression_error(fn):
    """conv_transpose took ``[1, 1, 1]`` for a 2-D kernel to an IndexError; both convolutions
    check the pads in one place now."""
    x = te.placeholder((1, 2, 5, 5), name="x")
    w = te.placeholder((2, 2, 3, 3), name="w")
    with pytest.raises(ExpressionError, match=r"pads \[1, 1, 1\] must hold 4 ints"):
        fn(x, w, pads=[1, 1, 1], name="c")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_conv_of_a_reshaped_0_d_tensor(dtype):
    """Regression (``polyfuse fuzz --torch`` seeds 5002, 5087): a conv whose input is a 0-d
    tensor reshaped to (1, 1, 1, 1) reads a scalar. The GEMM path staged it as a shared tile
    of no dims (a zip mismatch in the copy) and the channels-last pass indexed its last
    subscript (IndexError); the GEMM path now refuses a 0-d operand, the pass skips it."""
    import polyfuse
    from polyfuse.graph.dtypes import numpy_dtype, tolerance

    s = te.placeholder((), dtype, name="s")
    w = te.placeholder((2, 1, 2, 2), dtype, name="w")
    y = ops.conv2d(ops.reshape(s, (1, 1, 1, 1)), w, padding=1)
    sv = np.array(0.7, numpy_dtype(dtype))
    wv = (np.arange(8).reshape(2, 1, 2, 2) / 8).astype(numpy_dtype(dtype))
    fn = polyfuse.compile([s, w], [y], check_cuda=False)
    got = np.asarray(fn(sv, wv, device="emulate"), np.float64)
    want = np.asarray(evaluate([y], {s: sv, w: wv})[0], np.float64)
    assert got.shape == (1, 2, 2, 2) and tolerance(dtype).allclose(got, want)
