"""Graph passes (issue 24 item 2): what they must NOT do, and the plan listing every pass.

The batch-norm fold only touches constant weights and never the array another primitive reads;
CSE never merges computations that differ in an attribute (reduction, stride, offset, shape);
DCE keeps every graph output; bad ``passes=`` arguments and a missing evaluator are polyfuse
errors. Values are checked against ``polyfuse.reference.evaluate`` of the ORIGINAL graph, with
the tolerances of tests/test_graph_passes.py.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from test_graph_passes import (
    _bn_params,
    _consistent,
    _emulated,
    _evaluate,
    _graph,
    _original,
    _rand,
    _records,
    _tags,
    _values,
)

import polyfuse
from polyfuse import ops, te
from polyfuse.errors import PolyfuseError
from polyfuse.graph.passes import PassAction, cse, dce, run_passes


def test_batchnorm_fold_scales_a_weight_read_twice_once():
    """``sum(x * r * r)`` with one Read object ``r = w[k, j]`` used twice: the fold scales one
    use (scaling both, as the first version did, squared the batch-norm scale)."""
    x, w = te.placeholder((3, 5), name="x"), te.placeholder((5, 4), name="w")
    (mean, var, gamma, beta), consts = _bn_params(4)
    consts[w] = _rand(5, 4)
    k = te.reduce_axis(5, name="k")

    def body(i, j):
        r = w[k, j]
        return te.sum(x[i, k] * r * r, k)

    sq = te.compute((3, 4), body, name="sq")
    y = ops.batch_norm(sq, mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x], [y], consts), evaluate=_evaluate)
    assert _records(g, "batchnorm_fold", PassAction.FOLDED) and "batch_norm" not in _tags(g)
    xv = _rand(3, 5)
    want = _original([y], {x: xv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv})[0], want, rtol=1e-5, atol=1e-6)


def test_batchnorm_fold_leaves_a_shared_weight_intact():
    """Two convolutions and a matmul-like reader share one weight; each batch norm folds into
    its own scaled copy, the weight array and the unfolded reader keep the original values."""
    x1, x2 = te.placeholder((1, 2, 5, 5), name="x1"), te.placeholder((1, 2, 5, 5), name="x2")
    w = te.placeholder((3, 2, 3, 3), name="w")
    (m1, v1, g1, b1), consts = _bn_params(3, "bn1")
    (m2, v2, g2, b2), c2 = _bn_params(3, "bn2")
    consts.update(c2)
    consts[w] = _rand(3, 2, 3, 3)
    w_before = consts[w].copy()
    y1 = ops.batch_norm(ops.conv2d(x1, w, padding=1, name="c1"), m1, v1, g1, b1, name="bn1")
    y2 = ops.batch_norm(ops.conv2d(x2, w, padding=1, name="c2"), m2, v2, g2, b2, name="bn2")
    plain = ops.conv2d(x1, w, name="c3")  # no batch norm: reads w itself
    outs = [y1, y2, plain]
    g = run_passes(_graph([x1, x2], outs, consts), evaluate=_evaluate)
    folds = _records(g, "batchnorm_fold", PassAction.FOLDED)
    assert sorted(r.prims for r in folds) == [("bn1", "c1_"), ("bn2", "c2_")]
    weights = {
        n: {r.tensor.uid for r in g.prims[n].tensor.op.reads() if g.is_constant(r.tensor)}
        for n in ("c1_", "c2_", "c3_")
    }
    assert weights["c3_"] == {w.uid} and len(weights["c1_"] | weights["c2_"]) == 2
    assert w.uid not in weights["c1_"] | weights["c2_"]
    np.testing.assert_array_equal(consts[w], w_before)  # the caller's array
    np.testing.assert_array_equal(g.constants[w.uid], w_before)  # the graph's binding
    _consistent(g)
    xv1, xv2 = _rand(1, 2, 5, 5), _rand(1, 2, 5, 5)
    want = _original(outs, {x1: xv1, x2: xv2}, consts)
    got_ref = _values(g, {x1: xv1, x2: xv2})
    np.testing.assert_array_equal(got_ref[2], want[2])  # the plain conv: exactly as written
    for a, b in zip(got_ref[:2], want[:2], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    got, _ = _emulated([x1, x2], outs, consts, [xv1, xv2])
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_batchnorm_is_not_folded_into_a_runtime_weight():
    """Constant statistics after a convolution whose weight is a call argument: no weight to
    scale at compile time, so the fold is refused with the reason (the scale is still folded
    into a constant by constant folding)."""
    x, w = te.placeholder((1, 2, 4, 4), name="x"), te.placeholder((3, 2, 1, 1), name="w")
    (mean, var, gamma, beta), consts = _bn_params(3)
    y = ops.batch_norm(ops.conv2d(x, w, name="conv"), mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x, w], [y], consts), evaluate=_evaluate)
    assert not _records(g, "batchnorm_fold", PassAction.FOLDED)
    (refused,) = _records(g, "batchnorm_fold", PassAction.REFUSED)
    assert refused.prims == ("bn", "conv") and "no constant factor" in refused.reason
    assert "batch_norm" in _tags(g)
    xv, wv = _rand(1, 2, 4, 4), _rand(3, 2, 1, 1)
    want = _original([y], {x: xv, w: wv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv, w: wv})[0], want, rtol=1e-6, atol=1e-7)
    got, _ = _emulated([x, w], [y], consts, [xv, wv])
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)


def test_cse_never_merges_different_attributes():
    """Same input, same body text but for one attribute: reduction kind, stride (shape),
    slice offset (subscripts), constant, reduced axis. Nothing merges; values unchanged."""
    x = te.placeholder((1, 2, 6, 6), name="x")
    w = te.placeholder((2, 2, 3, 3), name="w")
    m = te.placeholder((4, 6), name="m")
    c1 = ops.conv2d(x, w, name="c1")
    c2 = ops.conv2d(x, w, stride=2, name="c2")  # other stride: other shape
    s1, s2 = ops.slice(m, [0], [3], [0], name="s1"), ops.slice(m, [1], [4], [0], name="s2")
    r_sum, r_max = ops.reduce_sum(m, 1, name="r_sum"), ops.reduce_max(m, 1, name="r_max")
    r_rows = ops.reduce_sum(m, 0, name="r_rows")  # the other axis
    e2, e3 = ops.mul(m, 2.0, name="e2"), ops.mul(m, 3.0, name="e3")
    outs = [
        ops.exp(c1),
        ops.exp(c2),
        ops.add(s1, s2),
        ops.add(r_sum, r_max),
        ops.exp(r_rows),
        ops.add(e2, e3),
    ]
    g0 = _graph([x, w, m], outs)
    g = cse(g0)
    assert not _records(g, "cse") and sorted(g.prims) == sorted(g0.prims)
    feeds = {x: _rand(1, 2, 6, 6), w: _rand(2, 2, 3, 3), m: _rand(4, 6)}
    for a, b in zip(_values(g, feeds), _original(outs, feeds), strict=True):
        np.testing.assert_array_equal(a, b)


def test_cse_merges_equal_convolutions_and_matmuls():
    """The positive counterpart: the same conv and matmul written twice merge, down to one
    primitive each, and the reader of both reads one."""
    x, w = te.placeholder((1, 2, 5, 5), name="x"), te.placeholder((2, 2, 3, 3), name="w")
    a, b = te.placeholder((3, 4), name="a"), te.placeholder((4, 5), name="b")
    y = ops.add(ops.conv2d(x, w, name="c1"), ops.conv2d(x, w, name="c2"), name="y")
    z = ops.mul(ops.matmul(a, b, name="m1"), ops.matmul(a, b, name="m2"), name="z")
    g0 = _graph([x, w, a, b], [y, z])
    g = dce(cse(g0))
    assert sorted(r.prims for r in _records(g, "cse", PassAction.MERGED)) == [
        ("c2_", "c1_"),
        ("m2", "m1"),
    ]
    assert sorted(g.prims) == ["c1_", "m1", "y", "z"]
    feeds = {x: _rand(1, 2, 5, 5), w: _rand(2, 2, 3, 3), a: _rand(3, 4), b: _rand(4, 5)}
    for u, v in zip(_values(g, feeds), _original([y, z], feeds), strict=True):
        np.testing.assert_array_equal(u, v)


def test_dce_keeps_every_graph_output():
    """An output another output reads, an output nothing reads, and an output that is a pure
    copy of an input all stay primitives; only the dead branch goes."""
    x = te.placeholder((4, 3), name="x")
    a = ops.exp(x, name="a")  # an output, also read by b
    b = ops.mul(a, 2.0, name="b")
    copy = ops.mul(x, 1.0, name="copy")  # an output that simplifies to a copy
    dead = ops.tanh(a, name="dead")
    outs = [a, b, copy]
    g0 = _graph([x], [*outs, dead])
    g0 = replace(g0, outputs=list(outs))  # 'dead' is no longer an output: dead code
    g = dce(g0)
    assert sorted(g.prims) == ["a", "b", "copy"]
    (removed,) = _records(g, "dce", PassAction.REMOVED)
    assert removed.prims == ("dead",)
    g = run_passes(g0, evaluate=_evaluate)
    assert sorted(g.prims) == ["a", "b", "copy"]
    assert [o.name for o in g.outputs] == ["a", "b", "copy"]
    xv = _rand(4, 3)
    for u, v in zip(_values(g, {x: xv}), _original(outs, {x: xv}), strict=True):
        np.testing.assert_array_equal(u, v)
    got, _ = _emulated([x], outs, {}, [xv])
    for u, v in zip(got, _original(outs, {x: xv}), strict=True):
        np.testing.assert_allclose(u, v, rtol=1e-6)


def test_the_plan_lists_what_each_pass_did():
    """One graph that gives every pass something to do; the plan names each pass's change."""
    x = te.placeholder((1, 2, 4, 4), name="x")
    w, k = te.placeholder((3, 2, 1, 1), name="w"), te.placeholder((3, 1, 1), name="k")
    (mean, var, gamma, beta), consts = _bn_params(3)
    consts.update({w: _rand(3, 2, 1, 1), k: _rand(3, 1, 1)})
    conv = ops.conv2d(ops.mul(x, 1.0, name="one"), w, name="conv")  # simplify: x * 1
    y = ops.batch_norm(conv, mean, var, gamma, beta, name="bn")  # batchnorm_fold
    ek = ops.exp(k, name="ek")  # constant_fold
    r1, r2 = ops.relu(y, name="r1"), ops.relu(y, name="r2")  # cse, then dce
    out = ops.add(ops.mul(r1, ek, name="scaled"), r2, name="out")
    fn = polyfuse.compile([x], [out], constants=consts, check_cuda=False)
    text = str(fn.plan)
    head, _, _ = text.partition("primitives (")
    passes = ("simplify, constant_fold, cse, batchnorm_fold, merge_siblings, stack_siblings, "
              "layout_fold, split_reduction, dce")
    assert f"graph passes ({passes}:" in head
    assert "simplify: forwarded: one [mul] equals x element for element" in head
    assert "constant_fold: folded: ek [exp] reads only constants (k)" in head
    assert "cse: merged: r2_ computes what r1_ computes" in head
    assert "batchnorm_fold: folded: bn [batch_norm] scales conv [conv2d]" in head
    assert "dce: removed: 7 constants no primitive reads" in head  # w, k, the statistics
    for name in ("simplify", "constant_fold", "cse", "batchnorm_fold", "dce"):
        assert _records(fn.plan.graph, name), name
    xv = _rand(1, 2, 4, 4)
    want = _original([out], {x: xv}, consts)[0]
    np.testing.assert_allclose(fn(xv), want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("passes", [3, ["cse", 7], "nonsense"])
def test_bad_passes_argument_is_a_polyfuse_error(passes):
    x = te.placeholder((4,), name="x")
    with pytest.raises(PolyfuseError, match=r"compile: .*graph pass.*simplify"):
        polyfuse.compile([x], [ops.exp(x)], check_cuda=False, passes=passes)


def test_folding_without_an_evaluator_is_a_polyfuse_error():
    x = te.placeholder((4,), name="x")
    g = _graph([x], [ops.exp(x)])
    with pytest.raises(PolyfuseError, match="constant_fold.*evaluate="):
        run_passes(g, ["constant_fold"])
    assert run_passes(g, ["cse", "dce"]).prims.keys() == g.prims.keys()  # no evaluator needed
