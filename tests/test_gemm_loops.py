"""GEMM loop code (issue 20 item 2): the decisions of poly/gemm_loops.py, poly/select_free.py,
poly/tile_box.py, poly/tile_fit.py and the passes that carry them out (cuda/codegen/lower_loops.py,
cuda/codegen/lower_addresses.py), on small before/after pairs and on emulated kernels in every race
mode. The SASS-level thresholds are in tests/test_loop_quality.py."""

from __future__ import annotations

import re

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import examples, te
from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.cuda.codegen.kernel_ast import (
    KCopy,
    KDef,
    KernelIR,
    KFor,
    KIf,
    KInt,
    KOp,
    KParam,
    KStmt,
    KVar,
)
from polyfuse.cuda.codegen.lower_addresses import linear, strength_reduce
from polyfuse.cuda.codegen.lower_loops import peel_loop, unroll_loops
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.poly.copy_layout import copies_per_thread, thread_extents
from polyfuse.poly.device import H100, device_for_arch
from polyfuse.poly.gemm_loops import (
    REGISTER_MARGIN,
    CopyLoops,
    launch_bound,
    plan_gemm_loops,
    register_cap,
    unrolled_steps,
)
from polyfuse.poly.tile_box import tile_box
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")  # in order; reversed between barriers; shadow-memory races


def _ir(body) -> KernelIR:
    params = (KParam("a", "const float*", "a"),)
    return KernelIR("k", (("b0", 4),), (("t0", 64),), tuple(body), ("mg0",), params=params)


def _gemm_records(fn) -> dict[str, list]:
    out: dict[str, list] = {}
    for r in fn.plan.records():
        if DecisionKind.GEMM_LOOP in r.kinds:
            out.setdefault(r.data["what"], []).append(r)
    return out


# ------------------------------------------------------------------------ decisions, small


def test_reduction_steps_unrolled_innermost_first_within_the_limit():
    # a k-tile of 8 steps of an 8x8 micro-tile: whole
    assert unrolled_steps([8], 64) == ([0], [])
    # a conv's 8 channels x 3 x 3 window: the window whole, the channel loop kept
    assert unrolled_steps([8, 3, 3], 64) == ([1, 2], [0])
    loops = plan_gemm_loops("U", [8, 3, 3], (64, 64, 8, 8, 8), 64, 6336, 1, "", [], [], H100)
    assert ("kk0", "U", 8, 2) in loops.unroll  # by 2: 2 x 576 <= 2048 < 4 x 576
    assert {("kk1", "U", 3, 0), ("kk2", "U", 3, 0)} <= set(loops.unroll)
    kinds = [d.data["what"] for d in loops.decisions]
    assert kinds[:2] == ["unroll", "unroll by"] and "keep loop" in kinds


def test_launch_bounds_leave_a_margin_above_the_estimate_else_bound_at_it():
    """A cap at the micro-tile's estimate, or 8 above it, made ptxas spill (a 1x1 conv's
    64x64 block of 8x8 tiles at 128 registers: 24 B in the hot loop): the bound leaves
    REGISTER_MARGIN registers above the estimate."""
    assert REGISTER_MARGIN == 16
    # 8x8 tile, 64 threads, pipelined: 120 registers estimated -> 6 blocks of <= 168 (136
    # registers leave 3 warps per scheduler; not 8 blocks of <= 128)
    piped = plan_gemm_loops("U", [8], (64, 64, 8, 8, 8), 64, 1088, 2, "kt0", [], [], H100)
    assert (piped.min_blocks, piped.register_cap) == (6, 168)
    # 256 threads: 136 registers leave room for one block only, but the estimate (120) fits
    # two: bound at the estimate (unbound, ptxas took 124-130 registers: one block or two by
    # chance; with (256, 2) 128 and no spills, sm_80 and sm_90)
    big = plan_gemm_loops("U", [8], (128, 128, 8, 8, 8), 256, 2080, 2, "kt0", [], [], H100)
    assert (big.min_blocks, big.register_cap) == (2, 128)
    assert launch_bound(256, 120, 2080 * 8, H100) == (2, 128)
    assert launch_bound(256, 136, 2080 * 4, H100) == (0, 0)  # not even the estimate fits two
    # synchronous copies hold their vectors in registers: 136 + 16, one block, no bound
    copies = [CopyLoops("C_a", "a", ("x0", "x1"), (1, 1))]
    sync = plan_gemm_loops("U", [8], (128, 128, 8, 8, 8), 256, 2080, 1, "", copies, [], H100)
    assert sync.min_blocks == 0 and not sync.peel
    assert "launch bounds" not in [d.data["what"] for d in sync.decisions]
    # 4x4 tile, 256 threads: 64 estimated -> 3 blocks of <= 80 (not 4 of <= 64)
    small = plan_gemm_loops("U", [8], (64, 64, 4, 4, 8), 256, 1088, 2, "kt0", [], [], H100)
    assert (small.min_blocks, small.register_cap) == (3, 80)


