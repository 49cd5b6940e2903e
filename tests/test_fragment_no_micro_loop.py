"""A GEMM operand read twice per product by a 1x1 micro-tile: its register fragment loads
before the statement.

``sum_r where(x[i, r] > 0, x[i, r], 0) * w[r, j]`` (a ReLU inside the contraction) reads ``x``
twice per multiply-add, so isl finds a register fragment of ``x`` (one element read twice)
even where the tiling's micro-tile is 1x1 and no micro-tile loop surrounds the update. The
fragment pass loaded fragments only before micro-tile loops and stopped on an assertion
(``... not in a micro-tile``: a raw traceback from ``polyfuse.compile``) at 64 x 256 x 64.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
from polyfuse import te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")


def _relu_matmul(m: int, k: int, n: int):
    x = te.placeholder((m, k), name="x")
    w = te.placeholder((k, n), name="w")
    r = te.reduce_axis(k, "r")
    y = te.compute(
        (m, n),
        lambda i, j: te.sum(te.where(x[i, r] > 0.0, x[i, r], 0.0) * w[r, j], axis=r),
        name="y",
    )
    return [x, w], [y]


@pytest.mark.parametrize("shape", [(64, 256, 64), (37, 255, 29), (128, 128, 128)])
def test_relu_inside_the_contraction_on_the_emulator(shape):
    ins, outs = _relu_matmul(*shape)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    rng = np.random.default_rng(5)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    (want,) = evaluate(outs, {t: a.astype(np.float64) for t, a in zip(ins, arrays, strict=True)})
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-4)


def test_fragment_loads_before_the_update_without_micro_loops():
    ins, outs = _relu_matmul(64, 256, 64)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    loop = k.source[k.source.index("for (int kk0") :]
    load, update = loop.index("r_x_frag[0] = s_x["), loop.index("r_y_acc[0] = r_y_acc[0] +")
    assert load < update  # one shared load of x per product, before the update reads it twice
    assert loop[update : loop.index(";", update)].count("r_x_frag[0]") == 2


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_relu_inside_the_contraction_compiles(arch):
    ins, outs = _relu_matmul(64, 256, 64)
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
    compiles_without_spills(fn, arch)
