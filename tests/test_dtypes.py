"""Dtypes in the front of the compiler: te typing rules, the reference per dtype, the compile
refusal of what code generation cannot print yet (issue 22, item 1 and the reference side of
item 3)."""

from __future__ import annotations

import itertools
import re

import ml_dtypes
import numpy as np
import pytest

import polyfuse
from polyfuse import reference, te
from polyfuse.errors import DtypeError, ExpressionError, UnsupportedDtypeError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Cast, Const, Reduce

ALL = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32",
       "float64"]  # fmt: skip
FLOATS = ["float16", "bfloat16", "float32", "float64"]

#: The promotion table, written out independently of graph/dtypes.py (rows × columns of ALL).
TABLE = """
bool      uint8     int8      int16     int32     int64     float16   bfloat16  float32   float64
uint8     uint8     int16     int16     int32     int64     float16   bfloat16  float32   float64
int8      int16     int8      int16     int32     int64     float16   bfloat16  float32   float64
int16     int16     int16     int16     int32     int64     float16   bfloat16  float32   float64
int32     int32     int32     int32     int32     int64     float16   bfloat16  float32   float64
int64     int64     int64     int64     int64     int64     float16   bfloat16  float32   float64
float16   float16   float16   float16   float16   float16   float16   float32   float32   float64
bfloat16  bfloat16  bfloat16  bfloat16  bfloat16  bfloat16  float32   bfloat16  float32   float64
float32   float32   float32   float32   float32   float32   float32   float32   float32   float64
float64   float64   float64   float64   float64   float64   float64   float64   float64   float64
"""


def one_line(e: BaseException) -> str:
    msg = str(e)
    assert "\n" not in msg, msg
    return msg


def _pair(a: str, b: str, n: int = 4):
    x = te.placeholder((n,), a, name="x")
    y = te.placeholder((n,), b, name="y")
    return x, y


# --------------------------------------------------------------------------- typing rules


def test_promotion_table_in_expressions():
    rows = [r.split() for r in TABLE.strip().splitlines()]
    for (i, a), (j, b) in itertools.product(enumerate(ALL), repeat=2):
        x, y = _pair(a, b)
        want = rows[i][j]
        assert dt.promote(a, b) == want, (a, b)
        for e in (x[0] + y[0], x[0] * y[0], te.maximum(x[0], y[0]), te.where(x[0] > 0, x[0], y[0])):
            assert e.dtype == want, (a, b, e)


@pytest.mark.extra  # needs PyTorch
def test_promotion_table_matches_torch():
    torch = pytest.importorskip("torch")
    tt = {n: getattr(torch, n) for n in ALL}
    for a, b in itertools.product(ALL, repeat=2):
        want = str(torch.promote_types(tt[a], tt[b])).removeprefix("torch.")
        assert dt.promote(a, b) == want, (a, b)


def test_the_docstring_table_is_the_rule():
    """graph/dtypes.py's docstring table (what the README copies) is what promote computes."""
    doc = dt.__doc__ or ""
    legend = dict(re.findall(r"(\w+) = (\w+)", doc.split("(u8 = ")[1].split(")")[0]))
    legend = {"u8": "uint8", "bool": "bool", **legend}
    lines = [ln.split("|") for ln in doc.splitlines() if "|" in ln and "promote" not in ln]
    lines = [[legend.get(w, w) for w in (ln[0].strip(), *ln[1].split())] for ln in lines]
    rows = {ln[0]: ln[1:] for ln in lines if ln[0] in ALL}
    assert set(rows) == set(ALL)
    for a in ALL:
        assert rows[a] == [dt.promote(a, b) for b in ALL], a


