"""Graph passes (issue 24 item 2): each a function Graph → Graph, tested on before/after pairs.

Every test checks the primitives that remain (names, counts, tags) and that the values do not
change: the transformed graph, evaluated by ``polyfuse.reference``, and the compiled graph, run
on the emulator, both match ``polyfuse.reference.evaluate`` of the ORIGINAL graph. Tolerances:
simplification, CSE, DCE and constant folding evaluate the same float32 roundings (exact
equality on the reference, up to a zero's sign for ``x + 0``; on the emulator rtol 1e-6, the
ulp of CUDA's ``expf`` against numpy's float64 ``exp``); the batch-norm fold reassociates
``(x - mean) * scale + beta`` into ``x * scale + shift`` and rounds ``w * scale`` to float32,
so it is checked to rtol 1e-5 / atol 1e-6 on the reference and rtol 1e-4 / atol 1e-5 on the
emulator (which accumulates in float32 where the reference uses float64).
"""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te, zoo
from polyfuse.errors import ExpressionError
from polyfuse.graph.dtypes import numpy_dtype as dt_numpy
from polyfuse.graph.expr import Read, as_expr, walk
from polyfuse.graph.graph import Graph, build_graph
from polyfuse.graph.passes import (
    DEFAULT_PASSES,
    PassAction,
    batchnorm_fold,
    constant_fold,
    cse,
    dce,
    run_passes,
    simplify,
)

RNG = np.random.default_rng(7)
#: The passes without layout folding: what the composition tests of ``simplify`` look at
#: (with it, the composed move folds into its reader too; tests/test_layout_fold.py).
NO_FOLD = tuple(p for p in DEFAULT_PASSES if p != "layout_fold")


def _evaluate(t, feeds):
    return reference.evaluate([t], feeds)[0]


def _graph(inputs, outputs, constants=None) -> Graph:
    constants = constants or {}
    return build_graph(list(inputs) + list(constants), list(outputs), constants=constants)


def _values(g: Graph, feeds: dict) -> list[np.ndarray]:
    """The outputs of graph ``g`` (after passes) by the reference, from the user's feeds and
    the graph's own constants."""
    bound = {t: g.constants[t.uid] for t in g.inputs if g.is_constant(t)}
    return reference.evaluate(g.outputs, {**feeds, **bound})


def _original(outputs, feeds: dict, constants=None) -> list[np.ndarray]:
    return reference.evaluate(list(outputs), {**feeds, **(constants or {})})


def _tags(g: Graph) -> list[str]:
    return [p.composite for p in g.prims.values()]


def _records(g: Graph, pass_name: str, action: PassAction | None = None) -> list:
    return [
        r
        for r in g.pass_records
        if r.pass_name == pass_name and (action is None or r.action == action)
    ]


def _consistent(g: Graph) -> None:
    """Every read names the current tensor of the graph (a consistent te graph)."""
    current = {p.tensor.uid: p.tensor for p in g.prims.values()}
    current.update({t.uid: t for t in g.inputs})
    for p in g.prims.values():
        for r in p.tensor.op.reads():
            assert current[r.tensor.uid] is r.tensor, (p.name, r.tensor.name)
        body_reads = {id(r) for r in p.tensor.op.reads()}  # the isl relations' reads too
        assert all(id(r) in body_reads for r, _ in p.relations.reads), p.name
    assert {o.uid for o in g.outputs} <= {p.tensor.uid for p in g.prims.values()}


def _emulated(inputs, outputs, constants, arrays, **kw) -> tuple[list[np.ndarray], object]:
    fn = polyfuse.compile(inputs, outputs, constants=constants, check_cuda=False, **kw)
    got = fn(*arrays)
    return (list(got) if isinstance(got, tuple) else [got]), fn


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# --------------------------------------------------------------------------- CSE


