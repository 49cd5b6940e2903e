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

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import NO_DATA, DecisionData, StitchData
from polyfuse.graph.graph import Graph
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import STITCH_RULES, Partition, Rule
from polyfuse.graph.quotient import QuotientDag
from polyfuse.graph.structure import structural_key
from polyfuse.poly.canonical import CanonicalForm, canonical_form
from polyfuse.poly.compose import CompositionError, map_reduction_kernel
from polyfuse.poly.cost import ReductionStrategy, choose_reduction_strategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tiling import vector_contraction


class Memo(Protocol):
    """Where decisions are remembered by structural key (polyfuse.cache.CompileCache)."""

    def get(self, key: str, fields: Any = None) -> Any: ...

    def put(self, key: str, value: Any) -> None: ...


class DictMemo:
    """A :class:`Memo` in a dict (one compile; no persistence)."""

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

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.parts]

    def __str__(self) -> str:
        form = f" {self.form}" if self.form else ""
        return f"[{' + '.join(self.names)}] {self.kind.value}{form}"


@dataclass(frozen=True)
class StitchDecision:
    """A stitch made or refused between two kernel groups (its plan record: :attr:`record`)."""

    producer: list[str]
    consumer: list[str]
    rule: int | None
    stitched: bool
    reason: str
    tensors: list[str] = field(default_factory=list)
    kinds: tuple[DecisionKind, ...] = ()  # what the reason says, typed (polyfuse.base.decision)
    #: the numbers behind the decision (a GEMM + row stitch: its tile and modelled figures,
    #: polyfuse.base.decision_data.RowStitchData)
    data: DecisionData = NO_DATA

    @property
    def record(self) -> Decided:
        """This stitch as the one decision record (subject: producer and consumer groups)."""
        data = StitchData(self.rule, list(self.tensors), self.data)
        subject = (*self.producer, *self.consumer)
        return Decided(self.kinds, self.reason, data, subject, self.stitched)

    def __str__(self) -> str:
        verb = "stitched" if self.stitched else "not stitched"
        r = f" (rule {self.rule})" if self.rule else ""
        return f"{'+'.join(self.producer)} -> {'+'.join(self.consumer)}: {verb}{r}: {self.reason}"


def reduction_form(sm: ScheduledMicrograph, kind: OpKind) -> CanonicalForm | None:
    """The canonical form whose reduction layout maps micrograph ``sm`` of op kind ``kind``: a
    reduction's, and a matrix-vector product's (opaque, :func:`vector_contraction`: its
    reduced dims on lanes, not one serial loop per output); None for the others."""
    if kind == OpKind.REDUCTION or (kind == OpKind.OPAQUE and vector_contraction(sm)):
        return canonical_form(sm)
    return None


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
    have to be generated. Groups are contracted in place on a
    :class:`polyfuse.graph.quotient.QuotientDag` (the producer's id survives); within a rule
    the pair tried next is the first untried matching pair in (producer, consumer) id order,
    as in a plain rescan, without rescanning.
    """
    cache = cache if cache is not None else DictMemo()
    groups: dict[int, KernelGroup] = {}
    for i, (mg, sm) in enumerate(zip(part.micrographs, scheduled, strict=True)):
        form = reduction_form(sm, mg.kind)
        strategy = choose_reduction_strategy(form, device) if form is not None else None
        groups[i] = KernelGroup([sm], mg.kind, form, strategy)
    decisions: list[StitchDecision] = []
    if not enabled:
        return [groups[i] for i in sorted(groups)], decisions
    q = QuotientDag(len(groups), [g.kind for g in groups.values()])
    for n, (a, b) in enumerate(graph.dag.edges):
        ga, gb = part.owner[a], part.owner[b]
        if ga != gb:
            q.add_edge(ga, gb, (n, graph.dag.edges[a, b]["tensor"]))
    refused: set[tuple[int, int, int]] = set()

    def accept(rule: Rule, p: int, c: int) -> bool:
        gp, gc = groups[p], groups[c]
        if (p, c, rule.number) in refused:
            return False
        d = _try_stitch(graph, q, p, c, gp, gc, rule, _tensors(q, p, c), cache, salt)
        decisions.append(d)
        if not d.stitched:
            refused.add((p, c, rule.number))
            return False
        groups[p] = KernelGroup(_merge_parts(gp.parts, gc.parts), rule.result, gp.form, gp.strategy)
        del groups[c]
        return True

    q.contract_by_rules(rules, accept, by_first=False, keep_producer=True)
    for p, c in sorted(q.edges()):
        gp, gc = groups[p], groups[c]
        if not any(r.matches(gp.kind, gc.kind) for r in rules):
            why = f"no stitch rule for {gp.kind.value} -> {gc.kind.value}"
            tensors = _tensors(q, p, c)
            decisions.append(
                StitchDecision(
                    gp.names, gc.names, None, False, why, tensors, (DecisionKind.NO_RULE,)
                )
            )
    # A group that absorbed a consumer may now need a group created after it: return the
    # groups in a topological order of the group DAG, ties broken by creation order.
    return [groups[i] for i in q.lexicographic_order(by_first=False)], decisions


def _tensors(q: QuotientDag, p: int, c: int) -> list[str]:
    """Tensors flowing from group ``p`` to group ``c``, in graph edge order."""
    return [t for _, t in sorted(q.payloads(p, c))]  # type: ignore[misc]


def _merge_parts(a: list[ScheduledMicrograph], b: list[ScheduledMicrograph]):
    return sorted(a + b, key=lambda sm: sm.model.micrograph.id)


def _try_stitch(
    graph: Graph,
    q: QuotientDag,
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

    if q.cycle_via(p, c) is not None:
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
    parts = _merge_parts(gp.parts, gc.parts)
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
