"""Schedule a micrograph with the isl scheduler under an operation budget and a deadline.

The scheduler gets validity = all dependences, proximity = flow dependences and coincidence
= all dependences, with outer coincidence preferred so that parallel loops come first. A
micrograph must come back as *one fusion group*: a single outermost band over every
statement. When isl runs out of its operation budget or its deadline (poly/guard.py: the
budget alone does not bound isl's time), or returns a schedule whose top level is a
sequence/set that separates statements, the micrograph did not fuse and :class:`Feedback` is
raised with the groups to split it into; the driver hands those to the partitioner as
separations and re-partitions (APOLLO's partition ↔ fusion feedback loop).

isl's result, and its running time, depend on the order of the statements in its input,
which isl takes from hashes of their names: swin_t's LayerNorm→Pad→roll group scheduled in
0.01 s under one set of names and ran for 20 minutes under another. The scheduler therefore
sees canonical statement names (``S0``, ``S1``… in the micrograph's statement order) and its
schedule is renamed back by a pullback, so one group always gets one schedule, whatever its
tensors are called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import DecisionKind, noted
from polyfuse.base.errors import ScheduleError
from polyfuse.graph.access import loop_names
from polyfuse.graph.kinds import OpKind
from polyfuse.poly.guard import Exhausted, Limits, bounded, operation_budget
from polyfuse.poly.islutil import maps_of, parallel_depth, rename_tuples, sets_of, top_band
from polyfuse.poly.model import PolyModel

# isl operations per scheduler call. Every scheduler call of the examples, the suite, the
# test cases and the tiny zoo needs at most ~100k (median 14k, about 0.5 us each); five times
# that leaves room for larger groups while a call whose operations stay cheap ends on the
# budget (deterministically) well before its deadline.
DEFAULT_BUDGET = 500_000
# Wall-clock bound of one scheduler call (poly/guard.py): a safety net for the calls whose
# operations grow expensive (isl's integers grow); normal calls take at most ~50 ms.
SCHEDULE_DEADLINE_S = 2.0
# Operations a scheduler call runs in-process before it moves to a child process that the
# deadline can stop (a fork costs ~10-20 ms with the page faults it leaves; 85% of the calls
# of the corpus above end within 30k operations). The first 30k operations stay cheap on every
# input measured: 5 ms for the swin_t group whose next 70k took 13 s. The whole-component
# retry, whose operations grew expensive after 7k (3 s at 10k), always runs in the child.
INLINE_OPERATIONS = 30_000
# isl operations of the dependence analysis (in-process: flow analysis has not blown up, and
# its result is needed by later stages, so it is bounded by operations only).
DEPENDENCE_BUDGET = 2_000_000
# Bound on every schedule coefficient isl may choose. By default (schedule_treat_coalescing)
# a coefficient is bounded only by its loop's extent, and isl's search for a non-trivial band
# row (isl_tab_basic_set_non_trivial_lexmin in compute_wcc_band) then pivots on integers that
# grow so large that a few thousand operations of the budget took minutes (a fuzz graph with
# 257-wide loops: ~420 s). Fused DL schedules use coefficients 0/±1 (a stride at most a
# few), so a small bound keeps every schedule the same and the search short.
MAX_COEFFICIENT = 4
WHOLE_COMPONENT_MAX_STATEMENTS = 5
# Operation budget of the optional whole-component retry (the clustering schedule is kept
# when it runs out). isl counts tableau pivots, but a pivot's cost grows with the size of its
# integers, which grow with the loop extents: under the full budget the retry could run for
# minutes. The retries of the examples, the suite and the tests need at most 40k operations
# (batch_norm_train_relu of test_stitching).
WHOLE_COMPONENT_BUDGET = 60_000
# Its deadline: the retry is optional, so it gets less time than the call it improves on.
WHOLE_COMPONENT_DEADLINE_S = 1.0
# The retry runs without isl's coalescing treatment (schedule_treat_coalescing): it bounds
# each coefficient by half the other loops' extents, which MAX_COEFFICIENT already does more
# tightly, and the extents it writes into the ILP made the integers grow: Conv1d(1, 32, 16)
# -> ReLU -> MaxPool1d(4) on 8000 samples ran its 60k operations for 200 s with it, and
# finishes in 0.2 s without it (the same schedules elsewhere: batch_norm_train_relu).
WHOLE_COMPONENT_TREAT_COALESCING = False
# A reduction-free fused schedule whose parallel outer members cover fewer points than this
# (a quarter of one wave of full occupancy on an H100: 132 SMs x 2048 threads / 4) and fewer
# than 1/PARALLEL_LOSS of its largest statement's points lost its parallelism to the fusion.
PARALLEL_POINTS = 65_536
PARALLEL_LOSS = 8


@dataclass
class Feedback(Exception):
    """A micrograph did not schedule as one fusion group; split it into ``groups``.

    ``limit`` says which bound stopped isl (``"operations"``, ``"deadline"``, ``"error"``;
    see :class:`polyfuse.poly.guard.Exhausted`), or None when isl finished without fusing.
    """

    micrograph: str
    reason: str
    groups: list[list[str]]  # primitive names per part, in dependence order
    limit: str | None = None

    def __str__(self) -> str:
        parts = " | ".join(", ".join(g) for g in self.groups)
        return f"{self.micrograph}: {self.reason}; split into [{parts}]"


@dataclass
class ScheduledMicrograph:
    """A micrograph with the schedule isl computed for it (one fusion group)."""

    model: PolyModel
    _schedule: isl.Schedule | str  # isl text (from the compile cache) is parsed on first use
    budget_used: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def schedule(self) -> isl.Schedule:
        if isinstance(self._schedule, str):
            # the tiling and AST options live in the context: a schedule read from the cache
            # must be mapped under the same options as one the scheduler just computed
            configure(self.model.ctx)
            self._schedule = isl.Schedule(self._schedule, context=self.model.ctx)
        return self._schedule

    @property
    def name(self) -> str:
        return self.model.micrograph.name

    def __str__(self) -> str:
        lines = [f"ScheduledMicrograph {self.name}", f"  schedule: {self.schedule.get_root()}"]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def configure(ctx: isl.Context) -> isl.Context:
    """Scheduler and tiling options polyfuse relies on (set once per context).

    Every later stage (tiling in the mapping, AST generation) depends on these options, so
    they are set when the context is created, not only when the scheduler first runs: a
    compile whose schedules all come from the cache must tile exactly as a fresh one.
    """
    ctx.set_schedule_outer_coincidence(1)
    ctx.set_schedule_serialize_sccs(0)
    ctx.set_schedule_maximize_band_depth(1)
    ctx.set_tile_scale_tile_loops(0)
    ctx.set_tile_shift_point_loops(1)
    ctx.set_schedule_whole_component(0)
    ctx.set_on_error(isl.on_error.CONTINUE)
    return ctx


def identity_schedule(model: PolyModel) -> isl.Schedule:
    """The original loop order of a single primitive (always valid, needs no scheduler).

    Data dimensions form the band's coincident members; a reduction's init runs just before
    the first update (reduce index ``lo - 1``) and its final just after the last (``hi``).
    """
    (prim,) = {s.prim for s in model.statements}
    t = model.statements[0].tensor
    assert t.op is not None
    dn, rn = loop_names(t)
    raxes = [a for a in t.op.reduce_axes if a.extent > 1]
    nd = len(dn)
    role_pos = {"init": 0, "update": 1, "final": 2, "compute": 0}
    parts = []
    for s in model.statements:
        d = [f"i{k}" for k in range(nd)]
        r = [f"i{nd + k}" for k in range(len(raxes))]
        if s.role == "init" and raxes:
            tail = [str(raxes[0].lo - 1)] + [str(a.lo) for a in raxes[1:]]
        elif s.role == "final" and raxes:
            tail = [str(raxes[0].hi)] + [str(a.lo) for a in raxes[1:]]
        else:
            tail = r if s.role == "update" else [str(a.lo) for a in raxes]
        args = d + (r if s.role == "update" else [])
        sched = d + tail + [str(role_pos[s.role])]
        parts.append(f"{s.name}[{', '.join(args)}] -> [{', '.join(sched)}]")
    um = isl.UnionMap("{ " + "; ".join(parts) + " }", context=model.ctx)
    mupa = isl.MultiUnionPwAff.from_union_map(um.intersect_domain(model.domain))
    sched = isl.Schedule.from_domain(model.domain).insert_partial_schedule(mupa)
    node = sched.get_root().child(0)
    for i in range(nd):
        node = node.band_member_set_coincident(i, 1)
    return node.get_schedule()


def micrograph_label(mg) -> str:
    """``mg3 [a, b, c]``: a micrograph and its primitives, as feedback events name them."""
    return f"{mg.name} [{', '.join(mg.prims)}]"


def _split_groups(model: PolyModel, node: isl.ScheduleNode) -> list[list[str]]:
    groups: list[list[str]] = []
    for i in range(node.n_children()):
        filt = node.child(i).filter_get_filter()
        names = {
            s.prim
            for s in model.statements
            if not filt.extract_set(s.domain.get_space()).is_empty()
        }
        groups.append([p for p in model.micrograph.prims if p in names])
    seen: set[str] = set()
    out = []
    for g in groups:  # a reduction's statements may straddle children: keep first placement
        g = [p for p in g if p not in seen]
        seen.update(g)
        if g:
            out.append(g)
    return out if len(out) > 1 else halves(model)


def halves(model: PolyModel) -> list[list[str]]:
    """The micrograph's primitives cut in two in dependence order: the split of a feedback
    event that has no better one (each round separates more, so feedback makes progress)."""
    prims = model.micrograph.prims
    h = max(1, len(prims) // 2)
    return [prims[:h], prims[h:]]


def _run_scheduler(
    sc: isl.ScheduleConstraints, ctx: isl.Context, limits: Limits, whole_component: bool
) -> tuple[isl.Schedule | None, Exhausted | None]:
    """isl's schedule for ``sc`` under ``limits`` (poly/guard.py), or why there is none."""
    ctx.set_schedule_whole_component(1 if whole_component else 0)
    treat = not whole_component or WHOLE_COMPONENT_TREAT_COALESCING
    ctx.set_schedule_treat_coalescing(1 if treat else 0)
    ctx.set_schedule_max_coefficient(MAX_COEFFICIENT)
    try:
        out = bounded(ctx, sc.compute_schedule, limits, str, lambda t: isl.Schedule(t, context=ctx))
    except Exhausted as e:
        return None, e
    finally:
        ctx.set_schedule_max_coefficient(-1)
        ctx.set_schedule_treat_coalescing(1)
        ctx.set_schedule_whole_component(0)
    if out.value is None:
        return None, Exhausted("error", limits, "isl returned no schedule", out.seconds)
    return out.value, None


