"""Schedule a micrograph with the isl scheduler under an operation budget.

The scheduler gets validity = all dependences, proximity = flow dependences and coincidence
= all dependences, with outer coincidence preferred so that parallel loops come first. A
micrograph must come back as *one fusion group*: a single outermost band over every
statement. When isl runs out of its operation budget, or returns a schedule whose top level
is a sequence/set that separates statements, the micrograph did not fuse and
:class:`Feedback` is raised with the groups to split it into; the driver hands those to the
partitioner as separations and re-partitions (APOLLO's partition ↔ fusion feedback loop).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyfuse.graph.access import loop_names
from polyfuse.graph.kinds import OpKind
from polyfuse.poly.islutil import parallel_depth
from polyfuse.poly.model import PolyModel

DEFAULT_BUDGET = 2_000_000  # isl operations per scheduler call
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


@dataclass
class Feedback(Exception):
    """A micrograph did not schedule as one fusion group; split it into ``groups``."""

    micrograph: str
    reason: str
    groups: list[list[str]]  # primitive names per part, in dependence order

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


def _label(mg) -> str:
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
    return out if len(out) > 1 else _halves(model)


def _halves(model: PolyModel) -> list[list[str]]:
    prims = model.micrograph.prims
    h = max(1, len(prims) // 2)
    return [prims[:h], prims[h:]]


def _run_scheduler(
    sc: isl.ScheduleConstraints, ctx: isl.Context, budget: int, whole_component: bool
) -> tuple[isl.Schedule | None, bool]:
    ctx.set_schedule_whole_component(1 if whole_component else 0)
    ctx.set_schedule_max_coefficient(MAX_COEFFICIENT)
    ctx.set_max_operations(budget)
    ctx.reset_operations()
    try:
        sched = sc.compute_schedule()
        return sched, sched is None
    except isl.Error:
        return None, True
    finally:
        ctx.set_max_operations(0)
        ctx.set_schedule_max_coefficient(-1)
        ctx.set_schedule_whole_component(0)


def _single_band(sched: isl.Schedule) -> bool:
    root = sched.get_root()
    return root.has_children() and root.child(0).get_type() == isl.schedule_node_type.band


def compute_schedule(model: PolyModel, budget: int = DEFAULT_BUDGET) -> ScheduledMicrograph:
    """Run the isl scheduler on ``model`` within ``budget`` operations.

    Raises :class:`Feedback` when the micrograph does not come back as one fusion group.
    A single-primitive micrograph that exhausts the budget falls back to its original loop
    order (always legal), so feedback always makes progress.
    """
    ctx = model.ctx
    configure(ctx)
    mg = model.micrograph
    # A reduction's accumulator order need not make its loops sequential: its combine is
    # associative and commutative, so those dependences do not constrain coincidence (the
    # reduced loops can then fuse with their producers). Flags are made strict again below.
    relax = mg.kind == OpKind.REDUCTION
    coincidence = model.validity.subtract(model.accumulator_deps()) if relax else model.validity
    sc = (
        isl.ScheduleConstraints.on_domain(model.domain)
        .set_validity(model.validity)
        .set_proximity(model.flow)
        .set_coincidence(coincidence)
    )
    sched, failed = _run_scheduler(sc, ctx, budget, whole_component=False)
    small = len(model.statements) <= WHOLE_COMPONENT_MAX_STATEMENTS
    if relax and small and not failed and not _single_band(sched):
        # isl's clustering fused the producers first along their own outer loop; the
        # whole-component scheduler considers the reduction too. Its pivots get expensive (large
        # integers), so it is only tried on small micrographs and under its own small budget.
        retry_budget = min(budget, WHOLE_COMPONENT_BUDGET)
        retry, retry_failed = _run_scheduler(sc, ctx, retry_budget, whole_component=True)
        if not retry_failed and _single_band(retry):
            sched = retry
    if failed:
        if len(mg.prims) == 1:
            return ScheduledMicrograph(
                model,
                identity_schedule(model),
                notes=[
                    f"isl budget of {budget} operations exhausted; kept the original loop order"
                ],
            )
        raise Feedback(_label(mg), f"isl budget of {budget} operations exhausted", _halves(model))

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
            raise Feedback(
                _label(mg), f"isl did not fuse the micrograph (top-level {kind})", groups
            )
    if relax:
        sched = strict_coincidence(sched, model.validity)
    need, have = _parallelism_needed(model), parallel_depth(sched)
    if have < need:
        if len(mg.prims) == 1:
            return ScheduledMicrograph(model, identity_schedule(model))
        raise Feedback(
            _label(mg),
            f"isl fused the micrograph only without parallel outer loops ({have} < {need})",
            _halves(model),
        )
    return ScheduledMicrograph(model, sched)


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
        if dist is not None and ok:
            lst = dist.get_set_list()
            for k in range(lst.n_set()):
                s = lst.get_at(k)
                zero = isl.Set.universe(s.get_space()).fix_val(
                    isl.dim_type.set, i, isl.Val.zero(s.get_ctx())
                )
                if not s.is_subset(zero):
                    ok = False
        node = node.band_member_set_coincident(i, 1 if ok else 0)
    return node.get_schedule()