def test_cse_merges_duplicates_and_their_readers():
    x = te.placeholder((4, 8), name="x")
    a1, a2 = ops.exp(x, name="a1"), ops.exp(x, name="a2")
    m1, m2 = ops.mul(a1, 2.0, name="m1"), ops.mul(a2, 2.0, name="m2")
    out = ops.add(m1, m2, name="out")
    g0 = _graph([x], [out])
    g1 = cse(g0)
    merged = _records(g1, "cse", PassAction.MERGED)
    assert [r.prims for r in merged] == [("a2", "a1"), ("m2", "m1")]
    assert sorted(g1.prims) == ["a1", "m1", "out"]  # forwarded duplicates are gone
    assert sorted(g0.prims) == ["a1", "a2", "m1", "m2", "out"]  # the input graph is unchanged
    assert [r.tensor.name for r in g1.prims["out"].tensor.op.reads()] == ["m1", "m1"]
    _consistent(g1)
    xv = _rand(4, 8)
    np.testing.assert_array_equal(_values(g1, {x: xv})[0], _original([out], {x: xv})[0])
    got, fn = _emulated([x], [out], {}, [xv])
    np.testing.assert_allclose(got[0], _original([out], {x: xv})[0], rtol=1e-6)
    assert len(fn.plan.graph.prims) == 3


def test_cse_keeps_outputs_and_distinct_computations():
    x, y = te.placeholder((6,), name="x"), te.placeholder((6,), name="y")
    p, q = ops.exp(x, name="p"), ops.exp(x, name="q")  # both outputs: both stay
    r, s = ops.exp(y, name="r"), ops.mul(x, 3.0, name="s")  # other input / other constant
    t = ops.add(ops.add(r, s), ops.mul(x, 2.0))
    g = cse(_graph([x, y], [p, q, t]))
    assert not _records(g, "cse", PassAction.MERGED)
    (kept,) = _records(g, "cse", PassAction.REFUSED)
    assert "graph output" in kept.reason and kept.prims == ("q", "p")
    assert {"p", "q", "r", "s"} <= set(g.prims)


# --------------------------------------------------------------------------- constant folding


def test_constant_fold_evaluates_computations_on_constants():
    x = te.placeholder((5, 4), name="x")
    w = te.placeholder((3, 4), name="w")
    k = te.placeholder((3,), name="k")
    wt = ops.transpose(w, name="wt")  # (4, 3): a transposed weight
    ek = ops.exp(k, name="ek")
    y = ops.mul(ops.matmul(x, wt, name="mm"), ek, name="y")
    consts = {w: _rand(3, 4), k: _rand(3)}
    g0 = _graph([x], [y], consts)
    g1 = dce(constant_fold(g0, _evaluate))
    folded = _records(g1, "constant_fold", PassAction.FOLDED)
    assert sorted(r.prims[0] for r in folded) == ["ek", "wt"]
    assert sorted(g1.prims) == ["mm", "y"]
    mm_reads = {r.tensor.name for r in g1.prims["mm"].tensor.op.reads()}
    assert mm_reads == {"x", "wt_folded"}
    (wt_c,) = [t for t in g1.inputs if t.name == "wt_folded"]
    np.testing.assert_array_equal(g1.constants[wt_c.uid], consts[w].T)  # exact: a move
    (ek_c,) = [t for t in g1.inputs if t.name == "ek_folded"]
    want = reference.evaluate([ek], {k: consts[k]})[0]  # reference semantics, float32
    np.testing.assert_array_equal(g1.constants[ek_c.uid], want)
    assert w.uid not in g1.constants and k.uid not in g1.constants  # unread: unbound
    assert [r.action for r in _records(g1, "dce")] == [PassAction.REMOVED]
    _consistent(g1)
    xv = _rand(5, 4)
    want = _original([y], {x: xv}, consts)[0]
    np.testing.assert_array_equal(_values(g1, {x: xv})[0], want)
    got, fn = _emulated([x], [y], consts, [xv], passes=["constant_fold", "dce"])
    np.testing.assert_allclose(got[0], want, rtol=1e-5, atol=1e-6)
    assert set(fn.constants) == {"wt_folded", "ek_folded"}


