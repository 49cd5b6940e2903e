"""A contraction's epilogue that reads its result at other elements is split off the GEMM
(polyfuse.poly.tiling.epilogue_split, a partition feedback), so the contraction is tiled."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.promote import GemmKernel
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")


def _gates(batch: int, n_in: int, hidden: int):
    """An LSTM step's input projection: ``x @ W + bias`` (batch x 4*hidden), then its four
    gate slices, one through a sigmoid: each slice reads the product at a column offset."""
    x = te.placeholder((batch, n_in), name="x")
    w = te.placeholder((n_in, 4 * hidden), name="w")
    bias = te.placeholder((4 * hidden,), name="bias")
    gates = ops.add(ops.matmul(x, w, name="proj"), bias, name="biased")
    outs = [
        ops.slice(gates, [k * hidden], [(k + 1) * hidden], [1], name=f"gate{k}") for k in range(4)
    ]
    outs[0] = ops.sigmoid(outs[0], name="input_gate")
    return [x, w, bias], outs


def _gemms(fn) -> list[GemmKernel]:
    return [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]


@pytest.mark.parametrize(("batch", "n_in", "hidden"), [(32, 512, 512), (5, 37, 19)])
def test_gate_slices_are_split_off_and_the_projection_is_gemm_tiled(batch, n_in, hidden):
    """The slices were fused with the projection (elementwise with an offset), and the GEMM
    path declined the micrograph ("not elementwise on the reduction's domain"): every output
    of 32 x 2048 ran a serial 512-term loop (an LSTM step, modelled 33 us on an H100). The
    feedback splits the slices off: the projection and its bias are a tiled GEMM, the slices
    a kernel of their own; equal to float64 in every mode."""
    ins, outs = _gates(batch, n_in, hidden)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    events = [str(e) for e in fn.plan.feedback]
    assert any("reads the contraction's result at other elements" in e for e in events)
    (gk,) = _gemms(fn)
    assert gk.shape is not None and gk.shape.update.prim == "proj"
    assert {s.prim for s in gk.shape.epilogue} == {"proj", "biased"}
    assert not any("one element per thread: has a reduction" in n for k in fn.kernels
                   for n in k.notes)  # fmt: skip
    rng = np.random.default_rng(2)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    want = evaluate(outs, {t: a.astype(np.float64) for t, a in zip(ins, arrays, strict=True)})
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4, err_msg=f"mode {mode}")


def test_an_elementwise_epilogue_on_the_products_domain_is_not_split():
    """Bias and ReLU on the product's own elements stay in the GEMM's epilogue (no feedback,
    one kernel)."""
    x = te.placeholder((64, 96), name="x")
    w = te.placeholder((96, 80), name="w")
    bias = te.placeholder((80,), name="bias")
    y = ops.relu(ops.add(ops.matmul(x, w, name="mm"), bias, name="b"), name="r")
    fn = polyfuse.compile([x, w, bias], [y], "sm_90", check_cuda=False)
    assert not fn.plan.feedback
    (gk,) = _gemms(fn)
    assert len(fn.kernels) == 1 and {s.prim for s in gk.shape.epilogue} == {"mm", "b", "r"}


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_split_kernels_compile_without_spills(arch):
    ins, outs = _gates(32, 512, 512)
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
    res = compiles_without_spills(fn, arch)
    assert len(res.resources) == len({k.function or k.name for k in fn.kernels})