def test_register_caps_are_what_ptxas_caps_launch_bounds_at():
    """The register file is split between an SM's four partitions: ``__launch_bounds__(64,
    5)`` (10 warps, 3 in the fullest partition) caps a thread at 168 registers, not 65536 /
    320 = 204 (the cap the bound was planned and recorded with)."""
    for threads, blocks, cap in [(64, 5, 168), (64, 6, 168), (32, 10, 168), (96, 5, 128),
                                 (128, 3, 168), (64, 8, 128), (256, 2, 128), (64, 4, 255)]:
        assert register_cap(threads, blocks, H100) == cap, (threads, blocks)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_ptxas_caps_a_register_hungry_kernel_at_register_cap(arch):
    """NVRTC: a kernel that wants every register gets exactly :func:`register_cap` under
    ``__launch_bounds__(threads, blocks)``."""
    body = (
        "float acc[256];\n#pragma unroll\nfor (int i = 0; i < 256; i++) acc[i] = in[i * 7 + "
        "threadIdx.x];\nfor (int k = 0; k < n; k++) {\n#pragma unroll\nfor (int i = 0; i < "
        "256; i++) acc[i] = acc[i] * acc[(i + 1) % 256] + in[k];\n}\nfloat s = 0;\n#pragma "
        "unroll\nfor (int i = 0; i < 256; i++) s += acc[i] * (float)i;\nout[threadIdx.x] = s;"
    )
    for threads, blocks in [(64, 5), (96, 5), (128, 3), (256, 2)]:
        src = (
            f'extern "C" __global__ void __launch_bounds__({threads}, {blocks}) '
            f"kern(float* out, const float* in, int n) {{\n{body}\n}}"
        )
        got = compile_cuda(src, arch, compiler="nvrtc").resources["kern"].registers
        assert got == register_cap(threads, blocks, H100), (threads, blocks, got)


def test_launch_bounds_ask_no_more_blocks_per_sm_than_the_grid_gives():
    """DeepFM's deep-tower GEMMs (512 x 400, 104 blocks of 64 threads) were bounded to 8
    blocks/SM, a 128-register cap for 0.1 waves, and spilled 104 bytes on sm_80 (NVRTC 13.0);
    a grid that gives an SM at most ``ceil(blocks / SMs)`` blocks asks no more."""
    assert launch_bound(64, 84, 12800, H100) == (8, 128)
    assert launch_bound(64, 84, 12800, H100, grid=104) == (0, 0)  # one block an SM: no bound
    assert launch_bound(64, 84, 12800, H100, grid=3 * H100.sms) == (3, 255)
    assert launch_bound(64, 84, 12800, H100, grid=3 * H100.sms + 1) == (4, 255)
    assert launch_bound(64, 84, 12800, H100, grid=100 * H100.sms) == (8, 128)
    few = plan_gemm_loops("U", [8], (64, 64, 8, 8, 8), 64, 1088, 2, "kt0", [], [], H100, 40)
    assert (few.min_blocks, few.register_cap) == (0, 0)
    assert "launch bounds" not in [d.data["what"] for d in few.decisions]


def test_deepfm_compiles_without_a_spill():
    """The whole DeepFM at full size on sm_80 and sm_90: no kernel spills (its two 104-block
    GEMMs spilled 104 bytes each under ``__launch_bounds__(64, 8)``)."""
    from polyfuse import zoo
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")
    m = zoo.build("deepfm", "full", weights="zeros")
    for arch in ("sm_80", "sm_90"):
        fn = polyfuse.compile(m.inputs, m.outputs, arch, check_cuda=False, constants=m.constants)
        assert not any("__launch_bounds__(64, 8)" in k.source for k in fn.kernels)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        spilled = {f: r.spill_stores + r.spill_loads for f, r in binary.resources.items()}
        assert not any(spilled.values()), (arch, spilled)


