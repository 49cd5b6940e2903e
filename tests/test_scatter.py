"""Scatters (``ops.scatter``, ``ops.index_put``; ONNX's ScatterElements/ScatterND run on the
same code): per output element a reduction over the update rows naming it. Against numpy on
the emulator, rerun race-free, the CUDA compiled by NVRTC for sm_80 and sm_90 where installed;
torch's ``scatter``/``scatter_add``/``scatter_reduce``/``index_put``/``index_add`` (which
stayed in PyTorch) against eager in tests marked ``extra``."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import run_checked, torch_matches_eager

from polyfuse import ops, te
from polyfuse.errors import ExpressionError

RNG = np.random.default_rng(9)


def test_scatter_replaces_with_the_last_duplicate_and_adds_all_of_them():
    d = RNG.standard_normal((6, 5)).astype(np.float32)
    i = RNG.integers(-6, 6, (4, 5)).astype(np.int64)  # duplicates and negative indices
    s = RNG.standard_normal((4, 5)).astype(np.float32)
    data, index, src = (te.placeholder(a.shape, str(a.dtype), n) for a, n in
                        ((d, "data"), (i, "index"), (s, "src")))  # fmt: skip
    outs = [ops.scatter(data, 0, index, src), ops.scatter(data, 0, index, src, "add"),
            ops.scatter(data, 0, index, src, "max", include_self=False)]  # fmt: skip
    got = run_checked([data, index, src], outs, (d, i, s))
    put, added, big = d.copy(), d.copy(), np.full_like(d, -np.inf)
    cols = np.arange(5)
    for r in range(4):  # in row order: the last duplicate wins
        put[i[r] % 6, cols] = s[r]
    np.add.at(added, (i % 6, np.broadcast_to(cols, i.shape)), s)
    np.maximum.at(big, (i % 6, np.broadcast_to(cols, i.shape)), s)
    big = np.where(np.isinf(big), d, big)
    np.testing.assert_array_equal(got[0], put)
    np.testing.assert_allclose(got[1], added, rtol=1e-6)
    np.testing.assert_array_equal(got[2], big)


def test_index_put_writes_a_kv_cache_step_and_accumulates():
    # cache[:, :, pos] = new (the index on a middle dim: values keep its place) and
    # x[rows, cols] += v (two broadcast index tensors, duplicates add up)
    cache = RNG.standard_normal((2, 3, 10, 4)).astype(np.float32)
    new = RNG.standard_normal((2, 3, 2, 4)).astype(np.float32)
    pos = np.array([7, -1], np.int64)
    x = RNG.integers(-9, 9, (5, 6)).astype(np.int32)
    rows, cols = np.array([[0], [4], [0]], np.int64), np.array([1, 1, 5], np.int64)
    v = RNG.integers(-9, 9, (3, 3)).astype(np.int32)
    c, n, p = (te.placeholder(a.shape, str(a.dtype), k) for a, k in
               ((cache, "cache"), (new, "new"), (pos, "pos")))  # fmt: skip
    xt, rt, ct, vt = (te.placeholder(a.shape, str(a.dtype), k) for a, k in
                      ((x, "x"), (rows, "rows"), (cols, "cols"), (v, "v")))  # fmt: skip
    outs = [ops.index_put(c, [None, None, p], n), ops.index_put(xt, [rt, ct], vt, True)]
    got = run_checked([c, n, p, xt, rt, ct, vt], outs, (cache, new, pos, x, rows, cols, v))
    want = cache.copy()
    want[:, :, pos] = new
    acc = x.copy()
    np.add.at(acc, (np.broadcast_to(rows, (3, 3)), np.broadcast_to(cols, (3, 3))), v)
    np.testing.assert_array_equal(got[0], want)
    np.testing.assert_array_equal(got[1], acc)


def test_a_scatter_index_that_does_not_fit_is_a_one_line_error():
    data, index = te.placeholder((4, 5), "float32", "d"), te.placeholder((4, 6), "int64", "i")
    with pytest.raises(ExpressionError, match=r"scatter 's': index \(4, 6\) does not fit"):
        ops.scatter(data, 0, index, 1.0, name="s")
    with pytest.raises(ExpressionError, match=r"reduce='mean'"):
        ops.scatter(data, 0, te.placeholder((2, 5), "int64", "j"), 1.0, "mean", name="t")


@pytest.mark.extra  # needs PyTorch
def test_torch_scatters_run_in_polyfuse():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(4, 6, generator=g), torch.randn(3, 6, generator=g)
    idx = torch.randint(0, 4, (3, 6), generator=g)
    cache, new = torch.zeros(2, 3, 10, 4), torch.randn(2, 3, 2, 4, generator=g)
    pos = torch.tensor([7, 2])
    xi = torch.randint(-9, 9, (5, 7), generator=g, dtype=torch.int32)
    li = torch.randint(0, 5, (4,), generator=g)
    srci = torch.randint(-9, 9, (4, 7), generator=g, dtype=torch.int32)

    def f(x, idx, src, cache, new, pos, xi, li, srci):
        kv = cache.clone()
        kv[:, :, pos] = new  # a KV cache step: index_put
        return (x.scatter(0, idx, src), x.scatter_add(0, idx, src),
                x.scatter(1, idx[:, :2], 2.5),
                x.scatter_reduce(0, idx, src, "amax", include_self=False),
                x.scatter_reduce(0, idx, src, "mean"), kv, xi.index_add(0, li, srci),
                torch.zeros(4, 5).scatter_(1, li[:, None], 1.0),  # one-hot
                xi.scatter_reduce(0, li[:, None].expand(4, 7), srci, "mean"))  # fmt: skip

    report = torch_matches_eager(f, x, idx, src, cache, new, pos, xi, li, srci, atol=1e-6)
    assert report["eager"] == {} and report["eager_for_dtype"] == {}


@pytest.mark.extra  # needs PyTorch
def test_a_scatter_of_many_rows_stays_in_pytorch_with_its_reason():
    # F.fold decomposes into an index_put of every column entry: 8 * 9 * 1600 = 115200 rows
    # that each output element would compare (quadratic); eager visits each row once
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F  # noqa: N812

    from polyfuse.torch.scatter import SCATTER_MAX_ROWS

    def f(x):
        return F.fold(F.unfold(x, 3, padding=1) * 2, (40, 40), 3, padding=1)

    report = torch_matches_eager(f, torch.randn(1, 8, 40, 40), atol=1e-5)
    why = f"a scatter of more than {SCATTER_MAX_ROWS} update rows (each element compares all)"
    assert report["reasons"] == {"aten.index_put.default": why}
