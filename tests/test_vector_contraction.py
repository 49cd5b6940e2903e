"""Matrix-vector products (polyfuse.poly.tiling.vector_contraction) mapped as reductions, and
the small GEMMs around them: a float32 reshape-merged reduction axis split where no k-tile
keeps to its runs, and the loop-quality floor set aside where it costs the idle SMs."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import H100
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.promote import GemmKernel
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles, vector_contraction
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")  # in order; reversed between barriers; shadow-memory races


def _matvec(m: int, k: int, dtype: str = "float32"):
    """``sigmoid(x @ w)`` with ``w`` of one column: a classifier's logit."""
    x = te.placeholder((m, k), dtype, name="x")
    w = te.placeholder((k, 1), dtype, name="w")
    r = te.reduce_axis(k, "r")
    y = te.compute((m, 1), lambda i, n: te.sum(x[i, r] * w[r, n], axis=r), name="y")
    z = te.compute((m, 1), lambda i, n: te.sigmoid(y[i, n]), name="z")
    return [x, w], [z]


def _vecmat(k: int, n: int, dtype: str = "float32"):
    """``x @ W + b`` with ``x`` of one row: a decode step's projection."""
    x = te.placeholder((1, k), dtype, name="x")
    w = te.placeholder((k, n), dtype, name="w")
    b = te.placeholder((n,), dtype, name="b")
    r = te.reduce_axis(k, "r")
    y = te.compute((1, n), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="y")
    z = te.compute((1, n), lambda i, j: y[i, j] + b[j], name="z")
    return [x, w, b], [z]


def _check(fn, ins, outs, tol: float = 1e-4) -> None:
    """Every race mode against the float64 reference."""
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(t.shape).astype(polyfuse_dtype(t.dtype)) for t in ins]
    (want,) = evaluate(outs, {t: a.astype(np.float64) for t, a in zip(ins, arrays, strict=True)})
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(
            np.asarray(got, np.float64), want, rtol=tol, atol=tol, err_msg=f"mode {mode}"
        )


def polyfuse_dtype(dtype: str):
    return ml_dtypes.bfloat16 if dtype == "bfloat16" else np.dtype(dtype)


def _serial(fn) -> bool:
    return any("one element per thread: has a reduction" in n for k in fn.kernels for n in k.notes)


def test_a_matrix_vector_product_reduces_on_lanes_not_one_serial_loop_per_output():
    """512 x 256 times a vector (Wide&Deep's last layer): opaque (the vector broadcasts into
    every row), declined by the GEMM tiles (one data dim); it ran 2 blocks of 256 threads,
    each thread reading its 1 KB row alone, modelled 47.5 us on an H100. As a reduction: a
    warp per row, float4 loads, modelled under 5 us; the plan names its canonical form."""
    ins, outs = _matvec(512, 256)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    (sm,) = fn.plan.scheduled
    assert vector_contraction(sm)
    assert "fewer than two data dimensions" in str(detect_gemm(sm))
    assert "[canonical form: y-reduce" in str(fn.plan)
    assert not _serial(fn)
    (k,) = fn.kernels
    assert k.grid[0] * k.block[0] >= 32 * 512  # a warp (or more) per row
    assert "pf_allreduce" in k.source and "float4" in k.source
    assert model_kernel(describe_kernel(k), H100).us < 5
    _check(fn, ins, outs)


@pytest.mark.parametrize("m, k", [(37, 1000), (5, 33), (300, 4096)])
def test_matrix_vector_products_at_odd_sizes_match_float64_in_every_mode(m, k):
    ins, outs = _matvec(m, k)
    fn = polyfuse.compile(ins, outs, "sm_80", check_cuda=False)
    assert not _serial(fn)
    _check(fn, ins, outs)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_single_row_times_a_matrix_reduces_along_the_rows_of_threads(dtype):
    """A decode step, one row of 300 times 300 x 77: the kept dim (77 columns) is the
    innermost, so the reduction is an x-reduce, threads along the columns and rows of threads
    splitting the 300; bfloat16 too (the tensor cores take no single row)."""
    ins, outs = _vecmat(300, 77, dtype)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    assert "[canonical form: x-reduce" in str(fn.plan)
    assert not _serial(fn)
    _check(fn, ins, outs, 1e-4 if dtype == "float32" else 2e-2)


def test_short_matrix_vector_reductions_keep_one_loop_per_output():
    """Below a warp's worth of terms (16 here) lanes would idle: one output per thread, as
    before."""
    ins, outs = _matvec(512, 16)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    assert not vector_contraction(fn.plan.scheduled[0])
    assert _serial(fn)
    _check(fn, ins, outs)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_matrix_vector_kernels_compile_without_spills(arch):
    for ins, outs in (_matvec(512, 256), _vecmat(768, 768, "bfloat16"),
                      _embedding_mlp(512, 39, 10, 400)):  # fmt: skip
        fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
        compiles_without_spills(fn, arch)


def _embedding_mlp(b: int, fields: int, dim: int, width: int):
    """DeepFM's first deep layer: embeddings (b, fields, dim) reshaped to rows of fields x dim
    features, times a weight, plus a bias, ReLU."""
    emb = te.placeholder((b, fields, dim), name="emb")
    w = te.placeholder((fields * dim, width), name="w")
    bias = te.placeholder((width,), name="bias")
    flat = ops.reshape(emb, (b, fields * dim), name="flat")
    y = ops.relu(ops.add(ops.matmul(flat, w, name="mm"), bias, name="biased"), name="act")
    return [emb, w, bias], [y]


def test_a_float32_reduction_merged_from_runs_of_ten_is_split_and_gemm_tiled():
    """``emb[b, k // 10, k % 10]``: no k-tile of 8, 16 or 32 stays in one run of 10, so the
    operand's tile had no fixed box and the layer ran one element per thread (DeepFM: modelled
    76 us on an H100). Split into (fields, 10) the reads are affine and the GEMM tiles take
    it."""
    ins, outs = _embedding_mlp(64, 13, 10, 40)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    recs = [r for r in fn.plan.graph.pass_records if r.pass_name == "split_reduction"]
    assert recs and "(13 x 10)" in recs[0].reason
    assert [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    _check(fn, ins, outs)


def test_a_float32_reduction_merged_from_runs_of_sixteen_stays_merged():
    """Runs of 16: k-tiles of 8 and 16 keep inside one run, the merged axis tiles as it is
    (BERT-base's output projection); no split."""
    ins, outs = _embedding_mlp(64, 5, 16, 40)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    assert not [r for r in fn.plan.graph.pass_records if r.pass_name == "split_reduction"]
    assert [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    _check(fn, ins, outs)


def test_the_loop_quality_floor_gives_way_where_it_would_leave_sms_idle():
    """DeepFM's 512 x 390 x 400 layer on an H100: every tiling at or above 80 % FFMA is a
    64 x 64 one or larger (at most 56 blocks for 132 SMs), modelled about 3x the best tiling
    below the floor; the floor gives way, and says so."""
    ins, outs = _embedding_mlp(512, 39, 10, 400)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    (shape,) = [g for s in fn.plan.scheduled if isinstance(g := detect_gemm(s), GemmShape)]
    ranked = rank_gemm_tiles(shape, H100, stages=2)
    reason = next(r for r in ranked[0].reasons if "ranked too" in r)
    assert "below 80% FFMA ranked too" in reason and "more than 1.25x and 5 us" in reason
    assert ranked[0].modelled_us < 25
    (gk,) = [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    assert gk.tiling.choice == ranked[0].choice
