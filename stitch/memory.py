"""Layer 2: memory stitching of reduction micrographs with their consumers (APOLLO Algorithm 2).

Step 1 — the supplementary rules are the stitch rules of the table (7: reduction →
elementwise/broadcast; 8: reduction → reduction of the identical canonical form).
Step 2 — for each rule, greedily and until nothing changes, every producer→consumer pair of
kernel groups that matches the rule is stitched when (a) it creates no cycle among groups,
(b) for rule 8 the canonical forms are identical, and (c) the two groups' outer (block-level)
dimensions and launch shapes are consistent — decided by isl: the composed schedule of both
groups must keep every dependence inside one kept point and respect all dependences, and no
dependence may cross lanes inside a loop (``consist_dim_and_param``).
Step 3 — memory allocation happens later, per tensor, by its per-block footprint
(:func:`polyfuse.poly.placement.place_shared`).

Every stitch made or refused is recorded with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import networkx as nx

from polyfuse.decision import DecisionKind
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import STITCH_RULES, Partition, Rule
from polyfuse.graph.structure import structural_key
from polyfuse.poly.canonical import CanonicalForm, canonical_form
from polyfuse.poly.compose import CompositionError, ReductionKernel, map_reduction_kernel
from polyfuse.poly.cost import ReductionStrategy, choose_reduction_strategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.schedule import ScheduledMicrograph


class Memo(Protocol):
    """Where decisions are remembered by structural key (polyfuse.cache.CompileCache)."""

    def get(self, key: str, fields: Any = None) -> Any: ...

    def put(self, key: str, value: Any) -> None: ...


class _Memory:
    def __init__(self) -> None:
        self.d: dict[str, Any] = {}

    def get(self, key: str, fields: Any = None) -> Any:
        return self.d.get(key)

    def put(self, key: str, value: Any) -> None:
        self.d[key] = value


@dataclass
class KernelGroup:
    """Micrographs that will run as one kernel."""

    parts: list[ScheduledMicrograph]
    kind: OpKind
    form: CanonicalForm | None = None
    strategy: ReductionStrategy | None = None
    layout: ReductionKernel | None = None  # computed on demand (see ensure_layout)
    layout_error: str | None = None

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def __str__(self) -> str:
        form = f" {self.form}" if self.form else ""
        return f"[{' + '.join(self.names)}] {self.kind.value}{form}"


@dataclass
class StitchDecision:
    """A stitch made or refused between two kernel groups."""

    producer: list[str]
    consumer: list[str]
    rule: int | None
    stitched: bool
    reason: str
    tensors: list[str] = field(default_factory=list)
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.decision)

    def __str__(self) -> str:
        verb = "stitched" if self.stitched else "not stitched"
        r = f" (rule {self.rule})" if self.rule else ""
        return f"{'+'.join(self.producer)} -> {'+'.join(self.consumer)}: {verb}{r}: {self.reason}"


def ensure_layout(graph: Graph, g: KernelGroup) -> ReductionKernel | None:
    """The group's parallel reduction layout (composed and mapped now if not yet), or None
    when it has no reduction or the parts cannot share a layout (the reason is kept)."""
    if g.layout is None and g.strategy is not None and g.layout_error is None:
        try:
            g.layout = map_reduction_kernel(graph, g.parts, g.strategy)
        except CompositionError as e:
            g.layout_error = str(e)
            for sm in g.parts:
                sm.notes.append(f"no parallel reduction layout ({e}); reduction loops stay serial")
    return g.layout


def _group_edges(graph: Graph, owner: dict[str, int]) -> dict[tuple[int, int], list[str]]:
    edges: dict[tuple[int, int], list[str]] = {}
    for a, b in graph.dag.edges:
        ga, gb = owner[a], owner[b]
        if ga != gb:
            edges.setdefault((ga, gb), []).append(graph.dag.edges[a, b]["tensor"])
    return edges


def stitch_memory(
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
    cache = cache if cache is not None else _Memory()
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
            decisions.append(
                StitchDecision(
                    gp.names, gc.names, None, False, why, tensors, (DecisionKind.NO_RULE,)
                )
            )
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

    def decide(ok: bool, reason: str, *kinds: DecisionKind) -> StitchDecision:
        if ok:
            kinds = (DecisionKind.STITCHED, *kinds)
        return StitchDecision(gp.names, gc.names, rule.number, ok, reason, tensors, kinds)

    for s in q.successors(p):
        if s != c and nx.has_path(q, s, c):
            return decide(False, "stitching would create a cycle", DecisionKind.CYCLE)
    if gp.strategy is None:
        return decide(False, "the producer has no reduction layout")
    if rule.number == 8:
        if gc.form is None or not gp.form.same_as(gc.form):
            return decide(
                False,
                f"canonical forms differ ({gp.form} vs {gc.form})",
                DecisionKind.FORM_MISMATCH,
            )
        if gc.strategy != gp.strategy:
            return decide(False, "launch shapes differ", DecisionKind.FORM_MISMATCH)
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
    # a cached refusal is always the composition's (the checks above are not cached)
    mismatch = () if known["ok"] else (DecisionKind.TILE_MISMATCH,)
    return decide(known["ok"], known["reason"], *mismatch)