def canonical_names(model: PolyModel) -> dict[str, str]:
    """Statement name -> the name the scheduler sees (``S<k>``, k its position)."""
    return {s.name: f"S{k}" for k, s in enumerate(model.statements)}


def _renamed_back(model: PolyModel, canon: dict[str, str]) -> isl.UnionPwMultiAff:
    """Each statement instance -> its canonical instance: a schedule over the canonical names
    pulled back by it is the same schedule over the statements' own names."""
    out = isl.UnionMap.empty(isl.Space.params_alloc(model.ctx, 0))
    for s in model.statements:
        ident = isl.Map.identity(s.domain.get_space().map_from_set())
        ident = ident.set_tuple_name(isl.dim_type.out, canon[s.name])
        out = out.union(isl.UnionMap.from_map(ident))
    return isl.UnionPwMultiAff.from_union_map(out)


def _dependences(model: PolyModel) -> None:
    """Run the model's dependence analysis under :data:`DEPENDENCE_BUDGET` operations."""
    try:
        with operation_budget(model.ctx, DEPENDENCE_BUDGET):
            model.validity, model.flow  # noqa: B018 - computed and kept on first use
    except isl.Error as e:
        mg = model.micrograph
        why = f"dependence analysis exceeded {DEPENDENCE_BUDGET} isl operations"
        if len(mg.prims) > 1:
            raise Feedback(micrograph_label(mg), why, halves(model), "operations") from None
        label = micrograph_label(mg)
        raise ScheduleError(f"{label}: {why} ({e}); this primitive is too complex") from None


