"""Before/after tests of poly/vectorize.py beyond tests/test_gemm_vectorize.py: the vector
width as a parameter (a start aligned to 8 bytes, not 16) and footprints that are no box."""

from __future__ import annotations

import islpy as isl

from polyfuse.poly.vectorize import prove_vector_copy


def test_starts_two_past_a_vector_boundary_allow_two_wide_vectors_only():
    ctx = isl.Context()
    fp = isl.Set(
        "[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 2 + 8kt0 <= e1 < 10 + 8kt0 }",
        context=ctx,
    )
    four = prove_vector_copy(fp, ["0", "2 + 8kt0"], [4, 8], (4, 64))
    assert four.width == 1 and four.why == (
        "vector starts are not 16-byte aligned (row length 64; start offsets mod 4 take more "
        "than 0)"
    )
    two = prove_vector_copy(fp, ["0", "2 + 8kt0"], [4, 8], (4, 64), width=2)
    assert two.width == 2 and two.reason == (
        "64-bit vector copy: rows contiguous, extent 8 a multiple of 2, isl proves every start "
        "8-byte aligned"
    )


def test_a_box_starting_before_the_array_is_whole_vectors_outside_it():
    """Starts at 8 b0 - 2: the first pair (-2, -1) lies wholly outside, so no pair straddles
    the edge; a vector of 4 would not even be aligned."""
    ctx = isl.Context()
    fp = isl.Set("[b0] -> { a[e0] : 0 <= b0 < 4 and 8b0 - 2 <= e0 < 8b0 + 6 }", context=ctx)
    assert prove_vector_copy(fp, ["8b0 - 2"], [8], (64,), width=2).width == 2
    assert prove_vector_copy(fp, ["8b0 - 2"], [8], (64,)).width == 1


def test_a_footprint_that_is_no_box_of_the_array_copies_scalars():
    ctx = isl.Context()
    fp = isl.Set("{ a[e0, e1] : 0 <= e0 < 4 and 0 <= e1 < 8 }", context=ctx)
    for lo, size, shape in ((["0", "0"], [4, 8], (64,)), ([], [], (4, 64))):
        got = prove_vector_copy(fp, lo, size, shape)
        assert (got.width, got.why) == (1, "the footprint is not a box of the array")
