"""Before/after tests of poly/select_free.py: a zero-padded factor ``where(c, x[..], 0)`` is
read as ``x[..]`` only where isl proves every instance failing ``c`` reads outside ``x``."""

from __future__ import annotations

import pytest
from poly_inputs import one

from polyfuse import ops, te
from polyfuse.poly.promote import access_function
from polyfuse.poly.select_free import select_free_operands
from polyfuse.poly.tiling import detect_gemm

CONV_ITER = [(0, 15), (0, 55), (0, 55), (0, 7), (0, 2), (0, 2)]  # co, oh, ow, ci, kh, kw


def _shape(inputs, out):
    shape = detect_gemm(one(inputs, out))
    assert not isinstance(shape, str), shape
    return shape, {n: access_function(m) for n, m in shape.operands}


@pytest.fixture(scope="module")
def conv():
    x = te.placeholder((1, 8, 56, 56), name="x")
    w = te.placeholder((16, 8, 3, 3), name="w")
    return _shape([x, w], ops.conv2d(x, w, padding=1))


def _why(t: str, cond: str) -> str:
    return (
        f"{t}: the update's select where({cond}, {t}[..], 0) dropped: isl proves every padded "
        f"update instance where it fails reads outside {t}, which the shared tile holds as "
        "zeros; the term is one fused multiply-add"
    )


def test_conv_padding_select_is_dropped_on_whole_and_partial_tiles(conv):
    shape, access = conv
    zero = {"x": (1, 8, 56, 56), "w": (16, 8, 3, 3)}
    cond = (
        "((((((d2 + r1) - 1) >= 0) and (((d2 + r1) - 1) < 56)) and (((d3 + r2) - 1) >= 0)) "
        "and (((d3 + r2) - 1) < 56))"
    )
    assert select_free_operands(shape, CONV_ITER, zero, access) == {"x": _why("x", cond)}
    # image tiles of 64 past the 56 rows and columns: the padded instances read outside too
    partial = [(0, 15), (0, 63), (0, 63), (0, 7), (0, 2), (0, 2)]
    assert list(select_free_operands(shape, partial, zero, access)) == ["x"]


def test_only_operands_whose_tile_holds_zeros(conv):
    shape, access = conv
    assert select_free_operands(shape, CONV_ITER, {"w": (16, 8, 3, 3)}, access) == {}
    assert select_free_operands(shape, CONV_ITER, {"x": (1, 8, 56, 56)}, {"w": access["w"]}) == {}


def test_a_shifted_row_is_dropped_a_select_inside_the_array_is_kept():
    a, b = te.placeholder((8, 12), name="a"), te.placeholder((12, 16), name="b")
    r = te.reduce_axis(12, name="r")
    zero = {"a": (8, 12), "b": (12, 16)}
    box = [(0, 7), (0, 15), (0, 15)]  # k-tiles of 16 over K = 12
    shifted = te.compute(
        (8, 16), lambda i, j: te.sum(te.where(i >= 1, a[i - 1, r], 0.0) * b[r, j], axis=r)
    )
    shape, access = _shape([a, b], shifted)
    assert select_free_operands(shape, box, zero, access) == {"a": _why("a", "(d0 >= 1)")}
    # where(r < 6, ..): a[i, 6..11] lie inside a, so the select is a real zero
    half = te.compute((8, 16), lambda i, j: te.sum(te.where(r < 6, a[i, r], 0.0) * b[r, j], axis=r))
    shape, access = _shape([a, b], half)
    assert select_free_operands(shape, box, zero, access) == {}
    # a condition isl cannot read (not affine) is kept
    square = te.compute(
        (8, 16), lambda i, j: te.sum(te.where(i * i >= 1, a[i, r], 0.0) * b[r, j], axis=r)
    )
    shape, access = _shape([a, b], square)
    assert select_free_operands(shape, box, zero, access) == {}


def test_a_padded_input_dim_of_extent_1_keeps_the_select():
    """Regression (``polyfuse fuzz --torch`` seed 4051): a padded conv over an input of one
    row. The guard pins its row (``h + r - 1 = 0``), the access function keeps that equality
    and is undefined where the select fails, so the vacuous image proved nothing: the tile
    held the one row, every kernel row read it, and the conv summed it twice (0.6 for 0.3)."""
    x = te.placeholder((1, 1, 1, 7), name="x")
    w = te.placeholder((2, 1, 2, 2), name="w")
    shape, access = _shape([x, w], ops.conv2d(x, w, padding=1))
    padded = [(0, 63), (0, 1), (0, 31), (0, 1), (0, 1)]  # co, oh, ow, kh, kw (ci of 1 folded)
    assert select_free_operands(shape, padded, {"x": (1, 1, 1, 7)}, access) == {}


@pytest.mark.parametrize("hw", [(1, 7), (1, 3), (5, 1)])
def test_a_padded_conv_over_one_row_or_column_matches_the_reference(hw):
    import numpy as np

    import polyfuse
    from polyfuse import reference

    x = te.placeholder((1, 1, *hw), name="x")
    w = te.placeholder((3, 1, 2, 2), name="w")
    y = ops.conv2d(x, w, padding=1)
    rng = np.random.default_rng(3)
    xv = rng.standard_normal((1, 1, *hw)).astype(np.float32)
    wv = rng.standard_normal((3, 1, 2, 2)).astype(np.float32)
    fn = polyfuse.compile([x, w], [y], check_cuda=False)
    want = reference.evaluate([y], {x: xv, w: wv})[0]
    for race in (False, True):
        got = fn(xv, wv, device="emulate", race_check=race)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