def _skewed_update(model: PolyModel, sched: isl.Schedule) -> str | None:
    """A band member that combines several loop dimensions of a reduction's update (isl
    skews e.g. ``(r1, r1 + r2)`` over a reduced extent of 2 to keep the band permutable
    under the accumulator's dependences), as text; None when every member of the updates is
    one dimension or a constant. Lane mapping flattens the band by its members' ranges, so a
    skewed one leaves most lanes idle and gives placement sets isl cannot project cheaply
    (fuzz seed 790008: ``sum`` over a 7x97x2 tensor)."""
    ups = {s.name for s in model.statements if s.role == "update"}
    todo = [sched.get_root()]
    while todo:
        node = todo.pop()
        todo += [node.child(i) for i in range(node.n_children())]
        if node.get_type() != isl.schedule_node_type.band:
            continue
        partial = node.band_get_partial_schedule()
        for i in range(node.band_n_member()):
            pas = partial.get_union_pw_aff(i).get_pw_aff_list()
            for k in range(pas.n_pw_aff()):
                pa = pas.get_at(k)
                if pa.get_domain_space().get_tuple_name(isl.dim_type.set) not in ups:
                    continue
                n = pa.dim(isl.dim_type.in_)
                if sum(pa.involves_dims(isl.dim_type.in_, d, 1) for d in range(n)) > 1:
                    return str(pa)
    return None


