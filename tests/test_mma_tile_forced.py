"""``MappingConfig.mma_tile``: a tensorized GEMM's block tile and warp grid forced, so a GPU
day can time tilings the model did not take (the H100's bf16 4096³ loop sustains 45 % of what
``mma.sync`` reaches; which tiling does better is a measurement).

Each forced tiling (the model's candidates and others: one warp, three warps along M, a
48-row tile) runs on the emulator against float64 in every race mode at odd sizes (partial
block tiles on every side), a conv's gathered fills included; its plan says the tile was
forced and by what; a tiling the lowering cannot split, or that would spill, is refused with a
one-line message before anything compiles.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_tensorize import _matmul
from test_tensorize_pipeline import MODES, _run_all_modes

import polyfuse
from polyfuse import ops, te
from polyfuse.base.errors import PolyfuseError
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.tensorize_tiling import TILINGS


def _compile(inputs, out, tile, arch="sm_80", **mapping):
    cfg = MappingConfig(mma_tile=tile, **mapping)
    return polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)


@pytest.mark.parametrize(
    "tile", [(128, 128, 2, 4), (128, 128, 2, 2), (64, 64, 1, 1), (192, 128, 3, 2), (48, 64, 1, 2)]
)
def test_a_forced_tiling_is_the_kernels_and_matches_float64(tile):
    inputs, out, arrays, want = _matmul("bfloat16", 75, 140, 72, epilogue=True)
    fn = _compile(inputs, out, tile)
    (k,) = fn.kernels
    bm, bn, wm, wn = tile
    assert k.block == (32 * wm * wn, 1, 1)
    assert f"block tile {bm}x{bn}x32 of {wm * wn} warps" in k.notes[0]
    assert "forced: MappingConfig.mma_tile" in k.notes[0]
    _run_all_modes(fn, "bfloat16", arrays, want, MODES)


def test_the_model_prices_the_others_unforced():
    inputs, out, _, _ = _matmul("bfloat16", 75, 140, 72)
    (k,) = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False).kernels
    assert "forced" not in k.notes[0]


def test_a_forced_tiling_takes_tf32_and_the_stage_count_too():
    inputs, out, arrays, want = _matmul("float32", 67, 72, 40)
    fn = _compile(inputs, out, (128, 128, 2, 4), allow_tf32=True, gemm_stages=3)
    (k,) = fn.kernels
    assert "m16n8k8" in k.notes[0] and "block tile 128x128x16 of 8 warps" in k.notes[0]
    got = fn(*arrays, device="emulate")
    assert abs(got - want).max() <= 2e-3 * abs(want).max()


def test_a_forced_tiling_runs_a_convs_gathered_fills():
    x = te.placeholder((2, 6, 9, 11), dtype="bfloat16", name="x")
    w = te.placeholder((20, 6, 3, 3), dtype="bfloat16", name="w")
    y = ops.conv2d(x, w, stride=2, padding=1)
    fn = polyfuse.compile(
        [x, w], [y], arch="sm_80", check_cuda=False,
        mapping=MappingConfig(mma_tile=(64, 64, 1, 1)),
    )  # fmt: skip
    assert any("block tile 64x64x32 of 1 warps" in n for k in fn.kernels for n in k.notes)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(t.shape).astype(numpy_dtype("bfloat16")) for t in (x, w)]
    feeds = {x: arrays[0], w: arrays[1]}
    want = polyfuse.reference.evaluate([y], feeds, precision="storage")[0]
    for race in MODES:
        got = fn(*arrays, device="emulate", race_check=race)
        assert tolerance("bfloat16").allclose(got, want), race


@pytest.mark.parametrize(
    ("tile", "why"),
    [
        ((48, 64, 2, 2), "a block tile split into whole 16x8 mma tiles per warp"),
        ((512, 512, 8, 8), "at most 32 warps"),
        ((128, 256, 1, 4), "at most 255 registers per thread"),
        ((256, 256, 4, 4), r"at most 65536 registers per block \(modelled \d+ x 512 threads"),
        ((128, 0, 1, 1), "four positive integers"),
    ],
)
def test_a_tiling_the_lowering_cannot_take_is_refused_up_front(tile, why):
    inputs, out, _, _ = _matmul("bfloat16", 64, 64, 64)
    with pytest.raises(PolyfuseError, match=rf"mma_tile={re.escape(str(tile))} .*{why}") as e:
        _compile(inputs, out, tile)
    assert str(TILINGS[0]) in str(e.value) and "\n" not in str(e.value)
