"""uint8, int8 and int16 tensors: stored in their own width (``unsigned char``, ``signed
char``, ``short``), computed in C's ``int`` and wrapped back after every operation, as numpy
and torch compute them. Every kernel is checked against numpy's own arithmetic on those
dtypes (not only against polyfuse's reference), compiled with NVRTC for sm_80 and sm_90 where
installed and rerun race-free on the emulator."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import run_checked

import polyfuse
from polyfuse import reference, te
from polyfuse.graph import dtypes as dt

RNG = np.random.default_rng(8)
NARROW = ("uint8", "int8", "int16")


def _full_range(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, int(info.max) + 1, shape).astype(dtype)
    a.flat[:3] = [info.min, info.max, 0]
    return a


def test_promotion_of_the_integers_is_numpys_and_torchs():
    ints = [d for d in dt.DTYPES if dt.is_int(d)]
    for a in ints:
        for b in ints:
            assert dt.promote(a, b) == np.promote_types(a, b).name, (a, b)
    assert dt.promote("uint8", "int8") == "int16"
    assert dt.promote("bool", "uint8") == "uint8"
    assert dt.promote("int8", "float16") == "float16"
    x = te.placeholder((3,), "uint8", "x")
    assert te.compute((3,), lambda i: x[i] + 1, name="y").dtype == "uint8"  # weak int
    assert te.compute((3,), lambda i: x[i] * 0.5, name="z").dtype == "float32"


@pytest.mark.parametrize("dtype", NARROW)
def test_arithmetic_wraps_at_every_operation_as_numpy(dtype):
    shape = (37, 29)  # odd: partial blocks and no whole words
    a, b = _full_range(dtype, shape), _full_range(dtype, shape)
    x, y = te.placeholder(shape, dtype, "x"), te.placeholder(shape, dtype, "y")
    exprs = {
        "mix": lambda i, j: (x[i, j] * y[i, j] + 7) * 3 - y[i, j],
        "neg_abs": lambda i, j: te.abs(-x[i, j]) + te.bitwise_not(y[i, j]),
        "floor": lambda i, j: x[i, j] // 3 + (y[i, j] % 5) - x[i, j] // 7,
        "cmp": lambda i, j: te.where(x[i, j] + x[i, j] > y[i, j], x[i, j] - y[i, j], 7),
        "minmax": lambda i, j: te.maximum(x[i, j] * 2, y[i, j]) - te.minimum(x[i, j], y[i, j]),
        "pow": lambda i, j: x[i, j] ** 3,
    }
    outs = [te.compute(shape, f, name=k) for k, f in exprs.items()]
    got = run_checked([x, y], outs, {"x": a, "y": b})
    with np.errstate(over="ignore"):
        t = np.dtype(dtype).type
        want = {
            "mix": (a * b + t(7)) * t(3) - b,
            "neg_abs": np.abs(-a) + np.invert(b),
            "floor": a // t(3) + b % t(5) - a // t(7),
            "cmp": np.where(a + a > b, a - b, t(7)),
            "minmax": np.maximum(a * t(2), b) - np.minimum(a, b),
            "pow": a * a * a,
        }
    ref = reference.evaluate(outs, {x: a, y: b})
    for o, g, r in zip(outs, got, ref, strict=True):
        assert g.dtype == np.dtype(dtype), o.name
        np.testing.assert_array_equal(g, want[o.name], err_msg=o.name)
        np.testing.assert_array_equal(r, want[o.name], err_msg=o.name)


def test_reductions_of_narrow_integers_wrap_as_numpy():
    a, c = _full_range("uint8", (24, 70)), _full_range("int16", (24, 70))
    x, z = te.placeholder((24, 70), "uint8", "x"), te.placeholder((24, 70), "int16", "z")
    k = te.reduce_axis((0, 70), "k")
    outs = [
        te.compute((24,), lambda i: te.sum(x[i, k] * x[i, k], axis=k), name="s"),
        te.compute((24,), lambda i: te.max(z[i, k] * 3, axis=k), name="m"),
        te.compute((24,), lambda i: te.sum(te.cast(x[i, k], "int32"), axis=k), name="wide"),
    ]
    got = run_checked([x, z], outs, {"x": a, "z": c})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[0], (a * a).sum(axis=1, dtype=np.uint8))
        np.testing.assert_array_equal(got[1], (c * np.int16(3)).max(axis=1))
    np.testing.assert_array_equal(got[2], a.astype(np.int32).sum(axis=1))


def test_casts_to_narrow_integers_wrap_integers_and_saturate_floats():
    f = np.array([-1e9, -300.7, -128.9, -0.9, 0.0, 0.9, 127.9, 255.5, 300.2, 1e9, np.nan] * 3,
                 np.float32)  # fmt: skip
    n = np.array([-70000, -129, -128, -1, 0, 127, 128, 255, 256, 40000, 70000] * 3, np.int32)
    x, m = te.placeholder(f.shape, "float32", "x"), te.placeholder(n.shape, "int32", "m")
    outs = [
        te.compute(f.shape, lambda i, d=d: te.cast(x[i], d), name=f"f_{d}") for d in NARROW
    ] + [te.compute(n.shape, lambda i, d=d: te.cast(m[i], d), name=f"i_{d}") for d in NARROW]
    got = run_checked([x, m], outs, {"x": f, "m": n})
    for d, g in zip(NARROW, got[:3], strict=True):
        info = np.iinfo(d)
        want = np.clip(np.trunc(np.nan_to_num(f, nan=0.0)), info.min, info.max).astype(d)
        np.testing.assert_array_equal(g, want, err_msg=d)
    for d, g in zip(NARROW, got[3:], strict=True):
        np.testing.assert_array_equal(g, n.astype(d), err_msg=d)


def test_a_number_outside_a_narrow_dtype_is_a_one_line_error():
    x = te.placeholder((4,), "uint8", "x")
    with pytest.raises(polyfuse.errors.ExpressionError, match=r"300 does not fit uint8"):
        te.compute((4,), lambda i: x[i] + 300, name="y")
    with pytest.raises(polyfuse.errors.ExpressionError, match=r"-1 does not fit uint8"):
        te.compute((4,), lambda i: x[i] // -1, name="y")
    s = te.placeholder((4,), "int8", "s")
    with pytest.raises(polyfuse.errors.ExpressionError, match=r"compute 'y': 128 does not fit"):
        te.compute((4,), lambda i: te.where(s[i] > 0, s[i], 128), name="y")
    y = te.compute((4,), lambda i: te.cast(x[i], "int32") + 300, name="y")  # widened first
    assert y.dtype == "int32"


@pytest.mark.parametrize("width", [128, 35])
def test_narrow_tensors_move_in_words_of_their_run(width):
    # a uint8 image normalised to float32 and scaled in uint8, an int16 plane added to itself:
    # at an aligned width each thread's run of 4 lanes moves as one 4-byte (uint8) or 8-byte
    # (int16) word, each lane shifted out of it and or-ed back in (the bytes used to stay
    # scalar; before that, a float4 read of a uint8 row read 16 bytes from a 4-byte offset:
    # "misaligned 16-byte read" on the emulator); at an odd width, element by element
    img = _full_range("uint8", (16, 3, 64, width))
    s = _full_range("int16", (512, 8 * width))
    x = te.placeholder(img.shape, "uint8", "img")
    y = te.compute(img.shape, lambda n, c, h, w: te.cast(x[n, c, h, w], "float32") / 255.0 - 0.5,
                   name="y")  # fmt: skip
    z = te.compute(img.shape, lambda n, c, h, w: x[n, c, h, w] * te.const(3, "uint8") + 1,
                   name="z")  # fmt: skip
    p = te.placeholder(s.shape, "int16", "p")
    q = te.compute(s.shape, lambda i, j: p[i, j] + p[i, j], name="q")
    got = run_checked([x, p], [y, z, q], {"img": img, "p": s})
    np.testing.assert_allclose(got[0], img.astype(np.float32) / 255.0 - 0.5, rtol=1e-6)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[1], img * np.uint8(3) + np.uint8(1))
        np.testing.assert_array_equal(got[2], s + s)
    src = polyfuse.compile([x, p], [y, z, q]).cuda_source
    assert "const unsigned char* __restrict__ img" in src
    words = ("reinterpret_cast<const unsigned*>(&img", "reinterpret_cast<unsigned*>(&z",
             "reinterpret_cast<const uint2*>(&p", "reinterpret_cast<uint2*>(&q")  # fmt: skip
    assert all((w in src) == (width % 4 == 0) for w in words), width


def test_a_long_int8_sum_split_across_blocks_wraps_as_numpy():
    # the partial sums, their identity and the strong int8 constant are int8 too
    a = _full_range("int8", (1 << 18,))
    x = te.placeholder(a.shape, "int8", "x")
    k = te.reduce_axis((0, a.shape[0]), "k")
    s = te.compute((), lambda: te.sum(x[k] * te.const(-3, "int8"), axis=k), name="s")
    m = te.compute((), lambda: te.min(x[k] + 1, axis=k), name="m")
    got = run_checked([x], [s, m], {"x": a})
    assert "partial" in polyfuse.compile([x], [s, m]).cuda_source  # split across blocks
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got[0], (a * np.int8(-3)).sum(dtype=np.int8))
        np.testing.assert_array_equal(got[1], (a + np.int8(1)).min())


def test_truncated_division_of_uint8_by_255_is_an_ordinary_division():
    """torch fuzz seed 12810: ``x_u8 % (x.abs() + 2)`` gave 0 for 253 % 255. The typed
    helpers special-case a divisor of -1 (``INT_MIN / -1``), and ``T(-1)`` of ``unsigned
    char`` is 255: 253 / 255 came out as ``0 - 253``, 253 % 255 as 0."""
    a = np.array([253, 254, 255, 7, 0, 200] * 5, np.uint8)
    b = np.array([255, 255, 255, 255, 255, 7] * 5, np.uint8)
    s = np.array([-128, 127, -128, 5, -7, 0] * 5, np.int8)
    t = np.array([-1, -1, 3, -1, 2, -1] * 5, np.int8)
    x, y = te.placeholder(a.shape, "uint8", "x"), te.placeholder(b.shape, "uint8", "y")
    u, v = te.placeholder(s.shape, "int8", "u"), te.placeholder(t.shape, "int8", "v")
    outs = [
        te.compute(a.shape, lambda i: te.truncdiv(x[i], y[i]), name="q"),
        te.compute(a.shape, lambda i: te.truncmod(x[i], y[i]), name="r"),
        te.compute(s.shape, lambda i: te.truncdiv(u[i], v[i]), name="sq"),
        te.compute(s.shape, lambda i: te.truncmod(u[i], v[i]), name="sr"),
    ]
    got = run_checked([x, y, u, v], outs, {"x": a, "y": b, "u": s, "v": t})
    np.testing.assert_array_equal(got[0], a // b)
    np.testing.assert_array_equal(got[1], a % b)
    with np.errstate(over="ignore"):  # -128 / -1 wraps to -128, as torch's int8
        want_q = (np.trunc(s.astype(np.float64) / t)).astype(np.int64).astype(np.int8)
    np.testing.assert_array_equal(got[2], want_q)
    np.testing.assert_array_equal(got[3], np.fmod(s, t))
