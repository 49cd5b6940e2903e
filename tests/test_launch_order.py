"""The launch order (stitch/order.py:dependence_order) in linear time gives the order of the
original all-pairs definition on random buffer accesses."""

from __future__ import annotations

import random

import pytest

from polyfuse.errors import CallError
from polyfuse.stitch.order import dependence_order


def all_pairs_order(accesses, names):
    """The original definition: every ordered pair checked, lowest ready index first."""
    n = len(accesses)
    preds = [set() for _ in range(n)]
    for j in range(n):
        rj, wj = accesses[j]
        for i in range(n):
            if i == j:
                continue
            wi = accesses[i][1]
            if wi & (rj - wj) or (i < j and wi & wj):
                preds[j].add(i)
    order, done = [], set()
    while len(order) < n:
        ready = [k for k in range(n) if k not in done and preds[k] <= done]
        if not ready:
            stuck = [names[k] for k in range(n) if k not in done]
            raise CallError(f"kernels {', '.join(stuck)} depend on each other in a cycle")
        order.append(ready[0])
        done.add(ready[0])
    return order


@pytest.mark.parametrize("seed", range(200))
def test_same_order_as_all_pairs(seed):
    rng = random.Random(seed)
    n, nbuf = rng.randint(1, 25), rng.randint(3, 30)
    bufs = [f"b{i}" for i in range(nbuf)]
    accesses = [
        (set(rng.sample(bufs, rng.randint(0, 3))), set(rng.sample(bufs, rng.randint(0, 2))))
        for _ in range(n)
    ]
    names = [f"k{i}" for i in range(n)]
    try:
        want = all_pairs_order(accesses, names)
    except CallError as e:
        with pytest.raises(CallError) as got:
            dependence_order(accesses, names)
        assert str(got.value) == str(e)
        return
    assert dependence_order(accesses, names) == want