def _single_band(sched: isl.Schedule) -> bool:
    root = sched.get_root()
    return root.has_children() and root.child(0).get_type() == isl.schedule_node_type.band


def compute_schedule(
    model: PolyModel, budget: int = DEFAULT_BUDGET, deadline: float | None = None
) -> ScheduledMicrograph:
    """Run the isl scheduler on ``model`` within ``budget`` operations and ``deadline``
    seconds per isl call (None: :data:`SCHEDULE_DEADLINE_S`; ``math.inf``: no deadline, the
    calls then run in-process).

    Raises :class:`Feedback` when the micrograph does not come back as one fusion group.
    A single-primitive micrograph that exhausts a bound falls back to its original loop
    order (always legal), so feedback always makes progress.
    """
    ctx = model.ctx
    configure(ctx)
    mg = model.micrograph
    deadline = SCHEDULE_DEADLINE_S if deadline is None else deadline
    deadline = None if math.isinf(deadline) else deadline
    _dependences(model)
    # A reduction's accumulator order need not make its loops sequential: its combine is
    # associative and commutative, so those dependences do not constrain coincidence (the
    # reduced loops can then fuse with their producers). Flags are made strict again below.
    relax = mg.kind == OpKind.REDUCTION
    coincidence = model.validity.subtract(model.accumulator_deps()) if relax else model.validity
    canon = canonical_names(model)
    sc = (
        isl.ScheduleConstraints.on_domain(rename_tuples(model.domain, canon))
        .set_validity(rename_tuples(model.validity, canon))
        .set_proximity(rename_tuples(model.flow, canon))
        .set_coincidence(rename_tuples(coincidence, canon))
    )
    back = _renamed_back(model, canon)
    limits = Limits(budget, deadline, INLINE_OPERATIONS)
    sched, why = _run_scheduler(sc, ctx, limits, whole_component=False)
    if sched is None:
        assert why is not None
        if len(mg.prims) == 1:
            return ScheduledMicrograph(
                model,
                identity_schedule(model),
                notes=[
                    noted(
                        DecisionKind.ISL_FEEDBACK,
                        f"{why.reason}; kept the original loop order",
                        mg.name,
                        made=False,
                    )
                ],
            )
        raise Feedback(micrograph_label(mg), why.reason, halves(model), why.limit)
    sched = sched.pullback_union_pw_multi_aff(back)
    small = len(model.statements) <= WHOLE_COMPONENT_MAX_STATEMENTS
    retry_note = ""
    if relax and small and not _single_band(sched):
        retry, retry_note = _whole_component(model, sc, back, budget, deadline)
        if retry is not None:
            sched = retry

    root = sched.get_root()
    top = root.child(0) if root.has_children() else None
    if top is not None and top.get_type() in (
        isl.schedule_node_type.sequence,
        isl.schedule_node_type.set,
    ):
        if len(mg.prims) == 1:  # one primitive needs no fusion: use its own loop order
            return ScheduledMicrograph(model, identity_schedule(model))
        groups = _split_groups(model, top)
        if len(groups) > 1:
            kind = "sequence" if top.get_type() == isl.schedule_node_type.sequence else "set"
            why = f"isl did not fuse the micrograph (top-level {kind})"
            why += f"; {retry_note}" if retry_note else ""
            raise Feedback(micrograph_label(mg), why, groups)
    skew = _skewed_update(model, sched) if relax else None
    if skew is not None:
        why = (
            f"isl skewed a reduction's loops ({skew}): flattened onto lanes, a skewed band "
            "strides them sparsely"
        )
        if len(mg.prims) > 1:
            raise Feedback(micrograph_label(mg), why, halves(model))
        note = noted(DecisionKind.ISL_FEEDBACK, f"{why}; kept the original loop order", mg.name)
        return ScheduledMicrograph(model, identity_schedule(model), notes=[note])
    if relax:
        sched = strict_coincidence(sched, model.validity)
    need, have = _parallelism_needed(model), parallel_depth(sched)
    if have < need:
        if len(mg.prims) == 1:
            return ScheduledMicrograph(model, identity_schedule(model))
        raise Feedback(
            micrograph_label(mg),
            f"isl fused the micrograph only without parallel outer loops ({have} < {need})",
            halves(model),
        )
    lost = _lost_parallelism(model, sched, have) if need and not relax else None
    if lost is not None and len(mg.prims) > 1:
        raise Feedback(micrograph_label(mg), lost, halves(model))
    return ScheduledMicrograph(model, sched)


