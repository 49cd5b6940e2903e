"""GEMM-like micrographs: register micro-tile, k-tiles, shared-memory promotion, epilogue.

Correctness runs on the CPU emulator at sizes that are not tile multiples, in order and in the
race-check modes (reverse, random); structure is checked on the plan and the CUDA text (the
4096³ kernel is never emulated); ptxas resources come from NVRTC when it is installed.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.mapping import MappingConfig

ORDERS = (False, "reverse", "random")


def _gemm_kernels(fn) -> list:
    return [k for k in fn.kernels if any("register micro-tile" in n for n in k.notes)]


def _rng_arrays(*shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(np.float32) for s in shapes]


def _check_all_orders(fn, arrays, want, tol=1e-4):
    for order in ORDERS:
        got = fn(*arrays, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=f"order {order}")


def _gelu(x):
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _matmul_4096():
    a = te.placeholder((4096, 4096), name="a")
    w = te.placeholder((4096, 4096), name="w")
    return a, w, ops.matmul(a, w)


def test_4096_matmul_has_shared_tiles_and_register_micro_tile():
    a, w, y = _matmul_4096()
    fn = polyfuse.compile(inputs=[a, w], outputs=[y], arch="sm_80", check_cuda=False)
    (k,) = _gemm_kernels(fn)
    src = k.source
    assert re.search(r"__shared__ (?:__align__\(16\) )?float s_a\[\d+\];", src)
    assert re.search(r"__shared__ (?:__align__\(16\) )?float s_w\[\d+\];", src)
    assert src.count("__syncthreads();") >= 2
    dims = re.search(r"float r_\w+_acc((?:\[\d+\])+);", src).group(1)
    accumulators = math.prod(int(x) for x in re.findall(r"\d+", dims))
    assert accumulators >= 16
    text = str(fn.plan)
    assert "register micro-tile" in text and "shared" in text
    # The plan names the tile sizes, the promotions and why.
    notes = "\n".join(k.notes)
    assert re.search(r"block tile \d+x\d+, \d+x\d+ threads, register micro-tile \d+x\d+", notes)
    assert "a: shared (reused across threads" in notes
    assert "w: shared (reused across threads" in notes
    assert "modelled" in notes and "blocks/SM" in notes


def test_plan_lists_promotions_and_register_tile():
    a, w, y = _matmul_4096()
    fn = polyfuse.compile(inputs=[a, w], outputs=[y], arch="sm_80", check_cuda=False)
    text = str(fn.plan)
    assert "a: shared (reused across threads along data dims [1]" in text
    assert re.search(r"\w+_acc: register \(register micro-tile \d+x\d+ per thread", text)


def test_matmul_bias_gelu_non_multiple_forced_micro_tile():
    m, k, n = 70, 53, 90
    a, w, b = (te.placeholder(s, name=nm) for s, nm in (((m, k), "a"), ((k, n), "w"), ((n,), "b")))
    y = ops.gelu(ops.add(ops.matmul(a, w), b))
    cfg = MappingConfig(gemm_tile=(64, 32, 4, 4, 16))
    fn = polyfuse.compile(inputs=[a, w, b], outputs=[y], check_cuda=False, mapping=cfg)
    (kern,) = _gemm_kernels(fn)
    assert re.search(r"float r_\w+_acc\[4\]\[4\];", kern.source)
    assert "tile sizes forced by MappingConfig.gemm_tile" in "\n".join(kern.notes)
    arrays = _rng_arrays((m, k), (k, n), (n,))
    want = _gelu(arrays[0].astype(np.float64) @ arrays[1] + arrays[2])
    _check_all_orders(fn, arrays, want)


def test_matmul_residual_model_tiles():
    m, k, n = 33, 40, 50
    a, w, r = (
        te.placeholder(s, name=nm) for s, nm in (((m, k), "a"), ((k, n), "w"), ((m, n), "r"))
    )
    fn = polyfuse.compile(
        inputs=[a, w, r], outputs=[ops.add(ops.matmul(a, w), r)], check_cuda=False
    )
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((m, k), (k, n), (m, n))
    _check_all_orders(fn, arrays, arrays[0].astype(np.float64) @ arrays[1] + arrays[2])


def test_batched_matmul():
    a = te.placeholder((3, 37, 29), name="a")
    b = te.placeholder((3, 29, 45), name="b")
    cfg = MappingConfig(gemm_tile=(32, 32, 4, 2, 8))
    fn = polyfuse.compile(inputs=[a, b], outputs=[ops.matmul(a, b)], check_cuda=False, mapping=cfg)
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((3, 37, 29), (3, 29, 45))
    _check_all_orders(fn, arrays, arrays[0].astype(np.float64) @ arrays[1])


def _conv_ref(x, w, st, pd, dl, g):
    n, c, h, wd = x.shape
    o, cg, kh_, kw_ = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pd, pd), (pd, pd)))
    oh = (h + 2 * pd - dl * (kh_ - 1) - 1) // st + 1
    ow = (wd + 2 * pd - dl * (kw_ - 1) - 1) // st + 1
    out = np.zeros((n, o, oh, ow))
    og = o // g
    for oc in range(o):
        gi = oc // og
        for kh in range(kh_):
            for kw in range(kw_):
                patch = xp[
                    :,
                    gi * cg : (gi + 1) * cg,
                    kh * dl : kh * dl + st * (oh - 1) + 1 : st,
                    kw * dl : kw * dl + st * (ow - 1) + 1 : st,
                ]
                out[:, oc] += np.einsum("nchw,c->nhw", patch, w[oc, :, kh, kw])
    return out


@pytest.mark.parametrize(
    "stride,padding,dilation,groups",
    [(1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (2, 0, 1, 1), (1, 1, 1, 2)],
)
def test_conv_implicit_gemm(stride, padding, dilation, groups):
    n, c, h, wd, o = 2, 4, 11, 13, 6
    x = te.placeholder((n, c, h, wd), name="x")
    w = te.placeholder((o, c // groups, 3, 3), name="w")
    b = te.placeholder((o, 1, 1), name="b")
    y = ops.relu(
        ops.add(
            ops.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups), b
        )
    )
    fn = polyfuse.compile(inputs=[x, w, b], outputs=[y], check_cuda=False)
    # (grouped conv indexes input channels through a floor division of the output channel)
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((n, c, h, wd), (o, c // groups, 3, 3), (o, 1, 1))
    want = np.maximum(
        _conv_ref(arrays[0], arrays[1], stride, padding, dilation, groups) + arrays[2], 0
    )
    _check_all_orders(fn, arrays, want)


def test_depthwise_conv_is_not_gemm_like():
    # Each output channel reads its own input channel: only the weights are reused across
    # threads, so the micrograph is memory-bound and keeps its kernel.
    x = te.placeholder((2, 8, 11, 13), name="x")
    w = te.placeholder((8, 1, 3, 3), name="w")
    fn = polyfuse.compile(
        inputs=[x, w], outputs=[ops.conv2d(x, w, padding=1, groups=8)], check_cuda=False
    )
    assert not _gemm_kernels(fn)
    arrays = _rng_arrays((2, 8, 11, 13), (8, 1, 3, 3))
    _check_all_orders(fn, arrays, _conv_ref(arrays[0], arrays[1], 1, 1, 1, 8))


def test_attention_products():
    bsz, heads, s, d = 2, 2, 20, 12
    q, k, v = (te.placeholder((bsz, heads, s, d), name=nm) for nm in "qkv")
    scale = 1.0 / math.sqrt(d)
    scores = ops.mul(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), scale)
    out = ops.matmul(ops.softmax(scores, axis=-1), v)
    fn = polyfuse.compile(inputs=[q, k, v], outputs=[out], check_cuda=False)
    assert len(_gemm_kernels(fn)) == 2  # Q·Kᵀ (with the scale as epilogue) and P·V
    arrays = _rng_arrays(*[(bsz, heads, s, d)] * 3)
    qn, kn, vn = arrays
    sc = qn.astype(np.float64) @ kn.transpose(0, 1, 3, 2) * scale
    p = np.exp(sc - sc.max(axis=-1, keepdims=True))
    want = p / p.sum(axis=-1, keepdims=True) @ vn
    _check_all_orders(fn, arrays, want)


def test_matvec_is_not_gemm_like():
    a = te.placeholder((64, 48), name="a")
    x = te.placeholder((48,), name="x")
    fn = polyfuse.compile(inputs=[a, x], outputs=[ops.matmul(a, x)], check_cuda=False)
    assert not _gemm_kernels(fn)


def test_requested_bytes_counted_with_repeats():
    # Naive kernel (GEMM path off): every multiply-add reads both operands from global memory.
    m, k, n = 24, 20, 28
    a, w = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="w")
    arrays = _rng_arrays((m, k), (k, n))
    naive = polyfuse.compile(
        inputs=[a, w],
        outputs=[ops.matmul(a, w)],
        check_cuda=False,
        mapping=MappingConfig(gemm=False),
    )
    naive(*arrays, device="emulate")
    assert naive.requested_bytes() == 4 * (2 * m * n * k + m * n)
    assert naive.traffic_bytes() == 4 * (m * k + k * n + m * n)
    # An elementwise kernel requests each element once: requested = distinct.
    x = te.placeholder((100,), name="x")
    ew = polyfuse.compile(inputs=[x], outputs=[ops.relu(x)], check_cuda=False)
    ew(*_rng_arrays((100,)), device="emulate")
    assert ew.requested_bytes() == ew.traffic_bytes() == 800


def test_512_matmul_requested_bytes_at_most_a_sixteenth():
    n = 512
    a, w = te.placeholder((n, n), name="a"), te.placeholder((n, n), name="w")
    fn = polyfuse.compile(inputs=[a, w], outputs=[ops.matmul(a, w)], check_cuda=False)
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((n, n), (n, n))
    got = fn(*arrays, device="emulate")
    np.testing.assert_allclose(got, arrays[0].astype(np.float64) @ arrays[1], rtol=1e-3, atol=1e-3)
    # Today's one-element-per-thread kernel requests 4 * (2 n³ + n²) bytes (the formula is
    # checked against the emulator in test_requested_bytes_counted_with_repeats).
    naive = 4 * (2 * n**3 + n**2)
    assert fn.requested_bytes() * 16 <= naive
    assert fn.traffic_bytes() == 3 * 4 * n * n  # distinct bytes are the compulsory ones


@pytest.mark.skipif(not available_compilers(), reason="no NVRTC/nvcc installed")
@pytest.mark.slow  # 10-16 s each; the fast tier's other NVRTC checks cover small tiles
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_no_spills(arch):
    a, w, y = _matmul_4096()
    bias = te.placeholder((4096,), name="bias")
    y = ops.gelu(ops.add(y, bias))
    x = te.placeholder((32, 64, 56, 56), name="x")
    cw = te.placeholder((64, 64, 3, 3), name="cw")
    cy = ops.relu(ops.conv2d(x, cw, padding=1))
    # Regression: the strided grouped conv's input tile (halo, several groups) is larger than
    # the cost model's estimate; the best-ranked tiles overflowed 48 KB of static shared memory.
    gw = te.placeholder((64, 16, 3, 3), name="gw")
    gy = ops.relu(ops.conv2d(x, gw, padding=1, stride=2, groups=4))
    for inputs, out in (([a, w, bias], y), ([x, cw], cy), ([x, gw], gy)):
        fn = polyfuse.compile(inputs=inputs, outputs=[out], arch=arch, check_cuda=False)
        assert _gemm_kernels(fn)
        binary = fn.check_cuda(arch)
        for res in binary.resources.values():
            assert res.shared_bytes <= 48 * 1024
            assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res


def test_memory_bound_suite_kernels_unchanged():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import suite  # noqa: PLC0415

    for name in ("rmsnorm_swiglu", "lstm_cell", "two_branches"):
        ins, outs, _ = suite.build(name)
        srcs = []
        for cfg in (MappingConfig(), MappingConfig(gemm=False)):
            fn = polyfuse.compile(inputs=ins, outputs=outs, check_cuda=False, mapping=cfg)
            srcs.append([k.source for k in fn.kernels])
        assert srcs[0] == srcs[1], name


def test_batched_matmul_with_unit_batch_dim_and_epilogue():
    # Regression: size-1 dims are not loop dims, so the accumulator's subscript has more
    # dims than the statement; detection used to crash in isl (identity of unequal spaces).
    a = te.placeholder((1, 2, 33, 16), name="a")
    b = te.placeholder((1, 2, 16, 40), name="b")
    fn = polyfuse.compile(inputs=[a, b], outputs=[ops.mul(ops.matmul(a, b), 0.5)], check_cuda=False)
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((1, 2, 33, 16), (1, 2, 16, 40))
    _check_all_orders(fn, arrays, 0.5 * (arrays[0].astype(np.float64) @ arrays[1]))


def test_operand_read_twice_keeps_correct_kernel():
    # Regression: matmul(a, a) reads a through two accesses; promoting one footprint for both
    # indexed the shared tile out of range (the emulator crashed).
    a = te.placeholder((40, 40), name="a")
    fn = polyfuse.compile(inputs=[a], outputs=[ops.matmul(a, a)], check_cuda=False)
    (arr,) = _rng_arrays((40, 40))
    _check_all_orders(fn, [arr], arr.astype(np.float64) @ arr)


def test_epilogue_reads_promoted_operand_from_global():
    # Regression: the epilogue's read of a (a residual that is also the left operand) was
    # rewritten to a's shared k-tile (the CUDA did not even compile).
    a, w = te.placeholder((40, 40), name="a"), te.placeholder((40, 40), name="w")
    fn = polyfuse.compile(inputs=[a, w], outputs=[ops.add(ops.matmul(a, w), a)], check_cuda=False)
    assert len(_gemm_kernels(fn)) == 1
    arrays = _rng_arrays((40, 40), (40, 40))
    _check_all_orders(fn, arrays, arrays[0].astype(np.float64) @ arrays[1] + arrays[0])
