"""Bounds as isl facts (issue 19, item 2): every access of a compute stays inside its tensor.

An out-of-bounds subscript raises an ExpressionError when the compute is built, naming the
compute, the tensor, the dimension and isl's witness; reads that a ``te.where`` (or the left
side of ``&``/``|``) guards stay legal and compute the same values on the emulator as the
reference and numpy; the padded ops keep working.
"""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.errors import ExpressionError
from polyfuse.graph import bounds
from polyfuse.graph.access import primitive_relations
from polyfuse.graph.expr import ComputeOp, IterVar, Tensor

M, N = 4, 8


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _run(inputs, outputs, *arrays):
    """Emulator result and reference result of a one-output graph."""
    fn = polyfuse.compile(inputs, outputs)
    got = fn(*arrays)
    (want,) = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    return np.asarray(got), want


# --------------------------------------------------------------------------- refused


def test_shifted_read_past_the_row_raises_with_witness():
    # the reproduction: j + 1 = N at j = N - 1 would read the next row's first element
    x = te.placeholder((M, N), name="x")
    with pytest.raises(ExpressionError) as ei:
        te.compute((M - 1, N), lambda i, j: x[i, j + 1], name="y")
    msg = str(ei.value)
    assert "\n" not in msg
    assert msg.startswith(
        "compute 'y' reads tensor 'x' out of bounds: dimension 1 index 8 is outside [0, 8) "
        "at i=0, j=7"
    )


def test_negative_subscript_raises():
    x = te.placeholder((N,), name="x")
    with pytest.raises(ExpressionError, match=r"dimension 0 index -1 is outside \[0, 8\) at i=0"):
        te.compute((N,), lambda i: x[i - 1], name="prev")


def test_reduction_axis_out_of_bounds_names_the_reduce_axis():
    x = te.placeholder((M, N), name="x")
    k = te.reduce_axis(N, name="k")
    with pytest.raises(ExpressionError, match=r"index 8 is outside \[0, 8\) at i=0, k=7"):
        te.compute((M,), lambda i: te.sum(x[i, k + 1], axis=k), name="s")


def test_lifted_nested_reduction_is_checked():
    x = te.placeholder((M, N), name="x")
    k = te.reduce_axis(N, name="k")
    with pytest.raises(ExpressionError, match=r"reads tensor 'x' out of bounds: dimension 0"):
        te.compute((M,), lambda i: 1.0 + te.sum(x[i + 1, k], axis=k), name="s")