@pytest.mark.parametrize(
    ("dtype", "value"), [("int64", 2**40 + 1), ("float64", 1 + 2**-40), ("int32", 2**30 + 1)]
)
def test_constant_fold_keeps_the_folded_primitive_s_dtype(dtype, value):
    """Regression: a folded primitive became a float32 constant whatever its dtype, so an
    int64 beyond 2**24 or a float64 lost its low bits (a silent wrong result)."""
    x = te.placeholder((3,), dtype, name="x")
    c = te.placeholder((3,), dtype, name="c")
    c2 = te.compute((3,), lambda i: c[2 - i] + 1, name="c2")  # reads only a constant
    y = te.compute((3,), lambda i: x[i] + c2[i], name="y")
    cv = np.array([value, -value, 7], dt_numpy(dtype))
    consts = {c: cv}
    g1 = dce(constant_fold(_graph([x], [y], consts), _evaluate))
    (c2c,) = [t for t in g1.inputs if t.name.endswith("_folded")]
    assert c2c.dtype == dtype and g1.constants[c2c.uid].dtype == dt_numpy(dtype)
    np.testing.assert_array_equal(g1.constants[c2c.uid], cv[::-1] + 1)
    xv = np.array([1, 2, 3], dt_numpy(dtype))
    want = _original([y], {x: xv}, consts)[0]
    np.testing.assert_array_equal(want, xv + cv[::-1] + 1)
    got, _ = _emulated([x], [y], consts, [xv], passes=["constant_fold", "dce"])
    np.testing.assert_array_equal(got[0], want)


def test_a_folded_scalar_keeps_its_zero_dimensions():
    """ONNX fuzz seed 12709: a loss's weight total over constant targets is a 0-d sum of
    constants; its folded constant came out of shape (1,) (``np.ascontiguousarray`` adds a
    dimension to a 0-d array) and the rewrite's shape check failed with an AssertionError."""
    x = te.placeholder((3,), name="x")
    c = te.placeholder((4,), name="c")
    k = te.reduce_axis(4, name="k")
    total = te.compute((), lambda: te.sum(c[k], axis=k), name="total")
    y = te.compute((3,), lambda i: x[i] / total[()], name="y")
    cv, xv = np.array([1, 2, 3, 4], np.float32), _rand(3)
    g1 = dce(constant_fold(_graph([x], [y], {c: cv}), _evaluate))
    (tc,) = [t for t in g1.inputs if t.name.endswith("_folded")]
    assert tc.shape == () and g1.constants[tc.uid].shape == ()
    got, _ = _emulated([x], [y], {c: cv}, [xv], passes=["constant_fold", "dce"])
    np.testing.assert_allclose(got[0], xv / 10, rtol=1e-6)


def test_a_bound_scalar_constant_keeps_its_zero_dimensions():
    """A 0-d constant bound by ``compile(constants=...)`` (ONNX's scalar zero points) became
    shape (1,) in ``compile`` itself (``np.ascontiguousarray`` again), so folding anything that
    read it failed: "evaluate: input 'c' expects shape (), got (1,)"."""
    x = te.placeholder((4,), name="x")
    c = te.placeholder((), name="c")
    d = te.compute((), lambda: c[()] * 2.0, name="d")
    y = te.compute((4,), lambda i: x[i] + d[()], name="y")
    xv = _rand(4)
    got, fn = _emulated([x], [y], {c: np.array(1.5, np.float32)}, [xv])
    np.testing.assert_allclose(got[0], xv + 3.0, rtol=1e-6)
    assert [r for r in fn.plan.graph.pass_records if r.action == PassAction.FOLDED]


def test_constant_fold_refusals():
    x = te.placeholder((4, 3), name="x")
    c = te.placeholder((3,), name="c")
    wide = te.compute((4, 3), lambda i, j: c[j] * 2.0, name="wide")  # a broadcast: grows
    iota = te.compute((4, 3), lambda i, j: i * 3 + j, name="iota")  # reads nothing
    out_c = ops.exp(c, name="out_c")  # an output on constants only
    y = ops.add(ops.add(x, wide, name="xw"), iota, name="y")
    g = run_passes(_graph([x], [y, out_c], {c: _rand(3)}), evaluate=_evaluate)
    refused = {r.prims[0]: r.reason for r in _records(g, "constant_fold", PassAction.REFUSED)}
    assert set(refused) == {"wide", "out_c"}
    assert "outnumber" in refused["wide"] and "graph output" in refused["out_c"]
    assert {"wide", "iota", "out_c"} <= set(g.prims)
    assert not _records(g, "constant_fold", PassAction.FOLDED)


# --------------------------------------------------------------------------- batch-norm fold


def _bn_params(c: int, prefix: str = "bn") -> tuple[list, dict]:
    ts = [te.placeholder((c,), name=f"{prefix}_{n}") for n in ("mean", "var", "gamma", "beta")]
    vals = [
        0.1 * _rand(c),
        (1.0 + 0.5 * np.abs(_rand(c))).astype(np.float32),
        (1.0 + 0.1 * _rand(c)).astype(np.float32),
        0.1 * _rand(c),
    ]
    return ts, dict(zip(ts, vals, strict=True))


