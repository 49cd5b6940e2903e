"""Tensor-core GEMMs too small to fill the SMs with 64x64 tiles take smaller ones.

MobileNetV2's 1x1 projections on 7x7 maps (N8: M = 392, N = 160, K = 960, bfloat16) made 21
blocks of the smallest candidate, 64x64, for 132 SMs: 8.2 us modelled where 65 blocks of
32x32 (four warps of 16x16) take 5.5. The candidates now include 64x32, 32x64 and 32x32 blocks
of four warps (:data:`SMALL_TILINGS`), priced where every larger candidate leaves more than a
tenth of the SMs idle (:data:`FILL_SHARE`: 64x64 in 128 blocks on 132 SMs stays).
"""

from __future__ import annotations

import pytest
from kernel_checks import compiles_without_spills, require_sass_tools
from test_tensorize import _matmul
from test_tensorize_pipeline import MODES, _run_all_modes

import polyfuse
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import device_for_arch
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.tensorize_tiling import FILL_SHARE, SMALL_TILINGS


def _modelled(fn) -> float:
    (k,) = fn.kernels
    return model_kernel(describe_kernel(k), device_for_arch("sm_90")).us


def test_small_gemm_takes_a_small_tile():
    inputs, out, _, _ = _matmul("bfloat16", 392, 160, 960)
    fn = polyfuse.compile(inputs, [out], arch="sm_90", check_cuda=False)
    (k,) = fn.kernels
    assert "block tile 32x32x32 of 4 warps" in k.notes[0], k.notes[0]
    assert k.grid[0] == 13 * 5
    big = polyfuse.compile(
        inputs, [out], arch="sm_90", check_cuda=False,
        mapping=MappingConfig(mma_tile=(64, 64, 2, 2)),
    )  # fmt: skip
    assert big.kernels[0].grid[0] == 7 * 3
    assert _modelled(fn) < 0.75 * _modelled(big)  # 5.5 vs 8.2 us


def test_a_tile_on_nearly_every_sm_keeps_the_small_ones_out():
    """128 blocks of 64x64 on 132 SMs: the small tilings are not priced (64x32 in 256 blocks
    is modelled slower, shared-memory-bound)."""
    assert 128 >= FILL_SHARE * 132
    inputs, out, _, _ = _matmul("bfloat16", 1024, 512, 512)
    (k,) = polyfuse.compile(inputs, [out], arch="sm_90", check_cuda=False).kernels
    assert "block tile 64x64x32 of 4 warps" in k.notes[0], k.notes[0]
    assert "64x32 (4 warps)" not in k.notes[0] and "32x32 (4 warps)" not in k.notes[0]


def test_the_new_candidates_are_four_warps():
    for bm, bn, wm, wn in SMALL_TILINGS:
        assert (bm, bn) in ((64, 32), (32, 64), (32, 32)) and wm * wn == 4


@pytest.mark.parametrize("tile", [(64, 32, 2, 2), (32, 64, 2, 2), (32, 32, 2, 2)])
def test_small_tiles_match_float64_at_odd_sizes(tile):
    inputs, out, arrays, want = _matmul("bfloat16", 75, 70, 72, epilogue=True)
    fn = polyfuse.compile(
        inputs, [out], arch="sm_80", check_cuda=False, mapping=MappingConfig(mma_tile=tile)
    )
    (k,) = fn.kernels
    assert k.block == (128, 1, 1)
    assert f"block tile {tile[0]}x{tile[1]}x32 of 4 warps" in k.notes[0]
    _run_all_modes(fn, "bfloat16", arrays, want, MODES)


def test_small_tile_compiles_and_issues_hmma():
    require_sass_tools()
    from polyfuse.cuda.toolchain.sass import analyse

    inputs, out, _, _ = _matmul("bfloat16", 392, 160, 960, epilogue=True)
    for arch in ("sm_80", "sm_90"):
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
        compiles_without_spills(fn, arch)
        (ks,) = analyse(fn.cuda_source, (arch,), kernels=fn.kernels).kernels
        assert ks.hot.mix.classes.get("HMMA", 0) > 0, ks.hot.mix
