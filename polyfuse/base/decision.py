"""Decisions as typed records: a kind, the reason in prose, and the data behind it.

Every stage states why it decided what it did (partition edges, stitches, placements,
recomputes). The reason text is for people (``print(fn.plan)``); the :class:`DecisionKind` is
for programs — the visualizer's filters, reports — so rewording a reason changes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class DecisionKind(StrEnum):
    """Why two primitives ended up together or apart (the visualizer's reason kinds)."""

    FUSED = "fused"  # same micrograph, by a partition rule
    STITCHED = "stitched"  # same kernel, by a Layer 2 stitch rule
    NO_RULE = "no rule"  # no partition / stitch rule for the kinds
    CYCLE = "cycle"  # merging or stitching would create a cycle
    ISL_FEEDBACK = "isl feedback"  # isl could not schedule them together within budget
    FORM_MISMATCH = "form mismatch"  # canonical forms or launch shapes differ
    TILE_MISMATCH = "tile mismatch"  # outer dimensions or tiles do not match / no layout
    FOOTPRINT = "footprint"  # per-block footprint too large for shared memory
    COST_MODEL = "cost model"  # decided by a cost model (recompute, not spill; pack or not)
    PARALLEL_STITCH = "parallel stitch"  # a Layer 3 decision: independent kernels in one launch
    PACKED = "packed"  # Layer 3 packed the kernels into one launch
    SHARED_BUFFER = "shared buffer"  # Layer 3 kept kernels apart that touch a common buffer
    ELEMENTS_PER_THREAD = "elements per thread"  # and float4 accesses (poly/coarsen.py)
    SPLIT_REDUCTION = "split reduction"  # a reduction split across blocks (poly/split.py)
    REDUCTION_LAYOUT = "reduction layout"  # a reduction kernel's launch shape (poly/cost.py)
    GEMM_TILE = "gemm tile"  # a GEMM's block / register / k tiles (poly/tiling.py)
    GEMM_LOOP = "gemm loop"  # how a GEMM's loops are emitted (poly/gemm_loops.py)


@dataclass(frozen=True)
class Decided:
    """One decision: its kinds, the reason as the plan prints it, and its data."""

    kinds: tuple[DecisionKind, ...]
    reason: str
    data: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return f"[{', '.join(k.value for k in self.kinds)}] {self.reason}"
