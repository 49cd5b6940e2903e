"""Kernel plans: which mapped micrographs become which kernel.

Today every micrograph is its own kernel; Layer 2 (memory stitching of a reduction with its
consumers) and Layer 3 (packing independent branches) will merge plans here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from polyfuse.poly.mapping import MappedMicrograph
from polyfuse.poly.placement import Placement


@dataclass
class KernelPlan:
    """The micrographs one kernel runs, with where each of their tensors lives."""

    name: str
    parts: list[MappedMicrograph]
    placements: dict[str, Placement]
    decisions: list[str] = field(default_factory=list)

    @property
    def micrograph_parts(self):
        """The scheduled micrographs this kernel runs."""
        out = []
        for p in self.parts:
            out.extend(getattr(p, "parts", None) or [p.scheduled])
        return out

    @property
    def micrographs(self) -> list[str]:
        return [p.name for p in self.micrograph_parts]

    def __str__(self) -> str:
        lines = [f"KernelPlan {self.name}: {', '.join(self.micrographs)}"]
        lines += [f"  {p}" for p in self.placements.values()]
        lines += [f"  decision: {d}" for d in self.decisions]
        return "\n".join(lines)


def plan_kernels(mapped: list[tuple[MappedMicrograph, dict[str, Placement]]]) -> list[KernelPlan]:
    """One kernel per micrograph, named after its first primitive."""
    plans = []
    for i, (mm, pl) in enumerate(mapped):
        first = mm.scheduled.model.statements[0].prim
        plans.append(KernelPlan(f"k{i}_{first}", [mm], pl))
    return plans
