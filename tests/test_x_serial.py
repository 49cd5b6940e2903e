"""Column reductions over a short reduced dim whose kept points fill the GPU: one thread per
kept point sums its few elements serially (``ReductionConfig.x_serial``), no lanes to combine.

``sum_s p[s, i, j]`` over ``s`` of extent 2 (the partials of a split, heads or a small batch
summed) with 786,432 kept points ran 2 lanes x 32 kept points per block: every thread loaded
one element, the two lanes (in two warps) combined through shared memory behind a barrier,
and half the threads stored — 24,576 blocks of 64 threads, 10.6 us MODELLED on an H100
(sm_90). Serially: 3,072 blocks of 256 threads, 7.0 us; 8 x 1024 x 1024: 46.0 -> 18.0 us.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
from polyfuse import te
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.canonical import form_of
from polyfuse.poly.cost import ReductionConfig, choose_reduction_strategy
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import H100
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")


def _column_sum(s: int, m: int, n: int, op: str = "sum", dtype: str = "float32"):
    p = te.placeholder((s, m, n), dtype, name="p")
    r = te.reduce_axis(s, "r")
    c = te.compute((m, n), lambda i, j: getattr(te, op)(p[r, i, j], axis=r), name="c")
    g = te.compute((m, n), lambda i, j: te.maximum(c[i, j], 0.0), name="g")
    return [p], [g], c


def test_short_x_reduction_filling_the_gpu_is_serial_per_thread():
    _, _, c = _column_sum(2, 1024, 768)
    st = choose_reduction_strategy(form_of(c), H100, ReductionConfig())
    assert (st.lanes, st.kept_tile) == (1, 256), st
    assert "alone" in st.reason


@pytest.mark.parametrize(
    "shape",
    [(16, 128, 768), (32, 1024, 768), (2, 64, 768)],  # kept too few / reduced too long
)
def test_other_x_reductions_keep_their_lanes(shape):
    _, _, c = _column_sum(*shape)
    st = choose_reduction_strategy(form_of(c), H100, ReductionConfig())
    assert st.lanes > 1, st


def test_serial_columns_modelled_faster():
    ins, outs, _ = _column_sum(8, 1024, 1024)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    assert k.block[0] * k.block[1] * k.block[2] == 256
    assert k.grid[0] * k.grid[1] * k.grid[2] == 8 * 1024 * 1024 // 8 // 256
    assert "pf_allreduce" not in k.source and "__syncthreads" not in k.source
    assert model_kernel(describe_kernel(k), H100).us < 25.0  # 46.0 us with 8 lanes


@pytest.mark.parametrize(
    ("s", "m", "n", "op", "dtype"),
    [
        (2, 1024, 768, "sum", "float32"),
        (5, 700, 512, "max", "float32"),
        (3, 2200, 128, "min", "float32"),
        (4, 1100, 256, "sum", "bfloat16"),
    ],
)
def test_serial_columns_on_the_emulator(s, m, n, op, dtype):
    ins, outs, c = _column_sum(s, m, n, op, dtype)
    assert choose_reduction_strategy(form_of(c), H100, ReductionConfig()).lanes == 1
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    rng = np.random.default_rng(11)
    x = rng.standard_normal((s, m, n)).astype(
        ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float32
    )
    (want,) = evaluate(outs, {ins[0]: x.astype(np.float64)})
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    for mode in MODES:
        got = fn(x, device="emulate", race_check=mode)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_serial_columns_compile(arch):
    ins, outs, _ = _column_sum(8, 1024, 1024)
    compiles_without_spills(polyfuse.compile(ins, outs, arch, check_cuda=False), arch)
