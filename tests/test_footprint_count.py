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
