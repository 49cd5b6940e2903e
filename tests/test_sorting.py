"""``ops.topk`` and ``ops.sort``: stable (ties keep their order), NaN the largest, int64
indices; against numpy's stable argsort on the emulator, rerun race-free, the CUDA compiled by
NVRTC for sm_80 and sm_90 where installed. torch's ``topk``/``sort``/``argsort`` (which stayed
in PyTorch) run through them: tests marked ``extra``."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import run_checked, torch_matches_eager

from polyfuse import ops, te
from polyfuse.errors import ExpressionError

RNG = np.random.default_rng(5)


def test_sort_is_stable_with_nan_last_as_numpy():
    a = RNG.integers(-4, 4, (5, 37)).astype(np.float32)  # many ties
    a[0, [3, 9]] = np.nan
    a[2, :] = 1.0
    x = te.placeholder(a.shape, "float32", "x")
    values, idx = ops.sort(x, axis=1)
    assert idx.dtype == "int64" and values.dtype == "float32"
    got_v, got_i = run_checked([x], [values, idx], (a,))
    want_i = np.argsort(a, axis=1, kind="stable")
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v, np.take_along_axis(a, want_i, 1))


@pytest.mark.parametrize("k", [1, 3, 8, 20])  # rounds up to 8 (2k < n), ranks beyond
def test_topk_largest_and_smallest_of_ints_and_floats(k):
    a = RNG.integers(-9, 9, (3, 41, 6)).astype(np.int32)
    f = RNG.standard_normal((3, 41, 6)).astype(np.float32)
    f[1, 5, 2] = np.nan
    x, y = te.placeholder(a.shape, "int32", "x"), te.placeholder(f.shape, "float32", "y")
    big_v, big_i = ops.topk(x, k, axis=1)
    small_v, small_i = ops.topk(y, k, axis=1, largest=False)
    got = run_checked([x, y], [big_v, big_i, small_v, small_i], (a, f))
    want_big = np.argsort(-a.astype(np.int64), axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(got[1], want_big)
    np.testing.assert_array_equal(got[0], np.take_along_axis(a, want_big, 1))
    want_small = np.argsort(f, axis=1, kind="stable")[:, :k]  # NaN last
    np.testing.assert_array_equal(got[3], want_small)
    np.testing.assert_array_equal(got[2], np.take_along_axis(f, want_small, 1))


def test_topk_k_out_of_range_is_a_one_line_error():
    x = te.placeholder((4, 5), "float32", "x")
    with pytest.raises(ExpressionError, match=r"topk 't': k=6 out of range for axis 1 of size 5"):
        ops.topk(x, 6, name="t")
    with pytest.raises(ExpressionError, match=r"sort 's': axis 2 is out of range"):
        ops.sort(x, axis=2, name="s")


@pytest.mark.extra  # needs PyTorch
def test_torch_topk_sort_and_argsort_run_in_polyfuse():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 7, 33, generator=g)  # no ties: torch's unstable order is theirs
    x[0, 0, 3] = float("nan")
    xi = torch.randint(-5, 5, (3, 50), generator=g, dtype=torch.int32)  # ties: stable sorts

    def f(x, xi):
        gates = torch.softmax(x[1:], -1).topk(2)  # MoE routing (a NaN row ties everywhere)
        return (*torch.topk(x, 3), *torch.topk(x, 5, dim=1, largest=False),
                *torch.sort(x), *torch.sort(x, dim=0, descending=True), *gates,
                torch.argsort(xi, dim=-1, stable=True),
                *torch.sort(xi, descending=True, stable=True))  # fmt: skip

    report = torch_matches_eager(f, x, xi)
    assert report["eager"] == {} and report["eager_for_dtype"] == {}
    assert report["polyfuse"]["aten.topk.default"] == 3


def test_topk_of_a_concatenation_of_a_reduction_compiles():
    """torch fuzz seed 13436: stitching recomputed the concatenation inside the topk's later
    parts instead of storing it, which turned the gather ``c[data_index(k)]`` into
    ``v[data_index(k) - 5]``, no subscript isl can model (an ``ExpressionError`` at compile).
    A gather's producer is recomputed only where its subscripts stay whole."""
    a = RNG.integers(-20, 20, (5, 8)).astype(np.int64)
    x = te.placeholder(a.shape, "int64", "x")
    k = te.reduce_axis((0, 8), "k")
    v = te.compute((5,), lambda i: te.max(x[i, k], axis=k), name="v")
    c = ops.concat([v, ops.mul(v, 2)], axis=0)
    values, idx = ops.topk(c, 2, 0)
    got_v, got_i = run_checked([x], [values, idx], (a,))
    cat = np.concatenate([a.max(1), 2 * a.max(1)])
    want_i = np.argsort(-cat, kind="stable")[:2]
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v, cat[want_i])


@pytest.mark.extra  # needs PyTorch
def test_torch_median_and_kthvalue_run_in_polyfuse():
    # read from the stable sort; a row holding NaN has median NaN at its first NaN's index
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 9, generator=g)
    x[1, 3] = x[2, 1] = x[2, 5] = float("nan")
    xi = torch.randperm(33, generator=g).reshape(3, 11).to(torch.int32) - 16  # no ties

    def f(x, xi):
        return (*torch.median(x, 1), *torch.median(x, 0, keepdim=True), torch.median(x[0]),
                torch.median(x), *torch.kthvalue(x, 3, 1), *torch.kthvalue(xi, 4, -1, True),
                torch.median(xi))  # fmt: skip

    assert torch_matches_eager(f, x, xi)["eager"] == {}


@pytest.mark.extra  # needs PyTorch
def test_a_sort_of_long_rows_stays_in_pytorch_while_a_small_topk_runs():
    # ranking a row of 5000 compares 25M pairs per row (eager sorts in n log n); a topk of 3
    # takes rounds (2 n k comparisons) whatever the row
    torch = pytest.importorskip("torch")
    from polyfuse.torch.order import SORT_MAX_ROW

    def f(x):
        return torch.sort(x, 1).values, torch.topk(x, 3).values

    report = torch_matches_eager(f, torch.randn(2, 5000))
    why = f"a sort of rows longer than {SORT_MAX_ROW} (n * n comparisons per row)"
    assert report["reasons"] == {"aten.sort.default": why}
    assert report["polyfuse"]["aten.topk.default"] == 1
