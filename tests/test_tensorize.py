"""Tensorization of 16-bit GEMM micrographs (issue 23 item 1, first step): the update matched
by isl against ``mma.sync.m16n8k16``, fragments loaded with ``ldmatrix`` from 16-bit shared
tiles, float32 accumulators, the epilogue per accumulator element.

Every graph runs on the emulator in both thread orders (race check) against float64 numpy
under the project's per-dtype tolerance (:func:`polyfuse.graph.dtypes.tolerance`).
"""

from __future__ import annotations

import numpy as np
import pytest
from hmma_loops import hmma_loop

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly import tensorize_tiling

HALVES = ["float16", "bfloat16"]
RNG = np.random.default_rng(23)
ODD = (67, 45, 53)  # M, N, K: no multiple of 16 anywhere
WHOLE = (128, 64, 64)  # whole block tiles and k-tiles


def _array(shape, dtype: str) -> np.ndarray:
    return RNG.standard_normal(shape).astype(numpy_dtype(dtype))


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf

    return 0.5 * x * (1.0 + np.vectorize(erf)(x / np.sqrt(2.0)))


def _matmul(dtype: str, m: int, n: int, k: int, batch: int = 0, trans_b: bool = False,
            trans_a: bool = False, epilogue: bool = False):  # fmt: skip
    """(inputs, output, arrays, float64 want) of ``a @ b`` in ``dtype`` (batched over
    ``batch`` when > 0, ``b`` stored n-by-k when ``trans_b``, ``a`` k-by-m when ``trans_a``),
    with bias + GELU when ``epilogue``."""
    lead = (batch,) if batch else ()
    a_shape = lead + ((k, m) if trans_a else (m, k))
    b_shape = lead + ((n, k) if trans_b else (k, n))
    a = te.placeholder(a_shape, dtype, name="a")
    b = te.placeholder(b_shape, dtype, name="b")
    r = te.reduce_axis(k, name="r")

    def body(*ix):
        *bt, i, j = ix
        av = a[(*bt, r, i)] if trans_a else a[(*bt, i, r)]
        bv = b[(*bt, j, r)] if trans_b else b[(*bt, r, j)]
        return te.sum(av * bv, axis=r)

    mm = te.compute(lead + (m, n), body, name="mm")
    arrays = [_array(a_shape, dtype), _array(b_shape, dtype)]
    fa, fb = (x.astype(np.float64) for x in arrays)
    fa = np.swapaxes(fa, -1, -2) if trans_a else fa
    fb = np.swapaxes(fb, -1, -2) if trans_b else fb
    want = fa @ fb
    inputs, out = [a, b], mm
    if epilogue:
        bias = te.placeholder((n,), dtype, name="bias")
        y = te.compute(lead + (m, n), lambda *ix: mm[ix] + bias[ix[-1]], name="y")
        out = ops.gelu(y, name="g")
        arrays.append(_array((n,), dtype))
        inputs.append(bias)
        want = _gelu(want + arrays[-1].astype(np.float64))
    return inputs, out, arrays, want


def _check(dtype, inputs, out, arrays, want, **compile_args):
    fn = polyfuse.compile(inputs, [out], check_cuda=False, **compile_args)
    tol = tolerance(dtype)
    for race in (False, True):
        got = fn(*arrays, device="emulate", race_check=race)
        assert got.dtype == numpy_dtype(dtype)
        w = want.astype(numpy_dtype(dtype))  # the reference rounded to the stored dtype
        err = np.abs(got.astype(np.float64) - w.astype(np.float64)).max()
        assert tol.allclose(got, w), (race, err)
    return fn


def _tensorized(fn) -> None:
    (k,) = fn.kernels
    assert any(n.startswith("tensor cores: mma.sync.m16n8k16") for n in k.notes), k.notes
    assert "pf_mma_m16n8k16_f32_" in k.source and "pf_ldmatrix_x4" in k.source
    assert k.facts is not None and k.facts.mma
    # the facts say cp.async exactly where the source fills tiles with it
    assert k.facts.async_copies == ("pf_cp_async16(" in k.source)
    assert "mma.sync.aligned.m16n8k16" in fn.cuda_source  # the prelude's inline PTX


CASES = {
    "2d": {},
    "batched": {"batch": 3},
    "trans_b": {"trans_b": True},
    "trans_a": {"trans_a": True},
    "batched_trans_b_epilogue": {"batch": 2, "trans_b": True, "epilogue": True},
    "epilogue": {"epilogue": True},
}


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("size", [ODD, WHOLE], ids=["odd", "whole"])
def test_half_matmuls_run_on_tensor_cores_and_match_float64(dtype, case, size):
    inputs, out, arrays, want = _matmul(dtype, *size, **CASES[case])
    fn = _check(dtype, inputs, out, arrays, want)
    _tensorized(fn)
    src = fn.kernels[0].source
    trans_b = CASES[case].get("trans_b", False)
    # B stored n-innermost (k by n) is loaded transposed; x @ W^T (n by k) is not; B's
    # fragments come two mma tiles per ldmatrix.x4
    assert "pf_ldmatrix_x2" not in src
    trans = {c.split("(")[0] for c in src.split("pf_ldmatrix_x4")[1:]}
    a_trans = CASES[case].get("trans_a", False)
    assert trans == {"_trans" if a_trans else "", "" if trans_b else "_trans"}, trans


