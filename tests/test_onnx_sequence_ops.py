"""ONNX operators of sequence models and caches: SwiGLU, ReverseSequence (lengths at run
time), TensorScatter (a KV-cache write, linear and circular, positions at run time),
CenterCropPad (crop and pad at once, odd differences), CausalConvWithState (a depthwise
causal convolution carrying its state), DFT, STFT and Col2Im, against ONNX's reference
evaluator, compiled with NVRTC for sm_80 and sm_90 and rerun race-free."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

RNG = np.random.default_rng(25)


def _x(*shape, dtype="float32"):
    return RNG.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_swiglu(dtype):
    node = helper.make_node("SwiGLU", ["a", "b"], ["y"], alpha=1.702)
    _agrees([node], {"a": _x(5, 13, dtype=dtype), "b": _x(5, 13, dtype=dtype)}, opset=26)


@pytest.mark.parametrize(("batch_axis", "time_axis"), [(1, 0), (0, 1)])
def test_reverse_sequence_reads_its_lengths_at_run_time(batch_axis, time_axis):
    shape = [0, 0, 3]
    shape[batch_axis], shape[time_axis] = 4, 6
    node = helper.make_node("ReverseSequence", ["x", "n"], ["y"], batch_axis=batch_axis,
                            time_axis=time_axis)  # fmt: skip
    for lens in ([6, 1, 0, 4], [2, 6, 3, 5]):
        _agrees([node], {"x": _x(*shape), "n": np.array(lens, np.int64)})


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_a_cache_at_run_time_positions(mode):
    past, upd = _x(3, 2, 9, 4), _x(3, 2, 3, 4)
    starts = [0, 6, 4] if mode == "linear" else [7, 8, 2]  # circular: wraps past the end
    node = helper.make_node("TensorScatter", ["c", "u", "w"], ["y"], mode=mode)
    _agrees([node], {"c": past, "u": upd, "w": np.array(starts, np.int64)}, opset=24)


def test_tensor_scatter_along_another_axis_without_positions():
    node = helper.make_node("TensorScatter", ["c", "u"], ["y"], axis=1)
    _agrees([node], {"c": _x(2, 7, 5), "u": _x(2, 3, 5)}, opset=24)


def test_center_crop_pad_crops_one_axis_and_pads_another():
    node = helper.make_node("CenterCropPad", ["x", "s"], ["y"], axes=[0, 2])
    _agrees([node], {"x": _x(9, 4, 6)}, {"s": np.array([4, 9], np.int64)}, opset=18)


@pytest.mark.parametrize("k", [1, 3, 4])
@pytest.mark.parametrize("activation", ["none", "silu"])
def test_causal_conv_with_state(k, activation):
    inputs = {"x": _x(2, 5, 7), "w": _x(5, 1, k), "b": _x(5)}
    names = ["x", "w", "b"]
    if k > 1:
        inputs["s"] = _x(2, 5, k - 1)
        names.append("s")
    node = helper.make_node("CausalConvWithState", names, ["y", "state"], activation=activation)
    _agrees([node], inputs, opset=26, infer=k > 1)


@pytest.mark.parametrize(
    ("components", "axis", "length", "inverse", "onesided"),
    [(1, 1, None, 0, 0), (2, 1, None, 0, 0), (1, 2, None, 0, 1), (2, 2, 12, 0, 0),
     (1, 1, 5, 0, 1), (2, 1, None, 1, 0), (2, 2, 9, 1, 0), (2, 1, None, 1, 1),
     (2, 2, 11, 1, 1), (2, 1, 14, 1, 1)],  # fmt: skip
)
def test_dft_forward_inverse_padded_truncated_and_one_sided(
    components, axis, length, inverse, onesided
):
    x = _x(2, 8, 7, components)
    inputs = {"x": x}
    consts = {"a": np.array(axis, np.int64)}
    names = ["x", "n" if length else "", "a"]
    if length:
        consts["n"] = np.array(length, np.int64)
    node = helper.make_node("DFT", names, ["y"], inverse=inverse, onesided=onesided)
    _agrees([node], inputs, consts, opset=20)


@pytest.mark.parametrize(("components", "onesided", "window"), [(1, 1, True), (1, 0, False),
                                                                 (2, 0, True)])  # fmt: skip
def test_stft_frames_windows_and_sides(components, onesided, window):
    inputs = {"x": _x(2, 50, components)}
    consts = {"step": np.array(7, np.int64), "n": np.array(12, np.int64)}
    names = ["x", "step", "", "n"]
    if window:
        inputs["w"] = np.hanning(12).astype(np.float32)  # a run-time window
        names[2] = "w"
    node = helper.make_node("STFT", names, ["y"], onesided=onesided)
    (y,) = _agrees([node], inputs, consts, opset=17)
    assert y.shape == (2, 1 + (50 - 12) // 7, 7 if onesided else 12, 2)


@pytest.mark.parametrize(
    ("image", "block", "at"),
    [([5, 6], [2, 3], {}), ([7, 8], [3, 2], {"strides": [2, 3], "pads": [1, 0, 2, 1]}),
     ([9, 5], [2, 2], {"dilations": [3, 1], "strides": [1, 2]}),
     ([3, 4, 5], [2, 1, 3], {"pads": [0, 1, 1, 1, 0, 1]})],  # fmt: skip
)
def test_col2im_strides_pads_dilations(image, block, at):
    nd = len(image)
    dil, st = at.get("dilations", [1] * nd), at.get("strides", [1] * nd)
    pads = at.get("pads", [0] * 2 * nd)
    pos = [(image[d] + pads[d] + pads[nd + d] - dil[d] * (block[d] - 1) - 1) // st[d] + 1
           for d in range(nd)]  # fmt: skip
    x = _x(2, 3 * int(np.prod(block)), int(np.prod(pos)))
    node = helper.make_node("Col2Im", ["x", "i", "b"], ["y"], **at)
    consts = {"i": np.array(image, np.int64), "b": np.array(block, np.int64)}
    _agrees([node], {"x": x}, consts, opset=18)
