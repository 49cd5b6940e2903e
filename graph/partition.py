"""Partition a graph into micrographs by the aggregation rule table (APOLLO Algorithm 1).

Every primitive starts as a micrograph of its own kind. For each rule, highest priority first,
producer→consumer micrograph pairs whose kinds match the rule are merged into one micrograph
of the rule's result kind, as long as the merge creates no cycle among micrographs and no
feedback separation forbids it; the scan repeats until the rule changes nothing. The table is
data (:data:`PARTITION_RULES`) so feedback and experiments can edit it.

Feedback from the polyhedral layer arrives as *separations*: pairs of primitives that must not
share a micrograph because isl could not schedule them together within budget. The
partitioner is re-run with them, and every decision (merge, refusal and its reason) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from polyfuse.decision import DecisionKind
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind

E, B, R, OP = OpKind.ELEMENTWISE, OpKind.BROADCAST, OpKind.REDUCTION, OpKind.OPAQUE


@dataclass(frozen=True)
class Rule:
    """Merge a ``producer``-kind micrograph into a ``consumer``-kind one, giving ``result``."""

    number: int
    producer: frozenset[OpKind]
    consumer: frozenset[OpKind]
    result: OpKind
    layer: str = "partition"

    def matches(self, p: OpKind, c: OpKind) -> bool:
        return p in self.producer and c in self.consumer

    def __str__(self) -> str:
        ps = "/".join(sorted(k.value for k in self.producer))
        cs = "/".join(sorted(k.value for k in self.consumer))
        return f"rule {self.number}: {ps} -> {cs} => {self.result.value} ({self.layer})"


def _r(n: int, p: set[OpKind], c: set[OpKind], res: OpKind, layer: str = "partition") -> Rule:
    return Rule(n, frozenset(p), frozenset(c), res, layer)


# Priority order = table order. Rules 7/8 are Layer 2 (memory stitching) and are not used here.
PARTITION_RULES: tuple[Rule, ...] = (
    _r(1, {E}, {E}, E),
    _r(2, {E}, {B}, B),
    _r(3, {B}, {E, B}, B),
    _r(4, {E, B}, {R}, R),
    _r(5, {OP}, {E, B}, OP),
)
STITCH_RULES: tuple[Rule, ...] = (
    _r(7, {R}, {E, B}, R, "memory stitching"),
    _r(8, {R}, {R}, R, "memory stitching"),
)


@dataclass
class Micrograph:
    """A set of primitives that isl is asked to fuse into one loop nest (one kernel)."""

    id: int
    prims: list[str]  # topological order
    kind: OpKind

    @property
    def name(self) -> str:
        return f"mg{self.id}"

    def __str__(self) -> str:
        return f"{self.name} ({self.kind.value}): {', '.join(self.prims)}"


@dataclass
class Decision:
    """What happened to one producer→consumer edge between primitives."""

    producer: str
    consumer: str
    tensor: str
    fused: bool
    rule: int | None
    reason: str
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.decision)

    def __str__(self) -> str:
        verb = "fused" if self.fused else "not fused"
        return f"{self.producer} -> {self.consumer} [{self.tensor}]: {verb}: {self.reason}"


@dataclass
class Partition:
    """Result of Algorithm 1: micrographs in dependence order plus every edge decision."""

    micrographs: list[Micrograph]
    decisions: list[Decision]
    owner: dict[str, int]  # primitive -> micrograph id
    separations: set[frozenset[str]] = field(default_factory=set)

    def micrograph_of(self, prim: str) -> Micrograph:
        return next(m for m in self.micrographs if m.id == self.owner[prim])

    def __str__(self) -> str:
        return "\n".join(
            [f"Partition: {len(self.micrographs)} micrographs"]
            + [f"  {m}" for m in self.micrographs]
        )


def partition(
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
    # primitive edge -> why its merge was refused
    refusals: dict[tuple[str, str], tuple[str, DecisionKind]] = {}

    def refuse(p: int, c: int, reason: str, kind: DecisionKind) -> None:
        for a, b in graph.dag.edges:
            if a in members[p] and b in members[c]:
                refusals[(a, b)] = (reason, kind)

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
                    refuse(
                        p, c, "isl feedback separated these primitives", DecisionKind.ISL_FEEDBACK
                    )
                    continue
                via = creates_cycle(p, c)
                if via is not None:
                    refuse(p, c, f"merging would create a cycle through {via}", DecisionKind.CYCLE)
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
            out.append(
                Decision(
                    a,
                    b,
                    t,
                    True,
                    rule,
                    f"same micrograph mg{owner[a]} (rule {rule})",
                    (DecisionKind.FUSED,),
                )
            )
            continue
        pk, ck = kind[old_of[owner[a]]], kind[old_of[owner[b]]]
        if frozenset((a, b)) in separations:
            reason = "isl feedback: split after scheduling failed (see feedback events)"
            why = DecisionKind.ISL_FEEDBACK
        elif (a, b) in refusals:
            reason, why = refusals[(a, b)]
        else:
            reason = f"no partition rule for {pk.value} -> {ck.value}"
            why = DecisionKind.NO_RULE
            if pk == R:
                reason += " (a reduction joins its consumers in Layer 2 memory stitching)"
        out.append(Decision(a, b, t, False, None, reason, (why,)))
    return out
