"""Lowering pass: barriers between the stitched parts of a reduction kernel.

The parts of a stitched kernel (marks ``part:<micrograph>``) exchange data through shared
tiles: a later part reads what an earlier part wrote, from other threads. So when a reduction
kernel has shared tiles, every part but the first starts with a barrier. Its scope is a warp
when each result's lanes are consecutive threads of one warp (form "y", at most 32 lanes: the
threads sharing a tile are that warp), else the block.

Schedules that order shared-tile copies themselves (the GEMM tiling of ``poly/promote.py``)
carry barrier *statements*; :func:`lower_sync_statements` turns their instances into barriers.
"""

from __future__ import annotations

from polyfuse.cuda.kernel_ast import (
    KBarrier,
    KernelIR,
    KIf,
    KMark,
    KNode,
    KStmt,
    MemSpace,
    Scope,
    map_children,
)
from polyfuse.cuda.lower_combines import WARP_SIZE

PART = "part:"


def barrier_scope(form: str, lanes: int) -> Scope:
    """The threads that share a stitched kernel's tiles, for a reduction of ``form``."""
    return Scope.WARP if form != "x" and lanes <= WARP_SIZE else Scope.BLOCK


def insert_barriers(ir: KernelIR, scope: Scope) -> KernelIR:
    """A new IR with a barrier before every part but the first, where parts share tiles."""
    scratch = ir.combine.scratch if ir.combine else None
    tiles = [a for a in ir.allocs if a.space is MemSpace.SHARED and a.name != scratch]
    if not ir.reduction or not tiles:
        return ir
    seen = 0
    hoisted = False  # the next part's barrier already stands before its guard

    def walk(nodes: tuple[KNode, ...] | list[KNode]) -> list[KNode]:
        nonlocal seen, hoisted
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, KMark):
                part = n.name.startswith(PART)
                if part and seen and not hoisted:
                    out.append(KBarrier(scope, _note(n)))
                hoisted = False
                seen += part
                out.append(KMark(n.name, walk(n.body)))
            else:
                lead = _leading_part(n)
                if seen and lead is not None:
                    # every thread must reach the barrier: put it before the part's lane guard
                    out.append(KBarrier(scope, _note(lead)))
                    hoisted = True
                out.append(map_children(n, walk))
        return out

    return ir.with_(body=tuple(walk(ir.body)))


def _note(mark: KMark) -> str:
    return f"{mark.name[len(PART) :]} reads what earlier parts wrote"


def _leading_part(n: KNode) -> KMark | None:
    """The part mark a guard without else begins with (isl hoisted a lane guard over the whole
    part, e.g. when only some lanes have work in it), else None."""
    while isinstance(n, KIf) and not n.orelse and n.then:
        n = n.then[0]
        if isinstance(n, KMark) and n.name.startswith(PART):
            return n
    return None


def lower_sync_statements(
    body: list[KNode], names: frozenset[str], scope: Scope = Scope.BLOCK
) -> list[KNode]:
    """A new body in which every instance of a statement in ``names`` is a barrier."""

    def walk(nodes: list[KNode]) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, KStmt) and n.stmt in names:
                out.append(KBarrier(scope))
            else:
                out.append(map_children(n, walk))
        return out

    return walk(body)
