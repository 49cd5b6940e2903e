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