def _lost_parallelism(model: PolyModel, sched: isl.Schedule, have: int) -> str | None:
    """Why the fused schedule of a reduction-free micrograph runs far fewer points in parallel
    than its statements have, or None. isl may fuse consumers that read a producer at other
    offsets along a dimension (slices of an LSTM's gates at columns ``j``, ``j + 512``, ...) by
    shifting them along that dimension: the fusion is legal, but the dimension is no longer
    parallel, and a kernel that had 32 x 2048 parallel points runs 32 threads each looping
    over 2048 (a single block). Split when the top band has a serial member and its parallel
    members cover fewer points than :data:`PARALLEL_POINTS` and than the largest statement's
    points by over :data:`PARALLEL_LOSS` (a per-row statement fused with a per-element one
    keeps the columns in a nested band, parallel: not a loss)."""
    node = top_band(sched)
    if node is None or have == node.band_n_member():
        return None  # no serial member: the inner loops (nested bands) keep theirs
    domain = sched.get_domain()
    part = isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule())
    part = part.intersect_domain(domain)
    if not _shifted(model, part, have):
        return None
    points = 1
    if have:
        rng = isl.Set.from_union_set(part.range())
        for i in range(have):
            lo, hi = rng.dim_min_val(i), rng.dim_max_val(i)
            if not (lo.is_int() and hi.is_int()):
                return None
            points *= hi.to_python() - lo.to_python() + 1
    largest = max(math.prod(s.tensor.shape) for s in model.statements)
    if points >= PARALLEL_POINTS or points * PARALLEL_LOSS >= largest:
        return None
    return (
        f"isl fused the micrograph with {points} parallel points of the {largest} its largest "
        "statement has (a dimension shifted out of parallel): split instead"
    )


