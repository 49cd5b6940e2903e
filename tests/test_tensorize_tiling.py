"""The tensor-core tiling model (:mod:`polyfuse.poly.tensorize_tiling`): every block tile
whose registers fit priced by the cost model, and among those within 5 % of its best the
fewest modelled non-HMMA instructions per useful HMMA of a k-tile -- larger warp tiles (4x8
mma tiles, 64x64) where there are blocks enough, no 128-row tile on a 64-row GEMM (half its
HMMA on zero rows), tiles that balance a short grid over the SMs. The chosen tilings are
correct at odd sizes in every emulator mode and read without bank conflicts."""

from __future__ import annotations

import re

import numpy as np
import pytest
from kernel_checks import site_text
from test_tensorize import ODD, _check, _matmul
from test_tensorize_conv import CASES as CONV_CASES
from test_tensorize_conv import ODD as CONV_ODD
from test_tensorize_conv import _conv, _run_all_modes

import polyfuse
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.graph.passes import DEFAULT_PASSES
from polyfuse.poly import tensorize_tiling
from polyfuse.poly.costs import Mix


def _note(fn) -> str:
    """The tensorized kernel's tiling note (the last kernel: channels-last copies come first)."""
    return fn.kernels[-1].notes[0]


@pytest.mark.slow  # ~14 s on 2 cores (fast tier near its 15-minute limit)
def test_a_large_gemm_takes_64x64_warp_tiles():
    """4096^3 bf16 x @ W^T: 128x256 of 8 warps, each 4x8 mma tiles: the cost model prices it
    and 256x128 alike (one block per SM, four rounds) and its hot loop has the fewest others
    per HMMA (1.27 against 128x128's 2.03: 48 copied elements per thread feed 64 HMMA per
    warp instead of 32 for 32); before, the fixed list's 128x128. 1024x1024x2048 (A100, 108
    SMs): tiles of fewer blocks than SMs are out (the model prices one block's mma at the
    pipe's rate however few warps hold it); of the rest, 128x64's 128 blocks run two rounds
    on 20 SMs, 64x64's 256 three half-size ones on 40: modelled 7 % faster, taken (before,
    128x64: the fewest others per HMMA among the tiles that fill the SMs)."""
    inputs, out, _, _ = _matmul("bfloat16", 4096, 4096, 4096, trans_b=True, epilogue=True)
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False)
    note = _note(fn)
    assert "block tile 128x256x32 of 8 warps, each 4x8 mma tiles of 16x8 (512 blocks" in note
    assert ", 1.27 other instructions per useful HMMA; the fewest others within 5%" in note
    assert re.search(r"128x128 \(8 warps\): [\d.]+ us, 2\.03", note), note
    us = _modelled(note)
    assert us["128x256 (8 warps)"] == us["256x128 (8 warps)"] < us["128x128 (8 warps)"]
    inputs, out, _, _ = _matmul("bfloat16", 1024, 1024, 2048, trans_b=True)
    note = _note(polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False))
    assert "block tile 64x64x32 of 4 warps, each 2x4 mma tiles of 16x8 (256 blocks" in note
    assert "too few blocks: 128x256 (8 warps): 32 blocks" in note
    us = _modelled(note)
    assert us["128x64 (4 warps)"] > 1.05 * us["64x64 (4 warps)"]


def _modelled(note: str) -> dict[str, float]:
    """Each tiling's modelled microseconds in a tiling note (the chosen one's included)."""
    got = {m[0]: float(m[1]) for m in re.findall(r"(\d+x\d+ \(\d+ warps\)): ([\d.]+) us", note)}
    head = re.search(r"block tile (\d+x\d+)x\d+ of (\d+) warps.*?modelled ([\d.]+) us", note)
    assert head, note
    got[f"{head[1]} ({head[2]} warps)"] = float(head[3])
    return got


def test_a_64_row_conv_takes_no_128_row_tile():
    """The GPU-day conv (bf16 3x3 pad 1, N32 C64 -> O64, 56x56): 64 output channels, so a
    128-row tile computes half of its HMMA on zero rows (before: 128x128, 1 HMMA per 5.3
    others in SASS, 1 useful per 10.6); the model prices the useful share and takes 64x256 of
    8 warps, each 2x8 mma tiles (every HMMA useful, 416 blocks) for the NCHW scalar fills —
    now 64x128 of 4 warps (800 blocks): those fills are single-stage, each k-tile waits for its
    loads, and the cost model overlaps the waits of more resident blocks — and 64x256 of 4
    warps, each 4x8 mma tiles, for the channels-last chunk fills (the default)."""
    inputs, out, _, _ = _conv("bfloat16", (32, 64, 64, 56, 56), *CONV_CASES["3x3_pad1"])
    nchw = tuple(p for p in DEFAULT_PASSES if p != "channels_last")
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False, passes=nchw)
    note = _note(fn)
    assert "block tile 64x128x32 of 4 warps, each 2x8 mma tiles of 16x8 (800 blocks" in note, note
    assert re.search(r"128x128 \(8 warps\): [\d.]+ us, 10\.78", note), note
    us = _modelled(note)  # single-stage fills: more resident blocks overlap their waits
    assert us["64x256 (8 warps)"] > us["64x128 (4 warps)"] < us["128x128 (8 warps)"] / 2
    fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False)
    note = _note(fn)
    assert "block tile 64x256x32 of 4 warps, each 4x8 mma tiles of 16x8 (416 blocks" in note, note


