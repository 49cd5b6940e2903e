"""Constants in their dtype and one rule for integer division (issue 19, items 3 and 8).

A float constant means its float32 value, as numpy's float32 arithmetic gives it: ``1e39`` is
inf, ``1e-50`` is 0, ``1e-45`` the smallest denormal; the printer writes that value so NVRTC
accepts it and reads back the same float32. A Python int that does not fit int32 is an int64
beside integers and takes the float32 value beside floats (numpy's promotion of Python
scalars). ``/`` is true division, ``//`` and ``%`` Python's floor division and modulo, in the
reference and the kernel alike.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from vector_checks import require_nvrtc

import polyfuse
from polyfuse import reference, te
from polyfuse.cuda.codegen.literals import c_float
from polyfuse.errors import ExpressionError

EXTREME = [1e39, -1e39, 3.4028236e38, 1e-50, 1e-45, math.nan, 10**20, 2**31, -(2**31) - 1]
VALUES = np.array([0.0, 1.0, -2.0, 0.5, 3.0e-39, -7.25, np.inf, 1e30], np.float32)


def _scale_graph(c):
    x = te.placeholder((VALUES.size,), name="x")
    return x, te.compute((VALUES.size,), lambda i: x[i] * c, name="y")


@pytest.mark.parametrize("c", EXTREME, ids=repr)
def test_extreme_constant_matches_numpy_float32(c):
    x, y = _scale_graph(c)
    with np.errstate(all="ignore"):
        want = VALUES * c  # numpy: a Python scalar takes the float32 array's dtype
    assert want.dtype == np.float32
    got = polyfuse.compile([x], [y], check_cuda=False)(VALUES)
    np.testing.assert_array_equal(got, want)
    (ref,) = reference.evaluate([y], {x: VALUES})
    np.testing.assert_array_equal(ref, want)


@pytest.mark.parametrize("c", EXTREME, ids=repr)
def test_extreme_constant_compiles_with_nvrtc(c):
    require_nvrtc()
    x, y = _scale_graph(c)
    fn = polyfuse.compile([x], [y], check_cuda=True)
    assert fn.kernels


def test_float_literals_round_trip_exactly():
    samples = [1e39, 3.4028235e38, 1e-50, 1e-45, 1e-40, 1.17549435e-38, 0.1, 1 / 3, -0.0, 2**31]
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32)
    samples += [float(v) for v in bits.view(np.float32) if np.isfinite(v)]
    for v in samples:
        x = np.float32(v) if abs(v) < 3.5e38 else np.float32(np.inf) * np.sign(v)
        s = c_float(v).strip("()")
        if s.endswith("INFINITY"):
            back = -np.inf if s.startswith("-") else np.inf
        else:
            body = s.removesuffix("f")
            back = float.fromhex(body) if "0x" in body else float(body)
        assert np.float32(back) == x and math.copysign(1, back) == math.copysign(1, x), (v, s)
    assert c_float(1e-45) == "0x1p-149f"  # a denormal is a hex float
    assert c_float(1e-50) == "0.0f" and c_float(1e39) == "INFINITY"
    assert c_float(math.nan) == "__uint_as_float(0x7fc00000u)"


def test_wide_integer_in_an_integer_expression_is_int64():
    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: x[i] + (i + 2**31) - (i - 2**31 - 1), name="y")
    a = np.array([0.0, 1.0, 2.0, 3.0], np.float32)
    want = a + np.float32(2**32 + 1)
    np.testing.assert_array_equal(polyfuse.compile([x], [y], check_cuda=False)(a), want)
    np.testing.assert_array_equal(reference.evaluate([y], {x: a})[0], want)


def test_integer_beyond_int64_beside_integers_is_an_error():
    x = te.placeholder((4,), name="x")
    with pytest.raises(ExpressionError, match=r"compute 'y': integer constant 10{20} does not"):
        te.compute((4,), lambda i: x[i] + (i + 10**20), name="y")


# --------------------------------------------------------------------------- integer division

N = 12


def _int_expr_graph(f):
    x = te.placeholder((N,), name="x")
    return x, te.compute((N,), lambda i: x[i] + f(i), name="y")


INT_EXPRS = {
    "i/2": (lambda i: i / 2, lambda i: i / 2),
    "i//2": (lambda i: i // 2, lambda i: i // 2),
    "i%3": (lambda i: i % 3, lambda i: i % 3),
    "(i-5)/2": (lambda i: (i - 5) / 2, lambda i: (i - 5) / 2),
    "(i-5)//2": (lambda i: (i - 5) // 2, lambda i: (i - 5) // 2),
    "(i-5)%3": (lambda i: (i - 5) % 3, lambda i: (i - 5) % 3),
    "(i-5)//-2": (lambda i: (i - 5) // -2, lambda i: (i - 5) // -2),
    "(i-5)%-3": (lambda i: (i - 5) % -3, lambda i: (i - 5) % -3),
    "(7-i)/(-4)": (lambda i: (7 - i) / -4, lambda i: (7 - i) / -4),
}


@pytest.mark.parametrize("name", list(INT_EXPRS))
def test_integer_division_agrees_between_reference_kernel_and_python(name):
    te_f, np_f = INT_EXPRS[name]
    x, y = _int_expr_graph(te_f)
    zeros = np.zeros(N, np.float32)
    want = np.array([np_f(i) for i in range(N)], np.float32)  # Python's / // % on ints
    (ref,) = reference.evaluate([y], {x: zeros})
    np.testing.assert_array_equal(ref, want)
    got = polyfuse.compile([x], [y], check_cuda=False)(zeros)
    np.testing.assert_array_equal(got, want)


def test_integer_floordiv_by_a_variable_is_an_error():
    x = te.placeholder((N,), name="x")
    with pytest.raises(ExpressionError, match=r"compute 'y': integer .* nonzero constant divisor"):
        te.compute((N,), lambda i: x[i] + i // (i + 1), name="y")


# --------------------------------------------------------------------------- item 8


@pytest.mark.parametrize(
    "reduce, hint", [(te.min, "te.minimum"), (te.max, "te.maximum"), (te.sum, "a + b")]
)
def test_reduction_called_like_the_elementwise_op_says_what_to_use(reduce, hint):
    x = te.placeholder((N,), name="x")
    for second in (lambda i: 3, lambda i: i, lambda i: x[i]):
        with pytest.raises(ExpressionError) as ei:
            te.compute((N,), lambda i, s=second: reduce(x[i], s(i)), name="y")
        msg = str(ei.value)
        assert "\n" not in msg and "is not a te.reduce_axis" in msg and hint in msg
