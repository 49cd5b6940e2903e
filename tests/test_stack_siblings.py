"""Reductions applying one computation to constant offsets of one input stack into one.

An LSTM written step by step (the zoo's) projects each step's input ``x[t]`` with the same
``W_x``: 16 GEMMs of 32 rows at T 16, B 32, one launch each. ``stack_siblings`` computes them
as one GEMM over ``(t, b, j)`` with the bias add, each step reading its slice; the zoo LSTM
went from 63 to 48 kernels, 385 -> 286 us modelled in float32 (283 -> 205 in bfloat16).
"""

from __future__ import annotations

import numpy as np
import pytest
from lstm_graphs import lstm, lstm_reference

import polyfuse
from polyfuse import te, zoo
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.graph.expr import Binary, Const, IterVar
from polyfuse.graph.graph import build_graph
from polyfuse.graph.passes.pipeline import DEFAULT_PASSES, run_passes
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.stack_siblings import int_value


def _stepwise_lstm(steps: int, batch: int, n_in: int, hidden: int, dtype: str = "float32"):
    return lstm(steps, batch, n_in, hidden, dtype)


def _passes(ins, outs, names=DEFAULT_PASSES):
    import islpy as isl

    from polyfuse.driver import _evaluate

    g = build_graph(list(ins), list(outs), isl.Context())
    return run_passes(g, names, evaluate=_evaluate)


def _records(g, action):
    return [r for r in g.pass_records if r.pass_name == "stack_siblings" and r.action == action]


def test_int_value_of_folded_subscripts():
    """The layout fold leaves constant subscripts as ``0 + 1``: evaluated; a loop variable is
    no constant."""
    one = Const(1, "int32", weak=False)
    assert int_value(Binary("add", Const(0, "int32", weak=False), one)) == 1
    assert int_value(Binary("mul", Const(3, "int32", weak=False), Const(2, "int32"))) == 6
    assert int_value(Binary("add", IterVar("i", 0, 4), one)) is None


def test_zoo_lstm_projections_are_one_gemm():
    """T 4 (tiny zoo LSTM): the four ``x[t] @ W_x`` and their bias adds become one reduction
    over ``(u, b, j)`` with the bias add stacked; nothing else reads ``x``."""
    ins, outs, consts, _ = zoo.build("lstm", "tiny", weights="zeros")
    import islpy as isl

    from polyfuse.driver import _evaluate

    g = build_graph(ins + list(consts), outs, isl.Context(), constants=consts)
    g = run_passes(g, evaluate=_evaluate)
    (rec,) = _records(g, PassAction.MERGED)
    assert "u < 4" in rec.reason and "epilogue" in rec.reason, rec.reason
    x = next(t for t in ins if t.name == "x")
    readers = [p for p in g.prims.values() if any(s.uid == x.uid for s in p.tensor.op.inputs())]
    (only,) = readers
    assert only.tensor.shape == (4, 2, 32) and only.tensor.op.reduce is not None


def test_full_lstm_launches_one_projection():
    """T 16, B 32, H 512 (the zoo's full size): one kernel reads ``x`` (16 did), 3 kernels a
    step after the first (4 before)."""
    ins, outs = _stepwise_lstm(16, 32, 512, 512)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    reading_x = [k for k in fn.kernels if k.tensor_bytes.get("x", (0, 0))[0]]
    assert len(reading_x) == 1, [k.name for k in reading_x]
    assert len(fn.kernels) <= 3 * 16, len(fn.kernels)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stacked_lstm_matches_float64(dtype):
    """Odd sizes (T 3, B 5, I 19, H 13), every race mode, float32 and bfloat16 (the stacked
    GEMM on tensor cores)."""
    steps, hidden = 3, 13
    ins, outs = _stepwise_lstm(steps, 5, 19, hidden, dtype)
    assert _records(_passes(ins, outs), PassAction.MERGED)
    fn = polyfuse.compile(ins, outs)
    rng = np.random.default_rng(1)
    arrays = [(0.5 * rng.standard_normal(t.shape)).astype(numpy_dtype(dtype)) for t in ins]
    want = lstm_reference(arrays, steps, hidden)
    for mode in (False, True):
        got = fn(*arrays, device="emulate", race_check=mode)
        for gv, w in zip(got, want, strict=True):
            assert tolerance(dtype).allclose(gv, w.astype(numpy_dtype(dtype))), (mode, gv, w)