def test_copy_grid_takes_the_fewest_copies_per_thread():
    # a conv input box 1x8x3x72 (18 vectors a row) over 64 threads: 9 copies each, not 16
    assert thread_extents([1, 8, 3, 72], 4, 64) == [1, 8, 1, 8]
    assert copies_per_thread([1, 8, 3, 72], 4, [1, 8, 1, 8]) == 9
    # conv weights viewed as 64x72: every thread busy, 18 copies each
    assert thread_extents([64, 72], 4, 64) == [32, 2]
    # where innermost-first is already as good, it stays
    assert thread_extents([16, 8], 4, 256) == [128, 2]
    assert thread_extents([8, 128], 4, 256) == [8, 32]


def test_tile_box_merges_whole_inner_dims_and_aligns_a_shifted_row():
    ctx = isl.Context()
    ranges = isl.Set("[b, kt] -> { : 0 <= b < 7 and 0 <= kt < 8 }", context=ctx)
    # conv weights w[o, c, kh, kw] (64 x 64 x 3 x 3), k-tiles of 8 channels: 64x72 of 64x576
    hull = isl.Map("{ S[o, c, kh, kw] -> w[o, c, kh, kw] }", context=ctx)
    tile = isl.Set(
        "[b, kt] -> { S[o, c, kh, kw] : 0 <= o < 64 and 8kt <= c < 8kt + 8 and "
        "0 <= kh < 3 and 0 <= kw < 3 }",
        context=ctx,
    )
    box = tile_box("w", hull, tile, ranges, (64, 64, 3, 3))
    assert not isinstance(box, Refusal)
    assert (box.size, box.shape, box.proof.width) == ([64, 72], (64, 576), 4)
    assert box.merge == ((1, 0, 0, 0), (0, 9, 3, 1))
    # a padded conv's input row x[.., 8b + j + kw - 1]: 10 columns from 8b - 1 -> 16 from
    # 8b - 4 (3 earlier, rounded up to whole vectors)
    hull = isl.Map("{ S[j, kw] -> x[j + kw - 1] }", context=ctx)
    tile = isl.Set("[b, kt] -> { S[j, kw] : 8b <= j < 8b + 8 and 0 <= kw < 3 }", context=ctx)
    box = tile_box("x", hull, tile, ranges, (56,))
    assert not isinstance(box, Refusal)
    assert box.size == [16] and box.proof.width == 4 and "widened 10 -> 16" in box.notes[0]
    assert box.lo_t == ["(-1 + 8b) - 3"]


# -------------------------------------------------------------------- passes, before/after


def test_peel_splits_the_pipelined_loop_where_its_bound_tests_change():
    copy = KCopy("s", (KInt(0),), "a", (KVar("kt"),), src_shape=(64,))
    use = KCopy("r", (KInt(0),), "s", (KInt(0),), src_shape=(4,))
    loop = KFor(
        "kt",
        KInt(-1),
        KOp("<=", (KVar("kt"), KInt(7))),
        1,
        [
            KIf(KOp("<=", (KVar("kt"), KInt(6))), [copy]),
            KIf(KOp(">=", (KVar("kt"), KInt(0))), [use]),
        ],
    )
    first, steady, last = peel_loop(_ir([loop]), "kt").body
    assert isinstance(first, KDef) and first.value == KInt(-1) and first.body == (copy,)
    assert isinstance(steady, KFor) and (steady.init, steady.cond) == (
        KInt(0),
        KOp("<=", (KVar("kt"), KInt(6))),
    )
    assert steady.body == (copy, use)  # no tests left
    assert isinstance(last, KDef) and last.value == KInt(7) and last.body == (use,)


def test_strength_reduction_advances_a_pointer_per_k_tile():
    # a[(64 b0 + t0) * 64 + 8 kt + 4 q]: start at kt = 0, +8 per k-tile, 4 q from the pointer
    row = KOp("+", (KOp("*", (KInt(64), KVar("b0"))), KVar("t0")))
    col = KOp("+", (KOp("*", (KInt(8), KVar("kt"))), KOp("*", (KInt(4), KVar("q")))))
    copy = KCopy("s", (KVar("q"),), "a", (row, col), src_shape=(256, 64), width=4)
    inner = KFor("q", KInt(0), KOp("<=", (KVar("q"), KInt(1))), 1, [copy], unroll=True)
    loop = KFor("kt", KInt(0), KOp("<=", (KVar("kt"), KInt(7))), 1, [inner])
    (out,) = strength_reduce(_ir([loop]), ["kt"]).body
    (stream,) = out.streams
    assert stream.array == "a" and stream.step == 8
    assert linear(stream.start) == {"b0": 4096, "t0": 64}
    (new,) = out.body[0].body
    assert new.stream == stream.name and linear(new.stream_offset) == {"q": 4}
    # a copy whose offset is not affine keeps its address
    odd = KCopy("s", (KInt(0),), "a", (KOp("%", (KVar("kt"), KInt(2))),), src_shape=(64,))
    loop = KFor("kt", KInt(0), KOp("<=", (KVar("kt"), KInt(7))), 1, [odd])
    (out,) = strength_reduce(_ir([loop]), ["kt"]).body
    assert not out.streams and out.body == (odd,)


