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

from polyfuse.cuda.codegen.kernel_ast import (
    KBarrier,
    KernelIR,
    KIf,
    KMark,
    KMutator,
    KNode,
    KStmt,
    MemSpace,
    Scope,
    map_children,
)
from polyfuse.cuda.codegen.lower_combines import SCRATCH, WARP_SIZE

PART = "part:"


def barrier_scope(form: str, lanes: int) -> Scope:
    """The threads that share a stitched kernel's tiles, for a reduction of ``form``."""
    return Scope.WARP if form != "x" and lanes <= WARP_SIZE else Scope.BLOCK


def insert_barriers(ir: KernelIR, scope: Scope) -> KernelIR:
    """A new IR with a barrier before every part but the first, where parts share tiles."""
    tiles = [a for a in ir.allocs if a.space is MemSpace.SHARED and a.name != SCRATCH]
    if not ir.reduction or not tiles:
        return ir
    return ir.with_(body=tuple(_PartBarriers(scope).body(ir.body)))


class _PartBarriers(KMutator):
    """A barrier of ``scope`` before every ``part:`` mark but the first; where isl hoisted a
    lane guard over a whole part, the barrier stands before the guard (every thread must
    reach it)."""

    def __init__(self, scope: Scope) -> None:
        self.scope = scope
        self.seen = 0
        self.hoisted = False  # the next part's barrier already stands before its guard

    def visit_KMark(self, n: KMark) -> list[KNode]:
        part = n.name.startswith(PART)
        out: list[KNode] = []
        if part and self.seen and not self.hoisted:
            out.append(KBarrier(self.scope, _note(n)))
        self.hoisted = False
        self.seen += part
        return out + [KMark(n.name, self.body(n.body))]

    def visit_default(self, n: KNode) -> list[KNode]:
        if _holds_parts(n):
            # isl hoisted one guard over several parts: one guard per child (the guard reads
            # only loop and thread indices), so each part's barrier can stand outside it
            return self.body(_pieces(n))
        out: list[KNode] = []
        lead = _leading_part(n)
        # nested guards lead to the same part: its barrier stands before the outermost
        if self.seen and lead is not None and not self.hoisted:
            out.append(KBarrier(self.scope, _note(lead)))
            self.hoisted = True
        r = super().visit_default(n)
        return out + (r if isinstance(r, list) else [r])


def _note(mark: KMark) -> str:
    return f"{mark.name[len(PART) :]} reads what earlier parts wrote"


def _holds_parts(n: KNode) -> bool:
    """Whether ``n`` is a guard (no else) over several parts: a part after its first child, or
    a child that is such a guard itself (``if (l0 <= 1) { A; if (l0 == 0) { B; C } }``)."""
    return (
        isinstance(n, KIf)
        and not n.orelse
        and (any(_has_part(c) for c in n.then[1:]) or any(_holds_parts(c) for c in n.then))
    )


def _pieces(n: KIf) -> list[KNode]:
    """``n`` as one copy of its guard per child, the children that are guards over several
    parts split first: every part then leads its own chain of guards, so its barrier can
    stand before the outermost."""
    return [
        KIf(n.cond, [p]) for c in n.then for p in (_pieces(c) if _holds_parts(c) else [c])
    ]


def _has_part(n: KNode) -> bool:
    """Whether a part mark stands in ``n`` or below it."""
    found = False

    def look(nodes: list[KNode]) -> list[KNode]:
        nonlocal found
        for c in nodes:
            if isinstance(c, KMark) and c.name.startswith(PART):
                found = True
            else:
                map_children(c, look)
        return nodes

    look([n])
    return found


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
    return _SyncStatements(names, scope).body(body)


class _SyncStatements(KMutator):
    def __init__(self, names: frozenset[str], scope: Scope) -> None:
        self.names, self.scope = names, scope

    def visit_KStmt(self, n: KStmt) -> KNode:
        return KBarrier(self.scope) if n.stmt in self.names else n