def test_python_numbers_are_weak():
    h = te.placeholder((4,), "float16", name="h")
    n = te.placeholder((4,), "int32", name="n")
    d = te.placeholder((4,), "float64", name="d")
    i = te.reduce_axis(4)  # any int32 value
    assert (h[0] * 2.5).dtype == "float16"
    assert (h[0] + 1).dtype == "float16"
    assert (h[0] / 2.0).dtype == (2 / h[0]).dtype == (h[0] / 2).dtype == "float16"
    assert (n[0] + 1).dtype == "int32"
    assert (n[0] * 0.5).dtype == "float32"
    assert (n[0] + 2**40).dtype == "int64"
    assert (i + True).dtype == "int32"
    # a te.const is not weak: it promotes like a tensor value of its dtype
    assert (h[0] * te.const(2.5, "float32")).dtype == "float32"
    assert (n[0] + te.const(1, "int64")).dtype == "int64"
    # a Python float beside float64 is the double, not its float32 rounding
    y = te.compute((4,), lambda j: d[j] * 0.1, name="y")
    x = np.array([1.0, 3.0, 7.0, 1e10])
    (got,) = reference.evaluate([y], {d: x})
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x * 0.1)


def test_cast_every_dtype_and_its_values():
    x = te.placeholder((6,), "float32", name="x")
    vals = np.array([-2.7, -0.5, 0.0, 1.0 / 3.0, 2.5, 70000.0], np.float32)
    for dtype in ALL:
        y = te.compute((6,), lambda i, d=dtype: te.cast(x[i], d), name=f"y_{dtype}")
        assert isinstance(y.op.body, Cast) and y.dtype == dtype
        (got,) = reference.evaluate([y], {x: vals})
        assert got.dtype == dt.numpy_dtype(dtype)
        if dtype == "bool":
            want = vals != 0
        elif dtype in ("int32", "int64"):
            want = np.trunc(vals).astype(dtype)  # toward zero
        elif dtype in dt.NARROW_INTS:  # toward zero, saturated (70000)
            info = np.iinfo(dtype)
            want = np.clip(np.trunc(vals), info.min, info.max).astype(dtype)
        else:
            with np.errstate(over="ignore"):  # 70000 is inf in float16
                want = vals.astype(dt.numpy_dtype(dtype))  # round to nearest even
        np.testing.assert_array_equal(got, want)
    with pytest.raises(DtypeError, match="te.cast: unknown dtype 'float8'"):
        te.cast(x[0], "float8")


def test_cast_to_int_saturates_like_cuda():
    x = te.placeholder((3,), name="x")
    y = te.compute((3,), lambda i: te.cast(x[i], "int32"), name="y")
    (got,) = reference.evaluate([y], {x: np.array([3e9, -3e9, np.nan], np.float32)})
    np.testing.assert_array_equal(got, [2**31 - 1, -(2**31), 0])


def test_comparisons_give_bool():
    x, y = _pair("float16", "int64")
    for e in (x[0] < y[0], x[0] >= 1, te.equal(x[0], y[0]), te.isnan(x[0]), te.isinf(x[0])):
        assert e.dtype == "bool"
    m = te.compute((4,), lambda i: x[i] > y[i], name="m")
    assert m.dtype == "bool"
    (got,) = reference.evaluate([m], {x: np.array([1, 2, 3, 4]), y: np.array([4, 2, 1, 0])})
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, [False, False, True, True])


