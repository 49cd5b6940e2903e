"""Before/after tests of poly/tile_fit.py: a ranked GEMM tiling's column tile folded over the
image's rows and columns when that pads less (a 3x3 conv over a 56x56 image)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from poly_inputs import one

from polyfuse import ops, te
from polyfuse.poly.tile_fit import fit_tiling
from polyfuse.poly.tiling import _tiling, detect_gemm


@pytest.fixture(scope="module")
def conv():
    """3x3 conv, 8 -> 16 channels, padding 1, over 56x56: data dims (co, oh, ow)."""
    x = te.placeholder((1, 8, 56, 56), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    shape = detect_gemm(one([x, w], ops.conv2d(x, w, padding=1)))
    assert not isinstance(shape, str)
    assert shape.data == [(0, 15), (0, 55), (0, 55)] and shape.reuse == [{0}, {1, 2}]
    return shape


def _ranked(tile):
    """The unfolded tiling of (BM, BN, TM, TN, TK): rows co, columns ow, k-tiles over ci."""
    return _tiling(3, 0, 2, 0, [8, 3, 3], tile)


def test_columns_of_64_over_56_fold_into_8x8_without_padding(conv):
    t = _ranked((16, 64, 2, 4, 8))
    assert (t.block, t.threads) == ([16, 1, 64], [8, 1, 16])
    f = fit_tiling(conv, t)
    # 16 threads x 4 registers as 8x2 threads x 1x4 registers: runs of 4 columns kept
    assert (f.block, f.threads, f.regs) == ([16, 8, 8], [8, 8, 2], [2, 1, 4])
    assert (f.nthreads, f.accumulators) == (t.nthreads, t.accumulators)
    assert f.reasons == [
        "column tile of 64 folded into 8x8 over data dims 1x2 (extents 56x56; 16 threads x 4 "
        "registers as 8x2 x 1x4): padding 12.5% -> 0.0% of the multiply-adds, threads, "
        "accumulators and shared words per multiply-add unchanged"
    ]
    assert t.block == [16, 1, 64]  # the ranked tiling itself is not changed


def test_two_registers_per_thread_fold_with_the_fewest_thread_rows(conv):
    f = fit_tiling(conv, _ranked((16, 64, 2, 2, 8)))
    assert (f.block, f.threads, f.regs) == ([16, 8, 8], [8, 4, 8], [2, 2, 1])
    f = fit_tiling(conv, _ranked((16, 32, 2, 4, 8)))
    assert (f.block, f.threads, f.regs) == ([16, 4, 8], [8, 4, 2], [2, 1, 4])


def test_kept_when_the_columns_divide_or_the_fold_would_grow_a_fragment(conv):
    whole = _ranked((16, 56, 2, 4, 8))  # 56 divides 56: nothing to gain
    assert fit_tiling(conv, whole) is whole
    # an operand reused along the columns but not the rows would need more registers
    t = _ranked((16, 64, 2, 4, 8))
    assert fit_tiling(replace(conv, reuse=[{0}, {2}]), t) is t
    # the rows already tiled (not 1)
    rows = _tiling(3, 1, 2, 0, [8, 3, 3], (16, 64, 2, 4, 8))
    assert fit_tiling(conv, rows) is rows