def test_the_large_block_tile_is_chosen_where_its_blocks_fill_the_sms():
    """A larger tile where its blocks still give one block per SM (A100: 108): 1000x1700x40
    takes 256x64 of 4 warps, 4x8 mma tiles each (the tiling model's least modelled others per
    HMMA; before, the fixed list's 128x128); 200x1100x40 makes 72 blocks of 64x64, too few:
    126 of 32x64 (:data:`SMALL_TILINGS`; 64x64 before); the 8-warp kernel is correct at odd
    sizes too (forced here)."""
    inputs, out, _, _ = _matmul("bfloat16", 1000, 1700, 40)
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False)
    assert "block tile 256x64x32 of 4 warps, each 4x8 mma tiles" in fn.kernels[0].notes[0]
    inputs, out, _, _ = _matmul("bfloat16", 200, 1100, 40)
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False)
    assert "block tile 64x64x32 of 4 warps, each 2x4 mma tiles (18" not in fn.kernels[0].notes[0]
    note = fn.kernels[0].notes[0]
    assert "block tile 32x64x32 of 4 warps, each 1x4 mma tiles of 16x8 (126" in note
    # the plan's layout record carries the choice as typed data (the one decision record)
    from polyfuse.base.decision_data import TensorCoreData

    (layout,) = [d for kp in fn.plan.kernel_plans for d in kp.layout]
    assert isinstance(layout.data, TensorCoreData)
    assert (layout.data.intrinsic, layout.data.block, layout.data.warps) == (
        "m16n8k16.bfloat16", [32, 64, 32], [2, 2]
    )


def test_the_eight_warp_tile_is_correct_at_odd_sizes(monkeypatch):
    monkeypatch.setattr(tensorize_tiling, "TILINGS", ((128, 128, 2, 4),))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _matmul("float16", *ODD, batch=2, trans_b=True, epilogue=True)
    fn = _check("float16", inputs, out, arrays, want)
    _tensorized(fn)
    assert "block tile 128x128x32 of 8 warps" in fn.kernels[0].notes[0]


def test_a_float32_matmul_keeps_the_cuda_core_tiles():
    inputs, out, arrays, want = _matmul("float32", *ODD)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    (k,) = fn.kernels
    assert "pf_mma_" not in k.source and "mma.sync" not in fn.cuda_source
    assert not any(n.startswith("tensor cores") for n in k.notes)
    got = fn(*arrays, device="emulate")
    assert np.allclose(got, want, rtol=1e-4, atol=1e-4)


