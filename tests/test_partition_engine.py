"""The merge-engine partitioner gives the same partition as the original rescanning loop.

The reference (:mod:`partition_reference`) is the pre-rewrite Algorithm 1, kept test-only.
Compared: micrographs (members in order, kinds), owners, and each edge's fused flag and rule;
refusal reasons must agree on their cause (separation, cycle, no rule).
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import networkx as nx
import pytest
from partition_reference import reference_partition

from polyfuse import ops, te
from polyfuse.graph.graph import build_graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import PARTITION_RULES, partition
from polyfuse.graph.quotient import QuotientDag
from polyfuse.zoo import MODELS, build

KINDS = list(OpKind)


def _cause(reason: str) -> str:
    for word in ("separat", "cycle", "no partition rule", "same micrograph"):
        if word in reason:
            return word
    return reason


def assert_same(graph, separations=None) -> None:
    new = partition(graph, PARTITION_RULES, separations)
    old = reference_partition(graph, PARTITION_RULES, separations)
    assert [(m.id, m.prims, m.kind) for m in new.micrographs] == [
        (m.id, m.prims, m.kind) for m in old.micrographs
    ]
    assert new.owner == old.owner
    assert [(d.producer, d.consumer, d.fused, d.rule, _cause(d.reason)) for d in new.decisions] == [
        (d.producer, d.consumer, d.fused, d.rule, _cause(d.reason)) for d in old.decisions
    ]


def synthetic_graph(rng: random.Random, n: int, density: float):
    """A random DAG whose nodes carry random op kinds, shaped like :class:`Graph` for the
    partitioner (which reads only ``dag``, ``prims[..].kind`` and the topological order)."""
    dag = nx.DiGraph()
    prims = {}
    for i in range(n):
        name = f"p{i}"
        dag.add_node(name)
        kind = rng.choices(KINDS, weights=[5, 3, 2, 1])[0]
        prims[name] = SimpleNamespace(kind=kind, tensor=SimpleNamespace(uid=i))
        for j in range(max(0, i - 12), i):
            if rng.random() < density:
                dag.add_edge(f"p{j}", name, tensor=f"p{j}")
    g = SimpleNamespace(dag=dag, prims=prims)
    g.topo_order = lambda: list(nx.lexicographical_topological_sort(dag, key=lambda x: int(x[1:])))
    return g


@pytest.mark.parametrize("seed", range(300))
def test_random_graphs_match_reference(seed):
    rng = random.Random(seed)
    g = synthetic_graph(rng, rng.randint(2, 60), rng.choice([0.1, 0.2, 0.35]))
    seps = None
    if seed % 3 == 0 and g.dag.number_of_edges():
        edges = list(g.dag.edges)
        seps = {frozenset(e) for e in rng.sample(edges, min(len(edges), rng.randint(1, 4)))}
    assert_same(g, seps)


def te_random_graph(rng: random.Random, n: int):
    """A random te program over (4, 8) and (4,) tensors: elementwise, broadcast, row
    reductions and opaque (reversed) reads, so every rule and refusal occurs."""
    return build_graph(*te_random_program(rng, n))


def te_random_program(rng: random.Random, n: int):
    """(inputs, outputs) of the random te program of :func:`te_random_graph`."""
    x = te.placeholder((4, 8), name="x")
    full, rows = [x], []
    for k in range(n):
        op = rng.choice(["ew", "ew", "bcast", "red", "opaque", "rowew"] if rows else ["ew", "red"])
        t = _te_op(rng, op, k, rng.choice(full), full, rows)
        (rows if op in ("red", "rowew") else full).append(t)
    outs = [full[-1]] + ([rows[-1]] if rows else [])
    return [x], outs


def _te_op(rng: random.Random, op: str, k: int, a, full: list, rows: list):
    if op == "ew":
        b = rng.choice(full)
        return te.compute((4, 8), lambda i, j: a[i, j] + b[i, j], name=f"e{k}")
    if op == "bcast":
        r = rng.choice(rows)
        return te.compute((4, 8), lambda i, j: a[i, j] * r[i], name=f"b{k}")
    if op == "red":
        return ops.reduce_sum(a, 1, name=f"r{k}")
    if op == "opaque":
        return te.compute((4, 8), lambda i, j: a[i, 7 - j], name=f"o{k}")
    r = rng.choice(rows)
    return te.compute((4,), lambda i: te.exp(r[i]), name=f"w{k}")


@pytest.mark.parametrize("seed", range(40))
def test_random_te_graphs_match_reference(seed):
    rng = random.Random(1000 + seed)
    assert_same(te_random_graph(rng, rng.randint(3, 25)))


@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_tiny_matches_reference(name):
    m = build(name, "tiny", weights="zeros")
    assert_same(build_graph(list(m.inputs) + list(m.constants), list(m.outputs)))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(MODELS))
def test_zoo_full_matches_reference(name):
    m = build(name, "full", weights="zeros")
    assert_same(build_graph(list(m.inputs) + list(m.constants), list(m.outputs)))


def test_engine_keeps_a_topological_order_and_refuses_cycles():
    # 0 -> 1 -> 3, 0 -> 2 -> 3, 0 -> 3: contracting 0->3 would close 0->1->3.
    q = QuotientDag(5, [None] * 5)
    for u, v in [(0, 1), (1, 3), (0, 2), (2, 3), (0, 3), (3, 4), (2, 4)]:
        q.add_edge(u, v, (u, v))
    assert q.cycle_via(0, 3) == 1
    with pytest.raises(ValueError):
        q.merge(0, 3, None)
    q.merge(1, 3, None)  # 1 and 3 become one node; 2 must still precede it
    assert q.owner_of(1) == q.owner_of(3) == 3
    assert sorted(q.payloads(2, 3)) == [(2, 3)]
    for u, v in q.edges():
        assert q.pos[u] < q.pos[v]
    # A contraction that needs a reorder: 0->2 and 0->1 with 1 placed before 2; after the
    # merge the merged node 2 feeds 1, so 1 must move after it.
    q2 = QuotientDag(3, [None] * 3)
    for u, v in [(0, 2), (0, 1)]:
        q2.add_edge(u, v, (u, v))
    q2.merge(0, 2, "k")
    assert list(q2.edges()) == [(2, 1)] and q2.pos[2] < q2.pos[1]
    assert q2.kind[2] == "k" and q2.lexicographic_order() == [2, 1]
