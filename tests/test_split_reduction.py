"""The ``split_reduction`` graph pass: a reduction axis read through ``k // D`` and ``k % D``
(attention's merged heads before the output projection) becomes two affine axes, so the
16-bit GEMM matches tensor cores; the sum is the same, term for term in the same order.
"""

from __future__ import annotations

import numpy as np
import pytest
from hmma_loops import hmma_loop

import polyfuse
from polyfuse import ops, reference, te, zoo
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.graph.graph import build_graph
from polyfuse.graph.passes.split_reduction import split_reduction

RNG = np.random.default_rng(41)


def _merged_heads(dtype: str, heads: int = 3, d: int = 16, s: int = 19, n: int = 40):
    """``reshape(transpose(pv, (0, 2, 1, 3)), (b, s, heads * d)) @ w``: the output
    projection of attention, its operand a merge of the heads."""
    pv = te.placeholder((2, heads, s, d), dtype, name="pv")
    w = te.placeholder((heads * d, n), dtype, name="w")
    ctx = ops.reshape(ops.transpose(pv, (0, 2, 1, 3)), (2, s, heads * d))
    return pv, w, ops.matmul(ctx, w, name="out")


def _records(g) -> list[str]:
    return [r.reason for r in g.pass_records if r.pass_name == "split_reduction"]


def test_a_merged_heads_gemm_runs_on_tensor_cores():
    """bfloat16: before, ``pv[b, k // 16, s, k % 16]`` kept the GEMM off tensor cores (one
    element per thread); split, it is an implicit GEMM over (head, d), pv gathered by
    16-byte chunks of d. Matches float64 in both thread orders."""
    dtype = "bfloat16"
    pv, w, out = _merged_heads(dtype)
    fn = polyfuse.compile([pv, w], [out], check_cuda=False)
    (made,) = _records(fn.plan.graph)
    assert made.startswith("out: reduction axis k (extent 48) as k_hi x k_lo (3 x 16)"), made
    (k,) = fn.kernels
    assert any(n.startswith("tensor cores: mma.sync.m16n8k16 bfloat16") for n in k.notes)
    a = RNG.standard_normal(pv.shape).astype(numpy_dtype(dtype))
    b = RNG.standard_normal(w.shape).astype(numpy_dtype(dtype))
    merged = np.transpose(a.astype(np.float64), (0, 2, 1, 3)).reshape(2, 19, 48)
    want = (merged @ b.astype(np.float64)).astype(numpy_dtype(dtype))
    for race in (False, True):
        got = fn(a, b, device="emulate", race_check=race)
        assert tolerance(dtype).allclose(got, want)
    off = tuple(p for p in polyfuse.graph.passes.DEFAULT_PASSES if p != "split_reduction")
    (k,) = polyfuse.compile([pv, w], [out], check_cuda=False, passes=off).kernels
    assert not any(n.startswith("tensor cores: mma") for n in k.notes)


def test_the_split_sums_the_same_terms_in_the_same_order():
    """The reference evaluator gives the same bits before and after the pass (float16 sums
    rounded per step in the accumulator's dtype), and the graph is consistent."""
    pv, w, out = _merged_heads("float16")
    g = build_graph([pv, w], [out])
    from polyfuse.graph.passes import run_passes

    g = run_passes(g, ("layout_fold", "dce"))
    before = g.prims["out"].tensor
    assert "//" in repr(before.op.body)
    g1 = split_reduction(g)
    after = g1.prims["out"].tensor
    assert "//" not in repr(after.op.body) and "%" not in repr(after.op.body)
    assert [a.extent for a in after.op.reduce_axes] == [3, 16]
    feeds = {pv: RNG.standard_normal(pv.shape).astype(np.float16),
             w: RNG.standard_normal(w.shape).astype(np.float16)}  # fmt: skip
    np.testing.assert_array_equal(
        reference.evaluate([before], feeds)[0], reference.evaluate([after], feeds)[0]
    )


def test_reductions_the_pass_leaves_alone():
    """float32 (the CUDA-core tiles take the merged form; split they fit no tile), two
    divisors, and a divisor that does not divide the extent: no change, nothing recorded."""
    pv, w, out = _merged_heads("float32")
    fn = polyfuse.compile([pv, w], [out], check_cuda=False)
    assert _records(fn.plan.graph) == []
    x = te.placeholder((4, 6), "float16", name="x")
    k = te.reduce_axis(24, name="k")
    two = te.compute((1,), lambda i: te.sum(x[k // 6, k % 4], axis=k), name="two")
    y = te.placeholder((5, 5), "float16", name="y")
    k2 = te.reduce_axis(24, name="k2")
    odd = te.compute((1,), lambda i: te.sum(y[k2 // 5, k2 % 5], axis=k2), name="odd")
    g = split_reduction(build_graph([x, y], [two, odd]))
    assert _records(g) == []


@pytest.mark.parametrize("name", ["bert_base", "vit_b16"])
def test_transformers_in_bfloat16_run_every_gemm_on_tensor_cores(name):
    """Tiny BERT and ViT in bfloat16: each layer's output projection joins the other GEMMs on
    tensor cores (12 of 12 more at full size); BERT within bfloat16 rounding of its float64
    reference."""
    m = zoo.build(name, "tiny", dtype="bfloat16")
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    layers = m.config["layers"]
    assert len(_records(fn.plan.graph)) == layers
    projections = [k for k in fn.kernels if "_attn_o_w" in k.source]
    assert len(projections) == layers
    assert all("pf_mma_m16n8k16" in k.source for k in projections)
    if name == "bert_base":
        arrays = m.sample_inputs(seed=1)
        (want,) = m.reference(*arrays)
        got = fn(*arrays, device="emulate")
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=5e-2, atol=5e-2)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_bert_s_output_projection_without_spills(arch):
    """BERT-base's output projection in bfloat16 (batch 8, seq 128, 12 heads of 64 merged
    into 768, times 768 x 768): on tensor cores, no spills, HMMA in the k-tile loop."""
    pv = te.placeholder((8, 12, 128, 64), "bfloat16", name="pv")
    w = te.placeholder((768, 768), "bfloat16", name="w")
    ctx = ops.reshape(ops.transpose(pv, (0, 2, 1, 3)), (8, 128, 768))
    out = ops.matmul(ctx, w, name="out")
    fn = polyfuse.compile([pv, w], [out], arch=arch, check_cuda=False)
    (k,) = fn.kernels
    assert "pf_mma_m16n8k16" in k.source
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    hmma, ldsm, _, _ = hmma_loop(binary, arch, k.function)
    assert hmma > 0 and ldsm > 0
