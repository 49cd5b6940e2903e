"""The tensor-core epilogue stores two adjacent columns per access where that is proven
(:mod:`polyfuse.cuda.codegen.lower_mma_epilogue`), and a vector group's lanes that only its
whole-word store reads are not rounded twice (:class:`polyfuse.cuda.codegen.lower_accesses.
Accesses`).

Before, every accumulator element of a 16-bit result took its own 2-byte store under its own
guard (a bf16 FFN up + GELU: 128 ``STG.E.U16`` per thread, sm_90), and every lane of a 16-bit
vector group was rounded to the dtype, widened back, and rounded again by the word store.
Numbers against float64 in every race-check mode, at sizes that are not multiples of 16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig

MODES = (False, True, "shadow")
_erf = np.vectorize(math.erf)


def _ffn(dtype: str, m: int, k: int, n: int, batch: int = 0, out: str | None = None):
    """``gelu(a @ w + b)`` (cast to ``out`` when given) and ``a @ w``: inputs, outputs,
    arrays, the float64 wants."""
    lead = (batch,) if batch else ()
    a = te.placeholder((*lead, m, k), dtype, name="a")
    w = te.placeholder((*lead, k, n), dtype, name="w")
    b = te.placeholder((n,), dtype, name="b")
    h = ops.matmul(a, w, name="h")
    g = ops.gelu(ops.add(h, b, name="hb"), name="g")
    if out is not None:
        g0 = g
        g = te.compute(g0.shape, lambda *i: te.cast(g0[i], out), name="g_out", dtype=out)
    rng = np.random.default_rng(m * n + k)
    arrays = [rng.standard_normal(t.shape).astype(numpy_dtype(dtype)) for t in (a, w, b)]
    x = [v.astype(np.float64) for v in arrays]
    z = x[0] @ x[1] + x[2]
    return [a, w, b], [g, h], arrays, [0.5 * z * (1 + _erf(z / math.sqrt(2))), x[0] @ x[1]]


def _epilogue_note(fn) -> str:
    (note,) = [n for k in fn.kernels for n in k.notes if n.startswith("epilogue:")]
    return note


def _check(fn, arrays, wants, dtypes):
    """Every output within the tolerance of ``dtypes`` (the precision each was computed in)."""
    for race in MODES:
        got = fn(*arrays, device="emulate", race_check=race)
        got = got if isinstance(got, list | tuple) else [got]
        for g, w, dt in zip(got, wants, dtypes, strict=True):
            assert tolerance(dt).allclose(g, w.astype(g.dtype)), (race, dt)


@pytest.mark.parametrize(
    ("dtype", "m", "k", "n", "batch"),
    [("bfloat16", 33, 40, 66, 0), ("float16", 70, 24, 34, 2), ("bfloat16", 96, 64, 128, 0)],
)
def test_pairs_of_columns_are_stored_as_one_word(dtype, m, k, n, batch):
    """Even column counts: both results (``h``, ``g``) stored as one 32-bit pair per two
    columns, under one guard, the bias read as one pair; no 2-byte element store of them is
    left; the lanes that only feed the pair store are not rounded before it; numbers as
    float64."""
    ins, outs, arrays, wants = _ffn(dtype, m, k, n, batch)
    fn = polyfuse.compile(ins, outs, "sm_80")  # NVRTC checks it where installed
    (kern,) = fn.kernels
    assert "pf_mma_" in fn.cuda_source
    assert _epilogue_note(fn) == (
        "epilogue: h, g stored a pair of adjacent columns per access; b read likewise"
    )
    pair = "__nv_bfloat162" if dtype == "bfloat16" else "__half2"
    rn = "__float2bfloat16_rn" if dtype == "bfloat16" else "__float2half_rn"
    src = fn.cuda_source
    for t in ("h", "g"):
        assert f"*reinterpret_cast<{pair}*>(&{t}[" in src
        assert f"  {t}[" not in src  # no element store
    assert "const unsigned q_b0 = *reinterpret_cast<const unsigned*>(&b[pf_c0]);" in src
    assert "b[pf_col]" not in src  # the bias read once per pair
    assert "v_g[pf_v] = (" in src and "v_g[pf_v] = __" not in src, "lanes rounded twice"
    assert rn in src  # the register copy of h that hb reads is still rounded
    _check(fn, arrays, wants, [dtype, dtype])


def test_a_residual_pairs_and_a_row_scale_stays_scalar():
    """``(a @ w) * s[row] + r[row, col]``: the residual is read as one pair per two columns,
    the row scale (the same element for both) stays a scalar read; numbers as float64."""
    m, k, n = 36, 48, 40
    a = te.placeholder((m, k), "float16", name="a")
    w = te.placeholder((k, n), "float16", name="w")
    sc = te.placeholder((m,), "float16", name="s")
    r = te.placeholder((m, n), "float16", name="r")
    h = ops.matmul(a, w, name="h")
    y = te.compute((m, n), lambda i, j: h[i, j] * sc[i] + r[i, j], name="y")
    fn = polyfuse.compile([a, w, sc, r], [y], check_cuda=False)
    assert _epilogue_note(fn) == (
        "epilogue: y stored a pair of adjacent columns per access; r read likewise"
    )
    src = fn.cuda_source
    assert "*reinterpret_cast<const unsigned*>(&r[" in src and "s[pf_row]" in src
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(t.shape).astype(np.float16) for t in (a, w, sc, r)]
    x = [v.astype(np.float64) for v in arrays]
    want = (x[0] @ x[1]) * x[2][:, None] + x[3]
    _check(fn, arrays, [want], ["float16"])


@pytest.mark.parametrize(("hw", "paired"), [((9, 8), True), ((11, 9), False)])
def test_a_conv_whose_rows_fold_into_the_columns_pairs_when_they_are_even(hw, paired):
    """NCHW 3x3 conv + bias + ReLU (float16, scalar fills): the output rows fold into the
    GEMM's columns (``col / W``, ``col % W``). Rows of 8 keep a pair inside one row: one
    word per pair; rows of 9 would straddle: element stores, with the reason. Numbers as
    float64 in every mode."""
    from test_tensorize_conv import NCHW, _np_conv

    (h, w), (n, c, o) = hw, (2, 13, 21)
    x = te.placeholder((n, c, h, w), "float16", name="x")
    wt = te.placeholder((o, c, 3, 3), "float16", name="wt")
    b = te.placeholder((o,), "float16", name="b")
    y = ops.relu(ops.conv2d(x, wt, b, stride=1, padding=1), name="y")
    fn = polyfuse.compile([x, wt, b], [y], check_cuda=False, passes=NCHW)
    note = _epilogue_note(fn)
    if paired:
        assert note == "epilogue: y stored a pair of adjacent columns per access", note
        assert "*reinterpret_cast<__half2*>(&y[" in fn.cuda_source
    else:
        assert note == (
            "epilogue: element stores (folded rows of 9 columns: a pair may straddle two)"
        )
    rng = np.random.default_rng(11)
    arrays = [rng.standard_normal(t.shape).astype(np.float16) for t in (x, wt, b)]
    want = _np_conv(arrays[0], arrays[1], 1, 1) + arrays[2].astype(np.float64)[None, :, None, None]
    _check(fn, arrays, [np.maximum(want, 0)], ["float16"])


@pytest.mark.usefixtures("main_tilings")
def test_the_guard_tests_only_the_extents_the_tiles_do_not_cover():
    """The epilogue's guard tests a result extent only where the block tiles overhang it: 256
    x 256 in whole tiles runs untested; 96 rows in 64-row tiles test the row alone; numbers
    as float64 in every mode."""
    for m, guard in ((256, None), (96, "if ((pf_row <= 95)) {")):
        ins, outs, arrays, wants = _ffn("bfloat16", m, 64, 256)
        fn = polyfuse.compile(ins, outs, check_cuda=False)
        (kern,) = fn.kernels
        tail = kern.source[kern.source.index("for (int pf_h = 0") :]
        if guard is None:
            assert "if (" not in tail, tail[:600]
        else:
            assert guard in tail and "pf_c0 <=" not in tail, tail[:600]
        _check(fn, arrays, wants, ["bfloat16", "bfloat16"])


def test_an_odd_column_count_keeps_element_stores():
    """65 columns: the last pair would be half outside the result (and odd rows misalign
    the words): element stores, and the note says why; numbers as float64."""
    ins, outs, arrays, wants = _ffn("bfloat16", 33, 17, 65)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert _epilogue_note(fn) == "epilogue: element stores (columns 0..64: an odd bound)"
    assert "__nv_bfloat162*>(&g[" not in fn.cuda_source
    _check(fn, arrays, wants, ["bfloat16", "bfloat16"])


def test_a_float32_result_pairs_as_float2():
    """A bf16 GEMM whose epilogue casts to float32: the float32 result stored as one float2
    per two columns (8-byte aligned: an even element of rows of even length)."""
    ins, outs, arrays, wants = _ffn("bfloat16", 40, 32, 48, out="float32")
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert _epilogue_note(fn) == (
        "epilogue: h, g_out stored a pair of adjacent columns per access; b read likewise"
    )
    assert "*reinterpret_cast<float2*>(&g_out[" in fn.cuda_source
    _check(fn, arrays, wants, ["bfloat16", "bfloat16"])  # g was bf16 before the cast


def test_tf32_result_pairs_as_float2():
    """A float32 GEMM on tf32 tensor cores (allowed): its float32 result as float2 pairs."""
    a = te.placeholder((48, 40), "float32", name="a")
    w = te.placeholder((40, 80), "float32", name="w")
    h = ops.matmul(a, w, name="h")
    fn = polyfuse.compile(
        [a, w], [h], check_cuda=False, mapping=MappingConfig(allow_tf32=True)
    )
    assert "pf_mma_m16n8k8" in fn.cuda_source
    assert "*reinterpret_cast<float2*>(&h[" in fn.cuda_source
    rng = np.random.default_rng(3)
    x = [rng.standard_normal(t.shape).astype(np.float32) for t in (a, w)]
    want = x[0].astype(np.float64) @ x[1].astype(np.float64)
    for race in MODES:
        got = fn(*x, device="emulate", race_check=race)
        assert np.abs(got - want).max() <= 2e-2 * np.abs(want).max(), race


def test_a_memory_bound_group_rounds_its_stored_lanes_once():
    """A bf16 elementwise chain vectorized 4 lanes a word: each stored lane holds the float
    value and the word store rounds it (``__floats2bfloat162_rn``) — it was rounded, widened
    and rounded again, the same bits; the product ``xy`` other statements read stays rounded
    in its register. The emulator's result equals numpy's float32 computation rounded where
    the graph rounds."""
    shape = (1024, 1024)
    x = te.placeholder(shape, "bfloat16", name="x")
    y = te.placeholder(shape, "bfloat16", name="y")
    out = ops.exp(ops.mul(x, y, name="xy"), name="e")
    fn = polyfuse.compile([x, y], [out], check_cuda=False)
    src = fn.cuda_source
    assert "__floats2bfloat162_rn(v_e[0], v_e[1])" in src
    assert "v_e[c0] = expf(r_xy);" in src
    assert "r_xy = __bfloat162float(__float2bfloat16_rn(" in src
    rng = np.random.default_rng(5)
    bf16 = numpy_dtype("bfloat16")
    arrays = [rng.standard_normal(shape).astype(bf16) for _ in "xy"]
    xy = (arrays[0].astype(np.float32) * arrays[1].astype(np.float32)).astype(bf16)
    want = np.exp(xy.astype(np.float32)).astype(bf16).astype(np.float32)
    for race in (False, "shadow"):
        got = fn(*arrays, device="emulate", race_check=race).astype(np.float32)
        # expf and numpy's exp may differ by an ulp of float32, then round alike or not
        assert np.mean(got == want) > 0.999, race
        assert tolerance("bfloat16").allclose(got, want), race


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_sass_stores_one_word_per_pair(arch):
    """NVRTC + nvdisasm: a thread of the bf16 GEMM + GELU stores its 64 accumulators of each
    result in 32 STG.E (32-bit) instructions — none 16-bit — and spills nothing."""
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, analyse

    ins, outs, _, _ = _ffn("bfloat16", 256, 64, 256)
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
    try:
        (ks,) = analyse(fn.cuda_source, (arch,), kernels=fn.kernels).kernels
    except DisassemblerNotFound:
        pytest.skip("NVIDIA's disassembler is not installed")
    (kern,) = fn.kernels
    per_thread = 256 * 256 // (kern.grid[0] * kern.block[0])  # accumulators per thread
    stg = ks.per_thread.widths.get("STG", {})
    assert stg == {32: 2 * per_thread // 2}, stg  # two results, a word per pair
    assert ks.resources.spill_stores == ks.resources.spill_loads == 0
