"""Before/after tests of cuda/codegen/lower_half2.py: native 16-bit pair arithmetic
(``__hadd2_rn``/``__hsub2_rn``/``__hmul2_rn``/``__hneg2`` on ``__half2``/``__nv_bfloat162``) in
the vector groups of elementwise kernels, only where it gives the float32 path's bits.

The emulator computes the native ``_rn`` pair operations apart from the float path (in
double, rounded once), so the bit-identity checks below test the double-rounding argument
of the module doc, in every race-check order, against the kernel with the pass off and
against numpy's float32 path (ml_dtypes for bfloat16).
"""

from __future__ import annotations

import re
from dataclasses import replace

import ml_dtypes
import numpy as np
import pytest

import polyfuse
import polyfuse.cuda.codegen.lower as lower_mod
from polyfuse import te
from polyfuse.cuda.codegen.kernel_access import (
    KPairConst,
    KPairLane,
    KPairOp,
    KPairSplat,
    KPairStore,
)
from polyfuse.cuda.codegen.kernel_ast import KernelIR, KVector
from polyfuse.cuda.codegen.lower_half2 import lower_half2
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype

HALVES = ["float16", "bfloat16"]
SHAPE = (256, 1024)  # large enough for 4 lanes per thread (a 64-bit word of 16-bit floats)
RNG = np.random.default_rng(2202)

#: name -> (te body over x, y, z and the dtype; numpy float32 path over float32 arrays)
CASES = {
    "add": (lambda x, y, z, d: x + y, lambda x, y, z, r: r(x + y)),
    "sub": (lambda x, y, z, d: x - y, lambda x, y, z, r: r(x - y)),
    "mul": (lambda x, y, z, d: x * y, lambda x, y, z, r: r(x * y)),
    "neg_mul": (lambda x, y, z, d: -(x * y), lambda x, y, z, r: r(-(x * y))),
    "cast_chain": (
        lambda x, y, z, d: te.cast(x + y, d) * z,
        lambda x, y, z, r: r(r(x + y) * z),
    ),
    "const": (
        lambda x, y, z, d: te.cast(x * 0.5, d) - y,
        lambda x, y, z, r: r(r(x * np.float32(0.5)) - y),
    ),
}


def _graph(dtype: str, body, shape=SHAPE):
    x, y, z = (te.placeholder(shape, dtype, name=n) for n in "xyz")
    o = te.compute(shape, lambda i, j: body(x[i, j], y[i, j], z[i, j], dtype), name="o")
    return [x, y, z], o


def _compile(dtype: str, body, native: bool, monkeypatch, arch: str = "sm_80", shape=SHAPE):
    """The graph compiled with the pass on, or off (the float32 path)."""
    with monkeypatch.context() as m:
        if not native:
            m.setattr(lower_mod, "lower_half2", lambda ir: (ir, []))
        inputs, o = _graph(dtype, body, shape)
        return polyfuse.compile(inputs, [o], arch=arch, check_cuda=False)


def _vectors(nodes) -> list[KVector]:
    out = []
    for n in nodes:
        if isinstance(n, KVector):
            out.append(n)
        for child in ("body", "then", "orelse"):
            out += _vectors(getattr(n, child, ()))
    return out


def _ir(fn) -> KernelIR:
    (k,) = fn.kernels
    return KernelIR(k.name, (), (), tuple(k.body), ())


def _inputs(dtype: str) -> list[np.ndarray]:
    """Random values at several scales with the special ones mixed in: zeros of both signs,
    infinities, NaN, the largest finite value, subnormals and values whose sums overflow."""
    t = numpy_dtype(dtype)
    info = ml_dtypes.finfo(t)
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, float(info.max), -float(info.max),
         float(info.smallest_subnormal), -float(info.smallest_subnormal),
         float(info.smallest_normal), 1.0, -1.0, 0.5],
        np.float32,
    )  # fmt: skip
    out = []
    for _ in range(3):
        v = RNG.standard_normal(SHAPE).astype(np.float32)
        v *= np.exp2(RNG.integers(-30 if dtype == "float16" else -140, 16, SHAPE)).astype(
            np.float32
        )
        flat = v.reshape(-1)
        where = RNG.choice(flat.size, 4096, replace=False)
        flat[where] = RNG.choice(special, where.size)
        with np.errstate(over="ignore"):
            out.append(v.astype(t))
    return out