def test_batchnorm_folds_into_conv_weights_and_bias():
    x = te.placeholder((2, 3, 8, 8), name="x")
    w = te.placeholder((4, 3, 3, 3), name="w")
    (mean, var, gamma, beta), consts = _bn_params(4)
    consts[w] = _rand(4, 3, 3, 3)
    conv = ops.conv2d(x, w, padding=1, name="conv")
    y = ops.relu(ops.batch_norm(conv, mean, var, gamma, beta, name="bn"), name="y")
    g0 = _graph([x], [y], consts)
    assert sorted(_tags(g0)) == ["batch_norm", "batch_norm", "conv2d", "relu"]
    g1 = run_passes(g0, evaluate=_evaluate)
    assert "batch_norm" not in _tags(g1)
    assert sorted(g1.prims) == ["bn", "conv", "y"]
    assert g1.prims["bn"].composite == "conv2d"  # the conv's bias epilogue now
    (fold,) = _records(g1, "batchnorm_fold", PassAction.FOLDED)
    assert fold.prims == ("bn", "conv") and "into weight w" in fold.reason
    # the folded weight is w * gamma / sqrt(var + eps) per output channel, rounded once
    bn_scale = te.compute((4,), lambda c: gamma[c] * te.rsqrt(var[c] + 1e-5))  # as batch_norm
    scale = reference.evaluate([bn_scale], consts)[0].astype(np.float64)
    (wf,) = [r.tensor for r in g1.prims["conv"].tensor.op.reads() if g1.is_constant(r.tensor)]
    want_w = (consts[w].astype(np.float64) * scale[:, None, None, None]).astype(np.float32)
    np.testing.assert_array_equal(g1.constants[wf.uid], want_w)
    assert set(g1.constants) == {wf.uid, *(t.uid for t in g1.inputs if t.name == "bn_shift")}
    _consistent(g1)
    xv = _rand(2, 3, 8, 8)
    want = _original([y], {x: xv}, consts)[0]
    np.testing.assert_allclose(_values(g1, {x: xv})[0], want, rtol=1e-5, atol=1e-6)
    got, fn = _emulated([x], [y], consts, [xv])
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)
    _, before = _emulated([x], [y], consts, [xv], passes=False)
    assert len(fn.kernels) == 1 < len(before.kernels)  # conv + bias + ReLU: one kernel


def test_batchnorm_folds_into_matmul_columns():
    x = te.placeholder((5, 6), name="x")
    w = te.placeholder((6, 4), name="w")
    (mean, var, gamma, beta), consts = _bn_params(4)
    consts[w] = _rand(6, 4)
    y = ops.batch_norm(ops.matmul(x, w, name="mm"), mean, var, gamma, beta, name="bn")
    out = ops.tanh(y, name="out")
    g = run_passes(_graph([x], [out], consts), evaluate=_evaluate)
    assert "batch_norm" not in _tags(g) and sorted(g.prims) == ["bn", "mm", "out"]
    xv = _rand(5, 6)
    want = _original([out], {x: xv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv})[0], want, rtol=1e-5, atol=1e-6)
    got, _ = _emulated([x], [out], consts, [xv])
    np.testing.assert_allclose(got[0], want, rtol=1e-4, atol=1e-5)


def test_batchnorm_after_conv_bias_collapses_then_folds():
    x = te.placeholder((1, 2, 6, 6), name="x")
    w, b = te.placeholder((3, 2, 3, 3), name="w"), te.placeholder((3,), name="b")
    (mean, var, gamma, beta), consts = _bn_params(3)
    consts.update({w: _rand(3, 2, 3, 3), b: _rand(3)})
    y = ops.batch_norm(ops.conv2d(x, w, b, name="conv"), mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x], [y], consts), evaluate=_evaluate)
    assert sorted(g.prims) == ["bn", "conv_conv"]  # conv's bias add collapsed into bn
    assert _records(g, "batchnorm_fold", PassAction.FOLDED)[0].prims == ("bn", "conv")
    xv = _rand(1, 2, 6, 6)
    want = _original([y], {x: xv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv})[0], want, rtol=1e-5, atol=1e-6)


