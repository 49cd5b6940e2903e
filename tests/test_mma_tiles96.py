"""Tensor-core block tiles 96 wide (64x96, 96x64, 128x96, 96x128 of 4 warps, forced by
``MappingConfig.mma_tile``), and scalar fills of 4-warp tiles without bank conflicts.

A GEMM whose side is no multiple of the power-of-two tiles runs a last round of blocks on a
few SMs: BERT-base's FFN down projection (1024 x 768 x 3072) makes 192 blocks of 64x64 on
132 SMs (60 SMs run two); 96x64 makes 132. The cost model prices 96x64 24.6 us against 31.4,
but its hot loop has more other instructions per HMMA (2.5 in SASS) and the model is most
optimistic on such loops, so the 96-wide tiles are not the model's candidates until a GPU day
measures them (``benchmarks/gpu_cases.py``: ``ffn_down_bf16`` beside ``ffn_down_bf16_t96x64``).

Their shared tiles are filled by scalar copies where the array's rows are no whole 16-byte
chunks: 128 threads do not divide a 96-wide row, and the element-order copy wrote two
16-column blocks of the swizzled tile from one warp at addresses 1 KB apart (2-way bank
conflicts), as did a 128- or 256-wide row on 4 warps (copied one row per trip); such a copy
now walks the blocked order (two rows of one block per 32 lanes).
"""

from __future__ import annotations

import pytest
from hmma_loops import hmma_loop
from test_tensorize import _matmul
from test_tensorize_pipeline import _run_all_modes

import polyfuse
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig

TILES96 = [(64, 96, 2, 2), (96, 64, 2, 2), (128, 96, 2, 2), (96, 128, 2, 2)]


def _compile(inputs, out, tile, arch="sm_80"):
    cfg = MappingConfig(mma_tile=tile)
    return polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)


def _conflicts(fn, arrays, want, dtype) -> list[str]:
    """The shared accesses with bank conflicts on one run (its result checked)."""
    got = fn(*arrays, race_check="banks")
    assert tolerance(dtype).allclose(got, want.astype(numpy_dtype(dtype)))
    return [str(s) for t in fn.last_traffic for s in t.shared_banks if s.conflicts]


@pytest.mark.parametrize("tile", TILES96)
@pytest.mark.parametrize(
    "dtype,trans_a,trans_b",
    [("bfloat16", False, False), ("float16", True, True), ("float16", True, False)],
)
def test_96_wide_tiles_match_float64_at_odd_sizes_without_bank_conflicts(
    tile, dtype, trans_a, trans_b
):
    """75 x 211 x 72 with bias + GELU: partial tiles on every side, rows of 211 (no whole
    16-byte chunks: scalar fills of n-innermost operands), correct in every race mode, no
    shared access with a bank conflict (before: the scalar fills of the 96-wide operand, 2
    wavefronts per request)."""
    inputs, out, arrays, want = _matmul(
        dtype, 75, 211, 72, trans_a=trans_a, trans_b=trans_b, epilogue=True
    )
    fn = _compile(inputs, out, tile)
    (k,) = fn.kernels
    bm, bn, wm, wn = tile
    assert f"block tile {bm}x{bn}x32 of {wm * wn} warps" in k.notes[0]
    assert _conflicts(fn, arrays, want, dtype) == []
    _run_all_modes(fn, dtype, arrays, want)


@pytest.mark.parametrize("tile", [(64, 128, 2, 2), (128, 64, 2, 2), (64, 256, 1, 4)])
@pytest.mark.parametrize("dtype,trans", [("bfloat16", False), ("float16", True)])
def test_wide_tiles_on_4_warps_fill_by_scalar_copies_without_bank_conflicts(tile, dtype, trans):
    """The same at the power-of-two widths of 4-warp tiles: a 128- or 256-wide row on 128
    threads was copied one row per trip, each warp across two 16-column blocks (2-way
    conflicts on the n-innermost operand's fills)."""
    inputs, out, arrays, want = _matmul(dtype, 75, 211, 72, trans_a=trans, trans_b=trans)
    assert _conflicts(_compile(inputs, out, tile), arrays, want, dtype) == []


