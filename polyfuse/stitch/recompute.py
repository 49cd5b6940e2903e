"""Recompute instead of spilling: the costed alternative to a global scratch buffer.

Policy. When an intermediate of a stitched kernel fits neither registers nor shared memory,
keeping it means writing it to global memory and reading it back (2 × its bytes); a kernel
output that later parts read back costs the reload the same way. If the
intermediate is elementwise/broadcast (no reduction) and every tensor its expression reads
is already available inside the kernel — a kernel input read anyway, or a value the kernel
keeps in registers or shared memory — then the later parts can recompute it from those
inputs at no extra global traffic. Those readers get the expression inlined
(:func:`polyfuse.graph.inline.inline`); readers in the producer's own part keep using it.

The decision is a stitch-stage pass (:func:`recompute_spills`) that runs before lowering: it
maps and places the kernel, inlines what it decides into a *view* of the graph
(:meth:`polyfuse.graph.graph.Graph.replaced`; the compile's graph is never rewritten), maps
and places again on the view until nothing more can be recomputed, and returns the result
with one typed decision per recomputed tensor. Code generation then only reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote
from polyfuse.base.decision_data import RecomputeData
from polyfuse.graph.graph import Graph
from polyfuse.graph.inline import inlinable, inline
from polyfuse.poly.cost import ReductionStrategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.kernel_map import map_kernel, place_kernel
from polyfuse.poly.mapping import MappedKernel, MappingConfig
from polyfuse.poly.placement import Placement
from polyfuse.poly.policy import reduction_tile_budget
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.stage import resident_blocks


@dataclass(frozen=True)
class Recomputed:
    """A kernel mapped and placed after the recompute decisions (none: as first mapped)."""

    graph: Graph  # the view the kernel computes (the compile's graph when nothing changed)
    mapped: MappedKernel
    placements: dict[str, Placement]
    decisions: list[Decided]  # data: RecomputeData per recomputed tensor
    #: the inputs its first placement staged in shared memory (:mod:`polyfuse.poly.stage`)
    staged: frozenset[str] = frozenset()


def recompute_spills(
    graph: Graph,
    parts: list[ScheduledMicrograph],
    strategy: ReductionStrategy | None,
    device: DeviceSpec,
    cfg: MappingConfig | None = None,
    stage: bool = False,
) -> Recomputed:
    """Map and place the kernel of ``parts``, recomputing spilled intermediates in later
    parts while any qualifies (inlining may expose the next spill). With ``stage``, inputs
    several parts read may be staged in shared memory (:mod:`polyfuse.poly.stage`, decided on
    the first placement); a staging is dropped where the kernel without it keeps a tensor on
    chip that it spills, or more blocks resident per SM."""
    r = _recompute(graph, parts, strategy, device, cfg, stage)
    if not r.staged:
        return r
    plain = _recompute(graph, parts, strategy, device, cfg, False)
    worse = sorted(_spills(r.placements) - _spills(plain.placements))
    blocks, plain_blocks = _resident(r, device), _resident(plain, device)
    why = ""
    if not any(p.stage for p in r.placements.values()):
        why = "the kernel re-placed after its recomputes stages none"
    elif worse:
        why = f"it spills {', '.join(worse)}, which the kernel without it keeps on chip"
    elif blocks < plain_blocks:
        why = f"it leaves {_blocks(blocks)} per SM, the kernel without it {plain_blocks}"
    if not why:
        return r
    note = f"{', '.join(sorted(r.staged))}: not staged in shared memory: {why}"
    return replace(plain, mapped=replace(plain.mapped, notes=[*plain.mapped.notes, note]))


def _blocks(n: int) -> str:
    return f"{n} block" if n == 1 else f"{n} blocks"


def _spills(placements: dict[str, Placement]) -> set[str]:
    return {t for t, p in placements.items() if p.spill_why}


def _resident(r: Recomputed, device: DeviceSpec) -> int:
    """Blocks per SM the kernel's shared memory (its tiles and the combine's scratch) allows."""
    threads = r.mapped.block
    smem = sum(p.smem_bytes for p in r.placements.values())
    return resident_blocks(device, threads, smem + device.smem_per_block_optin
                           - reduction_tile_budget(device, threads))  # fmt: skip


def _recompute(
    graph: Graph,
    parts: list[ScheduledMicrograph],
    strategy: ReductionStrategy | None,
    device: DeviceSpec,
    cfg: MappingConfig | None,
    stage: bool,
) -> Recomputed:
    mm = map_kernel(graph, parts, strategy, device, cfg)
    pl = place_kernel(mm, device, stage)
    first = pl
    staged = frozenset(t for t, p in pl.items() if p.stage)
    view = graph
    notes: list[str] = []
    decisions: list[Decided] = []
    for _ in range(len(graph.prims)):
        spilled = recompute_candidates(mm, pl)
        if not spilled:
            break
        for t in spilled:
            view, readers = inline_into_later_parts(view, mm, t)
            why = pl[t].spill_why
            note = f"{t}: recomputed in {', '.join(readers)} instead of a spill ({why})"
            kinds = (*pl[t].kinds, DecisionKind.COST_MODEL)
            data = RecomputeData(t, list(readers))
            decisions.append(Decided(kinds, note, data, (t, *readers)))
            notes.append(DecisionNote(decisions[-1]))  # the plan's note is the record
        mm = map_kernel(view, parts, strategy, device, cfg)
        pl = place_kernel(mm, device, staged if stage else False)
    if notes:
        mm = replace(mm, notes=[*mm.notes, *notes])
    # the inputs' staging was decided on the first placement: its reasons stand
    roles = mm.scheduled.model.tensors
    pl = {
        t: replace(p, reason=first[t].reason)
        if t in first and t in roles and roles[t].role == "input" and not p.stage
        else p
        for t, p in pl.items()
    }
    return Recomputed(view, mm, pl, decisions, staged)


def recompute_candidates(rk: MappedKernel, placements: dict[str, Placement]) -> list[str]:
    """Spilled intermediates of ``rk`` that later parts can recompute for free."""
    if len(rk.parts) < 2:  # no later part to recompute in
        return []
    model = rk.scheduled.model
    part_of = {s.name: i for i, p in enumerate(rk.parts) for s in p.model.statements}
    stmt_tensor = {s.name: s.tensor for s in model.statements}
    out = []
    for name, p in placements.items():
        role = model.tensors[name]
        if p.space != "global" or role.tensor is None:
            continue
        if role.role not in ("internal", "output") or p.register_copy:
            continue
        t = role.tensor
        if t.op is None or t.op.reduce is not None:
            continue
        inputs_ok = all(_available(model, placements, src) for src in t.op.inputs())
        writer = f"S_{name}"
        readers = {
            m.get_tuple_name(isl.dim_type.in_)
            for m in maps_of(model.reads)
            if m.get_tuple_name(isl.dim_type.out) == name
        }
        later = [r for r in readers if part_of[r] > part_of[writer]]
        readable = all(inlinable(stmt_tensor[r], t) for r in later)
        if inputs_ok and later and readable:
            out.append(name)
    return out


def _available(model, placements: dict[str, Placement], t) -> bool:
    """Whether the kernel holds ``t`` anyway: an input it reads, or a register/shared value."""
    for ident, role in model.tensors.items():
        if role.role == "accumulator" or role.tensor is None or role.tensor.uid != t.uid:
            continue
        p = placements[ident]
        return role.role == "input" or p.in_register or p.space == "shared"
    return False


def inline_into_later_parts(graph: Graph, rk: MappedKernel, name: str) -> tuple[Graph, list[str]]:
    """A view of ``graph`` with intermediate ``name`` inlined into its readers in later parts,
    and those readers (``graph`` itself is unchanged)."""
    part_of = {s.prim: i for i, p in enumerate(rk.parts) for s in p.model.statements}
    producer = graph.prims[name].tensor
    changes = {
        consumer: inline(graph.prims[consumer].tensor, producer)
        for consumer in sorted(graph.consumers(name))
        if consumer in part_of and part_of[consumer] > part_of[name]
    }
    return (graph.replaced(changes) if changes else graph), list(changes)
