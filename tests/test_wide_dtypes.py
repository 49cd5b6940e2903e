"""float64, int32, int64 and bool storage through code generation, on the emulator (issue 22,
the wide dtypes): ``double``/``int``/``long long``/``bool`` buffers, registers, shared tiles,
accumulators and combines in the tensor's own C type; comparisons giving bool; casts; integer
``//`` and ``%`` (Python's floor rule, README *Dtypes*) with negative operands; int32
arithmetic wrapping in two's complement in kernels and reference alike.

Every graph runs in both thread orders (race check) and is compared with
:func:`polyfuse.reference.evaluate` under :func:`polyfuse.graph.dtypes.tolerance` (exact for
integers and bools; float64 against the float64 oracle at a precision float32 cannot reach).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.cuda.codegen.literals import c_double
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import CallError, ExpressionError, UnsupportedDtypeError
from polyfuse.graph.dtypes import numpy_dtype, tolerance

RNG = np.random.default_rng(2264)
WIDE = ["float64", "int32", "int64", "bool"]


def _array(shape, dtype: str) -> np.ndarray:
    if dtype == "bool":
        return RNG.random(shape) < 0.4
    if dtype in ("int32", "int64"):
        return RNG.integers(-1000, 1000, shape).astype(dtype)
    return RNG.standard_normal(shape).astype(numpy_dtype(dtype))


def _run(inputs, outputs, arrays, rtol: float | None = None, precision: str = "float64"):
    """Compile, run in both thread orders, compare with the reference: the float64 oracle
    (``rtol``, also as ``atol``, overrides the float64 one; ``precision="storage"`` where casts
    round), integers and bools exactly."""
    fn = polyfuse.compile(inputs, outputs, check_cuda=False)
    feeds = dict(zip(inputs, arrays, strict=True))
    want = reference.evaluate(outputs, feeds, precision=precision)
    for race in (False, True):
        got = fn(*arrays, device="emulate", race_check=race)
        got = got if isinstance(got, tuple) else (got,)
        for t, g, w in zip(outputs, got, want, strict=True):
            assert g.dtype == numpy_dtype(t.dtype), t.name
            if t.dtype in ("int32", "int64", "bool"):
                np.testing.assert_array_equal(g, w, err_msg=t.name)
            elif t.dtype == "float64" and rtol is not None:
                np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol, err_msg=t.name)
            else:
                assert tolerance(t.dtype).allclose(g, w), t.name
    return fn


def _graphs(dtype: str):
    """(name, inputs, outputs, arrays): an elementwise chain with a broadcast, row, column
    and all-reductions, in ``dtype``."""
    x = te.placeholder((37, 130), dtype, name="x")
    b = te.placeholder((130,), dtype, name="b")
    if dtype == "bool":
        chain = te.compute(
            (37, 130),
            lambda i, j: (x[i, j] & te.not_equal(b[j], True)) | te.equal(x[i, j], b[j]),
            name="c",
        )
    elif dtype == "float64":
        chain = te.compute(
            (37, 130), lambda i, j: te.tanh(x[i, j] * 0.5 + b[j]) - x[i, j], name="c"
        )
    else:
        chain = te.compute((37, 130), lambda i, j: (x[i, j] * 3 - b[j]) * x[i, j] + 7, name="c")
    k = te.reduce_axis(130, name="k")
    rows = te.compute((37,), lambda i: te.sum(x[i, k], axis=k), name="rows")
    r = te.reduce_axis(37, name="r")
    cols = te.compute((130,), lambda j: te.max(x[r, j], axis=r), name="cols")
    p, q = te.reduce_axis(37, name="p"), te.reduce_axis(130, name="q")
    everything = te.compute((1,), lambda _: te.min(x[p, q], axis=[p, q]), name="all")
    arrays = [_array((37, 130), dtype), _array((130,), dtype)]
    return [
        ("chain", [x, b], [chain], arrays),
        ("rows", [x], [rows], arrays[:1]),
        ("cols", [x], [cols], arrays[:1]),
        ("all", [x], [everything], arrays[:1]),
    ]


@pytest.mark.parametrize("dtype", WIDE)
def test_elementwise_broadcast_and_reductions_per_dtype(dtype):
    for name, inputs, outputs, arrays in _graphs(dtype):
        fn = _run(inputs, outputs, arrays)
        assert {"float64": "double", "int32": "int", "int64": "long long", "bool": "bool"}[
            dtype
        ] in fn.cuda_source, name
    # the sum of bools counts in int32; the sum of int64 does not wrap at 32 bits
    rows = _graphs(dtype)[1][2][0]
    assert rows.dtype == ("int32" if dtype == "bool" else dtype)


def test_int64_sum_beyond_the_int32_range():
    x = te.placeholder((4, 300), "int64", name="x")
    k = te.reduce_axis(300, name="k")
    s = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="s")
    xv = np.full((4, 300), 2**40 + 3, np.int64)
    fn = _run([x], [s], [xv])
    assert np.all(fn(xv) == 300 * (2**40 + 3))


def test_comparison_gives_bool_then_where_and_any_all():
    x = te.placeholder((9, 70), "float64", name="x")
    m = te.compute((9, 70), lambda i, j: x[i, j] > 0.5, name="m")
    assert m.dtype == "bool"
    w = te.compute((9, 70), lambda i, j: te.where(m[i, j], x[i, j], -x[i, j] * 2), name="w")
    k = te.reduce_axis(70, name="k")
    anyv = te.compute((9,), lambda i: te.max(m[i, k], axis=k), name="any")
    allv = te.compute((9,), lambda i: te.min(m[i, k], axis=k), name="all")
    count = te.compute((9,), lambda i: te.sum(m[i, k], axis=k), name="count")
    xv = RNG.standard_normal((9, 70))
    xv[3] = 1.0  # a row where all hold
    xv[4] = -1.0  # and one where none does
    fn = _run([x], [m, w, anyv, allv, count], [xv])
    _, _, a, al, c = fn(xv)
    assert a[3] and al[3] and not a[4] and not al[4] and c[3] == 70 and c[4] == 0


@pytest.mark.parametrize("src", ["float64", "int32", "int64", "bool", "float32"])
def test_casts_between_the_dtypes(src):
    x = te.placeholder((64,), src, name="x")
    outs = [
        te.compute((64,), lambda i, d=d: te.cast(x[i], d), name=f"to_{d}")
        for d in ["float64", "float32", "int32", "int64", "bool", "float16"]
        if d != src
    ]
    if src in ("float64", "float32"):
        xv = np.concatenate(
            [[np.nan, np.inf, -np.inf, 3e9, -3e9, 1e19, -1e19, -2.5, 2.5, -0.5, 0.0]],
        )
        xv = np.concatenate([xv, RNG.standard_normal(64 - len(xv)) * 1e3]).astype(src)
    elif src == "bool":
        xv = _array((64,), "bool")
    else:
        xv = RNG.integers(-(2**31) if src == "int64" else -1000, 2**31, 64).astype(src)
        if src == "int64":
            xv[:3] = [2**40 + 5, -(2**40) - 7, 2**62]  # int32 casts wrap
    _run([x], outs, [xv], precision="storage")


def test_integer_floor_division_and_modulo_with_negative_operands():
    """``//`` floors and ``%`` takes the divisor's sign (README *Dtypes*), in int32 and
    int64, for positive and negative divisors, INT_MIN included."""
    a = te.placeholder((16,), "int32", name="a")
    b = te.placeholder((16,), "int64", name="b")
    outs = []
    for d in (3, -3, 7, -1):
        outs.append(te.compute((16,), lambda i, d=d: a[i] // d, name=f"qa{abs(d)}{d < 0}"))
        outs.append(te.compute((16,), lambda i, d=d: a[i] % d, name=f"ra{abs(d)}{d < 0}"))
        outs.append(te.compute((16,), lambda i, d=d: b[i] // d, name=f"qb{abs(d)}{d < 0}"))
        outs.append(te.compute((16,), lambda i, d=d: b[i] % d, name=f"rb{abs(d)}{d < 0}"))
    vals = [-7, -6, -1, 0, 1, 5, 7, -8, 8, -9, 100, -100, 2**31 - 1, -(2**31) + 1, -3, 3]
    av = np.array(vals, np.int32)
    bv = np.array(vals, np.int64) * 1000003
    fn = _run([a, b], outs, [av, bv])
    got = fn(av, bv)
    for t, g in zip(outs, got, strict=True):  # Python's own rule, independently of the reference
        d = int(t.name[2:-5] if t.name.endswith("False") else t.name[2:-4])
        d = -d if t.name.endswith("True") else d
        src = av if t.name[1] == "a" else bv
        want = [int(v) // d if t.name[0] == "q" else int(v) % d for v in src]
        if t.dtype == "int32":
            want = np.array(want, np.int64).astype(np.int32)  # INT_MIN // -1 wraps
        np.testing.assert_array_equal(g, want, err_msg=t.name)


def test_int32_arithmetic_wraps_in_kernel_and_reference():
    """One rule: int32 arithmetic wraps (two's complement, like numpy's int32 and CUDA), at
    every operation: ``a * b`` overflows before ``// 3``, ``> 0`` and the cast see it."""
    a = te.placeholder((8,), "int32", name="a")
    b = te.placeholder((8,), "int32", name="b")
    prod = te.compute((8,), lambda i: (a[i] * b[i]) // 3, name="prod")
    sign = te.compute((8,), lambda i: a[i] * b[i] + 1 > 0, name="sign")
    wide = te.compute((8,), lambda i: te.cast(a[i] * b[i], "int64") + 1, name="wide")
    av = np.array([70000, -70000, 2**31 - 1, 46341, 3, -(2**31), 65536, 1], np.int32)
    bv = np.array([70000, 70000, 2, 46341, 5, -1, 65536, -1], np.int32)
    with np.errstate(over="ignore"):
        p32 = av * bv  # numpy's int32 wraps
    want_prod = p32.astype(np.int64) // 3
    (r_prod, r_sign, r_wide) = reference.evaluate([prod, sign, wide], {a: av, b: bv})
    np.testing.assert_array_equal(r_prod, want_prod.astype(np.int32))
    np.testing.assert_array_equal(r_sign, p32.astype(np.int64) + 1 > 0)
    np.testing.assert_array_equal(r_wide, p32.astype(np.int64) + 1)
    assert not r_sign[3] and r_wide[3] < 0  # 46341² wraps negative in int32
    _run([a, b], [prod, sign, wide], [av, bv])


def test_float64_softmax_and_layer_norm_beyond_float32_precision():
    """float64 really is used: within 1e-12 of the float64 oracle, where float32 storage is
    ~1e-7 away."""
    x = te.placeholder((24, 333), "float64", name="x")
    sm = ops.softmax(x, axis=-1, name="sm")
    ln = ops.layer_norm(x, axis=-1, name="ln")
    xv = RNG.standard_normal((24, 333)) * 3 + 1e3  # a large mean: cancellation in float32
    fn = _run([x], [sm, ln], [xv], rtol=1e-12)
    x32 = te.placeholder((24, 333), "float32", name="x32")
    ln32 = ops.layer_norm(x32, axis=-1, name="ln32")
    got32 = polyfuse.compile([x32], [ln32], check_cuda=False)(xv.astype(np.float32))
    (want,) = reference.evaluate([ln], {x: xv}, precision="float64")
    assert np.abs(got32 - want).max() > 1e-6 > np.abs(fn(xv)[1] - want).max() * 1e5


def test_float64_matmul():
    a = te.placeholder((33, 70), "float64", name="a")
    b = te.placeholder((70, 45), "float64", name="b")
    k = te.reduce_axis(70, name="k")
    c = te.compute((33, 45), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    av, bv = RNG.standard_normal((33, 70)), RNG.standard_normal((70, 45))
    fn = _run([a, b], [c], [av, bv], rtol=1e-12)
    np.testing.assert_allclose(fn(av, bv), av @ bv, rtol=1e-12)


def test_double_constants_are_exact():
    assert c_double(0.1) == "0.1" and float(c_double(1 / 3)) == 1 / 3
    assert c_double(-2.0) == "(-2.0)" and c_double(5e-324) == "5e-324"
    assert c_double(float("inf")) == "((double)INFINITY)"
    assert c_double(float("nan")).startswith("__longlong_as_double(0x7ff8")
    x = te.placeholder((4,), "float64", name="x")
    y = te.compute((4,), lambda i: x[i] * (1 / 3) + 1e-300, name="y")
    fn = _run([x], [y], [np.arange(4.0)], rtol=0.0)
    assert "0.3333333333333333" in fn.cuda_source and "1e-300" in fn.cuda_source


def test_call_refuses_a_wrong_dtype_naming_the_input():
    for dtype, wrong in (
        ("float64", np.float32),
        ("int32", np.int64),
        ("int64", np.int32),
        ("bool", np.int8),
    ):
        x = te.placeholder((8,), dtype, name=f"x_{dtype}")
        y = te.compute((8,), lambda i, x=x: x[i], name="y")
        fn = polyfuse.compile([x], [y], check_cuda=False)
        with pytest.raises(CallError, match=f"input 'x_{dtype}': expected {dtype}, got"):
            fn(np.zeros(8, wrong), device="emulate")
        out = fn(np.ones(8, numpy_dtype(dtype)), device="emulate")
        assert out.dtype == numpy_dtype(dtype) and np.all(out == 1)


def test_a_float64_accumulator_of_a_float32_sum_is_still_refused():
    x = te.placeholder((8, 16), name="x")
    k = te.reduce_axis(16, name="k")
    s = te.compute((8,), lambda i: te.sum(x[i, k], axis=k, accumulate="float64"), name="s")
    with pytest.raises(UnsupportedDtypeError, match="compute 's' accumulates its sum in float64"):
        polyfuse.compile([x], [s], check_cuda=False)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_every_wide_kernel_without_spills(arch):
    for dtype in WIDE:
        for _, inputs, outputs, _ in _graphs(dtype):
            fn = polyfuse.compile(inputs, outputs, arch=arch, check_cuda=False)
            binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
            assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    x = te.placeholder((24, 333), "float64", name="x")
    a = te.placeholder((16,), "int64", name="a")
    q = te.compute(
        (16,),
        lambda i: te.cast(a[i] // -3 + a[i] % 5 + te.truncdiv(a[i], a[15 - i]), "float64")
        + te.cast(te.truncmod(te.cast(a[i], "int32"), te.cast(a[15 - i], "int32")), "float64"),
        name="q",
    )
    for ins, outs in (([x], [ops.softmax(x, axis=-1, name="sm")]), ([a], [q])):
        fn = polyfuse.compile(ins, outs, arch=arch, check_cuda=False)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


def test_floor_division_of_int32_data_near_int_min_in_a_float32_kernel():
    """Regression: the prelude's ``pf_fdiv`` negates its dividend, which overflows at
    INT_MIN; a dividend that reads a tensor now takes the exact typed helper."""
    x = te.placeholder((4,), name="x")
    y = te.compute((4,), lambda i: te.cast(te.cast(x[i], "int32") // 7, "float32"), name="y")
    z = te.compute((4,), lambda i: te.cast(te.cast(x[i], "int32") % -7, "float32"), name="z")
    xv = np.array([-(2.0**31), -7.0, 2.0**31, 5.0], np.float32)
    fn = _run([x], [y, z], [xv], precision="storage")
    want = [-(2**31) // 7, -1, (2**31 - 1) // 7, 0]
    np.testing.assert_array_equal(fn(xv)[0], np.array(want, np.float32))


def test_outputs_of_integer_dtypes_are_poisoned_without_a_numpy_warning():
    """Regression: output buffers were filled with NaN whatever their dtype (numpy warns
    'invalid value encountered in cast' for an int buffer)."""
    x = te.placeholder((8,), "int32", name="x")
    y = te.compute((8,), lambda i: x[i] + 1, name="y")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert np.array_equal(fn(np.arange(8, dtype=np.int32)), np.arange(1, 9))


def test_mixed_float32_and_float64_rows_share_dynamic_shared_memory_and_the_scratch():
    """A float64 softmax and a float32 one stitched in one kernel over 7000-long rows: double
    and float tiles slice one dynamic pool (offsets in 4-byte words, doubles 8-byte
    aligned), and one double scratch serves both combines."""
    x = te.placeholder((3, 7000), "float64", name="x")
    x32 = te.placeholder((3, 7000), "float32", name="x32")
    xs = te.compute((3, 7000), lambda i, j: x[i, j] + te.cast(x32[i, j], "float64"), name="xs")
    sm = ops.softmax(xs, axis=-1, name="sm")
    e32 = te.compute((3, 7000), lambda i, j: te.exp(x32[i, j]), name="e32")
    k = te.reduce_axis(7000, name="k")
    s32 = te.compute((3,), lambda i: te.sum(e32[i, k], axis=k), name="s32")
    y32 = te.compute(
        (3, 7000), lambda i, j: e32[i, j] / s32[i] + te.cast(sm[i, j], "float32"), name="y32"
    )
    xv, x32v = RNG.standard_normal((3, 7000)), RNG.standard_normal((3, 7000)).astype(np.float32)
    fn = _run([x, x32], [sm, y32], [xv, x32v], rtol=1e-12)
    src = fn.cuda_source
    assert len(fn.kernels) == 1 and "extern __shared__ __align__(16) float pf_smem[];" in src
    offsets = [int(m) for m in re.findall(r"reinterpret_cast<double\*>\(pf_smem \+ (\d+)\)", src)]
    assert offsets and all(o % 2 == 0 for o in offsets)
    assert "reinterpret_cast<float*>(pf_scratch)" in src and "double pf_scratch[" in src


@pytest.mark.parametrize(
    "dtype, word", [("float64", "double2"), ("int32", "int4"), ("int64", "longlong2")]
)
def test_128_bit_vector_accesses_in_bytes_of_the_dtype(dtype, word):
    """A memory-bound kernel coarsened to 4 elements per thread moves its rows as 128-bit
    words of the dtype (2 doubles, 4 ints, 2 int64; isl proves the alignment in elements,
    which for 8-byte elements is stronger than 16 bytes needs); bool stays scalar."""
    x = te.placeholder((1024, 2048), dtype, name="x")
    b = te.placeholder((2048,), dtype, name="b")
    y = te.compute((1024, 2048), lambda i, j: x[i, j] * 2 + b[j], name="y")
    xv, bv = _array((1024, 2048), dtype), _array((2048,), dtype)
    fn = _run([x, b], [y], [xv, bv])
    src = fn.cuda_source
    assert f"*reinterpret_cast<const {word}*>" in src and f"make_{word}(" in src
    assert "float4" not in src
    if "nvrtc" in available_compilers():
        binary = compile_cuda(src, "sm_90", compiler="nvrtc")
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


def test_bool_tensors_stay_scalar_in_a_vectorized_kernel():
    x = te.placeholder((1024, 2048), "float32", name="x")
    m = te.placeholder((1024, 2048), "bool", name="m")
    y = te.compute((1024, 2048), lambda i, j: te.where(m[i, j], x[i, j], -x[i, j]), name="y")
    xv, mv = _array((1024, 2048), "float32"), _array((1024, 2048), "bool")
    fn = _run([x, m], [y], [xv, mv])
    src = fn.cuda_source
    assert "float4" in src  # x and y move as float4, m element by element
    assert not any(w in src for w in ("uchar4", "char4", "uint4"))


def test_shadow_race_check_of_double_and_int64_combines():
    """The shadow-memory race detector over a float64 row softmax (warp shuffles and a
    shared double scratch) and an int64 column sum of floor quotients."""
    x = te.placeholder((24, 333), "float64", name="x")
    a = te.placeholder((24, 333), "int64", name="a")
    sm = ops.softmax(x, axis=-1, name="sm")
    k = te.reduce_axis(24, name="k")
    cs = te.compute((333,), lambda j: te.sum(a[k, j] // 3, axis=k), name="cs")
    fn = polyfuse.compile([x, a], [sm, cs], check_cuda=False)
    xv, av = RNG.standard_normal((24, 333)), RNG.integers(-(10**12), 10**12, (24, 333))
    got = fn(xv, av, device="emulate", race_check="shadow")
    want = reference.evaluate([sm, cs], {x: xv, a: av}, precision="float64")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_array_equal(got[1], (av // 3).sum(axis=0))


@pytest.mark.parametrize("dtype", ["int32", "float64", "bool"])
def test_gemm_epilogue_stored_in_a_wide_dtype(dtype):
    """Regression: a float32 GEMM's epilogue stored to an int32 output took the float4 store
    run (four 4-byte elements), writing float bits into the int buffer; float4 runs are for
    float32 outputs only (the others store scalars)."""
    a = te.placeholder((256, 128), name="a")
    b = te.placeholder((128, 256), name="b")
    k = te.reduce_axis(128, name="k")
    c = te.compute((256, 256), lambda i, j: te.sum(a[i, k] * b[k, j], axis=k), name="c")
    if dtype == "bool":
        y = te.compute((256, 256), lambda i, j: c[i, j] > 0, name="y")
    else:
        y = te.compute((256, 256), lambda i, j: te.cast(c[i, j] * 4, dtype) + 1, name="y")
    # small integers: every float32 sum is exact, so the integer result is too
    av = RNG.integers(-3, 4, (256, 128)).astype(np.float32)
    bv = RNG.integers(-3, 4, (128, 256)).astype(np.float32)
    fn = _run([a, b], [y], [av, bv], rtol=0.0)
    assert "r_c_acc[4][4]" in fn.cuda_source  # the GEMM tiles computed it
    assert "make_float4" not in fn.cuda_source


def test_bool_and_int64_shared_tiles_share_the_dynamic_pool():
    """A bool mask (1 byte an element) and an int64 row (8) stitched past two reductions
    over 13000-long rows: the pool's offsets are 4-byte words, the int64 slice starts on an
    8-byte boundary after the 13000-byte mask."""
    x = te.placeholder((5, 13000), name="x")
    i8 = te.placeholder((5, 13000), "int64", name="i8")
    m = te.compute((5, 13000), lambda i, j: x[i, j] > 0.3, name="m")
    q = te.compute((5, 13000), lambda i, j: i8[i, j] * 3 - 1, name="q")
    k = te.reduce_axis(13000, name="k")
    cnt = te.compute((5,), lambda i: te.sum(m[i, k], axis=k), name="cnt")
    qs = te.compute((5,), lambda i: te.max(q[i, k], axis=k), name="qs")
    y = te.compute(
        (5, 13000),
        lambda i, j: te.where(
            m[i, j], te.cast(cnt[i], "float32"), te.cast(q[i, j] - qs[i], "float32")
        ),
        name="y",
    )
    xv = _array((5, 13000), "float32")
    iv = RNG.integers(-(2**40), 2**40, (5, 13000))
    fn = _run([x, i8], [y, cnt], [xv, iv])
    src = fn.cuda_source
    assert len(fn.kernels) == 1
    assert "bool* s_m = reinterpret_cast<bool*>(pf_smem + 0);" in src
    assert "long long* s_q = reinterpret_cast<long long*>(pf_smem + 3250);" in src


def test_integer_powers_are_exact_and_wrap():
    """Regression: an integer ``**`` printed ``powf``, exact only below 2**24 (and not
    wrapping); now exponentiation by squaring in the integer type, like numpy's."""
    a = te.placeholder((16,), "int32", name="a")
    b = te.placeholder((16,), "int64", name="b")
    outs = [
        te.compute((16,), lambda i: a[i] ** 2, name="sq"),
        te.compute((16,), lambda i: a[i] ** 3, name="cube"),  # wraps past 1290
        te.compute((16,), lambda i: b[i] ** 3, name="bcube"),
        te.compute((16,), lambda i: a[i] ** -1, name="inv"),  # truncated 1 / a
    ]
    av = np.array([0, 1, -1, 2, -3, 1290, 1291, -2000, 4097, 46341, 7, -7, 12, 100, 3, 9], np.int32)
    bv = av.astype(np.int64) * 1000
    fn = _run([a, b], outs, [av, bv])
    sq, cube, bcube, inv = fn(av, bv)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(sq, av * av)
        np.testing.assert_array_equal(cube, av * av * av)
    np.testing.assert_array_equal(bcube, bv**3)
    np.testing.assert_array_equal(inv, [0, 1, -1] + [0] * 13)


def _c_quotient(x: int, y: int, bits: int, rem: bool) -> int:
    """C's truncating ``x / y`` (or ``x % y``) in Python integers, wrapped to ``bits``; 0 by
    zero, as te.truncdiv/truncmod define it."""
    if y == 0:
        return 0
    q = abs(x) // abs(y) * (1 if (x < 0) == (y < 0) else -1)
    v = x - y * q if rem else q
    return (v + 2 ** (bits - 1)) % 2**bits - 2 ** (bits - 1)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_truncating_division_by_tensor_values_over_the_whole_range(dtype):
    """``te.truncdiv``/``truncmod`` by run-time divisors: C's rounding toward zero (not the
    floor), 0 by zero, ``INT_MIN / -1`` wrapping, extremes of the range, a constant divisor;
    against Python's integers, the reference, in both thread orders."""
    info = np.iinfo(dtype)
    n = 48
    a = te.placeholder((n,), dtype, name="a")
    b = te.placeholder((n,), dtype, name="b")
    q = te.compute((n,), lambda i: te.truncdiv(a[i], b[i]), name="q")
    r = te.compute((n,), lambda i: te.truncmod(a[i], b[i]), name="r")
    q3 = te.compute((n,), lambda i: te.truncdiv(a[i], -3) + te.truncmod(a[i], 7), name="q3")
    rng = np.random.default_rng(7)
    av = rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
    bv = np.where(rng.random(n) < 0.5, rng.integers(-9, 10, n), av[::-1] // 3).astype(dtype)
    fixed = [(7, 2), (-7, 2), (7, -2), (-7, -2), (info.min, -1), (info.min, 1), (5, 0),
             (info.min, info.min), (info.max, info.min), (info.min, info.max), (0, -5)]  # fmt: skip
    for k, (x, y) in enumerate(fixed):
        av[k], bv[k] = x, y
    fn = _run([a, b], [q, r, q3], [av, bv])
    got = fn(av, bv)
    bits = info.bits
    pairs = list(zip(av.tolist(), bv.tolist(), strict=True))
    want_q = [_c_quotient(x, y, bits, False) for x, y in pairs]
    want_r = [_c_quotient(x, y, bits, True) for x, y in pairs]
    want_3 = [_c_quotient(_c_quotient(x, -3, bits, False) + _c_quotient(x, 7, bits, True), 1,
                          bits, False) for x, _ in pairs]  # fmt: skip
    for g, w, name in zip(got, (want_q, want_r, want_3), "q r q3".split(), strict=True):
        np.testing.assert_array_equal(g, np.array(w, dtype), err_msg=name)
    assert got[0][:5].tolist() == [3, -3, -3, 3, info.min]  # toward zero; INT_MIN / -1 wraps


def test_truncating_division_prints_one_helper_call_not_a_float_refinement():
    """Regression: ONNX's int64 ``Div``/``Mod`` by a tensor printed as a 15 KB expression (a
    float64 estimate refined twice, written out as a tree): ~15 s of g++ per kernel. Now each
    is one ``pf_w_tdiv``/``pf_w_tmod`` call."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    from polyfuse.onnx import load

    nodes = [helper.make_node("Div", ["a", "b"], ["q"]),
             helper.make_node("Mod", ["a", "b"], ["r"], fmod=0)]  # fmt: skip
    vi = [helper.make_tensor_value_info(n, TensorProto.INT64, [8]) for n in "abqr"]
    g = helper.make_graph(nodes, "div", vi[:2], vi[2:])
    fn = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])).compile()
    src = fn.cuda_source
    assert "pf_w_tdiv<long long>(" in src and "pf_w_tmod<long long>(" in src
    assert "(double)" not in src
    assert len(src) < 8000, len(src)  # was over 30 KB


def test_truncating_division_of_floats_is_an_error_naming_the_compute():
    x = te.placeholder((4,), name="x")
    with pytest.raises(ExpressionError, match=r"compute 'h': te.truncdiv takes integer operands"):
        te.compute((4,), lambda i: te.truncdiv(x[i], 2), name="h")


@pytest.mark.parametrize(
    ("dtype", "rel"),
    [("float32", 1e-6), ("float64", 1e-14), ("float16", 2.0**-10), ("bfloat16", 2.0**-7)],
)
def test_log1p_and_expm1_are_accurate_near_zero(dtype, rel):
    """``te.log1p``/``te.expm1`` keep their relative precision where ``log(1 + x)`` and
    ``exp(x) - 1`` lose all of it (``x`` below the dtype's epsilon: ``1 + x`` rounds to 1),
    and agree with the oracle elsewhere; NVRTC compiles them for sm_80."""
    n = 64
    x = te.placeholder((n,), dtype, name="x")
    lp = te.compute((n,), lambda i: te.log1p(x[i]), name="lp")
    em = te.compute((n,), lambda i: te.expm1(x[i]) * 2.0, name="em")
    eps = float(np.finfo(numpy_dtype(dtype)).eps) if dtype != "bfloat16" else 2.0**-7
    tiny = np.geomspace(eps / 64, eps / 2, n // 2) * np.where(np.arange(n // 2) % 2, 1, -1)
    xv = np.concatenate([tiny, RNG.uniform(-0.9, 3.0, n // 2)]).astype(numpy_dtype(dtype))
    fn = _run([x], [lp, em], [xv])
    got_lp, got_em = (np.asarray(g, np.float64) for g in fn(xv))
    x64 = np.asarray(xv, np.float64)
    small = slice(0, n // 2)
    np.testing.assert_allclose(got_lp[small], np.log1p(x64[small]), rtol=rel, atol=0)
    np.testing.assert_allclose(got_em[small], 2 * np.expm1(x64[small]), rtol=rel, atol=0)
    if "nvrtc" in available_compilers() and dtype in ("float32", "float16"):
        fn = polyfuse.compile([x], [lp, em], arch="sm_80", check_cuda=False)
        assert "log1pf(" in fn.cuda_source and "expm1f(" in fn.cuda_source
        compile_cuda(fn.cuda_source, "sm_80", compiler="nvrtc")


@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_bitwise_and_or_xor_not(dtype):
    """``te.bitwise_*`` of integers over their whole range (two's complement, as numpy) and
    of bools (logical: ``~`` of a bool is its negation, not ``-2``); a float operand is an
    error naming the compute; NVRTC compiles them for sm_80 and sm_90."""
    a = te.placeholder((37, 9), dtype, name="a")
    b = te.placeholder((9,), dtype, name="b")
    fns = (te.bitwise_and, te.bitwise_or, te.bitwise_xor)
    outs = [te.compute(a.shape, lambda i, j, f=f: f(a[i, j], b[j]), name=f.__name__)
            for f in fns]  # fmt: skip
    outs.append(te.compute(a.shape, lambda i, j: te.bitwise_not(a[i, j]), name="bnot"))
    if dtype == "bool":
        av, bv = RNG.random(a.shape) > 0.5, RNG.random(9) > 0.5
    else:
        info = np.iinfo(dtype)
        av = RNG.integers(info.min, info.max, a.shape, dtype=dtype, endpoint=True)
        bv = RNG.integers(info.min, info.max, 9, dtype=dtype, endpoint=True)
    fn = _run([a, b], outs, [av, bv])
    for g, w in zip(fn(av, bv), (av & bv, av | bv, av ^ bv, ~av), strict=True):
        np.testing.assert_array_equal(g, w)
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    x = te.placeholder((4,), "float32", name="x")
    with pytest.raises(ExpressionError, match=r"compute 'h': te.bitwise_or takes integer"):
        te.compute((4,), lambda i: te.bitwise_or(x[i], 1), name="h")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int32"])
def test_atan2_of_every_quadrant_and_signed_zeros(dtype):
    """``te.atan2(y, x)``: C's angle, signed zeros and infinities included; integers give
    float32; NVRTC compiles it for sm_80 and sm_90."""
    y = te.placeholder((12,), dtype, name="y")
    x = te.placeholder((12,), dtype, name="x")
    out = te.compute((12,), lambda k: te.atan2(y[k], x[k]), name="angle")
    if dtype == "int32":
        yv = np.array([0, 0, 1, -1, 3, 7, 2, -5, 1, 0, -2, 4], np.int32)
        xv = np.array([-1, 1, 0, 0, 2, 1, -2, 3, 1, 0, -3, -4], np.int32)
    else:
        yv = np.array([0, -0.0, 1, -1, 3, np.inf, 2, -5, np.nan, 0, -2, -np.inf]).astype(dtype)
        xv = np.array([-0.0, -1, 0, -0.0, 2, np.inf, -2, 3, 1, 0.0, -3, -4]).astype(dtype)
    fn = _run([y, x], [out], [yv, xv])
    got = fn(yv, xv).astype(np.float64)
    want = np.arctan2(yv.astype(np.float64), xv.astype(np.float64))
    np.testing.assert_array_equal(np.signbit(got), np.signbit(want))
    assert out.dtype == ("float32" if dtype == "int32" else dtype)
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image


@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32", "int64", "bool"])
def test_products_over_rows_columns_and_everything(dtype):
    """``te.prod``: a row product (one warp per row), a column product (a tree across thread
    rows) and a product of everything (split into partials), in both thread orders against
    the float64 oracle; integers wrap (exact), bools are their and; NVRTC compiles it."""
    shape = (70, 130)
    x = te.placeholder(shape, dtype, name="x")
    k1, k0 = te.reduce_axis(shape[1], name="k1"), te.reduce_axis(shape[0], name="k0")
    a, b = te.reduce_axis(shape[0], name="a"), te.reduce_axis(shape[1], name="b")
    outs = [te.compute((shape[0],), lambda i: te.prod(x[i, k1], axis=k1), name="row"),
            te.compute((shape[1],), lambda j: te.prod(x[k0, j], axis=k0), name="col"),
            te.compute((1,), lambda z: te.prod(x[a, b], axis=[a, b]), name="all")]  # fmt: skip
    if dtype == "bool":
        xv = RNG.random(shape) > 0.0005
    elif dtype.startswith("int"):
        xv = RNG.choice(np.array([-3, -1, 1, 1, 1, 2, 5]), shape).astype(dtype)
    else:
        xv = (1 + RNG.standard_normal(shape) * 0.01).astype(numpy_dtype(dtype))
    fn = _run([x], outs, [xv])
    assert [o.dtype for o in outs] == [dtype] * 3
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image


@pytest.mark.parametrize("op", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "bool"])
def test_an_integer_reduction_long_enough_to_split_stays_integer(dtype, op):
    """A reduction over 257 x 513 values splits into partials; their out-of-range lanes
    read the reduction's identity, which was a weak float constant: an integer sum's
    partials became float ones, and the kernel did not compile (``pf_allreduce_y`` of an int
    with a float scratch). The identity now has the body's dtype; the result is exact."""
    x = te.placeholder((257, 513), dtype, name="x")
    a, b = te.reduce_axis(257, name="a"), te.reduce_axis(513, name="b")
    out = te.compute((1,), lambda z: getattr(te, op)(x[a, b], axis=[a, b]), name="total")
    if dtype == "bool":
        xv = RNG.random(x.shape) > (0.001 if op in ("prod", "min") else 0.999)
    elif op == "prod":
        xv = np.where(RNG.random(x.shape) < 0.01, RNG.integers(-3, 4, x.shape), 1).astype(dtype)
    else:
        hi = 2**40 if dtype == "int64" else 2**12  # (an int32 total stays in range)
        xv = RNG.integers(-hi, hi, x.shape).astype(dtype)
    fn = _run([x], [out], [xv])
    want = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}[op](xv)
    assert fn(xv)[0] == (want if dtype != "bool" or op == "sum" else bool(want))
    assert "_partial" in fn.cuda_source


TRIG = ("sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh", "atanh")


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16", "int32"])
def test_trigonometric_hyperbolic_and_base_2_and_10_functions(dtype):
    """``te.sin`` ... ``te.atanh``, ``te.exp2``, ``te.log2``, ``te.log10`` (ONNX Sin ... Atanh
    and torch's ``aten.sin`` ... were unsupported: RoPE computes ``cos``/``sin`` of its
    angles in the graph). Each agrees with numpy's float64 value within the dtype's tolerance,
    NaN outside the domain and at NaN, in both thread orders; an integer operand computes in
    float32; NVRTC compiles them for sm_80 and sm_90."""
    names = (*TRIG, "exp2", "log2", "log10")
    x = te.placeholder((5, 40), dtype, name="x")
    outs = [te.compute(x.shape, lambda i, j, f=f: getattr(te, f)(x[i, j]), name=f"y_{f}")
            for f in names]  # fmt: skip
    if dtype == "int32":
        xv = RNG.integers(-4, 5, x.shape).astype(np.int32)
    else:
        v = RNG.standard_normal(x.shape) * 3
        v[0, :9] = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 0.999, 40.0]
        xv = v.astype(numpy_dtype(dtype))
    fn = _run([x], outs, [xv], precision="storage")  # sinh(12) is inf in float16
    assert [o.dtype for o in outs] == [dtype if dtype != "int32" else "float32"] * len(names)
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_floor_and_ceil_keep_the_dtype_huge_values_inf_and_nan(dtype):
    """``te.floor``/``te.ceil`` compute in the tensor's dtype. ONNX's Floor and Ceil used to
    go through an int32 and back to float32 (a float64 result lost its precision downstream,
    values beyond 2^31 overflowed, inf and NaN came back as garbage); NVRTC compiles them."""
    n = 10
    x = te.placeholder((n,), dtype, name="x")
    fl = te.compute((n,), lambda i: te.floor(x[i]), name="fl")
    ce = te.compute((n,), lambda i: te.ceil(x[i]) + te.floor(x[i] * 0.5), name="ce")
    big = 3e4 if dtype == "float16" else 3e9
    xv = np.array([-2.5, -0.5, 0.5, 1.0, 2.75, -big, big, np.inf, -np.inf, np.nan])
    fn = _run([x], [fl, ce], [xv.astype(numpy_dtype(dtype))])
    got_fl, got_ce = fn(xv.astype(numpy_dtype(dtype)))
    assert got_fl.dtype == numpy_dtype(dtype)
    x64 = np.asarray(xv.astype(numpy_dtype(dtype)), np.float64)
    np.testing.assert_array_equal(np.asarray(got_fl, np.float64), np.floor(x64))
    want_ce = np.asarray((np.ceil(x64) + np.floor(x64 * 0.5)).astype(numpy_dtype(dtype)))
    np.testing.assert_array_equal(np.asarray(got_ce, np.float64), np.asarray(want_ce, np.float64))
    i = te.placeholder((n,), "int32", name="i")
    assert te.floor(i[0]) is not None and te.floor(i[0]).dtype == "int32"  # its own floor
    if "nvrtc" in available_compilers():
        fn = polyfuse.compile([x], [fl, ce], arch="sm_80", check_cuda=False)
        compile_cuda(fn.cuda_source, "sm_80", compiler="nvrtc")