def test_batchnorm_fold_refused_when_the_conv_has_other_readers():
    x = te.placeholder((1, 2, 5, 5), name="x")
    w = te.placeholder((3, 2, 1, 1), name="w")
    (mean, var, gamma, beta), consts = _bn_params(3)
    consts[w] = _rand(3, 2, 1, 1)
    conv = ops.conv2d(x, w, name="conv")
    y = ops.add(ops.batch_norm(conv, mean, var, gamma, beta, name="bn"), conv, name="y")
    g = run_passes(_graph([x], [y], consts), evaluate=_evaluate)
    (refused,) = _records(g, "batchnorm_fold", PassAction.REFUSED)
    assert refused.prims == ("bn", "conv") and "duplicate" in refused.reason
    assert "batch_norm" in _tags(g)  # the scale was folded into a constant, the rest stays
    xv = _rand(1, 2, 5, 5)
    got, _ = _emulated([x], [y], consts, [xv])
    np.testing.assert_allclose(got[0], _original([y], {x: xv}, consts)[0], rtol=1e-5, atol=1e-6)


def test_batchnorm_with_a_runtime_variance_is_not_folded():
    x, var = te.placeholder((1, 2, 4, 4), name="x"), te.placeholder((2,), name="var")
    w = te.placeholder((2, 2, 1, 1), name="w")
    (mean, const_var, gamma, beta), consts = _bn_params(2)
    del consts[const_var]
    consts[w] = _rand(2, 2, 1, 1)
    y = ops.batch_norm(ops.conv2d(x, w, name="conv"), mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x, var], [y], consts), evaluate=_evaluate)
    assert not _records(g, "batchnorm_fold") and not _records(g, "constant_fold")
    assert sorted(_tags(g)) == ["batch_norm", "batch_norm", "conv2d"]


def test_batchnorm_with_a_runtime_mean_folds_its_scale():
    """Only the scale must be constant: a runtime mean stays in the shift expression."""
    x, mean = te.placeholder((1, 2, 4, 4), name="x"), te.placeholder((2,), name="mean")
    w = te.placeholder((2, 2, 1, 1), name="w")
    (const_mean, var, gamma, beta), consts = _bn_params(2)
    del consts[const_mean]
    consts[w] = _rand(2, 2, 1, 1)
    y = ops.batch_norm(ops.conv2d(x, w, name="conv"), mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x, mean], [y], consts), evaluate=_evaluate)
    (fold,) = _records(g, "batchnorm_fold", PassAction.FOLDED)
    assert "shift as an epilogue" in fold.reason
    assert "mean" in {r.tensor.name for r in g.prims["bn"].tensor.op.reads()}
    xv, mv = _rand(1, 2, 4, 4), _rand(2)
    want = _original([y], {x: xv, mean: mv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv, mean: mv})[0], want, rtol=1e-5, atol=1e-6)


def test_scale_shift_chain_collapses_into_one_primitive():
    x = te.placeholder((2, 3, 4), name="x")
    s1, sh1, s2 = (te.placeholder((3, 1), name=n) for n in ("s1", "sh1", "s2"))
    consts = {s1: _rand(3, 1), sh1: _rand(3, 1), s2: _rand(3, 1)}
    y = ops.mul(ops.add(ops.mul(x, s1, name="m1"), sh1, name="a1"), s2, name="m2")
    out = ops.exp(y, name="out")
    g = run_passes(_graph([x], [out], consts), evaluate=_evaluate)
    assert sorted(g.prims) == ["m2", "out"]
    assert len(_records(g, "batchnorm_fold", PassAction.FOLDED)) == 2
    xv = _rand(2, 3, 4)
    want = _original([out], {x: xv}, consts)[0]
    np.testing.assert_allclose(_values(g, {x: xv})[0], want, rtol=1e-5, atol=1e-6)


def test_chain_of_immediates_is_left_as_written():
    x = te.placeholder((16,), name="x")
    y = ops.relu(ops.add(ops.mul(x, 2.0, name="m"), 1.0, name="a"), name="y")
    g = run_passes(_graph([x], [y]), evaluate=_evaluate)
    assert sorted(g.prims) == ["a", "m", "y"]
    assert [r.action for r in g.pass_records] == [PassAction.SUMMARY]


# --------------------------------------------------------------------------- DCE


