"""Partition a graph into micrographs by the aggregation rule table (APOLLO Algorithm 1).

Every primitive starts as a micrograph of its own kind. For each rule, highest priority first,
producer→consumer micrograph pairs whose kinds match the rule are merged into one micrograph
of the rule's result kind, as long as the merge creates no cycle among micrographs and no
feedback separation forbids it; the scan repeats until the rule changes nothing. The table is
data (:data:`PARTITION_RULES`) so feedback and experiments can edit it.

The scan runs on :class:`polyfuse.graph.quotient.QuotientDag`, a merge engine that contracts
micrographs in place and answers cycle checks from a maintained topological order, so a
whole partition costs near-linear time in the graph size (deep models compile in time
proportional to their depth). The result is the one the plain rescanning loop gives: within a
rule, the pair merged next is always the first mergeable pair in (producer, consumer) order of
first primitives, because a refused pair whose micrographs do not change stays refused.

Feedback from the polyhedral layer arrives as *separations*: pairs of primitives that must not
share a micrograph because isl could not schedule them together within budget. The
partitioner is re-run with them, and every decision (merge, refusal and its reason) is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import EdgeData
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.quotient import QuotientDag

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


@dataclass(frozen=True)
class Decision:
    """What happened to one producer→consumer edge between primitives (its plan record:
    :attr:`record`)."""

    producer: str
    consumer: str
    tensor: str
    fused: bool
    rule: int | None
    reason: str
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.base.decision)

    @property
    def record(self) -> Decided:
        """This edge as the one decision record (subject: producer, consumer)."""
        data = EdgeData(self.tensor, self.rule)
        return Decided(self.kinds, self.reason, data, (self.producer, self.consumer), self.fused)

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
    #: pairs kept apart by a cost choice handed back by Layer 2 (stitch/epilogue.py), with why
    preferences: dict[frozenset[str], str] = field(default_factory=dict)

    def __str__(self) -> str:
        return "\n".join(
            [f"Partition: {len(self.micrographs)} micrographs"]
            + [f"  {m}" for m in self.micrographs]
        )


def partition(
    graph: Graph,
    rules: tuple[Rule, ...] = PARTITION_RULES,
    separations: set[frozenset[str]] | None = None,
    preferences: dict[frozenset[str], str] | None = None,
) -> Partition:
    """Algorithm 1 (aggregation). Steps numbered as in APOLLO's appendix. ``separations``
    (isl feedback) and ``preferences`` (a cost choice from Layer 2, pair -> reason) are pairs
    of primitives that must not share a micrograph."""
    separations = set(separations or ())
    preferences = dict(preferences or {})
    order = graph.topo_order()
    rank = {p: i for i, p in enumerate(order)}
    # Steps 1-2: one micrograph per primitive, typed by its kind; the quotient DAG over them.
    q = QuotientDag(len(order), [graph.prims[p].kind for p in order])
    for a, b in graph.dag.edges:
        q.add_edge(rank[a], rank[b], (a, b))
    for pair in separations | set(preferences):
        if len(pair) == 2 and all(x in rank for x in pair):
            x, y = pair
            q.separate(rank[x], rank[y])
    merged_by: dict[tuple[str, str], int] = {}  # fused primitive edge -> rule that fused it
    # primitive edge -> why its merge was refused
    refusals: dict[tuple[str, str], tuple[str, DecisionKind]] = {}

    # Steps 3-4: rules in priority order; each merges the first mergeable pair until none is.
    def accept(rule: Rule, p: int, c: int) -> bool:
        if q.separated(p, c):
            why = _preferred_apart(q, order, p, c, preferences) or (
                "isl feedback separated these primitives",
                DecisionKind.ISL_FEEDBACK,
            )
            for e in q.payloads(p, c):
                refusals[e] = why
            return False
        via = q.cycle_via(p, c)
        if via is not None:
            first = order[q.first[via]]
            for e in q.payloads(p, c):
                refusals[e] = (f"merging would create a cycle through {first}", DecisionKind.CYCLE)
            return False
        # aggregate(Gp, Gc): the consumer's id survives.
        for e in q.payloads(p, c):
            merged_by[e] = rule.number
        return True

    q.contract_by_rules(rules, accept)

    # Renumber micrographs in dependence order (ties: first primitive first).
    mg_order = q.lexicographic_order()
    new_id = {old: i for i, old in enumerate(mg_order)}
    mgs = [
        Micrograph(new_id[m], [order[i] for i in sorted(q.members[m])], q.kind[m]) for m in mg_order
    ]
    owner = {p: new_id[q.owner_of(rank[p])] for p in order}
    kinds = {new_id[m]: q.kind[m] for m in mg_order}
    decisions = _decisions(graph, owner, kinds, merged_by, refusals, separations)
    return Partition(mgs, decisions, owner, separations, preferences)


def _preferred_apart(
    q: QuotientDag, order: list[str], p: int, c: int, preferences: dict[frozenset[str], str]
) -> tuple[str, DecisionKind] | None:
    """The cost reason that keeps groups ``p`` and ``c`` apart, if a preference does."""
    for a in q.members[p]:
        for b in q.members[c]:
            why = preferences.get(frozenset((order[a], order[b])))
            if why is not None:
                return why, DecisionKind.COST_MODEL
    return None


def _decisions(graph, owner, kinds, merged_by, refusals, separations) -> list[Decision]:
    out = []
    for a, b in graph.dag.edges:
        t = graph.dag.edges[a, b]["tensor"]
        if owner[a] == owner[b]:
            rule = merged_by.get((a, b))
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
        pk, ck = kinds[owner[a]], kinds[owner[b]]
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
