"""Test-only reference: the original Layer 2 stitching loop (rescans, networkx path checks).

Kept from before :func:`polyfuse.stitch.memory.stitch_memory` moved onto the merge engine, so
the tests can check both give the same kernel groups and decisions.
"""

from __future__ import annotations

import networkx as nx

from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import STITCH_RULES, Partition, Rule
from polyfuse.graph.structure import structural_key
from polyfuse.poly.canonical import canonical_form
from polyfuse.poly.compose import CompositionError, map_reduction_kernel
from polyfuse.poly.cost import choose_reduction_strategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.stitch.memory import DictMemo, KernelGroup, Memo, StitchDecision


def _group_edges(graph: Graph, owner: dict[str, int]) -> dict[tuple[int, int], list[str]]:
    edges: dict[tuple[int, int], list[str]] = {}
    for a, b in graph.dag.edges:
        ga, gb = owner[a], owner[b]
        if ga != gb:
            edges.setdefault((ga, gb), []).append(graph.dag.edges[a, b]["tensor"])
    return edges


def reference_stitch_memory(
    graph: Graph,
    part: Partition,
    scheduled: list[ScheduledMicrograph],
    device: DeviceSpec,
    rules: tuple[Rule, ...] = STITCH_RULES,
    enabled: bool = True,
    cache: Memo | None = None,
    salt: str = "",
) -> tuple[list[KernelGroup], list[StitchDecision]]:
    """Algorithm 2 over the scheduled micrographs (in dependence order).

    Outcomes of the isl checks are kept in ``cache`` by the structural key of the pair, so
    identical layers are checked once; layouts are composed later, only for kernels that
    have to be generated.
    """
    cache = cache if cache is not None else DictMemo()
    groups: dict[int, KernelGroup] = {}
    for i, (mg, sm) in enumerate(zip(part.micrographs, scheduled, strict=True)):
        form = canonical_form(sm) if mg.kind == OpKind.REDUCTION else None
        g = KernelGroup([sm], mg.kind, form)
        if form is not None:
            g.strategy = choose_reduction_strategy(form, device)
        groups[i] = g
    owner = {p: part.owner[p] for p in graph.prims}
    decisions: list[StitchDecision] = []
    if not enabled:
        return [groups[i] for i in sorted(groups)], decisions
    refused: set[tuple[int, int]] = set()
    for rule in rules:
        changed = True
        while changed:
            changed = False
            edges = _group_edges(graph, owner)
            q = nx.DiGraph(list(edges))
            q.add_nodes_from(groups)
            for (p, c), tensors in sorted(edges.items()):
                gp, gc = groups[p], groups[c]
                if not rule.matches(gp.kind, gc.kind) or (p, c, rule.number) in refused:
                    continue
                d = _try_stitch(graph, q, p, c, gp, gc, rule, tensors, cache, salt)
                decisions.append(d)
                if not d.stitched:
                    refused.add((p, c, rule.number))
                    continue
                parts = sorted(gp.parts + gc.parts, key=lambda sm: sm.model.micrograph.id)
                groups[p] = KernelGroup(parts, rule.result, gp.form, gp.strategy)
                del groups[c]
                for prim, o in owner.items():
                    if o == c:
                        owner[prim] = p
                changed = True
                break
    for (p, c), tensors in sorted(_group_edges(graph, owner).items()):
        gp, gc = groups[p], groups[c]
        if not any(r.matches(gp.kind, gc.kind) for r in rules):
            why = f"no stitch rule for {gp.kind.value} -> {gc.kind.value}"
            decisions.append(StitchDecision(gp.names, gc.names, None, False, why, tensors))
    return _in_dependence_order(groups, _group_edges(graph, owner)), decisions


def _in_dependence_order(
    groups: dict[int, KernelGroup], edges: dict[tuple[int, int], list[str]]
) -> list[KernelGroup]:
    """The groups in a topological order of the group DAG (a group absorbing a consumer may
    now need a group created after it), ties broken by creation order."""
    q = nx.DiGraph(list(edges))
    q.add_nodes_from(groups)
    return [groups[i] for i in nx.lexicographical_topological_sort(q)]


def _try_stitch(
    graph: Graph,
    q: nx.DiGraph,
    p: int,
    c: int,
    gp: KernelGroup,
    gc: KernelGroup,
    rule: Rule,
    tensors: list[str],
    cache: Memo,
    salt: str,
) -> StitchDecision:
    """Check the conditions of Algorithm 2 step 2 for stitching ``gp`` with ``gc``."""

    def decide(ok: bool, reason: str) -> StitchDecision:
        return StitchDecision(gp.names, gc.names, rule.number, ok, reason, tensors)

    for s in q.successors(p):
        if s != c and nx.has_path(q, s, c):
            return decide(False, "stitching would create a cycle")
    if gp.strategy is None:
        return decide(False, "the producer has no reduction layout")
    if rule.number == 8:
        if gc.form is None or not gp.form.same_as(gc.form):
            return decide(False, f"canonical forms differ ({gp.form} vs {gc.form})")
        if gc.strategy != gp.strategy:
            return decide(False, "launch shapes differ")
    parts = sorted(gp.parts + gc.parts, key=lambda sm: sm.model.micrograph.id)
    prims = [x for sm in parts for x in sm.model.micrograph.prims]
    key = structural_key(graph, prims, f"{salt}|stitch{rule.number}|{gp.strategy}").digest
    known = cache.get(key, (("ok", "reason"),))
    if known is None:
        try:
            map_reduction_kernel(graph, parts, gp.strategy)
            shape = f"{gp.strategy.kept_tile}x{gp.strategy.lanes}"
            why = f"same outer dimensions and launch shape ({shape} threads)"
            known = {"ok": True, "reason": why}
        except CompositionError as e:
            known = {"ok": False, "reason": f"outer dimensions or tiles do not match: {e}"}
        cache.put(key, known)
    return decide(known["ok"], known["reason"])
