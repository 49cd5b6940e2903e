"""Kernel plans: which micrographs one kernel runs and where each of their tensors lives.

:func:`plan_kernel` is the last stitch-stage decision per kernel: the one mapping interface
(:func:`polyfuse.poly.kernel_map.map_kernel`), placement, and recompute instead of spilling
(:mod:`polyfuse.stitch.recompute`). Code generation is a function of the plan it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import Decided
from polyfuse.graph.graph import Graph
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.mapping import MappedKernel, MappingConfig
from polyfuse.poly.model import PolyModel
from polyfuse.poly.placement import Placement
from polyfuse.stitch.memory import KernelGroup
from polyfuse.stitch.recompute import recompute_spills


@dataclass
class KernelPlan:
    """The micrographs one kernel runs, with where each of their tensors lives.

    ``parts`` holds the mapped layout when the kernel was generated in this compile; a kernel
    taken from the compile cache has none and keeps only the micrograph ``names``.
    """

    name: str
    parts: list[MappedKernel]
    placements: dict[str, Placement]
    names: list[str] = field(default_factory=list)
    cached: bool = False
    # recomputes decided for this kernel: data {"tensor", "readers"} (polyfuse.base.decision)
    recomputes: list[Decided] = field(default_factory=list)
    # launch-layout decisions: the reduction layout (poly/cost.py) or GEMM tiles
    # (poly/tiling.py), elements per thread / float4 (poly/coarsen.py)
    layout: list[Decided] = field(default_factory=list)
    #: per tensor it reads from global memory itself (not staged in shared memory or
    #: registers), that read footprint as isl set text without the tensor's name: what Layer 3
    #: intersects when packed parts read one buffer. Kept by the compile cache too.
    shared_reads: dict[str, str] = field(default_factory=dict)

    @property
    def micrograph_parts(self):
        """The scheduled micrographs this kernel runs (empty for a cached kernel)."""
        return [sm for p in self.parts for sm in p.parts]

    @property
    def micrographs(self) -> list[str]:
        return [p.name for p in self.micrograph_parts] or list(self.names)

    def __str__(self) -> str:
        src = " (from the compile cache)" if self.cached else ""
        lines = [f"KernelPlan {self.name}: {', '.join(self.micrographs)}{src}"]
        lines += [f"  {p}" for p in self.placements.values()]
        return "\n".join(lines)


def plan_kernel(
    graph: Graph, group: KernelGroup, name: str, device: DeviceSpec, cfg: MappingConfig
) -> KernelPlan:
    """Map and place kernel ``name`` of ``group``, recomputes decided (a compile-cache miss)."""
    r = recompute_spills(graph, group.parts, group.strategy, device, cfg, stage=True)
    c = r.mapped.coarsening  # elements per thread / runs per lane (coarsen.py, lane_vector.py)
    layout = [r.mapped.layout] if r.mapped.layout is not None else []
    layout += [c.record] if c is not None else []
    layout += r.mapped.codegen
    reads = global_reads(r.mapped.scheduled.model, r.placements)
    return KernelPlan(
        name,
        [r.mapped],
        r.placements,
        recomputes=r.decisions,
        layout=layout,
        shared_reads=reads,
    )


def global_reads(model: PolyModel, placements: dict[str, Placement]) -> dict[str, str]:
    """Per tensor read straight from global memory, the elements the kernel reads (isl set
    text, its tuple unnamed so that it holds no tensor name)."""
    images: dict[str, isl.Set] = {}
    for m in maps_of(model.reads.intersect_domain(model.domain)):
        t = m.get_tuple_name(isl.dim_type.out)
        p = placements.get(t)
        if p is None or p.space != "global" or p.register_copy:
            continue
        img = m.range()
        images[t] = img.union(images[t]) if t in images else img
    return {t: str(img.coalesce().reset_tuple_id()) for t, img in sorted(images.items())}