def _shifted(model: PolyModel, part: isl.UnionMap, member: int) -> bool:
    """Whether band member ``member`` (of the band ``part`` maps the statements onto) carries
    a dependence between statements that both run along it: a consumer placed at another
    position than its producer (the LSTM's shifted slices). A producer the member holds at
    one position (a per-row statement fused with per-element ones: layer norm's ``rstd``
    before its columns) only orders the member's first iteration, which the kernel's
    lowering keeps (a statement per row, computed where every column reads it)."""
    varying = None
    for m in maps_of(part):
        img = m.range()
        lo, hi = img.dim_min_val(member), img.dim_max_val(member)
        if lo.is_int() and hi.is_int() and lo.to_python() == hi.to_python():
            continue  # fixed along the member
        dom = isl.UnionSet.from_set(m.domain())
        varying = dom if varying is None else varying.union(dom)
    if varying is None:
        return False
    deps = model.validity.intersect_domain(varying).intersect_range(varying)
    if deps.is_empty():
        return False
    return _carries(deps.apply_domain(part).apply_range(part).deltas(), member)


def _carries(dist: isl.UnionSet, member: int) -> bool:
    """Whether some dependence distance in ``dist`` is not zero on band member ``member``."""
    for s in sets_of(dist):
        zero = isl.Set.universe(s.get_space()).fix_val(
            isl.dim_type.set, member, isl.Val.zero(s.get_ctx())
        )
        if not s.is_subset(zero):
            return True
    return False


def _whole_component(
    model: PolyModel,
    sc: isl.ScheduleConstraints,
    back: isl.UnionPwMultiAff,
    budget: int,
    deadline: float | None,
) -> tuple[isl.Schedule | None, str]:
    """The whole-component schedule when it is one parallel band, else None and why not.

    isl's clustering fused the producers first along their own outer loop; the whole-component
    scheduler considers the reduction too. Its pivots get expensive (large integers), so it is
    only tried on small micrographs, under bounds of its own and always in a child process.
    """
    limits = Limits(min(budget, WHOLE_COMPONENT_BUDGET), _shorter(deadline))
    retry, why = _run_scheduler(sc, model.ctx, limits, whole_component=True)
    if retry is None:
        return None, f"whole-component retry: {why.reason if why else 'no schedule'}"
    if not _single_band(retry):
        return None, "the whole-component retry did not fuse it either"
    retry = retry.pullback_union_pw_multi_aff(back)
    need = _parallelism_needed(model)
    have = parallel_depth(strict_coincidence(retry, model.validity))
    if have < need:
        return None, (
            "the whole-component retry fused it only without parallel outer loops "
            f"({have} < {need})"
        )
    return retry, ""


def _shorter(deadline: float | None) -> float | None:
    return None if deadline is None else min(deadline, WHOLE_COMPONENT_DEADLINE_S)


def _parallelism_needed(model: PolyModel) -> int:
    """Parallel outer members a fused schedule must keep: the kept dimensions of the last
    reduction, or one when every statement has a loop (fusing must not serialise)."""
    ups = [s for s in model.statements if s.role == "update"]
    if ups:
        return len(loop_names(ups[-1].tensor)[0])
    return 1 if all(s.dims > 0 for s in model.statements) else 0


def strict_coincidence(sched: isl.Schedule, deps: isl.UnionMap) -> isl.Schedule:
    """Mark a top-band member coincident only if every dependence has distance 0 on it and on
    all members before it (conservative, and exact for the bands isl builds here)."""
    root = sched.get_root()
    if not root.has_children() or root.child(0).get_type() != isl.schedule_node_type.band:
        return sched
    node = root.child(0)
    part = isl.UnionMap.from_multi_union_pw_aff(node.band_get_partial_schedule())
    dist = deps.apply_domain(part).apply_range(part).deltas() if not deps.is_empty() else None
    ok = True
    for i in range(node.band_n_member()):
        if dist is not None and ok and _carries(dist, i):
            ok = False
        node = node.band_member_set_coincident(i, 1 if ok else 0)
    return node.get_schedule()
