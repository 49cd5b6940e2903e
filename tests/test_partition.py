"""Algorithm 1 partitioning, isl fusion into one band, and budget feedback."""

import islpy as isl
import numpy as np

import polyfuse
from polyfuse import ops, te
from polyfuse.graph.graph import build_graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import PARTITION_RULES, Rule, partition
from polyfuse.poly.model import build_model
from polyfuse.poly.schedule import compute_schedule


def chain5():
    x, b = te.placeholder((6, 40), name="x"), te.placeholder((40,), name="b")
    c0 = te.compute((6, 40), lambda i, j: x[i, j] * 2.0, name="c0")
    c1 = te.compute((6, 40), lambda i, j: c0[i, j] + b[j], name="c1")
    c2 = te.compute((6, 40), lambda i, j: te.exp(c1[i, j]), name="c2")
    c3 = te.compute((6, 40), lambda i, j: c2[i, j] - 1.0, name="c3")
    c4 = te.compute((6, 40), lambda i, j: te.tanh(c3[i, j]), name="c4")
    ref = lambda x, b: np.tanh(np.exp(2 * x + b) - 1)  # noqa: E731
    return [x, b], [c4], ref


def test_chain_of_five_is_one_micrograph_one_band_one_kernel():
    ins, outs, ref = chain5()
    fn = polyfuse.compile(ins, outs)
    assert len(fn.plan.micrographs) == 1
    assert len(fn.kernels) == 1
    sched = fn.plan.scheduled[0].schedule
    band = sched.get_root().child(0)
    assert band.get_type() == isl.schedule_node_type.band
    assert band.get_domain().is_equal(fn.plan.scheduled[0].model.domain)
    assert len(fn.plan.scheduled[0].model.statements) == 5
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(40).astype(np.float32)
    np.testing.assert_allclose(fn(x, b, device="emulate"), ref(x, b), rtol=1e-5, atol=1e-6)


def test_softmax_partition_and_reasons():
    x = te.placeholder((4, 8), name="x")
    y = ops.softmax(x, name="sm")
    part = partition(build_graph([x], [y]))
    groups = [m.prims for m in part.micrographs]
    assert groups == [["sm_max"], ["sm_sub", "sm_exp", "sm_sum"], ["sm"]]
    assert [m.kind for m in part.micrographs] == [
        OpKind.REDUCTION,
        OpKind.REDUCTION,
        OpKind.BROADCAST,
    ]
    reasons = {(d.producer, d.consumer): d for d in part.decisions}
    assert reasons[("sm_sub", "sm_exp")].fused and reasons[("sm_sub", "sm_exp")].rule == 3
    assert reasons[("sm_exp", "sm_sum")].rule == 4
    assert "cycle" in reasons[("sm_exp", "sm")].reason
    assert "no partition rule for reduction" in reasons[("sm_sum", "sm")].reason


def test_rule_table_is_data():
    x = te.placeholder((4, 8), name="x")
    y = ops.exp(ops.exp(x, name="a"), name="b")
    g = build_graph([x], [y])
    assert len(partition(g).micrographs) == 1
    no_rule_1 = tuple(r for r in PARTITION_RULES if r.number != 1)
    assert len(partition(g, no_rule_1).micrographs) == 2
    assert all(isinstance(r, Rule) for r in PARTITION_RULES)


def test_never_creates_cycles():
    # a -> b (reduction) -> c, and a -> c: merging a with c directly would enclose b.
    x = te.placeholder((4, 8), name="x")
    a = ops.exp(x, name="a")
    b = ops.reduce_sum(a, axis=1, keepdims=True, name="b")
    c = ops.add(a, b, name="c")
    part = partition(build_graph([x], [c]))
    import networkx as nx

    q = nx.DiGraph()
    for d in part.decisions:
        if not d.fused:
            q.add_edge(part.owner[d.producer], part.owner[d.consumer])
    assert nx.is_directed_acyclic_graph(q)


def test_tiny_budget_splits_with_reason_and_stays_correct():
    ins, outs, ref = chain5()
    fn = polyfuse.compile(ins, outs, budget=10)
    assert len(fn.plan.feedback) >= 1
    assert "budget of 10 operations exhausted" in fn.plan.feedback[0].reason
    assert len(fn.plan.micrographs) > 1
    text = str(fn.plan)
    assert "feedback events" in text and "split into" in text
    assert "isl feedback" in text  # decisions name the reason
    x = np.random.default_rng(0).standard_normal((6, 40)).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(40).astype(np.float32)
    np.testing.assert_allclose(fn(x, b, device="emulate"), ref(x, b), rtol=1e-5, atol=1e-6)


def test_isl_split_feeds_back_to_partitioner():
    # r[i] = sum_k c[k, i] * c[i, k]: every row of c is needed by every r, so isl can fuse
    # c with r only by skewing, without a parallel outer loop; the micrograph is split.
    x = te.placeholder((6, 6), name="x")
    c = te.compute((6, 6), lambda i, j: x[i, j] * 2.0, name="c")
    k = te.reduce_axis(6, name="k")
    r = te.compute((6,), lambda i: te.sum(c[k, i] * c[i, k], axis=k), name="r")
    fn = polyfuse.compile([x], [r])
    assert [e.groups for e in fn.plan.feedback] == [[["c"], ["r"]]]
    assert "without parallel outer loops" in fn.plan.feedback[0].reason
    xv = np.random.default_rng(0).standard_normal((6, 6)).astype(np.float32)
    c2 = 2.0 * xv.astype(np.float64)
    np.testing.assert_allclose(fn(xv, device="emulate"), (c2 * c2.T).sum(1), rtol=1e-5)


def test_schedule_model_is_printable():
    ins, outs, _ = chain5()
    g = build_graph(ins, outs)
    mg = partition(g).micrographs[0]
    sm = compute_schedule(build_model(g, mg))
    assert "S_c4" in str(sm.model) and "schedule" in str(sm)