def test_div_mod_subscripts_are_checked_exactly():
    x = te.placeholder((N,), name="x")
    te.compute((2 * N,), lambda i: x[i // 2], name="up")  # 0..7: inside
    te.compute((3 * N,), lambda i: x[(i + 5) % N], name="wrap")
    with pytest.raises(ExpressionError, match=r"index 8 is outside \[0, 8\) at i=10"):
        te.compute((2 * N,), lambda i: x[i // 2 + 3], name="up3")


def test_guard_that_stops_one_short_raises_at_the_first_uncovered_point():
    x = te.placeholder((M, N), name="x")
    with pytest.raises(ExpressionError, match=r"index 8 is outside \[0, 8\) at i=0, j=4"):
        te.compute((M, N), lambda i, j: te.where(j + 3 < N, x[i, j + 4], 0.0), name="y")


def test_data_dependent_guard_is_checked_at_its_worst():
    # the guard's value is unknown at compile time: the read must be inside everywhere
    x = te.placeholder((M, N), name="x")
    with pytest.raises(ExpressionError, match=r"'g' reads tensor 'x' out of bounds"):
        te.compute((M, N), lambda i, j: te.where(x[i, j] > 0.0, x[i, j + 1], 0.0), name="g")


def test_out_of_bounds_write_is_refused():
    # te.compute writes its own box; a hand-built op whose loop overruns the tensor is refused
    i = IterVar("i", 0, N + 1)
    y = Tensor((N,), "float32", "y")
    y.op = ComputeOp((i,), i * 1.0)
    with pytest.raises(ExpressionError, match=r"compute 'y' writes tensor 'y' out of bounds"):
        bounds.check_bounds(y)


def test_identical_accesses_are_checked_once():
    x = te.placeholder((M, N), name="x")
    bounds._cache.clear()
    te.compute((M, N), lambda i, j: x[i, j] * 2.0, name="a")
    n = len(bounds._cache)
    te.compute((M, N), lambda i, j: x[i, j] * 3.0, name="b")  # same layer, other constant
    assert n == 2 and len(bounds._cache) == n  # the write and the read, cached


# --------------------------------------------------------------------------- legal


def test_guarded_read_is_legal_and_correct():
    x = te.placeholder((M, N), name="x")
    y = te.compute((M, N), lambda i, j: te.where(j + 4 < N, x[i, j + 4], 0.0), name="y")
    a = _rand(M, N)
    got, want = _run([x], [y], a)
    expect = np.zeros_like(a)
    expect[:, : N - 4] = a[:, 4:]
    np.testing.assert_array_equal(want, expect)
    np.testing.assert_array_equal(got, expect)


def test_else_branch_guard_and_affine_part_of_a_data_dependent_guard():
    x = te.placeholder((M, N), name="x")
    y = te.compute(
        (M, N),
        lambda i, j: (
            te.where(j >= N - 1, 0.0, x[i, j + 1])
            + te.where((j + 1 < N) & (x[i, j] > 0.0), x[i, j + 1], -1.0)
        ),
        name="y",
    )
    a = _rand(M, N, seed=1)
    nxt = np.concatenate([a[:, 1:], np.zeros((M, 1), np.float32)], axis=1)
    expect = nxt + np.where((np.arange(N) + 1 < N) & (a > 0), nxt, -1.0).astype(np.float32)
    got, want = _run([x], [y], a)
    np.testing.assert_allclose(want, expect, rtol=1e-6)
    np.testing.assert_allclose(got, expect, rtol=1e-6)


def test_and_or_evaluate_their_right_side_only_where_needed():
    # like C's && and ||: x[i, j + 1] is read only where j + 1 < N decides nothing
    x = te.placeholder((M, N), name="x")
    y = te.compute(
        (M, N),
        lambda i, j: (
            te.where((j + 1 < N) & (x[i, j + 1] > 0.0), 1.0, 0.0)
            + te.where((j >= N - 1) | (x[i, j + 1] > 0.0), 2.0, 0.0)
        ),
        name="y",
    )
    a = _rand(M, N, seed=2)
    pos = np.zeros((M, N), bool)
    pos[:, :-1] = a[:, 1:] > 0
    last = np.arange(N) == N - 1
    expect = np.where(pos, 1.0, 0.0) + np.where(last | pos, 2.0, 0.0)
    got, want = _run([x], [y], a)
    np.testing.assert_array_equal(want, expect)
    np.testing.assert_array_equal(got, expect)


def test_padded_ops_stay_legal_and_correct():
    x = te.placeholder((1, 2, 7, 7), name="x")
    w = te.placeholder((3, 2, 3, 3), name="w")
    outs = [
        ops.pad(x, [(0, 0), (0, 0), (2, 1), (1, 3)], name="pad"),
        ops.conv2d(x, w, stride=2, padding=1, name="conv"),
        ops.max_pool2d(x, 3, stride=2, padding=1, name="mp"),
        ops.avg_pool2d(x, 3, stride=2, padding=1, name="ap"),
        ops.slice(x, [0, 0, 1, 2], [1, 2, 6, 7], name="sl"),
        ops.concat([x, ops.slice(x, [0, 0, 0, 0], [1, 2, 3, 7])], axis=2, name="cat"),
    ]
    a, b = _rand(1, 2, 7, 7, seed=3), _rand(3, 2, 3, 3, seed=4)
    fn = polyfuse.compile([x, w], outs)
    got = fn(a, b)
    want = reference.evaluate(outs, {x: a, w: b})
    for g, r in zip(got, want, strict=True):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(want[0][0, 0, 2:9, 1:8], a[0, 0])


def test_model_relation_is_exactly_the_guarded_reads():
    # no clipping in the isl model: the read relation of a padded read is the guarded set
    x = te.placeholder((N,), name="x")
    p = te.compute((N + 3,), lambda i: te.where(i >= 3, x[i - 3], 0.0), name="p")
    ctx = isl.Context()
    rel = primitive_relations(p, {x.uid: "x", p.uid: "p"}, ctx)
    ((_, read),) = rel.reads
    assert read.is_equal(isl.Map("{ S_p[d0] -> x[d0 - 3] : 3 <= d0 <= 10 }", context=ctx))
