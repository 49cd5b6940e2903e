"""poly/islutil.injective: the same answer as isl's is_injective, parameters moved out."""

import islpy as isl
import pytest

from polyfuse.poly.islutil import injective

CASES = [
    "[l] -> { S[i] -> [o] : 0 <= i < 64 and o = floor(i / 4) and i mod 4 = l and 0 <= l < 4 }",
    "[l] -> { S[i] -> [o] : 0 <= i < 64 and o = floor(i / 4) }",
    "[l] -> { S[i] -> [o] : 0 <= i < 64 and o = floor(i / 4) and l = 0 }",
    "[b, l] -> { S[i, j] -> [i, o] : 0 <= i < 8 and 0 <= j < 32 and o = floor(j / 8) "
    "and j mod 8 = l and b = 0 }",
    "[b, l] -> { S[i, j] -> [o] : 0 <= i < 8 and 0 <= j < 32 and o = i + j and l = b }",
    "{ S[i] -> [o] : 0 <= i < 8 and o = floor(i / 2) }",
    "[n] -> { S[i] -> [i] : 0 <= i < n }",
]


@pytest.mark.parametrize("text", CASES)
def test_injective_matches_isl(text):
    m = isl.UnionMap(text)
    assert injective(m) == m.is_injective()


def test_injective_cases_cover_both_answers():
    answers = {injective(isl.UnionMap(t)) for t in CASES}
    assert answers == {True, False}
