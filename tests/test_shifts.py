"""Bit shifts: ``te.shift_left``, ``te.shift_right`` (logical) and ``te.shift_right_arithmetic``
on int32, int64 and the narrow integers (negative values, counts outside ``[0, width)``) against
numpy on the emulator, the reference and NVRTC's compile; and ONNX BitShift of every integer
type (signed ones arithmetic, narrow ones wrapping at their own width) against ONNX's reference
evaluator, rerun race-free."""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import reference, te

RNG = np.random.default_rng(31)


def _numpy(op: str, a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    ok = (b >= 0) & (b < bits)
    s = np.where(ok, b, 0).astype(np.uint64)
    u = a.astype(np.int64).astype(np.uint64) & np.uint64((1 << bits) - 1)
    if op == "shl":
        r = np.where(ok, (u << s) & np.uint64((1 << bits) - 1), 0)
    elif op == "shr":
        r = np.where(ok, u >> s, 0)
    else:  # arithmetic
        return np.where(ok, a >> np.where(ok, b, 0), np.where(a < 0, -1, 0)).astype(a.dtype)
    return r.astype(np.uint64).astype(np.dtype(f"u{bits // 8}")).view(a.dtype)


@pytest.mark.parametrize("dtype", ["int32", "int64", "int16", "int8", "uint8"])
def test_te_shifts_against_numpy_reference_and_nvrtc(dtype):
    bits = np.iinfo(dtype).bits
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, 200, dtype=dtype)
    a[:4] = [info.max if info.min == 0 else -1, 1, info.min, info.max]
    b = RNG.integers(-4, bits + 6, 200).astype(dtype)
    b[:8] = np.array([0, bits - 1, bits, -1, 1, 63 if bits == 64 else 31, 2, 0]).astype(dtype)
    x, n = te.placeholder((200,), dtype, "x"), te.placeholder((200,), dtype, "n")
    fns = {"shl": te.shift_left, "shr": te.shift_right, "sar": te.shift_right_arithmetic}
    outs = [te.compute((200,), lambda i, f=f: f(x[i], n[i]), name=k) for k, f in fns.items()]
    fn = polyfuse.compile([x, n], outs)  # checks the CUDA with NVRTC where installed
    got = fn(a, b)
    ref = reference.evaluate(outs, {x: a, n: b})
    for k, g, r in zip(fns, got, ref, strict=True):
        want = _numpy(k, a, b, bits)
        np.testing.assert_array_equal(g, want, err_msg=k)
        np.testing.assert_array_equal(np.asarray(r).astype(dtype), want, err_msg=k)
    again = fn(a, b, device="emulate", race_check=True)
    for g, r in zip(got, again, strict=True):
        np.testing.assert_array_equal(g, r)


def test_a_float_shift_is_a_one_line_error():
    x = te.placeholder((4,), "float32", "x")
    with pytest.raises(polyfuse.errors.ExpressionError, match="te.shift_left takes integer"):
        te.compute((4,), lambda i: te.shift_left(x[i], 1), name="bad")


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "uint32", "uint64", "int8", "int16",
                                   "int32", "int64"])  # fmt: skip
@pytest.mark.parametrize("direction", ["LEFT", "RIGHT"])
def test_onnx_bitshift_of_every_integer_type(dtype, direction):
    pytest.importorskip("onnx")
    from onnx import helper
    from test_onnx_norms_and_math import _agrees

    info = np.iinfo(dtype)
    bits = info.bits
    x = RNG.integers(info.min, info.max, 60, dtype=dtype, endpoint=True)
    x[:3] = [info.min, info.max, 1]
    lo = -2 if info.min < 0 else 0
    y = RNG.integers(lo, bits + 3, 60).astype(dtype)
    _agrees([helper.make_node("BitShift", ["x", "y"], ["z"], direction=direction)],
            {"x": x, "y": y}, exact=True, opset=26, infer=False)  # fmt: skip