def test_copy_loop_with_a_thread_dependent_bound_runs_its_most_trips_guarded():
    bound = KOp("+", (KOp("neg", (KOp("/", (KVar("p"), KInt(64))),)), KInt(1)))
    loop = KFor("q", KInt(0), KOp("<=", (KVar("q"), bound)), 1, [KStmt("C_x", (KVar("q"),))])
    (out,) = unroll_loops(_ir([loop]), [("q", "C_x", 2, 0)], 3).body
    assert out.unroll and out.cond == KOp("<=", (KVar("q"), KInt(1)))
    (guard,) = out.body
    assert isinstance(guard, KIf) and guard.cond == loop.cond
    assert unroll_loops(_ir([loop]), [("q", "C_y", 2, 0)]).body[0].unroll is False


# ------------------------------------------------------------------ emulated, every mode


@pytest.mark.parametrize("arch", ["sm_75", "sm_90"])
def test_conv_select_free_folded_tile_correct_in_every_mode(arch):
    """A padded 3x3 conv: the select is dropped (isl's proof), the 24-column tile folds over
    rows x columns, copies are float4; the emulated result matches in every race mode. 48
    channels: more than one k-tile whatever the tiling (k-tiles of 8 to 32 channels), so the
    copies stream their addresses across k-tiles."""
    ins, outs, _ = examples.conv2d_relu(batch=2, channels=48, size=24, filters=32)
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
    recs = _gemm_records(fn)
    assert [r.data["tensor"] for r in recs["select free"]] == ["x"]
    assert {"unroll", "unroll copies", "strength reduction"} <= set(recs)
    # the launch bound asks for no more blocks per SM than the grid gives one (launch_bound)
    (bound,) = recs.get("launch bounds", [None])
    per_sm = -(-fn.kernels[0].grid[0] // device_for_arch(arch).sms)
    assert bound is None if per_sm == 1 else bound.data.min_blocks <= per_sm
    (k,) = fn.kernels
    update = [ln for ln in k.source.splitlines() if "_acc[" in ln and "_frag[" in ln and "+" in ln]
    assert update and all("?" not in ln for ln in update)  # one FFMA per term
    assert "column tile of" in "\n".join(k.notes)  # folded over two data dims
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    (want,) = evaluate(outs, dict(zip(ins, arrays, strict=True)))
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"mode {mode}")


def test_select_on_elements_inside_the_array_is_kept():
    """``where(k <= i, a[i, k], 0)`` zeroes elements that exist: isl finds no proof, the select
    stays, and the result is the masked product."""
    a = te.placeholder((40, 48), name="a")
    b = te.placeholder((48, 36), name="b")
    k = te.reduce_axis(48, name="k")
    c = te.compute(
        (40, 36),
        lambda i, j: te.sum(te.where(k <= i, a[i, k], 0.0) * b[k, j], axis=k),
        name="c",
    )
    fn = polyfuse.compile([a, b], [c], "sm_90", check_cuda=False)
    assert "select free" not in _gemm_records(fn)
    assert re.search(r"\? r_a_frag\[|\? s_a\[", fn.kernels[0].source)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in (a, b)]
    (want,) = evaluate([c], dict(zip([a, b], arrays, strict=True)))
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"mode {mode}")


def test_matmul_plan_records_every_loop_decision():
    # enough blocks that a launch bound asks for more than one per SM
    ins, outs, _ = examples.matmul_bias_gelu(2048, 256, 2048)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    recs = _gemm_records(fn)
    assert {"unroll", "peel", "strength reduction", "launch bounds", "padding"} <= set(recs)
    (lb,) = recs["launch bounds"]
    src = fn.kernels[0].source
    assert f"__launch_bounds__({lb.data['threads']}, {lb.data['min_blocks']})" in src
    (steps,) = recs["unroll"]
    tk = steps.data["steps"]
    assert re.search(rf"#pragma unroll\n\s*for \(int kk0 = 0; \(kk0 <= {tk - 1}\)", src)
    assert re.search(r"const float\* pf_gp0_a = &a\[", src) and "pf_gp0_a += " in src
    assert recs["padding"][0].data == {"what": "padding", "waste": 0.0, "explained": True}
