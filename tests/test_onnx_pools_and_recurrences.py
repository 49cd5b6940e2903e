"""ONNX LpPool / GlobalLpPool (p = 1, 2, 3; pads, strides, dilations, ceil mode) and the
simple RNN (forward, reverse, bidirectional; initial state; Tanh and Relu; both layouts)
against ONNX's reference evaluator, compiled with NVRTC for sm_80 and sm_90 and rerun
race-free."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _nodes_model  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

from polyfuse.onnx.backend import prepare  # noqa: E402

RNG = np.random.default_rng(18)


def _x(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _run(node, inputs, consts=None, opset=22):
    model = _nodes_model([node], inputs, consts or {}, opset)
    return prepare(model, "CPU").run(inputs)


@pytest.mark.parametrize("p", [1, 2, 3])
@pytest.mark.parametrize(
    "at",
    [{"kernel_shape": [3, 2]}, {"kernel_shape": [3, 3], "pads": [1, 0, 2, 1], "strides": [2, 3]},
     {"kernel_shape": [2, 3], "dilations": [2, 1], "strides": [2, 2]}],  # fmt: skip
)
def test_lp_pool(p, at):
    _agrees([helper.make_node("LpPool", ["x"], ["y"], p=p, **at)], {"x": _x(2, 3, 9, 7)},
            opset=22)  # fmt: skip


def test_a_ceil_mode_lp_pool_sums_the_window_inside_the_input():
    """The specification's sum of |x|^p over the window (as onnxruntime). onnx's reference
    scales an average pool by the kernel volume instead, which doubles a window half past
    the input's end (torch's LPPool does the same)."""
    x = _x(1, 2, 5, 5)
    node = helper.make_node("LpPool", ["x"], ["y"], p=1, kernel_shape=[2, 2], strides=[2, 2],
                            ceil_mode=1)  # fmt: skip
    (y,) = _run(node, {"x": x})
    a = np.pad(np.abs(x), [(0, 0), (0, 0), (0, 1), (0, 1)])
    np.testing.assert_allclose(y, a.reshape(1, 2, 3, 2, 3, 2).sum(axis=(3, 5)), rtol=1e-6)


@pytest.mark.parametrize("p", [1, 2, 3])
def test_global_lp_pool(p):
    """(onnx's reference has no GlobalLpPool: against numpy.)"""
    x = _x(2, 5, 7, 3)
    (y,) = _run(helper.make_node("GlobalLpPool", ["x"], ["y"], p=p), {"x": x})
    want = (np.abs(x.astype(np.float64)) ** p).sum(axis=(2, 3), keepdims=True) ** (1 / p)
    np.testing.assert_allclose(y, want, rtol=1e-5)


def test_simple_rnn_with_relu():
    """(onnx's reference knows Tanh and Affine only: a Relu RNN against numpy.)"""
    x, w, r = _x(4, 2, 3), _x(1, 5, 3), _x(1, 5, 5) * 0.3
    node = helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=5, activations=["Relu"])
    (y,) = _run(node, {"x": x}, {"w": w, "r": r})
    h = np.zeros((2, 5))
    for t in range(4):
        h = np.maximum(x[t] @ w[0].T + h @ r[0].T, 0)
        np.testing.assert_allclose(y[t, 0], h, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("act", ["Tanh"])
def test_simple_rnn(direction, act):
    seq, batch, nin, hid = 5, 3, 7, 6
    dirs = 2 if direction == "bidirectional" else 1
    consts = {"w": _x(dirs, hid, nin) * 0.4, "r": _x(dirs, hid, hid) * 0.4,
              "b": _x(dirs, 2 * hid) * 0.1, "h0": _x(dirs, batch, hid)}  # fmt: skip
    node = helper.make_node("RNN", ["x", "w", "r", "b", "", "h0"], ["y", "yh"], hidden_size=hid,
                            direction=direction, activations=[act] * dirs)  # fmt: skip
    _agrees([node], {"x": _x(seq, batch, nin)}, consts)


def test_simple_rnn_batch_first_without_bias_or_state():
    node = helper.make_node("RNN", ["x", "w", "r"], ["y", "yh"], hidden_size=4, layout=1)
    _agrees([node], {"x": _x(3, 6, 5)}, {"w": _x(1, 4, 5) * 0.5, "r": _x(1, 4, 4) * 0.5})
