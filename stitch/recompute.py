"""Recompute instead of spilling: the costed alternative to a global scratch buffer.

Policy. When an intermediate of a stitched kernel fits neither registers nor shared memory,
keeping it means writing it to global memory and reading it back (2 × its bytes); a kernel
output that later parts read back costs the reload the same way. If the
intermediate is elementwise/broadcast (no reduction) and every tensor its expression reads
is already available inside the kernel — a kernel input read anyway, or a value the kernel
keeps in registers or shared memory — then the later parts can recompute it from those
inputs at no extra global traffic. Those readers get the expression inlined
(:func:`polyfuse.graph.inline.inline`); readers in the producer's own part keep using it.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.graph.graph import Graph
from polyfuse.graph.inline import inline
from polyfuse.poly.compose import ReductionKernel
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.placement import Placement


def recompute_candidates(rk: ReductionKernel, placements: dict[str, Placement]) -> list[str]:
    """Spilled intermediates of ``rk`` that later parts can recompute for free."""
    model = rk.scheduled.model
    part_of = {s.name: i for i, p in enumerate(rk.parts) for s in p.model.statements}
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
        if inputs_ok and later:
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


def apply_recompute(graph: Graph, rk: ReductionKernel, name: str) -> list[str]:
    """Inline intermediate ``name`` into its readers in later parts; returns those readers."""
    part_of = {s.prim: i for i, p in enumerate(rk.parts) for s in p.model.statements}
    producer = graph.prims[name].tensor
    done = []
    for consumer in sorted(graph.consumers(name)):
        if consumer in part_of and part_of[consumer] > part_of[name]:
            graph.replace(consumer, inline(graph.prims[consumer].tensor, producer))
            done.append(consumer)
    return done