def _native(source: str) -> bool:
    """Whether ``source`` computes with native pair intrinsics."""
    return re.search(r"__h(add|sub|mul)2_rn\(|__hneg2\(", source) is not None


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal bit patterns, every NaN alike (the pass keeps NaNs NaN; payloads are not
    compared)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    nan = np.isnan(a32)
    return bool(np.array_equal(nan, np.isnan(b32))) and bool(
        np.array_equal(a[~nan].view(np.uint16), b[~nan].view(np.uint16))
    )


@pytest.mark.parametrize("dtype", HALVES)
def test_a_single_op_between_16_bit_loads_becomes_native_pairs(dtype, monkeypatch):
    """Before: the group widens x, y, z and rounds o; after: o's pairs are
    mul2(add2(x, y), z) from the loaded words (the cast rounds the sum in the float32 path)."""
    before = _compile(dtype, CASES["cast_chain"][0], native=False, monkeypatch=monkeypatch)
    (vec,) = _vectors(_ir(before).body)
    assert vec.native == () and vec.width == 4
    after, decisions = lower_half2(_ir(before))
    (got,) = _vectors(after.body)
    (store,) = vec.lane_stores  # the loads in the order the statement reads x, y, z
    x, y, z = (KPairLane(a.lanes.name, dtype) for a in vec.lane_loads)
    want = KPairOp("mul", (KPairOp("add", (x, y), dtype), z), dtype)
    assert got.native == (KPairStore(store.lanes.name, want),)
    (d,) = decisions
    assert d.made and d.reason.startswith(f"native 16-bit pairs: {dtype} add, mul on 2 pairs")
    # the pass is the printed difference: no widening, no rounding conversion
    fn = _compile(dtype, CASES["cast_chain"][0], native=True, monkeypatch=monkeypatch)
    src = fn.kernels[0].source
    assert "__hmul2_rn(__hadd2_rn(" in src and "2float" not in src and "floats2" not in src
    assert "float v_x[4]" in before.kernels[0].source


def test_an_exact_constant_is_a_pair_constant(monkeypatch):
    """``te.cast(x * 0.5, "bfloat16") - y``: 0.5 is a bfloat16 value, in both halves."""
    fn = _compile("bfloat16", CASES["const"][0], native=True, monkeypatch=monkeypatch)
    (vec,) = _vectors(fn.kernels[0].body)
    ((store,),) = [vec.native]
    x, y = (KPairLane(a.lanes.name, "bfloat16") for a in vec.lane_loads)
    mul = KPairOp("mul", (x, KPairConst(0.5, "bfloat16")), "bfloat16")
    assert store.value == KPairOp("sub", (mul, y), "bfloat16")
    assert "__float2bfloat162_rn(0.5f)" in fn.cuda_source


@pytest.mark.parametrize("dtype", HALVES)
def test_an_operand_that_is_a_float32_intermediate_is_refused(dtype, monkeypatch):
    """(x + y) * z: the float32 path does not round the sum before the product, so a native
    sum would change the bits; the group stays in float32 and the plan says why."""
    fn = _compile(dtype, lambda x, y, z, d: (x + y) * z, native=True, monkeypatch=monkeypatch)
    (k,) = fn.kernels
    (vec,) = _vectors(k.body)
    assert vec.native == ()
    (note,) = [n for n in k.notes if n.startswith("native 16-bit pairs")]
    assert note.startswith("native 16-bit pairs: no, statement S_o: operand add(")
    assert note.endswith(f"is a float32 intermediate (not rounded to {dtype} before its use)")
    assert "__hadd2" not in k.source and "__floats2" in k.source
    assert f"note: {note}" in str(fn.plan)


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (lambda x, y, z, d: x * 0.1, "constant 0.1 is not a float16 value"),
        (lambda x, y, z, d: te.maximum(x, y), "has no exact native float16 pair form"),
        (lambda x, y, z, d: x / y, "has no exact native float16 pair form"),
        (lambda x, y, z, d: x, "no arithmetic to pair (copies only)"),
    ],
)
def test_what_stays_in_float32_says_why(body, why, monkeypatch):
    """A constant that is not a float16 value, max (NaN rules differ), division, a copy."""
    fn = _compile("float16", body, native=True, monkeypatch=monkeypatch)
    (k,) = fn.kernels
    (note,) = [n for n in k.notes if n.startswith("native 16-bit pairs")]
    assert why in note and "native 16-bit pairs: no" in note
    assert not _native(k.source)