def test_96_wide_tiles_at_aligned_sizes_fill_by_cp_async_without_bank_conflicts():
    inputs, out, arrays, want = _matmul("bfloat16", 128, 192, 64)
    for tile in TILES96[:2]:
        fn = _compile(inputs, out, tile)
        assert "pf_cp_async16(" in fn.kernels[0].source
        assert _conflicts(fn, arrays, want, "bfloat16") == []


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sass_of_96_wide_tiles(arch):
    """1024 x 1152 x 1024 bf16 per k-tile, no spill: 64x96 and 96x64, 24 HMMA, 10 LDSM, 5
    LDGSTS, 55-60 others (1 HMMA per 2.3-2.5); 128x96 and 96x128, 48 HMMA, 14 LDSM, 7 LDGSTS,
    65-72 others (1 per 1.4-1.5, the issue's 1 per 2), 194-204 registers. Now their steady
    states are unrolled by their stages (no stage counters): 33-43 others (1.4-1.8) and 43-60
    (0.9-1.25), 146-168 and 232-254 registers."""
    inputs, out, _, _ = _matmul("bfloat16", 1024, 1152, 1024)
    for tile in TILES96:
        fn = _compile(inputs, out, tile, arch)
        (k,) = fn.kernels
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        res = binary.resources[k.function]
        hmma, ldsm, ldgsts, other = hmma_loop(binary, arch, k.function)
        assert res.spill_stores == res.spill_loads == 0, (tile, res)
        big = tile[0] * tile[1] > 96 * 64
        assert (hmma, ldsm, ldgsts) == ((48, 14, 7) if big else (24, 10, 5)), (tile, hmma)
        assert other <= (1.3 if big else 2.0) * hmma, (tile, hmma, other)


def test_an_odd_k_tile_count_and_96_rows_run_the_pipelined_loop():
    """96x64 with 3 stages over k 200 (7 k-tiles, the last partial) on a batched GEMM whose
    rows (97) end mid-tile."""
    inputs, out, arrays, want = _matmul("bfloat16", 97, 72, 200, batch=2)
    cfg = MappingConfig(mma_tile=(96, 64, 2, 2), gemm_stages=3)
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False, mapping=cfg)
    notes = " ".join(fn.kernels[0].notes)
    assert "block tile 96x64x32" in notes and "stages: 3 stages (forced)" in notes, notes
    _run_all_modes(fn, "bfloat16", arrays, want)


def test_96x64_is_modelled_faster_for_bert_ffn_down_but_not_taken_unforced():
    """The GPU-day pair: on sm_90 the model keeps 64x64 (192 blocks) for 1024 x 768 x 3072;
    forced, 96x64 makes 132 blocks, one per SM, modelled below the model's pick."""
    inputs, out, _, _ = _matmul("bfloat16", 1024, 768, 3072)
    model = polyfuse.compile(inputs, [out], arch="sm_90", check_cuda=False).kernels[0].notes[0]
    forced = _compile(inputs, out, (96, 64, 2, 2), "sm_90").kernels[0].notes[0]
    assert "block tile 64x64x32 of 4 warps" in model and "(192 blocks" in model, model
    assert "block tile 96x64x32 of 4 warps, each 3x4 mma tiles of 16x8 (132 blocks" in forced

    def us(note: str) -> float:
        return float(note.split("modelled ")[1].split(" us")[0])

    assert us(forced) < 0.85 * us(model), (forced, model)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sass_of_scalar_fills_in_the_blocked_order(arch):
    """1000 x 1001 x 1000 bf16 (rows of 1001: scalar fills of ``b``) per k-tile loop
    iteration, no spill. Others per k-tile before / after the blocked order (sm_80, sm_90):
    64x96 264 / 268 -> 214, 64x256 274 / 278 -> 219 (the element loop's divisions by 96 and
    256 gone); 64x128 194 / 202 -> 216 (the row-per-trip loop kept its column per thread; the
    blocked order computes it per element), in exchange for half the shared wavefronts of its
    32 scalar stores per thread and k-tile (2-way conflicts before)."""
    inputs, out, _, _ = _matmul("bfloat16", 1000, 1001, 1000)
    for tile, hmma_want, most in (((64, 96, 2, 2), 24, 214), ((64, 256, 1, 4), 64, 219),
                                  ((64, 128, 2, 2), 32, 216)):  # fmt: skip
        fn = _compile(inputs, out, tile, arch)
        (k,) = fn.kernels
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        res = binary.resources[k.function]
        hmma, _, _, other = hmma_loop(binary, arch, k.function)
        assert res.spill_stores == res.spill_loads == 0, (tile, res)
        assert hmma == hmma_want and other <= most, (tile, hmma, other)
