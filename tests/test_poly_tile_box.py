"""Before/after tests of poly/tile_box.py: the box of one block tile's footprint written as
isl sets and maps, its contiguous-dims view and its start aligned for 128-bit copies."""

from __future__ import annotations

import islpy as isl
import pytest

from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.poly.tile_box import merge_groups, tile_box


@pytest.fixture
def ctx():
    return isl.Context()


def test_matmul_operand_box_is_the_tile_rows_by_the_k_tile(ctx):
    ranges = isl.Set("[b0, kt0] -> { : 0 <= b0 < 2 and 0 <= kt0 < 5 }", context=ctx)
    tile = isl.Set(
        "[b0, kt0] -> { S[d0, d1, r0] : 32b0 <= d0 < 32b0 + 32 and 0 <= d1 < 32 and "
        "8kt0 <= r0 < 8kt0 + 8 }",
        context=ctx,
    )
    a = isl.Map("{ S[d0, d1, r0] -> a[d0, r0] }", context=ctx)
    box = tile_box("a", a, tile, ranges, (64, 40))
    assert not isinstance(box, Refusal)
    assert (box.lo_t, box.size, box.shape, box.merge, box.notes) == (
        ["32b0", "8kt0"],
        [32, 8],
        (64, 40),
        (),
        [],
    )
    assert box.proof.width == 4
    want = (
        "[b0, kt0] -> { a[i0, i1] : 0 <= b0 <= 1 and 0 <= kt0 <= 4 and "
        "32b0 <= i0 < 32b0 + 32 and 8kt0 <= i1 < 8kt0 + 8 }"
    )
    assert box.fp.is_equal(isl.Set(want, context=ctx))


def test_dims_covered_whole_merge_into_the_dim_outside_them(ctx):
    """A conv weight box 64 x 8 x 3 x 3 of a 64 x 64 x 3 x 3 array is 64 x 72 of 64 x 576."""
    ranges = isl.Set("[kt0] -> { : 0 <= kt0 < 8 }", context=ctx)
    tile = isl.Set(
        "[kt0] -> { S[co, ci, kh, kw] : 0 <= co < 64 and 8kt0 <= ci < 8kt0 + 8 and "
        "0 <= kh < 3 and 0 <= kw < 3 }",
        context=ctx,
    )
    w = isl.Map("{ S[co, ci, kh, kw] -> w[co, ci, kh, kw] }", context=ctx)
    box = tile_box("w", w, tile, ranges, (64, 64, 3, 3))
    assert not isinstance(box, Refusal)
    assert (box.lo_t, box.size, box.shape) == (["0", "72kt0"], [64, 72], (64, 576))
    assert box.merge == ((1, 0, 0, 0), (0, 9, 3, 1))  # view dim 1 = 9 ci + 3 kh + kw
    assert box.notes == [
        "box 64x8x3x3 viewed as 64x72 of 64x576 (dims it covers whole are contiguous)"
    ]
    assert box.proof.width == 4
    lo = [
        isl.PwAff("[kt0] -> { [(0)] }", context=ctx),
        isl.PwAff("[kt0] -> { [(8kt0)] }", context=ctx),
    ]
    lo += [isl.PwAff("[kt0] -> { [(0)] }", context=ctx)] * 2
    # co is whole but the outermost (nothing to merge into); kh and kw join ci
    assert merge_groups([64, 8, 3, 3], lo, (64, 64, 3, 3), ranges) == [[0], [1, 2, 3]]
    # a dim covered from 1, not 0, is not whole
    lo[3] = isl.PwAff("[kt0] -> { [(1)] }", context=ctx)
    assert merge_groups([64, 8, 3, 3], lo, (64, 64, 3, 3), ranges) == [[0], [1, 2], [3]]


def test_a_row_shifted_by_the_padding_starts_on_a_vector_boundary(ctx):
    """``x[ow + kw - 1]``: the box 8 b0 - 1 .. 8 b0 + 8 (10 wide) starts 3 elements earlier
    and rounds up to 16: float4 copies, with a few elements no thread reads."""
    ranges = isl.Set("[b0] -> { : 0 <= b0 < 8 }", context=ctx)
    tile = isl.Set("[b0] -> { S[ow, kw] : 8b0 <= ow < 8b0 + 8 and 0 <= kw < 3 }", context=ctx)
    box = tile_box(
        "x", isl.Map("{ S[ow, kw] -> x[ow + kw - 1] }", context=ctx), tile, ranges, (64,)
    )
    assert not isinstance(box, Refusal)
    assert (box.lo_t, box.size, box.proof.width) == (["(-1 + 8b0) - 3"], [16], 4)
    assert box.lo_c[0].is_equal(isl.PwAff("[b0] -> { [(-4 + 8b0)] : 0 <= b0 <= 7 }", context=ctx))
    assert box.notes == [
        "box row widened 10 -> 16 to start on a 16-byte boundary (3 element(s) earlier)"
    ]
    want = "[b0] -> { x[e0] : 0 <= b0 <= 7 and 8b0 - 4 <= e0 < 8b0 + 12 }"
    assert box.fp.is_equal(isl.Set(want, context=ctx))


def test_a_box_with_holes_is_not_widened(ctx):
    """A stride-2 read: widening would copy the holes too; the copy stays scalar."""
    ranges = isl.Set("[b0] -> { : 0 <= b0 < 8 }", context=ctx)
    tile = isl.Set("[b0] -> { S[i] : 8b0 <= i < 8b0 + 8 }", context=ctx)
    box = tile_box("x", isl.Map("{ S[i] -> x[2i + 1] }", context=ctx), tile, ranges, (128,))
    assert not isinstance(box, Refusal)
    assert (box.size, box.proof.width, box.notes) == ([15], 1, [])


def test_footprints_without_a_fixed_size_box_are_refused(ctx):
    ranges = isl.Set("[b0] -> { : 0 <= b0 < 8 }", context=ctx)
    tile = isl.Set("[b0] -> { S[i, kw] : 8b0 <= i < 8b0 + 8 and 0 <= kw < 3 }", context=ctx)
    # a guard kept in the function: the lower bound is max(0, 8 b0 - 1), two pieces
    guarded = isl.Map("{ S[i, kw] -> x[o] : o = i + kw - 1 and o >= 0 }", context=ctx)
    assert tile_box("x", guarded, tile, ranges, (64,)) == Refusal(
        DecisionKind.GEMM_TILE, "the footprint of x has no fixed-size box", ("x",)
    )
    unbounded = isl.Map("{ S[i, kw] -> x[o] : o >= i }", context=ctx)
    assert tile_box("x", unbounded, tile, ranges, (64,)) == Refusal(
        DecisionKind.GEMM_TILE, "the footprint of x is not bounded per tile", ("x",)
    )