def test_a_tiling_over_the_register_budget_is_refused_with_the_reason(monkeypatch):
    """A warp of 8x16 mma tiles (128x128) needs 616 modelled registers (> 255): refused in
    the note, the next candidate taken."""
    monkeypatch.setattr(tensorize_tiling, "TILINGS", ((128, 256, 1, 2), (64, 64, 2, 2)))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    inputs, out, _, _ = _matmul("bfloat16", 4096, 4096, 4096, trans_b=True)
    note = _note(polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False))
    assert "block tile 64x64x32" in note and "too many registers: 128x256 (2 warps): 616" in note


@pytest.mark.parametrize(
    "dtype, tiling, warps",
    [
        ("float16", (128, 256, 2, 4), 8),
        ("bfloat16", (128, 256, 2, 4), 8),
        ("bfloat16", (256, 64, 4, 1), 4),
        ("float16", (64, 256, 1, 4), 4),
    ],
)
def test_the_4x8_warp_tiles_are_correct_at_odd_sizes(monkeypatch, dtype, tiling, warps):
    """Warps of 4x8 mma tiles (64x64) in 8- and 4-warp blocks, one warp row or column
    included (forced at a size that has too few blocks for them), batched x @ W^T + epilogue
    at odd sizes, plain and race-checked."""
    monkeypatch.setattr(tensorize_tiling, "TILINGS", (tiling,))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _matmul(dtype, *ODD, batch=2, trans_b=True, epilogue=True)
    fn = _check(dtype, inputs, out, arrays, want)
    bm, bn = tiling[:2]
    assert f"block tile {bm}x{bn}x32 of {warps} warps, each 4x8 mma tiles" in _note(fn)
    assert "pf_acc[4][8][4]" in fn.kernels[0].source


def test_the_2x8_warp_tile_of_a_gathered_conv_is_correct_in_every_mode(monkeypatch):
    """64x256 of 8 warps, 2x8 mma tiles each (the GPU-day conv's choice), on a 3x3 pad 1 conv
    at odd sizes: im2col gathered into the 256-column tile, every emulator mode."""
    monkeypatch.setattr(tensorize_tiling, "TILINGS", ((64, 256, 2, 4),))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _conv("bfloat16", CONV_ODD, *CONV_CASES["3x3_pad1"])
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    assert "block tile 64x256x32 of 8 warps, each 2x8 mma tiles" in _note(fn)
    _run_all_modes(fn, "bfloat16", arrays, want)


def test_the_4x8_warp_tile_reads_and_writes_shared_without_bank_conflicts(monkeypatch):
    """The 128x256 tile's cp.async writes and ldmatrix reads (A k-innermost, B k-innermost:
    x @ W^T) on the emulator's bank counter: no conflict."""
    monkeypatch.setattr(tensorize_tiling, "TILINGS", ((128, 256, 2, 4),))
    monkeypatch.setattr(tensorize_tiling, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _matmul("float16", 96, 80, 112, trans_b=True)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    got = fn(*arrays, race_check="banks")
    assert tolerance("float16").allclose(got, want.astype(numpy_dtype("float16")))
    lines = fn.cuda_source.splitlines()
    sites = [s for t in fn.last_traffic for s in t.shared_banks]
    copies = [s for s in sites if "pf_cp_async16(" in site_text(lines, s)]
    loads = [s for s in sites if "pf_ldmatrix" in site_text(lines, s)]
    assert copies and loads
    assert [str(s) for s in copies + loads if s.conflicts] == []
    assert np.isfinite(got).all()


def test_a_short_grid_takes_the_tile_that_balances_the_sms():
    """Attention S512's PV product on an H100 (96 heads x 512 rows x 64 columns, k = 512):
    256x64 makes 192 blocks for 132 SMs (two rounds on 60 of them, one on the rest); 128x64
    of 4 warps makes 384, three resident per SM: modelled 10 % faster, taken though its hot
    loop has more others per HMMA (2.41 against 1.64). Before, the hot figure alone took
    256x64."""
    inputs, out, _, _ = _matmul("bfloat16", 512, 64, 512, batch=96)
    note = _note(polyfuse.compile(inputs, [out], arch="sm_90", check_cuda=False))
    assert "block tile 128x64x32 of 4 warps, each 4x4 mma tiles of 16x8 (384 blocks" in note
    us = _modelled(note)
    assert us["256x64 (4 warps)"] > 1.05 * us["128x64 (4 warps)"], us


def test_the_tile_description_counts_every_mma_once():
    """The cost model's description of a candidate (:mod:`polyfuse.poly.costs.mma`): its
    mma instructions over all warps are the GEMM's 16x8x16 tiles (padded to whole block
    tiles), its tail the epilogue outside the loop, its blocks stream both operands' k rows."""
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import H100
    from polyfuse.poly.tensorize_tiling import MmaProblem, MmaTiling, tile_desc

    t = MmaTiling(128, 256, 2, 4)
    p = MmaProblem(Mix(slots=3, fadd=1), 2 * 2 * 4096 * 4096, 2 * 4096 * 4096, 4096)
    d = tile_desc(t, p, 512, fill=6.0, itemsize=2)
    assert d.mix.mma * d.warps * d.blocks == 4096**3 / (16 * 8 * 16)
    assert d.tail.mma == 0 and d.tail.fadd == 128 * 256 / 256
    assert d.block_read_bytes == (128 + 256) * 4096 * 2 and d.threads == 256
    m = model_kernel(d, H100)
    assert m.bound == "block phases" and 400 < m.us < 700, m