def _projections(offsets, n=6, out_also=False):
    """``y_t = relu(x[t] @ w)`` for each ``t`` in ``offsets``, summed (one output each when
    ``out_also``)."""
    x = te.placeholder((n, 7, 11), name="x")
    w = te.placeholder((11, 9), name="w")
    ys = []
    for t in offsets:
        k = te.reduce_axis(11, "k")
        p = te.compute((7, 9), lambda i, j, t=t, k=k: te.sum(x[t, i, k] * w[k, j], axis=k))
        ys.append(te.compute((7, 9), lambda i, j, p=p: te.maximum(p[i, j], 0.0)))
    if out_also:
        return [x, w], ys
    total = ys[0]
    for y in ys[1:]:
        total = te.compute((7, 9), lambda i, j, a=total, b=y: a[i, j] + b[i, j])
    return [x, w], [total]


def test_a_strided_progression_stacks_and_matches():
    """``x[1]``, ``x[3]``, ``x[5]``: stacked with step 2, the ReLU epilogue along; numpy."""
    ins, outs = _projections([5, 1, 3])
    g = _passes(ins, outs)
    (rec,) = _records(g, PassAction.MERGED)
    assert "= 1 + 2·u (u < 3)" in rec.reason and "epilogue" in rec.reason, rec.reason
    rng = np.random.default_rng(2)
    x, w = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    want = sum(np.maximum(x[t].astype(np.float64) @ w, 0) for t in (1, 3, 5))
    fn = polyfuse.compile(ins, outs)
    for mode in (False, True):
        got = fn(x, w, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_no_progression_is_refused():
    """``x[0]``, ``x[1]``, ``x[3]``: no arithmetic progression, refused with the offsets."""
    ins, outs = _projections([0, 1, 3])
    g = _passes(ins, outs)
    assert not _records(g, PassAction.MERGED)
    (rec,) = _records(g, PassAction.REFUSED)
    assert "[0, 1, 3] are no arithmetic progression" in rec.reason, rec.reason


def test_graph_outputs_are_not_stacked():
    """A member that is a graph output would become a strided slice store: refused; the
    others still stack when two remain."""
    x = te.placeholder((4, 5, 6), name="x")
    w = te.placeholder((6, 3), name="w")
    ps = []
    for t in range(3):
        k = te.reduce_axis(6, "k")
        ps.append(te.compute((5, 3), lambda i, j, t=t, k=k: te.sum(x[t, i, k] * w[k, j], axis=k)))
    s = te.compute((5, 3), lambda i, j: ps[1][i, j] * ps[2][i, j])
    g = _passes([x, w], [ps[0], s])
    refused = _records(g, PassAction.REFUSED)
    assert any("graph output" in r.reason for r in refused), refused
    (rec,) = _records(g, PassAction.MERGED)
    assert "u < 2" in rec.reason, rec.reason


def test_plain_reductions_are_not_stacked():
    """Row sums of ``x[0]`` and ``x[1]`` are no contractions: each stays stitched with its
    reader (stacked, a reduction kernel and a reader kernel each would remain)."""
    x = te.placeholder((2, 6, 10), name="x")
    outs = []
    for t in range(2):
        k = te.reduce_axis(10, "k")
        s = te.compute((6,), lambda i, t=t, k=k: te.sum(x[t, i, k], axis=k))
        outs.append(te.compute((6, 10), lambda i, j, t=t, s=s: x[t, i, j] - s[i]))
    g = _passes([x], outs)
    assert not _records(g, PassAction.MERGED) and not _records(g, PassAction.REFUSED)