def test_dce_removes_dead_primitives_and_unbinds_unread_constants():
    x, unused = te.placeholder((4,), name="x"), te.placeholder((4,), name="unused")
    c, spare = te.placeholder((4,), name="c"), te.placeholder((4,), name="spare")
    a1, a2 = ops.add(x, c, name="a1"), ops.add(x, c, name="a2")
    y = ops.mul(a1, a2, name="y")
    g0 = _graph([x, unused], [y], {c: _rand(4), spare: _rand(4)})
    g1 = cse(g0)  # a2 forwarded to a1: a2 is no longer read
    assert "a2" not in g1.prims
    g2 = dce(g1)
    (unbound,) = _records(g2, "dce", PassAction.REMOVED)
    assert unbound.prims == ("spare",)
    assert spare.uid not in g2.constants and c.uid in g2.constants
    assert unused in g2.inputs  # a call argument stays one
    assert dce(g2).pass_records == g2.pass_records  # nothing left to do


def test_dce_removes_primitives_no_output_reads():
    x = te.placeholder((2, 3, 4), name="x")
    s1, sh1 = te.placeholder((3, 1), name="s1"), te.placeholder((3, 1), name="sh1")
    y = ops.add(ops.mul(x, s1, name="m1"), sh1, name="a1")
    g1 = batchnorm_fold(_graph([x], [y], {s1: _rand(3, 1), sh1: _rand(3, 1)}), _evaluate)
    assert "m1" in g1.prims and not g1.consumers("m1")  # collapsed into a1: dead
    g2 = dce(g1)
    removed = _records(g2, "dce", PassAction.REMOVED)
    assert [r.prims for r in removed] == [("m1",), ("s1", "sh1")]
    assert list(g2.prims) == ["a1"] and len(g2.constants) == 2  # a1's new scale and shift


# --------------------------------------------------------------------------- simplification


def test_simplify_removes_identities():
    x = te.placeholder((3, 5), name="x")
    y1 = ops.mul(x, 1.0, name="y1")
    y2 = te.compute((3, 5), lambda i, j: 1.0 * y1[i, j], name="y2")
    y3 = ops.add(y2, 0.0, name="y3")
    y4 = te.compute((3, 5), lambda i, j: 0 + y3[i, j], name="y4")
    y5 = ops.sub(y4, 0.0, name="y5")
    y6 = ops.div(y5, 1.0, name="y6")
    out = ops.exp(y6, name="out")
    g = run_passes(_graph([x], [out]), evaluate=_evaluate)
    assert sorted(g.prims) == ["out"]
    assert [r.tensor.name for r in g.prims["out"].tensor.op.reads()] == ["x"]
    forwarded = _records(g, "simplify", PassAction.FORWARDED)
    assert sorted(r.prims[0] for r in forwarded) == ["y1", "y2", "y3", "y4", "y5", "y6"]
    xv = _rand(3, 5)
    got, fn = _emulated([x], [out], {}, [xv])
    np.testing.assert_allclose(got[0], _original([out], {x: xv})[0], rtol=1e-6)
    assert len(fn.plan.graph.prims) == 1


def test_simplify_inside_bodies_and_constant_where():
    x, y = te.placeholder((8,), name="x"), te.placeholder((8,), name="y")
    cond = te.equal(as_expr(2), 2)  # a comparison of constants: always true
    s = te.compute((8,), lambda i: te.where(cond, x[i] * 1.0 + 0.0, y[i]) * 3.0, name="s")
    g = run_passes(_graph([x, y], [s]), evaluate=_evaluate)
    body = g.prims["s"].tensor.op.body
    assert repr(body) == "(x[i] * 3.0)"
    assert y in g.inputs and all(r.tensor is not y for r in walk(body) if isinstance(r, Read))
    xv, yv = _rand(8), _rand(8)
    got, _ = _emulated([x, y], [s], {}, [xv, yv])  # y: still a call argument, unread
    np.testing.assert_array_equal(got[0], _original([s], {x: xv, y: yv})[0])


def test_an_output_that_only_copies_stays_a_primitive():
    x = te.placeholder((6,), name="x")
    y = ops.mul(x, 1.0, name="y")
    g = run_passes(_graph([x], [y]), evaluate=_evaluate)
    assert list(g.prims) == ["y"] and repr(g.prims["y"].tensor.op.body) == "x[i0]"
    xv = _rand(6)
    got, _ = _emulated([x], [y], {}, [xv])
    np.testing.assert_array_equal(got[0], xv)


