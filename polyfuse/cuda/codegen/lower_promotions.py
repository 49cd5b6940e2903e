"""Lowering pass: shared tiles of promoted operands — allocation, copy statements, reads.

A GEMM operand promoted to shared memory (:mod:`polyfuse.poly.promote`) arrives as a
:class:`PromotedTile`: its box per k-tile (lower bounds as kernel-AST expressions, sizes), the
padded row of the buffer, the global array's shape, which dimensions may leave the array, and
the thread grid that copies it (:mod:`polyfuse.poly.copy_layout`: a coordinate per footprint
dimension spread over threads, for any rank; each element is copied by one thread). The pass
declares the buffer ``s_<tensor>`` (with its copy thread grid), turns every instance of the
copy statement into a :class:`KCopy` (zeros outside the array; ``width`` 4: one 128-bit vector
per instance) and records a :class:`KTile` so that the update's reads index the buffer.
Buffer names come from the IR's namer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KCopy,
    KernelIR,
    KExpr,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStmt,
    KThreadGrid,
    KTile,
    MemSpace,
    substitute,
)
from polyfuse.cuda.codegen.lower_pipeline import Pipeline, pipeline_tiles

__all__ = ["Pipeline", "PromotedTile", "lower_promotions"]

VECTOR_BYTES = 16  # a vector-copied tile is aligned to one 128-bit vector


@dataclass(frozen=True)
class PromotedTile:
    """One operand's shared tile as the pass needs it."""

    tensor: str
    copy_stmt: str  # isl statement ``C_<tensor>[kt..., e...]``: one copied element
    lo: tuple[KExpr, ...]  # box lower bounds (over block coordinates and k-tiles)
    shape: tuple[int, ...]  # buffer shape (the box, last dimension padded)
    global_shape: tuple[int, ...]
    bounds_check: tuple[bool, ...]  # per dimension: may the box leave the array?
    grid: tuple[tuple[str, int], ...]  # copying threads' coordinates (name, extent), outer first
    readers: frozenset[str]  # statements whose reads of ``tensor`` use the tile
    width: int = 1  # elements per copy instance (4: a 128-bit vector, aligned)
    select_free: bool = False  # selects-to-zero around the readers' reads are dropped
    merge: tuple[tuple[int, ...], ...] = ()  # the tile's dims over the tensor's (KTile.merge)
    #: a tensor read through several accesses has a tile per access: ``tensor`` is then the
    #: tile's key, ``source`` the global array and ``reads`` the read nodes it serves
    source: str = ""
    reads: tuple[object, ...] = ()


def lower_promotions(
    ir: KernelIR, tiles: Sequence[PromotedTile], pipeline: Pipeline | None = None
) -> KernelIR:
    """A new IR with the tiles allocated (before the registers), copies as :class:`KCopy`
    (with ``pipeline``: each copy's box is its own k-tile's, its first destination
    coordinate that k-tile, and the passes of :mod:`polyfuse.cuda.codegen.lower_pipeline` make
    ``stages`` buffers per tile filled by :class:`KAsyncCopy`)."""
    shared_name = ir.namer.shared  # the tile of a tensor: s_<name>
    allocs = list(ir.allocs)
    first_reg = next((i for i, a in enumerate(allocs) if a.space is MemSpace.REGISTER), len(allocs))
    new = [
        KAlloc(
            shared_name(t.tensor),
            MemSpace.SHARED,
            "",
            t.shape,
            align=VECTOR_BYTES if t.width > 1 else 0,
        )
        for t in tiles
    ]
    allocs[first_reg:first_reg] = new
    grids = tuple(KThreadGrid(shared_name(t.tensor), t.grid) for t in tiles)
    records = tuple(
        KTile(
            t.tensor,
            shared_name(t.tensor),
            t.lo,
            t.readers,
            None,
            t.select_free,
            t.merge,
            t.reads,
        )
        for t in tiles
    )
    by_stmt = {t.copy_stmt: t for t in tiles}

    def copy(n: KStmt, t: PromotedTile) -> KCopy:
        nk = len(n.args) - len(t.shape)  # the k-tiles lead the copy's coordinates
        es = n.args[nk:]
        lo = t.lo
        if pipeline:  # the copied k-tile is the copy's own, not the loop's (one ahead)
            for kt, arg in zip(pipeline.ktiles, n.args[:nk], strict=True):
                lo = tuple(substitute(x, kt, arg) for x in lo)
        conds: list[KExpr] = []
        for e, size, chk in zip(es, t.global_shape, t.bounds_check, strict=True):
            if chk:
                conds += [KOp(">=", (e, KInt(0))), KOp("<", (e, KInt(size)))]
        guard = None if not conds else conds[0] if len(conds) == 1 else KOp("&&", tuple(conds))
        dst = tuple(KOp("-", (e, b)) for e, b in zip(es, lo, strict=True))
        src = ir.namer.tensor(t.source or t.tensor)
        args = (shared_name(t.tensor), dst, src, tuple(es), guard, 0.0, t.global_shape)
        if not pipeline:
            return KCopy(*args, t.width)
        kt = n.args[pipeline.ktiles.index(pipeline.loop)]  # the k-tile this copy fills
        return KCopy(args[0], (kt, *dst), *args[2:], t.width)

    class Walk(KMutator):
        def visit_KStmt(self, n: KStmt) -> KNode:
            if n.stmt in by_stmt:
                return copy(n, by_stmt[n.stmt])
            return n

    ir = ir.with_(
        allocs=tuple(allocs),
        thread_grids=ir.thread_grids + grids,
        tiles=ir.tiles + records,
        body=tuple(Walk().body(ir.body)),
    )
    if pipeline is None:
        return ir
    return pipeline_tiles(ir, frozenset(shared_name(t.tensor) for t in tiles), pipeline)
