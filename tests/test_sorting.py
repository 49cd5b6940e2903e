"""``ops.topk`` and ``ops.sort``: stable (ties keep their order), NaN the largest, int64
indices; against numpy's stable argsort on the emulator, rerun race-free, the CUDA compiled by
NVRTC for sm_80 and sm_90 where installed. torch's ``topk``/``sort``/``argsort`` (which stayed
in PyTorch) run through them: tests marked ``extra``."""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import ExpressionError

RNG = np.random.default_rng(5)


def _run(ins, outs, feed):
    fn = polyfuse.compile(ins, outs)
    got = fn(*feed)
    again = fn(*feed, device="emulate", race_check=True)
    for g, a in zip(got, again, strict=True):
        np.testing.assert_array_equal(g, a)
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    return got


def test_sort_is_stable_with_nan_last_as_numpy():
    a = RNG.integers(-4, 4, (5, 37)).astype(np.float32)  # many ties
    a[0, [3, 9]] = np.nan
    a[2, :] = 1.0
    x = te.placeholder(a.shape, "float32", "x")
    values, idx = ops.sort(x, axis=1)
    assert idx.dtype == "int64" and values.dtype == "float32"
    got_v, got_i = _run([x], [values, idx], (a,))
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
    got = _run([x, y], [big_v, big_i, small_v, small_i], (a, f))
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
    import polyfuse.torch as pt
    from polyfuse.torch import last_compiled

    torch._dynamo.reset()
    pt.reset()
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

    with torch.no_grad():
        want, got = f(x, xi), torch.compile(f, backend="polyfuse")(x, xi)
    for w, o in zip(want, got, strict=True):
        assert w.dtype == o.dtype and w.shape == o.shape
        assert torch.equal(w, o) or torch.allclose(w, o, equal_nan=True), (w, o)
    report = last_compiled().polyfuse_report
    assert report["eager"] == {} and report["eager_for_dtype"] == {}
    assert report["polyfuse"]["aten.topk.default"] == 3
    torch._dynamo.reset()


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
    got_v, got_i = _run([x], [values, idx], (a,))
    cat = np.concatenate([a.max(1), 2 * a.max(1)])
    want_i = np.argsort(-cat, kind="stable")[:2]
    np.testing.assert_array_equal(got_i, want_i)
    np.testing.assert_array_equal(got_v, cat[want_i])