def test_double_transpose_restoring_the_input_is_forwarded():
    x = te.placeholder((2, 3, 4), name="x")
    tb = ops.transpose(ops.transpose(x, (1, 0, 2), name="ta"), (1, 0, 2), name="tb")
    out = ops.exp(tb, name="out")
    g = run_passes(_graph([x], [out]), evaluate=_evaluate)
    assert sorted(g.prims) == ["out"]
    (fw,) = _records(g, "simplify", PassAction.FORWARDED)
    assert "transpose of a transpose" in fw.reason


def test_double_transpose_composes_into_one():
    x = te.placeholder((2, 3, 4), name="x")
    tb = ops.transpose(ops.transpose(x, (0, 2, 1), name="ta"), (1, 0, 2), name="tb")
    out = ops.exp(tb, name="out")  # (4, 2, 3)
    g = run_passes(_graph([x], [out]), NO_FOLD, evaluate=_evaluate)
    assert sorted(g.prims) == ["out", "tb"]
    assert [r.tensor.name for r in g.prims["tb"].tensor.op.reads()] == ["x"]
    assert g.prims["tb"].kind.value == "opaque"  # still one layout move
    xv = _rand(2, 3, 4)
    got, _ = _emulated([x], [out], {}, [xv])
    want = np.exp(xv.astype(np.float64)).transpose(2, 0, 1).astype(np.float32)
    np.testing.assert_array_equal(_values(g, {x: xv})[0], want)
    np.testing.assert_allclose(got[0], want, rtol=1e-6)


@pytest.mark.parametrize(
    ("mid", "final", "remaining"),
    [
        ((2, 12), (8, 3), ["out", "rb"]),
        ((2, 12), (4, 6), ["out"]),
        ((24,), (2, 2, 6), ["out", "rb"]),
    ],
)
def test_reshape_of_reshape_is_one_reshape(mid, final, remaining):
    x = te.placeholder((4, 6), name="x")
    rb = ops.reshape(ops.reshape(x, mid, name="ra"), final, name="rb")
    out = ops.exp(rb, name="out")
    g = run_passes(_graph([x], [out]), NO_FOLD, evaluate=_evaluate)
    assert sorted(g.prims) == remaining
    if "rb" in g.prims:
        assert [r.tensor.name for r in g.prims["rb"].tensor.op.reads()] == ["x"]
    xv = _rand(4, 6)
    want = _original([out], {x: xv})[0]
    np.testing.assert_array_equal(_values(g, {x: xv})[0], want)
    got, _ = _emulated([x], [out], {}, [xv])
    np.testing.assert_allclose(got[0], want, rtol=1e-6)


def test_other_moves_are_not_composed():
    x = te.placeholder((4, 6), name="x")
    sl = ops.slice(ops.transpose(x, name="ta"), [1], [5], [0], name="sl")  # slice of transpose
    y = te.placeholder((4, 6), name="y")
    re = ops.reshape(ops.transpose(y, name="tb"), (24,), name="re")  # reshape of a transpose
    g = run_passes(_graph([x, y], [ops.exp(sl), ops.exp(re)]), NO_FOLD, evaluate=_evaluate)
    assert {"sl", "ta", "re", "tb"} <= set(g.prims)


# --------------------------------------------------------------------------- pipeline, compile


def test_pipeline_runs_to_a_fixed_point_within_its_bound():
    """Conv with bias → batch norm needs two rounds: the chain collapses, then folds."""
    x = te.placeholder((1, 3, 2, 4), name="x")
    w, b = te.placeholder((3, 3, 1, 1), name="w"), te.placeholder((3,), name="b")
    (mean, var, gamma, beta), consts = _bn_params(3)
    consts.update({w: _rand(3, 3, 1, 1), b: _rand(3)})
    y = ops.batch_norm(ops.conv2d(x, w, b, name="conv"), mean, var, gamma, beta, name="bn")
    g = run_passes(_graph([x], [y], consts), evaluate=_evaluate)
    (summary,) = [r for r in g.pass_records if r.action == PassAction.SUMMARY]
    assert "3 rounds" in summary.reason and "bound" not in summary.reason
    cut = run_passes(_graph([x], [y], consts), evaluate=_evaluate, max_rounds=1)
    assert "stopped at the bound of 1 rounds" in cut.pass_records[-1].reason
    assert sorted(cut.prims) == ["bn", "conv_conv"] and "batch_norm" in _tags(cut)


