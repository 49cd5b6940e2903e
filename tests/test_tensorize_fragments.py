"""Register fragments double-buffered across the k-steps (issue 23 item 2, ALCOP's second
level: :mod:`polyfuse.poly.tensorize_fragments` decides, :mod:`polyfuse.cuda.codegen.
lower_mma_fragments` writes the loop).

Correct against float64 numpy in the emulator's race-check modes at S = 2 and 3, bit for bit
what the single-buffered kernel computes (the mma order is the same); the pass's text before
and after; the register budget's refusal and the other refusals with their reasons; a planted
wrong buffer index is caught. NVRTC sm_80 / sm_90 without spills and the SASS figures:
test_tensorize_pipeline (its default-mapped kernels are double-buffered).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tensorize import CASES, ODD, _matmul
from test_tensorize_pipeline import MODES, ODD_ALIGNED, ODD_ALIGNED_T

import polyfuse
from polyfuse.cuda.codegen import lower_mma_fragments
from polyfuse.cuda.codegen.c_text import c_index
from polyfuse.cuda.codegen.kernel_arith import add, band, div, mul
from polyfuse.cuda.codegen.kernel_ast import KInt, KLdmatrix, KMma, KRef, KRegisters, KVar
from polyfuse.cuda.codegen.lower_mma_fragments import KStep, buffered, single_buffered
from polyfuse.cuda.codegen.printer import _Emitter
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly import tensorize_tiling
from polyfuse.poly.mapping import MappingConfig

DOUBLE = "tensor cores: fragments double-buffered across the 2 k-steps"
#: 64x64 blocks of four warps, each 2x4 mma tiles (what the texts below show)
SMALL = (64, 64, 2, 2)


def _compile(inputs, out, stages, buffers, arch="sm_80", tile=None):
    cfg = MappingConfig(gemm_stages=stages, mma_fragment_buffers=buffers, mma_tile=tile)
    return polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)


def _note(fn) -> str:
    (note,) = [n for n in fn.kernels[0].notes if "fragments" in n and "buffer" in n]
    return note


@pytest.mark.parametrize("stages", [3, pytest.param(4, marks=pytest.mark.slow)])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_double_buffered_fragments_match_float64_and_the_single_buffered_bits(dtype, stages):
    """Batched x @ W^T + bias + GELU, and A stored k-by-m (ldmatrix.trans), at odd M, N, K
    over 7 k-tiles (a partial last one): every race-check mode against float64 numpy, and
    the same bits as the single-buffered kernel. (S = 4 in the slow tier; the fast tier's
    default-mapped S = 3..4 kernels of test_tensorize_pipeline are double-buffered too.)"""
    for case, modes in (("batched_trans_b_epilogue", MODES), ("trans_a", (True,))):
        size = ODD_ALIGNED_T if case == "trans_a" else ODD_ALIGNED
        inputs, out, arrays, want = _matmul(dtype, *size, **CASES[case])
        fn = _compile(inputs, out, stages, 2)
        assert _note(fn).startswith(DOUBLE + " (forced)")
        assert "// two fragment buffers" in fn.kernels[0].source
        w = want.astype(numpy_dtype(dtype))
        for race in modes:
            got = fn(*arrays, device="emulate", race_check=race)
            err = np.abs(got.astype(np.float64) - w.astype(np.float64)).max()
            assert tolerance(dtype).allclose(got, w), (case, race, err)
        single = _compile(inputs, out, stages, 1)
        assert "// two fragment buffers" not in single.kernels[0].source
        assert np.array_equal(single(*arrays, device="emulate"), got, equal_nan=True), case


def _print(nodes) -> list[str]:
    """Nodes as the kernel printer writes them, unindented."""
    return [ln.strip() for ln in _Emitter({})(list(nodes), 0)]


def test_the_pass_text_before_and_after():
    """One k-step's nodes (a hand-built KStep), single-buffered as the k-tile loop has it,
    then on a buffer and k-step of the double-buffered loop: the rotation substitutes the
    buffer index and ``pf_ks`` on the nodes (the buffer expression itself may read the loop's
    ``pf_ks``: not substituted); and in a kernel the loop's order: k-step 0 loaded before
    the loop, k-step 1 loaded into buffer 1 before k-step 0's mma on buffer 0, then the wait,
    the barrier, the next k-tile's k-step 0 into buffer 0 from the next stage, and k-step 1's
    mma on buffer 1."""
    ks = KVar("pf_ks")
    step = KStep(
        (KRegisters("pf_fa", "unsigned", (1, 4), "fragment"),
         KRegisters("pf_fb", "unsigned", (1, 4), "fragment")),
        (KLdmatrix(KRef("pf_fa", (KInt(0),)), KRef("pf_sa", (mul(64, div(ks, 16)),)), 4),
         KLdmatrix(KRef("pf_fb", (KInt(0),)), KRef("pf_sb", (ks,)), 4, True)),
        (KMma("mma", (16, 8, 16), KRef("pf_acc"), KRef("pf_fa", (KInt(0),)),
              KRef("pf_fb", (KInt(0),))),),
        32,
        16,
    )  # fmt: skip
    assert _print(single_buffered(step)) == [
        "#pragma unroll",
        "for (int pf_ks = 0; (pf_ks < 32); pf_ks += 16) {",
        "unsigned pf_fa[1][4];",
        "unsigned pf_fb[1][4];",
        "pf_ldmatrix_x4(pf_fa[0], &pf_sa[(64 * (pf_ks / 16))]);",
        "pf_ldmatrix_x4_trans(pf_fb[0], &pf_sb[pf_ks]);",
        "mma(pf_acc, pf_fa[0], &pf_fb[0], pf_acc);",
        "}",
    ]
    now, last = lower_mma_fragments.mma_buffers(step)
    assert (c_index(now), c_index(last)) == ("((pf_ks / 16) & 1)", "1")
    ahead = buffered(step, step.loads, band(add(div(ks, 16), 1), 1), add(ks, 16))
    assert _print(ahead) == [
        "pf_ldmatrix_x4(pf_fa[(((pf_ks / 16) + 1) & 1)][0], &pf_sa[(64 * ((pf_ks + 16) / 16))]);",
        "pf_ldmatrix_x4_trans(pf_fb[(((pf_ks / 16) + 1) & 1)][0], &pf_sb[(pf_ks + 16)]);",
    ]
    assert _print(buffered(step, step.mma, last, KInt(16))) == [
        "mma(pf_acc, pf_fa[1][0], &pf_fb[1][0], pf_acc);"
    ]
    inputs, out, _, _ = _matmul("bfloat16", *ODD_ALIGNED)
    before = _compile(inputs, out, 3, 1, tile=SMALL).kernels[0].source
    after = _compile(inputs, out, 3, 2, tile=SMALL).kernels[0].source
    assert "unsigned pf_fa[2][4];" in before  # per k-step, in its loop
    assert "// two fragment buffers" not in before
    assert "__syncthreads();  // ... for every thread; k-tile pf_kt - 1 is read" in before
    steady = after[after.index("  for (int pf_kt = 0;") :].split("\n  }\n")[0].splitlines()

    def at(text: str, start: int = 0) -> int:
        return next(i for i, ln in enumerate(steady) if i >= start and text in ln)

    assert "  unsigned pf_fa[2][2][4];  // two fragment buffers" in after
    assert "  unsigned pf_fb[2][2][4];" in after
    prologue = after[: after.index("  for (int pf_kt = 0;")]
    assert "pf_ldmatrix_x4(pf_fa[0][pf_i], &pf_sa[" in prologue  # k-step 0 of k-tile 0
    commit = at("__pipeline_commit();")
    ahead = at("pf_ldmatrix_x4(pf_fa[(((pf_ks / 16) + 1) & 1)][pf_i]", commit)
    now = at("pf_fa[((pf_ks / 16) & 1)][pf_i], &pf_fb[((pf_ks / 16) & 1)][(pf_j / 2)]", ahead)
    wait = at("__pipeline_wait_prior(1);", now)
    barrier = at("__syncthreads();  // ... for every thread; k-tile pf_kt is read", wait)
    # the next k-tile's stage: a constant once the steady loop is unrolled by its 3 stages
    assert "  #pragma unroll 3\n  for (int pf_kt = 0;" in after
    stage = at("pf_sa = (s_a + (((pf_kt + 1) % 3) * ", barrier)
    first = at("pf_ldmatrix_x4(pf_fa[0][pf_i], &pf_sa[", stage)
    last = at("pf_fa[1][pf_i], &pf_fb[1][(pf_j / 2)]", first)
    # the last k-step's mma: its loop's lines (the mma, two closing braces) end the k-tile
    assert last == len(steady) - 3 and "__syncthreads" not in "".join(steady[:barrier])


def test_the_register_budget_and_the_loop_shape_refuse_with_the_reason(monkeypatch):
    """Warps of 6x6 mma tiles: 220 modelled registers, 36 more for the second buffer: over
    255, refused (model and forced alike), the kernel single-buffered; one stage or scalar
    fills: refused (the next k-tile's fragments come after the fill that overwrites its
    stage); the model takes two buffers where they fit, forced 1 keeps one."""
    inputs, out, _, _ = _matmul("bfloat16", *ODD_ALIGNED, trans_b=True)
    fn = _compile(inputs, out, 3, None)
    assert _note(fn).startswith(DOUBLE + " (the register model)"), _note(fn)
    (rec,) = [r for r in fn.plan.records() if r.data.get("what") == "tensorize"]
    assert rec.data["fragment_buffers"] == 2
    assert _note(_compile(inputs, out, 3, 1)) == (
        "tensor cores: single-buffered fragments (forced: mma_fragment_buffers=1)"
    )
    one = _compile(inputs, out, 1, 2)
    assert _note(one) == (
        "tensor cores: single-buffered fragments: double buffering refused (forced): one "
        "shared stage (the next k-tile's fragments are only ready after the fill that "
        "overwrites it)"
    )
    assert "// two fragment buffers" not in one.kernels[0].source
    two = _compile(inputs, out, 2, 2)  # two stages: measured slower double-buffered (H100)
    assert _note(two) == (
        "tensor cores: single-buffered fragments: double buffering refused (forced): 2 shared "
        "stages (the next k-tile is waited for before the last k-step, half a k-tile early: "
        "measured on an H100, 4096^3 bf16, 0.684 ms against 0.589 single-buffered; at three "
        "stages 0.477)"
    )
    scalar_in, scalar_out, _, _ = _matmul("float16", *ODD)  # unaligned rows: scalar fills
    assert "one shared stage" in _note(_compile(scalar_in, scalar_out, None, None))
    monkeypatch.setattr(tensorize_tiling, "TILINGS", ((96, 96, 1, 2),))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    for forced, how in ((None, "the register model"), (2, "forced")):
        fn = _compile(inputs, out, 3, forced)
        assert "block tile 96x96x32 of 2 warps, each 6x6 mma tiles" in fn.kernels[0].notes[0]
        assert _note(fn) == (
            f"tensor cores: single-buffered fragments: double buffering refused ({how}): "
            "220 + 36 + 18 (ptxas, 2 k-steps) = 274 modelled registers > 255 per thread"
        )
        assert "// two fragment buffers" not in fn.kernels[0].source
    with pytest.raises(ValueError, match="mma_fragment_buffers=3: 1 or 2"):
        _compile(inputs, out, 3, 3)


@pytest.mark.parametrize("where", ["k-step loop", "last k-step"])
def test_a_planted_wrong_buffer_index_is_caught(monkeypatch, where):
    """The mma reading the buffer being loaded (in the k-step loop: k-step kk+1's fragments
    multiplied at kk; at the last k-step: the next k-tile's first) gives a wrong product."""
    inputs, out, arrays, want = _matmul("bfloat16", *ODD_ALIGNED, trans_b=True)
    good = lower_mma_fragments.mma_buffers

    def planted(step):
        now, last = good(step)
        if where == "k-step loop":
            return band(add(div("pf_ks", step.mma_k), 1), 1), last
        return now, KInt(1 - last.value)

    monkeypatch.setattr(lower_mma_fragments, "mma_buffers", planted)
    fn = _compile(inputs, out, 3, 2)
    got = fn(*arrays, device="emulate")
    assert not tolerance("bfloat16").allclose(got, want.astype(numpy_dtype("bfloat16")))


def test_a_folded_gathered_conv_keeps_its_fragments_single_buffered_and_does_not_spill():
    """The strided bf16 3x3 conv (columns 28 x 28 folded, x gathered by 16-byte chunks) on
    sm_80 was double-buffered at a modelled 250 registers and spilled 48 bytes (NVRTC 13.0):
    the fold's per-chunk row values now count, the fragments stay single-buffered, and ptxas
    reports no spill."""
    from polyfuse import ops, te
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")
    x = te.placeholder((32, 64, 56, 56), "bfloat16", name="x")
    w = te.placeholder((64, 64, 3, 3), "bfloat16", name="w")
    b = te.placeholder((64,), "bfloat16", name="bias")
    y = ops.relu(ops.conv2d(x, w, b, stride=2, padding=1, name="conv"), name="y")
    cfg = MappingConfig(mma_tile=(64, 256, 1, 4))  # the tile of that spill (the model's then)
    fn = polyfuse.compile([x, w, b], [y], arch="sm_80", check_cuda=False, mapping=cfg)
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    (why,) = [n for n in k.notes if "fragments" in n and "buffer" in n]
    assert "single-buffered fragments: double buffering refused (the register model)" in why
    assert "> 255 per thread" in why
    binary = compile_cuda(fn.cuda_source, "sm_80", compiler="nvrtc")
    res = binary.resources[k.function or k.name]
    assert res.spill_stores + res.spill_loads == 0, res


def _projection(arch: str):
    """ResNet-50's stage-2 projection at full size: a 1x1 stride-2 bf16 conv on a
    channels-last input; the GEMM's rows are the 512 output channels (two block tiles of 256
    exactly), its columns the 28 x 28 output positions folded (784, in tiles of 128): the
    256x128 tile of eight warps forced (the model's until it weighed the waves: 200 blocks on
    108 SMs; 256x64 now)."""
    from polyfuse import te

    x = te.placeholder((8, 56, 56, 256), "bfloat16", name="x")
    w = te.placeholder((512, 256), "bfloat16", name="w")
    c = te.reduce_axis(256, name="c")
    y = te.compute(
        (8, 28, 28, 512),
        lambda n, h, q, o: te.sum(x[n, 2 * h, 2 * q, c] * w[o, c], axis=c),
        name="proj",
    )
    cfg = MappingConfig(mma_tile=(256, 128, 4, 2))
    return polyfuse.compile([x, w], [y], arch=arch, check_cuda=False, mapping=cfg)


def test_rows_that_tiles_cover_exactly_are_not_guarded():
    """The weight tile's 512 rows are two block tiles exactly: its fills test no row (they
    did: one test per chunk a thread copies, live across the loop); the input's 784 folded
    columns in tiles of 128 keep their test."""
    fn = _projection("sm_80")
    (k,) = fn.kernels
    assert DOUBLE in _note(fn)
    assert any("block tile 256x128x32" in n for n in k.notes), k.notes
    assert "(pf_r <= 511)" not in k.source
    assert "(pf_r <= 783)" in k.source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_the_projection_conv_double_buffers_without_a_spill(arch):
    """The projection (double-buffered fragments at a modelled 250 registers, a 64x256 tile
    then) took 255 registers and spilled 8 bytes on sm_80 (NVRTC 13.0) while its weight fills
    tested rows that are always inside: 215 registers without those tests; now it folds its
    output rows into the columns (test_tensorize_conv) and takes 256x128: 209 (sm_80), no
    spill."""
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")
    fn = _projection(arch)
    (k,) = fn.kernels
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    res = binary.resources[k.function or k.name]
    assert res.spill_stores + res.spill_loads == 0, res
    assert res.registers <= 250, res