def test_a_float32_result_of_16_bit_inputs_is_not_paired(monkeypatch):
    """float16 + bfloat16 is float32 (stored as float): no 16-bit lanes are stored."""
    x = te.placeholder(SHAPE, "float16", name="x")
    y = te.placeholder(SHAPE, "bfloat16", name="y")
    o = te.compute(SHAPE, lambda i, j: x[i, j] + y[i, j], name="o")
    fn = polyfuse.compile([x, y], [o], check_cuda=False)
    assert not _native(fn.cuda_source)
    notes = [n for n in fn.kernels[0].notes if n.startswith("native 16-bit pairs")]
    assert notes in ([], ["native 16-bit pairs: no, statement S_o: it stores 32-bit lanes"])


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_native_pairs_give_the_float32_paths_bits(dtype, case, monkeypatch):
    """In every race-check order: the native kernel, the same kernel with the pass off and
    numpy's float32 path (each op of 16-bit values in float32, rounded where the float32
    path rounds) agree bit for bit, NaN where NaN, over special values and subnormals."""
    body, ref = CASES[case]
    native = _compile(dtype, body, native=True, monkeypatch=monkeypatch)
    assert _native(native.cuda_source)
    plain = _compile(dtype, body, native=False, monkeypatch=monkeypatch)
    assert not _native(plain.cuda_source)
    t = numpy_dtype(dtype)
    xs = _inputs(dtype)
    with np.errstate(all="ignore"):
        want = ref(*(a.astype(np.float32) for a in xs), lambda v: v.astype(t).astype(np.float32))
    want = want.astype(t)
    base = plain(*xs, device="emulate")
    assert _same_bits(base, want)
    for race in (False, True, "shadow"):
        got = native(*xs, device="emulate", race_check=race)
        assert got.dtype == t and _same_bits(got, base), race


def test_bfloat16_products_round_once_through_float32_even_when_subnormal():
    """The one case the double-rounding theorem leaves open: float32 shares bfloat16's
    exponent range, so a product can be subnormal in float32 too. Every product of two
    bfloat16 significands (subnormal ones included), at every scale from below the smallest
    subnormal to the normal range, rounded to float32 and then to bfloat16, equals the exact
    product rounded once to bfloat16."""
    m = np.arange(256, dtype=np.int64)
    p = np.unique((m[:, None] * m[None, :]).ravel()).astype(np.float64)  # exact, < 2**16
    for s in range(-300, -100):
        x = np.ldexp(p, s)
        twice = x.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)
        e = np.floor(np.log2(np.where(x > 0, x, 1.0)))
        q = np.exp2(np.maximum(e - 7, -133))  # bfloat16's spacing: 8 bits, subnormal 2**-133
        once = np.round(x / q) * q  # ties to even
        assert np.array_equal(twice, once), s


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_native_pairs_without_spills(arch, monkeypatch):
    for dtype in HALVES:
        for case in ("cast_chain", "neg_mul", "const"):
            body = CASES[case][0]  # (an H100 coarsens from more elements than an A100)
            fn = _compile(dtype, body, True, monkeypatch, arch=arch, shape=(1024, 2048))
            assert _native(fn.cuda_source)
            binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
            assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


@pytest.mark.parametrize("dtype", HALVES)
def test_eight_lanes_per_128_bit_word_make_four_pairs(dtype):
    """On sm_90 a two-input kernel takes 8 lanes per thread (one uint4 word): four pairs,
    components x..w, the same bits as numpy's float32 path."""
    shape = (2048, 4096)
    x, y = (te.placeholder(shape, dtype, name=n) for n in "xy")
    o = te.compute(shape, lambda i, j: te.cast(x[i, j] - y[i, j], dtype) * x[i, j], name="o")
    fn = polyfuse.compile([x, y], [o], arch="sm_90", check_cuda=False)
    (k,) = fn.kernels
    assert "8 elements per thread" in k.notes[0]
    assert k.notes[1].startswith(f"native 16-bit pairs: {dtype} mul, sub on 4 pairs")
    assert "&q_x0.w)" in k.source and "make_uint4(" in k.source
    t = numpy_dtype(dtype)
    a, b = (RNG.standard_normal(shape).astype(t) for _ in range(2))
    f32 = lambda v: v.astype(np.float32)  # noqa: E731
    want = (f32((f32(a) - f32(b)).astype(t)) * f32(a)).astype(t)
    assert _same_bits(fn(a, b, device="emulate"), want)