def test_compile_passes_switch_and_plan_listing():
    x = te.placeholder((1, 2, 4, 4), name="x")
    w = te.placeholder((2, 2, 1, 1), name="w")
    (mean, var, gamma, beta), consts = _bn_params(2)
    consts[w] = _rand(2, 2, 1, 1)
    y = ops.batch_norm(ops.conv2d(x, w, name="conv"), mean, var, gamma, beta, name="bn")
    fn = polyfuse.compile([x], [y], constants=consts, check_cuda=False)
    text = str(fn.plan)
    passes = ("simplify, constant_fold, cse, batchnorm_fold, merge_siblings, stack_siblings, "
              "layout_fold, split_reduction, dce")
    assert f"graph passes ({passes}: 3 -> 2" in text
    assert "batchnorm_fold: folded: bn [batch_norm] scales conv [conv2d]" in text
    off = polyfuse.compile([x], [y], constants=consts, check_cuda=False, passes=False)
    assert "graph passes" not in str(off.plan) and len(off.plan.graph.prims) == 3
    only = polyfuse.compile([x], [y], constants=consts, check_cuda=False, passes=["cse"])
    assert {r.pass_name for r in only.plan.graph.pass_records} == {"pipeline"}
    with pytest.raises(ExpressionError, match="unknown graph pass 'fold'.*constant_fold"):
        polyfuse.compile([x], [y], constants=consts, check_cuda=False, passes=["fold"])


def test_every_pass_returns_a_consistent_graph_on_a_zoo_model():
    m = zoo.build("mobilenet_v2", "tiny")
    g = _graph(m.inputs, m.outputs, m.constants)
    for p in (simplify, cse, dce):
        g = p(g)
        _consistent(g)
    for p in (constant_fold, batchnorm_fold):
        g = p(g, _evaluate)
        _consistent(g)


@pytest.mark.slow  # two zoo CNNs compiled twice each, ~15 s apiece
@pytest.mark.parametrize(
    ("name", "kernels_off", "kernels_on"), [("resnet50", 19, 12), ("mobilenet_v2", 22, 12)]
)
def test_zoo_cnn_batch_norm_kernels_disappear(name, kernels_off, kernels_on):
    """Every batch norm folds into its conv. ``kernels_on`` is a bound, not a count: which
    of the remaining convs Layer 3 packs depends on the block sizes the tile model picks."""
    m = zoo.build(name, "tiny")
    arrays = m.sample_inputs()
    want = m.reference(*arrays)
    got_off, off = _emulated(m.inputs, m.outputs, m.constants, arrays, passes=False)
    got_on, on = _emulated(m.inputs, m.outputs, m.constants, arrays)
    bn_before = [p for p in off.plan.graph.prims.values() if p.composite == "batch_norm"]
    assert bn_before and "batch_norm" not in _tags(on.plan.graph)
    convs = [p.name for p in on.plan.graph.prims.values() if p.is_reduction and "conv" in p.name]
    folds = _records(on.plan.graph, "batchnorm_fold", PassAction.FOLDED)
    assert sorted(r.prims[1] for r in folds) == sorted(convs)  # every conv took its batch norm
    assert len(off.kernels) == kernels_off and len(on.kernels) <= kernels_on
    assert on.global_bytes() < 0.7 * off.global_bytes()
    mgs = {mg.name: mg.prims for mg in on.plan.partition.micrographs}
    shifts = {r.prims[0] for r in folds}
    for k in on.kernels:  # a former batch norm runs as its conv's or its reader's epilogue
        prims = {p for mg in k.micrographs for p in mgs[mg]}
        assert not prims <= shifts, (k.name, prims)
    for g, w in zip(got_on, want, strict=True):  # zoo tolerance: rtol 2e-3, atol 2e-4
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4)
    for a, b in zip(got_on, got_off, strict=True):  # folding moves float32 rounding only
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_full_resnet50_loses_its_batch_norm_kernels():
    m = zoo.build("resnet50", "full", weights="zeros")
    off = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, passes=False
    )
    on = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    assert "batch_norm" not in _tags(on.plan.graph)
    convs = sum(
        1 for p in on.plan.graph.prims.values() if p.composite == "conv2d" and p.is_reduction
    )
    assert convs == 53 and len(on.kernels) <= convs + 3 < len(off.kernels)
    assert on.global_bytes() < 0.7 * off.global_bytes()