def test_integer_division_rule():
    """``/`` of integers is float32 true division; ``//`` and ``%`` floor (Python)."""
    a = te.placeholder((8,), "int32", name="a")
    b = te.placeholder((8,), "int64", name="b")
    assert (a[0] / b[0]).dtype == "float32"
    assert (a[0] / 2).dtype == "float32"
    assert (a[0] // 2).dtype == "int32" and (a[0] % -3).dtype == "int32"
    assert (a[0] // 2.0).dtype == "float32"
    h = te.placeholder((8,), "float16", name="h")
    assert (a[0] / h[0]).dtype == "float16"
    av = np.array([-7, -6, -1, 0, 1, 5, 7, 2**31 - 1], np.int32)
    bv = np.array([2, -4, 3, 5, -2, 3, 7, 3], np.int64)
    q = te.compute((8,), lambda i: a[i] / b[i], name="q")
    f = te.compute((8,), lambda i: a[i] // 3, name="f")
    m = te.compute((8,), lambda i: a[i] % -3, name="m")
    got_q, got_f, got_m = reference.evaluate([q, f, m], {a: av, b: bv})
    assert got_q.dtype == np.float32 and got_f.dtype == got_m.dtype == np.int32
    np.testing.assert_array_equal(got_q, (av / bv).astype(np.float32))
    np.testing.assert_array_equal(got_f, [int(v) // 3 for v in av])
    np.testing.assert_array_equal(got_m, [int(v) % -3 for v in av])
    with pytest.raises(ExpressionError, match="needs a nonzero constant divisor.*te.truncdiv"):
        te.compute((8,), lambda i: a[i] // b[i], name="bad")


def test_accumulate_default_and_override():
    x = te.placeholder((4, 64), "float16", name="x")
    k = te.reduce_axis(64, name="k")
    s = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="s")
    assert s.dtype == "float16"
    red = s.op.body
    assert isinstance(red, Reduce) and red.accumulate is None
    assert red.accumulate_dtype == "float32"
    k2 = te.reduce_axis(64, name="k2")
    s16 = te.compute((4,), lambda i: te.sum(x[i, k2], axis=k2, accumulate="float16"), name="s16")
    assert s16.op.body.accumulate == s16.op.body.accumulate_dtype == "float16"
    k3 = te.reduce_axis(64, name="k3")
    mx = te.compute((4,), lambda i: te.max(x[i, k3], axis=k3, accumulate="float16"), name="mx")
    assert mx.op.body.accumulate_dtype == "float16"
    for body in ("float32", "float64", "int32", "int64"):
        assert dt.accumulate_dtype("sum", body) == body
    assert dt.accumulate_dtype("sum", "bfloat16") == "float32"
    assert dt.reduce_dtype("sum", "bool") == "int32"
    with pytest.raises(ExpressionError) as ei:
        k4 = te.reduce_axis(64)
        te.compute((4,), lambda i: te.sum(x[i, k4], axis=k4, accumulate="int32"), name="bad")
    assert "accumulate='int32'" in one_line(ei.value)


def test_accumulate_is_kept_by_nested_reductions_and_the_structural_key():
    """A reduction lifted out of a bigger body keeps its dtype and accumulator."""
    x = te.placeholder((4, 32), "bfloat16", name="x")
    k = te.reduce_axis(32, name="k")
    y = te.compute((4,), lambda i: te.sum(x[i, k], axis=k, accumulate="bfloat16") * 2, name="y")
    (hidden,) = [t for t in y.op.inputs() if t is not x]
    assert hidden.dtype == "bfloat16" and hidden.op.body.accumulate == "bfloat16"
    assert y.dtype == "bfloat16"


def test_compute_dtype_argument_converts_the_body():
    x = te.placeholder((4,), "float32", name="x")
    m = te.compute((4,), lambda i: x[i] > 0, name="m", dtype="float32")
    assert m.dtype == "float32" and isinstance(m.op.body, Cast)
    k = te.reduce_axis(4, name="k")
    c = te.compute((1,), lambda i: te.sum(x[k] > 0, axis=k), name="count")
    assert c.dtype == "int32"
    k2 = te.reduce_axis(4, name="k2")
    h = te.compute((1,), lambda i: te.sum(x[k2], axis=k2), name="h", dtype="float16")
    assert isinstance(h.op.body, Reduce) and h.dtype == "float16"
    xv = np.array([-1, 2, 3, 0.5], np.float32)
    got_m, got_c, got_h = reference.evaluate([m, c, h], {x: xv})
    np.testing.assert_array_equal(got_m, [0, 1, 1, 1])
    np.testing.assert_array_equal(got_c, [3])
    assert got_h.dtype == np.float16 and got_h[0] == np.float16(4.5)


def test_te_const():
    c = te.const(0.1, "float16")
    assert isinstance(c, Const) and c.dtype == "float16" and not c.weak
    y = te.compute((1,), lambda i: c + 0, name="y")
    (got,) = reference.evaluate([y], {})
    assert got.dtype == np.float16 and got[0] == np.float16(0.1)
    with pytest.raises(ExpressionError, match="not an integer"):
        te.const(0.5, "int32")
    with pytest.raises(ExpressionError, match="not an integer"):
        te.const(float("inf"), "int64")
    with pytest.raises(ExpressionError, match="does not fit int32"):
        te.const(2**31, "int32")
    assert te.const(2**31, "int64").value == 2**31


# --------------------------------------------------------------------------- dtypes accepted


def test_unknown_dtype_lists_exactly_the_accepted_ones():
    """The old message called bfloat16 unknown and listed float16, which te then refused."""
    with pytest.raises(DtypeError) as ei:
        te.placeholder((4,), dtype="bfloat17", name="w")
    msg = one_line(ei.value)
    assert "'w'" in msg and "bfloat17" in msg
    listed = re.search(r"use one of (.*)$", msg).group(1).split(", ")
    assert sorted(listed) == sorted(ALL)
    for d in listed:
        assert te.placeholder((4,), dtype=d, name="ok").dtype == d


def test_numpy_dtypes_accepted():
    assert te.placeholder((2,), np.float16).dtype == "float16"
    assert te.placeholder((2,), ml_dtypes.bfloat16).dtype == "bfloat16"
    assert dt.info("bfloat16").itemsize == 2 and dt.numpy_dtype("bfloat16") == ml_dtypes.bfloat16
    assert [dt.info(d).itemsize for d in ALL] == [1, 1, 1, 2, 4, 8, 2, 2, 4, 8]


# --------------------------------------------------------------------------- reference per dtype


@pytest.mark.parametrize("dtype", FLOATS)
def test_reference_rounds_each_float_dtype_like_numpy(dtype):
    """One rounding per compute: ``x + 2*y`` (2*y exact) equals numpy's in that dtype."""
    rng = np.random.default_rng(0)
    nd = dt.numpy_dtype(dtype)
    xv = rng.standard_normal(256).astype(nd)
    yv = rng.standard_normal(256).astype(nd)
    x, y = _pair(dtype, dtype, 256)
    z = te.compute((256,), lambda i: x[i] + y[i] * 2, name="z")
    assert z.dtype == dtype
    (got,) = reference.evaluate([z], {x: xv, y: yv})
    assert got.dtype == nd
    want = (xv.astype(np.float64) + 2 * yv.astype(np.float64)).astype(nd)
    np.testing.assert_array_equal(got, want)
    if dtype != "float64":
        assert not np.array_equal(got.astype(np.float64), xv.astype(np.float64) + 2 * yv)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_reference_integer_dtypes_wrap_like_numpy(dtype):
    nd = np.dtype(dtype)
    big = np.iinfo(nd).max // 2
    xv = np.array([1, -5, big, big + 7, -big - 9], nd)
    x = te.placeholder((5,), dtype, name="x")
    y = te.compute((5,), lambda i: x[i] * 3 + 7, name="y")
    assert y.dtype == dtype
    (got,) = reference.evaluate([y], {x: xv})
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(got, xv * nd.type(3) + nd.type(7))


def test_reference_bool_tensors():
    a, b = _pair("bool", "bool")
    y = te.compute((4,), lambda i: a[i] & (b[i] | (a[i] < b[i])), name="y")
    av, bv = np.array([1, 1, 0, 0], bool), np.array([1, 0, 1, 0], bool)
    (got,) = reference.evaluate([y], {a: av, b: bv})
    np.testing.assert_array_equal(got, av & bv)


def test_reference_refuses_floats_for_an_integer_input():
    x = te.placeholder((2,), "int32", name="ids")
    y = te.compute((2,), lambda i: x[i] + 1, name="y")
    with pytest.raises(polyfuse.errors.CallError, match="input 'ids' got a float64 array"):
        reference.evaluate([y], {x: np.array([1.0, 2.0])})


def _sum4096(dtype: str, accumulate: str | None):
    x = te.placeholder((4096,), dtype, name="x")
    k = te.reduce_axis(4096, name="k")
    s = te.compute((1,), lambda i: te.sum(x[k], axis=k, accumulate=accumulate), name="s")
    return x, s


def test_float16_accumulation_of_a_4096_long_sum_fails_float32_accumulation_does_not():
    """The accumulate rule matters: float16 running sums stall at 2048 when adding ones."""
    x16, s_default = _sum4096("float16", None)
    x16b, s_half = _sum4096("float16", "float16")
    ones = np.ones(4096, np.float16)
    (a,) = reference.evaluate([s_default], {x16: ones})
    (b,) = reference.evaluate([s_half], {x16b: ones})
    assert a.dtype == b.dtype == np.float16
    assert a[0] == 4096 and b[0] == 2048
    # random data: the float32 accumulator is within the float16 tolerance of the float64
    # oracle, the float16 one far outside it
    v = np.random.default_rng(1).random(4096).astype(np.float16)
    (oracle,) = reference.evaluate([s_default], {x16: v}, precision="float64")
    (good,) = reference.evaluate([s_default], {x16: v})
    (bad,) = reference.evaluate([s_half], {x16b: v})
    tol = reference.tolerance("float16")
    assert oracle.dtype == np.float64
    assert tol.allclose(good, oracle)
    assert not tol.allclose(bad, oracle)
    assert abs(float(bad[0]) - oracle[0]) > 10 * abs(float(good[0]) - oracle[0])


def test_bfloat16_sum_accumulates_in_float32():
    x, s = _sum4096("bfloat16", None)
    xb, sb = _sum4096("bfloat16", "bfloat16")
    ones = np.ones(4096, ml_dtypes.bfloat16)
    (a,) = reference.evaluate([s], {x: ones})
    (b,) = reference.evaluate([sb], {xb: ones})
    assert float(a[0]) == 4096 and float(b[0]) == 256  # bfloat16 has 8 significant bits


def test_storage_rounding_between_computes_and_the_float64_oracle():
    """A float16 compute loses what float16 storage loses; the oracle keeps it."""
    x = te.placeholder((3,), "float16", name="x")
    y = te.compute((3,), lambda i: x[i] + 1e-4, name="y")
    z = te.compute((3,), lambda i: y[i] - x[i], name="z")
    xv = np.array([1.0, 2.0, 0.5], np.float16)
    (stored,) = reference.evaluate([z], {x: xv})
    (exact,) = reference.evaluate([z], {x: xv}, precision="float64")
    np.testing.assert_array_equal(stored, [0, 0, 0])
    np.testing.assert_allclose(exact, 1e-4, rtol=1e-6)  # 1e-4 as a float32 constant
    y32 = te.compute((3,), lambda i: te.cast(x[i], "float32") + 1e-4, name="y32")
    z32 = te.compute((3,), lambda i: y32[i] - x[i], name="z32")
    (kept,) = reference.evaluate([z32], {x: xv})
    assert kept.dtype == np.float32 and np.all(kept > 0)


def test_float64_mode_keeps_float_casts_and_rejects_unknown_precision():
    x = te.placeholder((2,), "float32", name="x")
    y = te.compute((2,), lambda i: te.cast(te.cast(x[i], "float16") * 3, "float32"), name="y")
    xv = np.array([0.1, 1 / 3], np.float32)
    (s,) = reference.evaluate([y], {x: xv})
    (o,) = reference.evaluate([y], {x: xv}, precision="float64")
    np.testing.assert_array_equal(s, (xv.astype(np.float16).astype(np.float64) * 3).astype("f4"))
    np.testing.assert_array_equal(o, xv.astype(np.float64) * 3)
    with pytest.raises(polyfuse.errors.CallError, match="precision 'half'"):
        reference.evaluate([y], {x: xv}, precision="half")


def test_tolerance_table():
    for d in ALL:
        t = reference.tolerance(d)
        assert t.rtol >= 0 and t.atol >= 0
    assert reference.tolerance("int32").rtol == reference.tolerance("bool").atol == 0
    order = ["float64", "float32", "float16", "bfloat16"]
    rtols = [reference.tolerance(d).rtol for d in order]
    assert rtols == sorted(rtols)
    from polyfuse.testing import run

    assert (run.RTOL, run.ATOL) == (dt.tolerance("float32").rtol, dt.tolerance("float32").atol)


# --------------------------------------------------------------------------- compile refusal


def test_compile_accepts_a_float64_input():
    """float64 storage compiles (it was refused before the wide dtypes, issue 22)."""
    x = te.placeholder((8,), "float64", name="x_double")
    y = te.compute((8,), lambda i: x[i] * 2, name="y")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    xv = np.linspace(-1, 1, 8) / 3
    assert fn(xv).dtype == np.float64 and np.array_equal(fn(xv), xv * 2)


@pytest.mark.parametrize(
    "body",
    [
        lambda x, i: te.cast(te.cast(x[i], "int64") + 2**40, "float32"),
        lambda x, i: x[i] * te.const(0.1, "float64"),
    ],
)
def test_other_dtypes_inside_a_float32_graph_compile(body):
    """An int64 cast and a float64 constant inside a float32 kernel (refused before)."""
    x = te.placeholder((8,), name="x")
    y = te.compute((8,), lambda i: body(x, i), name="y", dtype="float32")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    xv = np.linspace(-9, 9, 8).astype(np.float32)
    (want,) = reference.evaluate([y], {x: xv})
    np.testing.assert_array_equal(fn(xv), want)


def test_compile_refuses_a_wider_accumulator_and_accepts_a_bool_output():
    x = te.placeholder((8, 16), name="x")
    k = te.reduce_axis(16, name="k")
    s = te.compute((8,), lambda i: te.sum(x[i, k], axis=k, accumulate="float64"), name="s")
    with pytest.raises(UnsupportedDtypeError, match="compute 's' accumulates its sum in float64"):
        polyfuse.compile([x], [s], check_cuda=False)
    m = te.compute((8,), lambda i: x[i, 0] > 0, name="mask")
    fn = polyfuse.compile([x], [m], check_cuda=False)
    xv = np.linspace(-1, 1, 128).astype(np.float32).reshape(8, 16)
    np.testing.assert_array_equal(fn(xv), xv[:, 0] > 0)


def test_float32_kernels_with_int_and_bool_expressions_still_compile():
    """Index arithmetic, comparisons, selects and an int64 constant inside a float32 kernel."""
    x = te.placeholder((16,), name="x")
    y = te.compute(
        (16,),
        lambda i: te.where(
            te.equal(i % 3, 0) | (x[i] > 0), x[(i + 1) % 16] / (i + 1), i // 2 + 2**40
        ),
        name="y",
    )
    assert y.dtype == "float32"
    xv = np.linspace(-1, 1, 16).astype(np.float32)
    fn = polyfuse.compile([x], [y], check_cuda=False)
    (want,) = reference.evaluate([y], {x: xv})
    np.testing.assert_allclose(fn(xv), want, rtol=1e-6)


@pytest.mark.parametrize("dtype", FLOATS)
def test_ops_in_each_float_dtype_are_within_tolerance_of_the_oracle(dtype):
    """ops keep the input dtype (Python constants are weak) and their stored results are
    within the dtype's tolerance of the float64 oracle."""
    from polyfuse import ops

    rng = np.random.default_rng(2)
    x = te.placeholder((8, 64), dtype, name="x")
    w = te.placeholder((64, 16), dtype, name="w")
    g = te.placeholder((64,), dtype, name="g")
    b = te.placeholder((64,), dtype, name="b")
    outs = [ops.softmax(x, axis=-1), ops.layer_norm(x, g, b, axis=-1), ops.matmul(x, w)]
    feeds = {t: rng.standard_normal(t.shape) for t in (x, w, g, b)}
    stored = reference.evaluate(outs, feeds)
    exact = reference.evaluate(outs, feeds, precision="float64")
    for o, s, e in zip(outs, stored, exact, strict=True):
        assert o.dtype == dtype and s.dtype == dt.numpy_dtype(dtype)
        assert reference.tolerance(dtype).allclose(s, e), o.name


def test_the_graph_shows_dtypes_and_accumulators():
    import islpy as isl

    from polyfuse.graph.graph import build_graph
    from polyfuse.poly.schedule import configure

    x = te.placeholder((4, 64), "float16", name="x")
    k, k2 = te.reduce_axis(64, name="k"), te.reduce_axis(64, name="k2")
    s = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="s")
    h = te.compute((4,), lambda i: te.sum(x[i, k2], axis=k2, accumulate="float16"), name="h")
    text = str(build_graph([x], [s, h], configure(isl.Context())))
    assert "s[4] float16 (accumulate float32) reduction" in text
    assert "h[4] float16 (accumulate float16) reduction" in text
    f = te.placeholder((4, 64), name="f")
    k3 = te.reduce_axis(64, name="k3")
    r = te.compute((4,), lambda i: te.sum(f[i, k3], axis=k3), name="r")
    assert "r[4] reduction" in str(build_graph([f], [r], configure(isl.Context())))


def test_two_stage_split_keeps_the_accumulator():
    """poly/split.py's partial and final reductions keep ``accumulate=``."""
    from polyfuse.poly.split import two_stage

    x = te.placeholder((4096,), "float16", name="x")
    k = te.reduce_axis(4096, name="k")
    s = te.compute((1,), lambda i: te.sum(x[k], axis=k, accumulate="float16"), name="s")
    partial, final = two_stage(s, 8)
    assert partial.op.body.accumulate == final.op.body.accumulate == "float16"
    v = np.ones(4096, np.float16)
    (whole,) = reference.evaluate([s], {x: v})
    (split,) = reference.evaluate([final], {x: v})
    assert whole[0] == 2048 and split[0] == 4096  # running float16 sums of 512 ones are exact


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_softmax_and_norms_round_once(dtype):
    """A float16/bfloat16 softmax, log-softmax, RMS norm and layer norm compute in float32
    and round their result once (torch's opmath): each element is the exact value rounded
    to the dtype, or one unit off where float32 itself sits on a rounding boundary. Their
    16-bit intermediates (exponentials, sums, rstd) rounded each before: several units off in
    the graph as written, and a kernel's result depended on which of them it kept in
    registers."""
    from polyfuse import ops

    rng = np.random.default_rng(5)
    x = te.placeholder((6, 96), dtype, name="x")
    g = te.placeholder((96,), dtype, name="g")
    outs = [
        ops.softmax(x, axis=-1),
        ops.log_softmax(x, axis=-1),
        ops.rms_norm(x, g, axis=-1),
        ops.layer_norm(x, g, None, axis=-1),
    ]
    npd = dt.numpy_dtype(dtype)
    feeds = {
        x: (rng.standard_normal(x.shape) * 3).astype(npd),
        g: rng.uniform(0.5, 2, 96).astype(npd),
    }
    stored = reference.evaluate(outs, feeds)
    exact = reference.evaluate(outs, feeds, precision="float64")
    fn = polyfuse.compile([x, g], outs, check_cuda=False)
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    got = fn(feeds[x], feeds[g], device="emulate")
    again = fn(feeds[x], feeds[g], device="emulate", race_check=True)
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(a, b)
    finfo = ml_dtypes.finfo(npd)
    for o, s, e, k in zip(outs, stored, exact, got, strict=True):
        assert o.dtype == dtype and k.dtype == npd
        e = np.asarray(e, np.float64)
        unit = np.maximum(np.abs(e), float(finfo.smallest_normal)) * float(finfo.eps)
        for what in (s, k):
            off = np.abs(what.astype(np.float64) - e) / unit
            assert off.max() <= 1.0, (o.name, float(off.max()))
            assert np.mean(what == e.astype(npd)) >= 0.98, o.name
