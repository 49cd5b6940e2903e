"""Test-only reference: the original Algorithm 1 loop (networkx contraction, full rescans).

Kept verbatim from before the merge-engine rewrite of :mod:`polyfuse.graph.partition` so the
tests can check that the fast partitioner gives the same micrographs on every zoo model and on
random graphs. Quadratic and slow on deep models; do not use outside the tests.
"""

from __future__ import annotations

import networkx as nx

from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import (
    PARTITION_RULES,
    Decision,
    Micrograph,
    Partition,
    Rule,
)

R = OpKind.REDUCTION


def reference_partition(
    graph: Graph,
    rules: tuple[Rule, ...] = PARTITION_RULES,
    separations: set[frozenset[str]] | None = None,
) -> Partition:
    """Algorithm 1 (aggregation). Steps numbered as in APOLLO's appendix."""
    separations = set(separations or ())
    order = graph.topo_order()
    rank = {p: i for i, p in enumerate(order)}
    # Step 1: one micrograph per primitive, typed by the primitive's kind.
    members: dict[int, set[str]] = {i: {p} for i, p in enumerate(order)}
    kind: dict[int, OpKind] = {i: graph.prims[p].kind for i, p in enumerate(order)}
    owner = {p: i for i, p in enumerate(order)}
    # Step 2: the quotient DAG over micrographs.
    q = nx.DiGraph()
    q.add_nodes_from(members)
    for a, b in graph.dag.edges:
        q.add_edge(owner[a], owner[b])
    merged_by: dict[frozenset[int], int] = {}
    refusals: dict[tuple[str, str], str] = {}  # primitive edge -> why its merge was refused

    def refuse(p: int, c: int, reason: str) -> None:
        for a, b in graph.dag.edges:
            if a in members[p] and b in members[c]:
                refusals[(a, b)] = reason

    def separated(a: int, b: int) -> bool:
        return any(frozenset((x, y)) in separations for x in members[a] for y in members[b])

    def creates_cycle(p: int, c: int) -> str | None:
        for s in q.successors(p):
            if s != c and nx.has_path(q, s, c):
                return next(iter(sorted(members[s], key=rank.__getitem__)))
        return None

    # Steps 3-4: rules in priority order; rescan until a rule changes nothing.
    for rule in rules:
        changed = True
        while changed:
            changed = False
            edges = sorted(
                q.edges,
                key=lambda e: (
                    min(rank[x] for x in members[e[0]]),
                    min(rank[x] for x in members[e[1]]),
                ),
            )
            for p, c in edges:
                if not rule.matches(kind[p], kind[c]):
                    continue
                if separated(p, c):
                    refuse(p, c, "isl feedback separated these primitives")
                    continue
                via = creates_cycle(p, c)
                if via is not None:
                    refuse(p, c, f"merging would create a cycle through {via}")
                    continue
                # aggregate(Gp, Gc): the consumer's id survives.
                members[c] |= members.pop(p)
                kind[c] = rule.result
                del kind[p]
                for x in members[c]:
                    owner[x] = c
                for x in members[c]:
                    for y in members[c]:
                        if x != y:
                            merged_by.setdefault(frozenset((x, y)), rule.number)  # type: ignore[arg-type]
                q = nx.contracted_nodes(q, c, p, self_loops=False)
                changed = True
                break

    # Renumber micrographs in dependence order.
    mg_order = list(
        nx.lexicographical_topological_sort(q, key=lambda m: min(rank[x] for x in members[m]))
    )
    new_id = {old: i for i, old in enumerate(mg_order)}
    mgs = [
        Micrograph(new_id[m], sorted(members[m], key=rank.__getitem__), kind[m]) for m in mg_order
    ]
    owner = {p: new_id[m] for p, m in owner.items()}
    decisions = _decisions(graph, owner, kind, new_id, merged_by, refusals, separations)
    return Partition(mgs, decisions, owner, separations)


def _decisions(graph, owner, kind, new_id, merged_by, refusals, separations) -> list[Decision]:
    old_of = {v: k for k, v in new_id.items()}
    out = []
    for a, b in graph.dag.edges:
        t = graph.dag.edges[a, b]["tensor"]
        if owner[a] == owner[b]:
            rule = merged_by.get(frozenset((a, b)))
            out.append(Decision(a, b, t, True, rule, f"same micrograph mg{owner[a]} (rule {rule})"))
            continue
        pk, ck = kind[old_of[owner[a]]], kind[old_of[owner[b]]]
        if frozenset((a, b)) in separations:
            reason = "isl feedback: split after scheduling failed (see feedback events)"
        elif (a, b) in refusals:
            reason = refusals[(a, b)]
        else:
            reason = f"no partition rule for {pk.value} -> {ck.value}"
            if pk == R:
                reason += " (a reduction joins its consumers in Layer 2 memory stitching)"
        out.append(Decision(a, b, t, False, None, reason))
    return out
