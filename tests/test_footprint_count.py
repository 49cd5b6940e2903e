"""count_points: the box fast path of footprint counting agrees with isl's count."""

import islpy as isl
import pytest

from polyfuse.poly.footprint import _box_count, count_points

CASES = [
    "{ A[i, j] : 0 <= i < 32 and 0 <= j < 3136 }",  # a box: counted by its extents
    "{ A[i, j] : 0 <= i < 8 and 2 <= j <= 9 }",
    "{ A[i] : 0 <= i < 100 and exists (q: i = 2q) }",  # strided: not a box
    "{ A[i, j] : 0 <= i < 10 and 0 <= j <= i }",  # a triangle: not a box
    "{ A[i, j] : 0 <= i < 4 and 0 <= j < 4; A[i, j] : 10 <= i < 12 and 0 <= j < 4 }",
    "{ A[i] : 0 <= i < 0 }",  # empty
]


@pytest.mark.parametrize("text", CASES)
def test_count_points_matches_isl(text):
    s = isl.Set(text)
    assert count_points(s) == s.count_val().to_python()


def test_box_fast_path_only_for_boxes():
    assert _box_count(isl.Set("{ A[i, j] : 0 <= i < 32 and 0 <= j < 3136 }")) == 32 * 3136
    assert _box_count(isl.Set("{ A[i] : 0 <= i < 100 and exists (q: i = 2q) }")) is None
    assert _box_count(isl.Set("{ A[i, j] : 0 <= i < 10 and 0 <= j <= i }")) is None


#: The read footprint of ``x`` (8x17x64) in a SpaceToDepth of a reshaped DepthToSpace of it,
#: composed by layout folding (fuzz: ``polyfuse fuzz --onnx`` at larger sizes, seed 9111).
#: isl cannot simplify it: its box check and count ran for hours.
UNCOUNTABLE = (
    "{ x2[i0, i1, i2] : exists (e0, e1: -8703 - 1054i0 - 8432i1 - 4216i2 - 63e0 <= 4185e1 <= "
    "-1054i0 - 8432i1 - 4216i2 - 63e0 and 1170855e1 >= -294882i0 - 2359056i1 - 1175176i2 - "
    "8641e0 and -294882i0 - 2359056i1 - 1179528i2 - 8641e0 <= 1170855e1 <= 278527 - 294882i0 - "
    "2359056i1 - 1179528i2 - 8641e0 and 1170855e1 <= 4351 - 294882i0 - 2359056i1 - 1175176i2 - "
    "8641e0 and 74310233e1 >= -9469951 - 18645022i0 - 149160176i1 - 74580088i2 - 548415e0 and "
    "-557055 - 18645022i0 - 149717232i1 - 74580088i2 - 548415e0 <= 74310233e1 <= -18645022i0 - "
    "149717232i1 - 74580088i2 - 548415e0 and 74310233e1 <= -18645022i0 - 149160176i1 - "
    "74580088i2 - 548415e0) }"
)


def test_a_set_isl_cannot_count_within_its_limits_is_none_in_seconds():
    """The count runs under ``COUNT_LIMITS`` (a deadline of 1 s in a child process): None,
    and the callers fall back (a footprint to the whole tensor, a read overlap to none)."""
    import time

    t0 = time.perf_counter()
    assert count_points(isl.Set(UNCOUNTABLE)) is None
    assert time.perf_counter() - t0 < 20


def test_an_uncountable_footprint_is_the_whole_tensor(monkeypatch):
    """global_footprint charges a tensor isl cannot count at its full size."""
    import numpy as np

    import polyfuse
    from polyfuse import te
    from polyfuse.poly import footprint

    x = te.placeholder((8, 16), name="x")
    y = te.compute((8, 8), lambda i, j: x[i, 2 * j] * 2.0, name="y")
    exact = polyfuse.compile([x], [y], check_cuda=False)
    assert exact.kernels[0].bytes_read == 8 * 8 * 4  # every other column
    monkeypatch.setattr(footprint, "count_points", lambda s: None)
    bounded = polyfuse.compile([x], [y], check_cuda=False)
    assert bounded.kernels[0].bytes_read == 8 * 16 * 4  # the whole of x
    np.testing.assert_array_equal(bounded(np.ones((8, 16), np.float32)), np.full((8, 8), 2.0))
