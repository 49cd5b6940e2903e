"""Regression tests for silent wrong answers of the core compiler (issue 9, items 1, 2, 4, 5).

Each test compiles a small graph, runs it on the emulator and compares with numpy: kernel
launch order, size-1 axes, NaN/±inf propagation of max/min, same-named placeholders and
lambdas with default arguments.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import te
from polyfuse.cuda import launch
from polyfuse.errors import CallError

RACE_MODES = (False, "reverse", "random")


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- 1. launch order


def _row_col_graph(m: int, n: int):
    x = te.placeholder((m, n), name="x")
    k = te.reduce_axis(n, name="k")
    q = te.reduce_axis(m, name="q")
    rs = te.compute((m,), lambda i: te.sum(x[i, k], axis=k), name="rowsum")
    cs = te.compute((n,), lambda j: te.sum(x[q, j], axis=q), name="colsum")
    y = te.compute((m, n), lambda i, j: x[i, j] / (rs[i] + cs[j]), name="y")
    return x, y


def _launches_read_only_written_buffers(fn: polyfuse.CompiledGraph) -> None:
    """Every launch reads only graph inputs or buffers an earlier launch wrote."""
    ready = {b.name for b in fn.buffers if b.role == "input"}
    kernels = {k.name: k for k in fn.kernels}
    assert [k.name for k in fn.kernels] == [la.kernel for la in fn.launches]
    for la in fn.launches:
        k = kernels[la.kernel]
        for p in k.params:
            if p.tensor and p.ctype.startswith("const"):
                assert p.tensor in ready, f"{la.kernel} reads {p.tensor} before it is written"
        ready |= {p.tensor for p in k.params if p.tensor and not p.ctype.startswith("const")}


@pytest.mark.parametrize("race_check", RACE_MODES)
def test_two_reductions_feeding_one_consumer(race_check):
    x, y = _row_col_graph(33, 47)
    fn = polyfuse.compile([x], [y])
    _launches_read_only_written_buffers(fn)
    a = np.abs(_rand(33, 47)) + 0.5
    want = a / (a.sum(1)[:, None] + a.sum(0)[None, :])
    np.testing.assert_allclose(fn(a, race_check=race_check), want, rtol=1e-5)


def test_launch_order_follows_buffers_not_creation():
    # kernel 0 reads what kernel 2 writes; kernel 1 is independent
    acc = [({"c"}, {"y"}), ({"x"}, {"a"}), ({"x"}, {"c"})]
    order = launch.dependence_order(acc, ["k0", "k1", "k2"])
    assert order == [1, 2, 0]
    with pytest.raises(CallError, match="cycle"):
        launch.dependence_order([({"b"}, {"a"}), ({"a"}, {"b"})], ["k0", "k1"])