@pytest.mark.parametrize("dtype", HALVES)
def test_an_element_every_lane_reads_is_a_pair_of_itself(dtype):
    """x[i, j] * b[i]: b's element is the same for the group's lanes (a row broadcast), read
    once into both halves (``__half2half2``/``__bfloat162bfloat162``); same bits as numpy's
    float32 path in every race-check order, and NVRTC compiles it for sm_80 and sm_90."""
    x = te.placeholder(SHAPE, dtype, name="x")
    b = te.placeholder(SHAPE[:1], dtype, name="b")
    o = te.compute(SHAPE, lambda i, j: x[i, j] * b[i], name="o")
    fn = polyfuse.compile([x, b], [o], check_cuda=False)
    splat = "__half2half2(b[" if dtype == "float16" else "__bfloat162bfloat162(b["
    assert splat in fn.cuda_source and "2float" not in fn.kernels[0].source
    (vec,) = _vectors(fn.kernels[0].body)
    ((store,),) = [vec.native]
    assert isinstance(store.value.args[1], KPairSplat)
    t = numpy_dtype(dtype)
    xs, bs = _inputs(dtype)[0], _inputs(dtype)[1][:, 0].copy()
    with np.errstate(all="ignore"):
        want = (xs.astype(np.float32) * bs.astype(np.float32)[:, None]).astype(t)
    for race in (False, True, "shadow"):
        assert _same_bits(fn(xs, bs, device="emulate", race_check=race), want), race
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
            assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


def test_a_scalar_access_per_lane_is_refused():
    """x[i, j] * c[j + 1]: c's runs start off a word, so each lane reads its own scalar c
    element: no pair to build from one load; the group stays in float32."""
    x = te.placeholder(SHAPE, "float16", name="x")
    c = te.placeholder((SHAPE[1] + 1,), "float16", name="c")
    o = te.compute(SHAPE, lambda i, j: x[i, j] * c[j + 1], name="o")
    fn = polyfuse.compile([x, c], [o], check_cuda=False)
    (k,) = fn.kernels
    assert "scalar: c" in k.notes[0]
    (note,) = [n for n in k.notes if n.startswith("native 16-bit pairs")]
    assert note.endswith("is a scalar access per lane") and not _native(k.source)


def test_a_group_goes_native_statement_by_statement(monkeypatch):
    """Before: a group with S_o = (x + y) * z (a float32 intermediate) and a second statement
    S_p = x * z storing p; after: p's pairs are native, S_o keeps the widened lanes and the
    loop (only S_o in it), and the decision says which and why. A statement that reads a
    native array's float lanes pins it to float32."""
    from polyfuse.cuda.codegen.kernel_access import (
        BufferScope,
        KBinary,
        KBuffer,
        KLane,
        KLoad,
        KStore,
    )
    from polyfuse.cuda.codegen.print_vectors import vector_lines
    from polyfuse.cuda.codegen.printer import _Emitter

    fn = _compile("float16", lambda x, y, z, d: (x + y) * z, False, monkeypatch)
    (vec,) = _vectors(_ir(fn).body)
    (s_o,) = vec.body
    (st,) = s_o.stores
    v_x, _, v_z = (KLoad(a.lanes, st.index, "float16") for a in vec.lane_loads)
    v_p = KBuffer("v_p", "float32", BufferScope.LOCAL, (4,))
    p_store = KStore(v_p, st.index, KBinary("mul", v_x, v_z, "float16", ("float16", "float16")))
    target = KLoad(KBuffer("p", "float16", BufferScope.GLOBAL, (1 << 18,)), (), "float16")
    s_p = type(s_o)("S_p", s_o.args, stores=(p_store,))
    group = type(vec)(
        vec.var, vec.width, (s_o, s_p), vec.loads, vec.stores, (),
        vec.lane_loads, (*vec.lane_stores, KLane(target, v_p)),
    )  # fmt: skip
    ir = _ir(fn).with_(body=(group,))
    after, (d,) = lower_half2(ir)
    (got,) = _vectors(after.body)
    x, _, z = (KPairLane(a.lanes.name, "float16") for a in vec.lane_loads)
    assert got.native == (KPairStore("v_p", KPairOp("mul", (x, z), "float16")),)
    assert d.made and d.reason.startswith("native 16-bit pairs: 1 of 2 stored arrays, float16 mul")
    assert "; float32: statement S_o: operand add(" in d.reason
    text = "\n".join(vector_lines(got, 1, _Emitter({})))
    assert text.count("for (int c0") == 1 and "v_p[c0]" not in text and "float v_p[4]" not in text
    assert "__hmul2_rn(" in text and text.count("__floats2half2_rn(") == 2  # o's two pairs
    # S_o reading p's float lanes keeps p in float32
    s_o2 = type(s_o)("S_o", s_o.args, stores=(replace(st, value=KLoad(v_p, st.index)),))
    pinned = replace(group, body=(s_o2, s_p))
    _, (d2,) = lower_half2(ir.with_(body=(pinned,)))
    assert not d2.made and "statement S_p: statement S_o reads its lanes in float32" in d2.reason
