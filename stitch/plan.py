"""Kernel plans: which micrographs one kernel runs and where each of their tensors lives."""

from __future__ import annotations

from dataclasses import dataclass, field

from polyfuse.decision import Decided
from polyfuse.poly.mapping import MappedMicrograph
from polyfuse.poly.placement import Placement


@dataclass
class KernelPlan:
    """The micrographs one kernel runs, with where each of their tensors lives.

    ``parts`` holds the mapped layout when the kernel was generated in this compile; a kernel
    taken from the compile cache has none and keeps only the micrograph ``names``.
    """

    name: str
    parts: list[MappedMicrograph]
    placements: dict[str, Placement]
    names: list[str] = field(default_factory=list)
    cached: bool = False
    # recomputes decided for this kernel: data {"tensor", "readers"} (polyfuse.decision)
    recomputes: list[Decided] = field(default_factory=list)
    # launch-layout decisions: elements per thread / float4 (poly/coarsen.py)
    layout: list[Decided] = field(default_factory=list)

    @property
    def micrograph_parts(self):
        """The scheduled micrographs this kernel runs (empty for a cached kernel)."""
        out = []
        for p in self.parts:
            out.extend(getattr(p, "parts", None) or [p.scheduled])
        return out

    @property
    def micrographs(self) -> list[str]:
        return [p.name for p in self.micrograph_parts] or list(self.names)

    def __str__(self) -> str:
        src = " (from the compile cache)" if self.cached else ""
        lines = [f"KernelPlan {self.name}: {', '.join(self.micrographs)}{src}"]
        lines += [f"  {p}" for p in self.placements.values()]
        return "\n".join(lines)
