"""The compile plan: every stage's result and every decision, printable.

``print(fn.plan)`` is the bug report: primitives with their op kinds, micrographs, each
producer→consumer decision with its reason, feedback events, schedules, kernels with their
launch shapes and tensor placements.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from polyfuse.base.decision import Decided, note_records
from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.graph.graph import Graph
from polyfuse.graph.partition import Partition
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.schedule import Feedback, ScheduledMicrograph
from polyfuse.stitch.memory import StitchDecision, reduction_form
from polyfuse.stitch.parallel import PackDecision
from polyfuse.stitch.plan import KernelPlan


@dataclass
class Plan:
    """Everything the compiler decided for one graph."""

    name: str
    graph: Graph
    partition: Partition
    feedback: list[Feedback]
    scheduled: list[ScheduledMicrograph]
    mapped: list[MappedKernel | None]  # None: kernel taken from the compile cache
    kernel_plans: list[KernelPlan]
    kernels: list[Kernel]
    asts: dict[str, Any] = field(repr=False, default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    stitches: list[StitchDecision] = field(default_factory=list)  # Layer 2, made or refused
    rewrites: list[str] = field(default_factory=list)  # graph rewrites (split: records)
    packs: list[PackDecision] = field(default_factory=list)  # Layer 3, made or refused
    splits: list[Decided] = field(default_factory=list)  # reductions split across blocks or not
    device: str = ""  # the cost models' device table entry and which figures they used

    @property
    def micrographs(self):
        return self.partition.micrographs

    def records(self) -> list[Decided]:
        """Every decision as the one typed record (kinds, subject, made, reason, typed data),
        in plan order: partition edges, stitches, per kernel its placements, recomputes and
        layout, packs, splits, then the choices the kernels' notes record (register
        fragments, tile boxes, tensor cores, stages, ...: :func:`note_records`) that no list
        before holds. Each stage's own decision class carries its record. (The graph
        rewrites' notes are the splits' records in the rewrite's words: the splits stand
        for them.)"""
        out = [d.record for d in self.partition.decisions]
        out += [d.record for d in self.stitches]
        for kp in self.kernel_plans:
            out += [p.record(kp.name) for p in kp.placements.values()]
            out += kp.recomputes
            out += kp.layout
        out += [d.record for d in self.packs]
        out += self.splits
        seen = set(out)
        for r in note_records([n for k in self.kernels for n in k.notes]):
            if r not in seen:
                seen.add(r)
                out.append(r)
        return out

    def __str__(self) -> str:
        g = self.graph
        out = [f"== polyfuse plan: {self.name} =="]
        if self.device:
            out.append(f"cost-model device: {self.device}")
        if g.pass_records:
            summary = [r for r in g.pass_records if r.action == "summary"]
            out.append("graph passes" + (f" ({summary[-1].reason}):" if summary else ":"))
            out += [f"  {r}" for r in g.pass_records if r.action != "summary"] or ["  (nothing)"]
        out.append(f"primitives ({len(g.prims)}):")
        out += [f"  {g.prims[n]}" for n in g.topo_order()]
        out += [f"  rewrite: {r}" for r in self.rewrites]
        out += [f"  reduction split: {d.reason}" for d in self.splits]
        out.append(f"micrographs ({len(self.partition.micrographs)}):")
        for m, sm in zip(self.partition.micrographs, self.scheduled, strict=True):
            form = reduction_form(sm, m.kind)
            out.append(f"  {m}" + (f"  [canonical form: {form}]" if form else ""))
        out.append("decisions:")
        out += [f"  {d}" for d in self.partition.decisions] or ["  (no edges)"]
        out.append(f"feedback events ({len(self.feedback)}):")
        out += [f"  {e}" for e in self.feedback]
        out.append(f"memory stitching ({len(self.stitches)} decisions):")
        out += [f"  {d}" for d in self.stitches]
        out.append(f"parallel stitching ({len(self.packs)} decisions):")
        out += [f"  {d}" for d in self.packs]
        functions = len({k.function or k.name for k in self.kernels})
        out.append(f"kernels ({len(self.kernels)}, {functions} distinct functions):")
        for k, kp, mm in zip(self.kernels, self.kernel_plans, self.mapped, strict=True):
            res = ""
            if k.registers is not None:
                res = (
                    f", {k.registers} regs, {k.static_shared_bytes} B smem, "
                    f"{k.spill_stores} B spills"
                )
            shape = f" {mm.grid_dims}, block {k.block[0]} {mm.tile_sizes}" if mm else ""
            shape = shape or f", block {k.block[0]}"
            fn = f"; runs {k.function}" if k.function else ""
            out.append(
                f"  {k.name}: micrographs {', '.join(k.micrographs)}; grid {k.grid[0]}{shape}{res}"
                + fn
            )
            out += [f"    {p}" for p in kp.placements.values()]
            out += [f"    note: {n}" for n in k.notes]
        out.append("compile seconds: " + ", ".join(f"{k} {v:.3f}" for k, v in self.seconds.items()))
        return "\n".join(out)