def test_mixed_operand_dtypes_are_refused_with_the_reason():
    a, w = te.placeholder((32, 48), "bfloat16", name="a"), te.placeholder((48, 40), name="w")
    k = te.reduce_axis(48, name="k")
    mm = te.compute((32, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="mm")
    fn = polyfuse.compile([a, w], [mm], check_cuda=False)
    (k,) = fn.kernels
    assert "pf_mma_" not in k.source
    assert "no tensor cores: the operands are not float16, bfloat16, int8 or uint8" in k.notes


@pytest.mark.parametrize("linear", [True, False])
def test_a_two_dim_contraction_is_an_implicit_gemm_on_tensor_cores(linear):
    """Two reduction dims (a conv-like contraction) flattened into one k of 48 (row-major over
    ``(r, s)``). Where an operand's offset is ``data + stride * k`` with its tile's inner dim
    contiguous (``x[i, r, s]``: ``48 i + k``; ``w[r, s, j]``: ``24 k + j``), its tile is
    copied by 16-byte cp.async chunks with no division of k, pipelined (issue 23; before: both
    gathered element by element, single-stage). Read in the other order (``x[i, s, r]``,
    ``w[s, r, j]``) k's runs are contiguous once the reduction is flattened as ``(s, r)``: the
    order model recomputes each operand's linear form per order and takes (1, 0), the same
    chunks (before: the linear form was only kept, never found, in another order: both scalar
    gathers, single-stage). Correct in both thread orders."""
    r, s = te.reduce_axis(6, name="r"), te.reduce_axis(8, name="s")
    chunks = (
        "tensor cores: the shared tiles are filled by 16-byte cp.async chunks (8 "
        "elements, zero-filled past the arrays' edges)"
    )
    xsh, wsh = ((32, 6, 8), (6, 8, 24)) if linear else ((32, 8, 6), (8, 6, 24))
    x = te.placeholder(xsh, "float16", name="x")
    w = te.placeholder(wsh, "float16", name="w")

    def body(i, j):
        if linear:
            return te.sum(x[i, r, s] * w[r, s, j], axis=[r, s])
        return te.sum(x[i, s, r] * w[s, r, j], axis=[r, s])

    mm = te.compute((32, 24), body, name="mm")
    xs, ws = _array(xsh, "float16"), _array(wsh, "float16")
    sub = "irs,rsj->ij" if linear else "isr,srj->ij"
    want = np.einsum(sub, xs.astype(np.float64), ws.astype(np.float64))
    fn = _check("float16", [x, w], mm, [xs, ws], want)
    _tensorized(fn)
    notes = fn.kernels[0].notes
    assert chunks in notes, notes
    order = "(0, 1)" if linear else "(1, 0)"
    assert any(n.startswith(f"tensor cores: reduction flattened in the order {order}")
               for n in notes), notes  # fmt: skip
    src = fn.kernels[0].source
    assert "&x[((pf_n > 0) ? ((48 * pf_r) + pf_k) : 0)]" in src
    assert "&w[((pf_n > 0) ? (pf_r + (24 * pf_k)) : 0)]" in src


def test_an_architecture_without_mma_is_refused_with_the_reason():
    inputs, out, arrays, want = _matmul("float16", *ODD)
    fn = polyfuse.compile(inputs, [out], arch="sm_70", check_cuda=False)
    (k,) = fn.kernels
    assert "pf_mma_" not in k.source
    assert "no tensor cores: no m16n8k16 mma.sync on sm_70 (sm_80 and later)" in k.notes


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", HALVES)
def test_nvrtc_compiles_tensorized_kernels_without_spills(arch, dtype):
    for case in ("batched_trans_b_epilogue", "trans_a"):
        inputs, out, _, _ = _matmul(dtype, *ODD, **CASES[case])
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
        _tensorized(fn)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
def test_sass_has_hmma_in_the_k_tile_loop():
    """The SASS instrument's question: HMMA instructions in the k-tile loop (the figure:
    HMMA to other instructions in that loop, fill loops included)."""
    inputs, out, _, _ = _matmul("bfloat16", 1024, 1024, 512, trans_b=True, epilogue=True)
    fn = polyfuse.compile(inputs, [out], arch="sm_90", check_cuda=False)
    binary = compile_cuda(fn.cuda_source, "sm_90", compiler="nvrtc")
    hmma, ldsm, _, other = counts = hmma_loop(binary, "sm_90")
    # 64x64 block, 4 warps of 2x4 mma tiles, two k-steps: 16 HMMA, 8 LDSM per k-tile (A: 2
    # x4, B: 2 x4 of two mma tiles each per k-step)
    assert (hmma, ldsm) == (16, 8), counts


def _offset_batches(rows: int):
    """``mm[t, i, j] = sum_r a[t + 1, i, r] * b[r, j]`` (3 batches of ``rows`` x 27, k 21) in
    float16, compiled and checked against float64 in both thread orders, on tensor cores."""
    a = te.placeholder((4, rows, 21), "float16", name="a")
    b = te.placeholder((21, 27), "float16", name="b")
    r = te.reduce_axis(21, name="r")
    mm = te.compute(
        (3, rows, 27), lambda t, i, j: te.sum(a[t + 1, i, r] * b[r, j], axis=r), name="mm"
    )
    xs, ws = _array((4, rows, 21), "float16"), _array((21, 27), "float16")
    want = xs[1:].astype(np.float64) @ ws.astype(np.float64)
    fn = _check("float16", [a, b], mm, [xs, ws], want)
    _tensorized(fn)
    return fn


def test_narrow_rows_swap_with_columns_that_fold_a_batch_dim(monkeypatch):
    """``mm[t, i, j]`` of 3 x 19 x 27 (``a[t + 1, i, r] @ b[r, j]``): rows ``i`` (19) and
    columns ``j`` (27) pad one 64x64 block tile per batch point to 8x the useful outputs; the
    swap (rows ``j``, columns ``i`` with ``t`` folded in: 57) pads 2.7x, one block tile in
    all (a channels-last conv's output width and channels are such a pair; the small tilings,
    which would split it in two 32x32 tiles, left out). Matches float64 in both thread
    orders."""
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    fn = _offset_batches(19)
    notes = fn.kernels[0].notes
    assert "tensor cores: the GEMM's rows are data dim 2, its columns data dim 1, the other " \
        "data dims a batch (one block tile per batch point)" in notes  # fmt: skip
    assert any(n.startswith("tensor cores: data dim 0 folded into the columns with data dim 1 "
                            "(3 x 19 = 57 columns") for n in notes), notes  # fmt: skip
    assert fn.kernels[0].grid == (1, 1, 1)


def test_an_operand_subscript_of_several_terms_is_parenthesized():
    """``a[t + 1, i, r]``: the batch subscript ``pf_g0 + 1`` times the row-major stride must be
    parenthesized in the fill's offset (it read ``pf_g0 + 1 * 399``: wrong rows, issue 23). 70
    rows: ``t`` stays a batch dim (beside 19 rows it is folded into the columns of the GEMM
    with ``i`` and ``j`` swapped, which pads less)."""
    fn = _offset_batches(70)
    assert "a[(((pf_g0 + 1) * 1470) + " in fn.kernels[0].source
