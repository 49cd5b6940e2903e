"""ONNX quantization operators: QuantizeLinear / DequantizeLinear (per tensor, per axis and
blocked; 8-, 16-, 4- and 2-bit integers; halves to even), DynamicQuantizeLinear,
MatMulInteger, QLinearMatMul, ConvInteger and QLinearConv (zero points per tensor and per
channel, padding, bias, int32 sums past 2**24 exact), against ONNX's reference evaluator,
compiled with NVRTC for sm_80 and sm_90 and rerun race-free; float8/float4 outputs are a
one-line refusal."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _nodes_model  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

from polyfuse.errors import UnsupportedOpError  # noqa: E402
from polyfuse.onnx.backend import prepare  # noqa: E402

RNG = np.random.default_rng(8)


def _ints(dtype, shape, lo=None, hi=None):
    info = np.iinfo(dtype)
    return RNG.integers(info.min if lo is None else lo, (info.max if hi is None else hi) + 1,
                        shape).astype(dtype)  # fmt: skip


@pytest.mark.parametrize("to", ["uint8", "int8", "uint16", "int16"])
@pytest.mark.parametrize("mode", ["tensor", "axis", "blocked"])
def test_quantize_then_dequantize(to, mode):
    x = (RNG.standard_normal((3, 10, 7)) * 40).astype(np.float32)
    x[0, 0, :4] = [2.5, 3.5, -2.5, -0.5]  # halves round to even (scale 1 there)
    if mode == "tensor":
        scale, zp, at = np.array(1.0, np.float32), np.array(3, to), {}
    elif mode == "axis":
        scale = RNG.uniform(0.2, 2, 10).astype(np.float32)
        scale[0] = 1.0
        zp, at = _ints(to, (10,), 0, 9), {"axis": 1}
    else:
        scale = RNG.uniform(0.2, 2, (3, 4, 7)).astype(np.float32)  # blocks of 3 along axis 1
        scale[0, 0] = 1.0
        zp, at = _ints(to, (3, 4, 7), 0, 9), {"axis": 1, "block_size": 3}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], **at),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], **at)]  # fmt: skip
    _agrees(nodes[:1], {"x": x}, {"s": scale, "z": zp}, exact=True, opset=21)
    _agrees(nodes, {"x": x}, {"s": scale, "z": zp}, opset=21)


def test_a_float16_scale_divides_in_float16():
    """ONNX fuzz seed 14000: the quotient ``x / scale`` is in the scale's type when no
    ``precision`` is given (the specification); a float16 one rounds before ``rint``. The
    importer divided in float32, so quotients within a float16 rounding of a half landed on
    the other integer (one quantization step off)."""
    x = (np.random.default_rng(671914575).standard_normal((4, 7, 7, 5)) * 2).astype("float16")
    consts = {"s": np.array(0.04998779296875, np.float16), "z": np.array(3, np.uint8)}
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]  # fmt: skip
    _agrees(nodes[:1], {"x": x}, consts, exact=True, opset=20)


@pytest.mark.parametrize("to", ["int4", "uint4", "int2"])
def test_quantize_to_narrow_integers_saturates(to):
    x = (RNG.standard_normal((5, 6)) * 8).astype(np.float32)
    out = helper.np_dtype_to_tensor_dtype(np.dtype(getattr(__import__("ml_dtypes"), to)))
    node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], output_dtype=out, axis=0)
    _agrees([node], {"x": x}, {"s": RNG.uniform(0.5, 2, 5).astype(np.float32)}, exact=True,
            opset=21)  # fmt: skip


def test_dequantize_int32_and_float16_scales():
    x = _ints(np.int32, (4, 9), -(2**20), 2**20)
    _agrees([helper.make_node("DequantizeLinear", ["x", "s"], ["y"])], {"x": x},
            {"s": np.array(0.01, np.float16)}, opset=21)  # fmt: skip


def test_dynamic_quantize_linear():
    for x in ((RNG.standard_normal((7, 13)) * 3).astype(np.float32),
              RNG.uniform(0.5, 4, (31,)).astype(np.float32)):  # fmt: skip
        node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "s", "z"])
        _agrees([node], {"x": x}, exact=True, opset=20)


@pytest.mark.parametrize("dtype", ["uint8", "int8"])
def test_qlinear_matmul_with_per_column_scales(dtype):
    a, b = _ints(dtype, (2, 7, 13)), _ints(dtype, (13, 5))
    consts = {"as": np.array([0.02], np.float32), "az": _ints(dtype, (1,), -3, 3),
              "bs": RNG.uniform(0.01, 0.03, 5).astype(np.float32), "bz": _ints(dtype, (5,), 0, 4),
              "ys": np.array([0.7], np.float32), "yz": _ints(dtype, (1,), 0, 5)}  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    _agrees([node], {"a": a, "b": b}, consts, exact=True, opset=21)


def test_matmul_integer_sums_exactly_past_2_to_the_24():
    """512 products of 255 * 255 sum to 33 292 800 > 2**24: an int32 accumulation, exact.
    A per-row zero point of A (shape [M], which the reference evaluator cannot broadcast)
    against numpy."""
    a, b = np.full((3, 512), 255, np.uint8), np.full((512, 4), 255, np.uint8)
    a[0, 0] = 254
    node = helper.make_node("MatMulInteger", ["a", "b", "az"], ["y"])
    (y,) = _agrees([node], {"a": a, "b": b}, {"az": np.array(0, np.uint8)}, exact=True)
    assert y[2, 0] == 512 * 255 * 255 and y[0, 0] == y[2, 0] - 255
    az = np.array([0, 1, 200], np.uint8)
    model = _nodes_model([node], {"a": a, "b": b}, {"az": az})
    (y,) = prepare(model, "CPU").run({"a": a, "b": b})
    want = (a.astype(np.int64) - az[:, None]) @ b.astype(np.int64)
    np.testing.assert_array_equal(y, want)


def test_conv_integer_and_qlinear_conv_with_padding_per_channel_zero_points_and_bias():
    x, w = _ints(np.uint8, (2, 3, 9, 8)), _ints(np.uint8, (4, 3, 3, 3))
    node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1],
                            strides=[2, 1])  # fmt: skip
    consts = {"xz": np.array(7, np.uint8), "wz": _ints(np.uint8, (4,), 0, 9)}
    _agrees([node], {"x": x, "w": w}, consts, exact=True, opset=10)
    node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"],
                            ["y"], pads=[1, 0, 1, 2])  # fmt: skip
    ws = RNG.uniform(0.01, 0.05, 4).astype(np.float32)
    consts |= {"xs": np.array(0.05, np.float32), "ws": ws,
               "ys": np.array(2.0, np.float32), "yz": np.array(100, np.uint8),
               "b": _ints(np.int32, (4,), -500, 500)}  # fmt: skip
    _agrees([node], {"x": x, "w": w}, consts, exact=True, opset=10)


def test_quantize_to_float8e8m0_is_a_one_line_refusal():
    """(float8 and float4 outputs are rounded onto their grids: tests/test_onnx_narrow_types.)"""
    from onnx import TensorProto

    node = helper.make_node("QuantizeLinear", ["x", "s"], ["q"], name="q8",
                            output_dtype=TensorProto.FLOAT8E8M0)  # fmt: skip
    model = _nodes_model([node], {"x": np.ones(4, np.float32)}, {"s": np.array(1.0, np.float32)},
                         opset=24, infer=False)  # fmt: skip
    with pytest.raises(UnsupportedOpError) as e:
        prepare(model, "CPU")
    assert "QuantizeLinear to float8_e8m0fnu is not supported" in str(e.value)
    assert "q8" in str(e.value) and "\n" not in str(e.value)


def test_int8_and_uint8_tensors_move_one_byte_each_and_wrap_as_onnx():
    """uint8/int8/int16 run in their own dtype (they were held in int32: four bytes moved per
    byte of a quantized weight): the kernel's parameters are ``unsigned char``/``signed
    char``/``short``, int8 arithmetic wraps as ONNX's, and MatMulInteger still sums in
    int32, exactly."""
    a, w = _ints("uint8", (6, 40)), _ints("int8", (40, 9))
    s = _ints("int16", (6, 9))
    consts = {"az": np.array(128, np.uint8)}
    mm = [helper.make_node("MatMulInteger", ["a", "w", "az"], ["acc"]),
          helper.make_node("Cast", ["acc"], ["c8"], to=onnx.TensorProto.INT8)]  # fmt: skip
    (c8,) = _agrees(mm, {"a": a, "w": w}, consts, exact=True, opset=21)
    acc = (a.astype(np.int32) - 128) @ w.astype(np.int32)
    assert np.abs(acc).max() > 127  # the cast keeps the low 8 bits
    np.testing.assert_array_equal(c8, acc.astype(np.int8))
    src = prepare(_nodes_model(mm, {"a": a, "w": w}, consts, 21), "CPU").fn.cuda_source
    assert "const unsigned char* __restrict__ a" in src
    assert "const signed char* __restrict__ w" in src
    add = [helper.make_node("Add", ["w", "w"], ["ww"])]
    (ww,) = _agrees(add, {"w": w}, exact=True, opset=21)
    mul = [helper.make_node("Mul", ["s", "s"], ["ss"])]
    (ss,) = _agrees(mul, {"s": s}, exact=True, opset=21)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(ww, w + w)  # int8: wraps at 8 bits
        np.testing.assert_array_equal(ss, s * s)  # int16: wraps at 16 bits
    assert ww.dtype == np.int8 and ss.dtype == np.int16
    src = prepare(_nodes_model(mul, {"s": s}, {}, 21), "CPU").fn.cuda_source
    assert "const short* __restrict__ s" in src
