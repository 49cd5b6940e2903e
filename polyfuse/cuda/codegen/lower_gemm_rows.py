"""One ``__global__`` running a GEMM and the row reduction after it (Layer 2 for GEMMs).

The decision is :mod:`polyfuse.stitch.gemm_rows`'s.

Both halves are lowered by their own passes (:func:`polyfuse.cuda.codegen.lower.lower_gemm_ir`,
:func:`polyfuse.cuda.codegen.lower.lower_kernel_ir`) with the intermediate placed in shared
memory in both; this module joins the two final IRs into one, printed by the one printer:
each half a :class:`~polyfuse.cuda.codegen.kernel_ast.KSection` (its launch coordinates,
allocations and body) in its own C scope (:class:`~polyfuse.cuda.codegen.kernel_ast.KScope`:
their loop variables, block and thread coordinates stay apart), a block barrier between them
(the GEMM's epilogue stores the tile that the reduction then reads), and the reduction run for
each of the GEMM block's reduction blocks
(:class:`~polyfuse.cuda.codegen.kernel_ast.KRowBlocks`). Both halves have the same grid and
block size (checked by the stitch), so every barrier is reached by the whole block.

Shared memory is one pool, overlaid by liveness: the GEMM's operand tiles from offset 0; the
row tile also from offset 0 in both halves, the reduction's own arrays after it. The operand
tiles are dead once the k-tile loop ends: the GEMM's schedule puts a barrier after every
k-tile's update (``SYNC_AFTER`` in :mod:`polyfuse.poly.promote`), before its epilogue stores
the row tile. The pool is the larger of the two halves' needs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.cuda.codegen.kernel_ast import (
    ROW_BLOCK,
    KAlloc,
    KBarrier,
    Kernel,
    KernelIR,
    KExpr,
    KNode,
    KRowBlocks,
    KScope,
    KSection,
    KVar,
    MemSpace,
    Scope,
)
from polyfuse.cuda.codegen.kernel_function import BLOCK_INDEX
from polyfuse.cuda.codegen.lower import Lowered
from polyfuse.cuda.codegen.lower_facts import ITEMSIZE
from polyfuse.cuda.codegen.printer import kernel_of
from polyfuse.stitch.facts import KernelFacts, SharedArray

POOL = "pf_pool"  # the joined kernel's shared memory
ALIGN = 16
POOL_DTYPE = "uint8"  # the pool is bytes; each array a typed slice of it
GEMM_NOTE = "the GEMM: its epilogue stores the row tile to shared memory"
TILE_NOTE = "the row tile is complete before the reduction reads it"
ROWS_NOTE = "the row reduction on the block's rows"


def pool_allocs(
    allocs: tuple[KAlloc, ...], first: str, overlay: bool
) -> tuple[tuple[KAlloc, ...], int]:
    """``allocs`` with the static shared arrays as slices of :data:`POOL` (16-byte aligned):
    ``first`` at offset 0, the others in declaration order after it or, with ``overlay``,
    from offset 0 too (their lifetimes end before ``first``'s begins); and the bytes they
    take."""
    shared = [a for a in allocs if a.space is MemSpace.SHARED]
    assert all(a.offset is None for a in shared), "the halves have no dynamic shared memory"
    offsets, end, top = {}, 0, 0
    for a in sorted(shared, key=lambda a: a.name != first):  # stable: ``first`` leads
        size = -(-ITEMSIZE[a.dtype] * a.elements // ALIGN) * ALIGN
        if a.name == first and overlay:
            offsets[a.name] = 0
            top = size
            continue
        offsets[a.name] = end
        end += size
    pooled = tuple(
        replace(a, offset=offsets[a.name], pool=POOL) if a.name in offsets else a
        for a in allocs
    )
    return pooled, max(end, top)


def section(ir: KernelIR, block: KExpr, first: str, overlay: bool) -> tuple[KSection, int]:
    """The lowered ``ir`` as a section run as block ``block`` whose shared arrays are slices
    of the pool (:func:`pool_allocs`), and the pool bytes it needs."""
    allocs, size = pool_allocs(ir.allocs, first, overlay)
    return KSection(block, ir.grid_dims, ir.thread_dims, allocs, ir.thread_grids, ir.body), size


@dataclass(frozen=True)
class RowBlocks:
    """Which reduction blocks one GEMM block runs: the GEMM's block grid (slowest first), the
    reduction's, and ``repeat`` reduction blocks per GEMM block along the last (rows)
    coordinate (:func:`polyfuse.stitch.gemm_rows.block_correspondence`, checked by isl)."""

    gemm_grid: tuple[int, ...]
    rows_grid: tuple[int, ...]
    repeat: int

    def node(self, body: tuple[KNode, ...]) -> KRowBlocks:
        """``body`` (whose block index is :data:`ROW_BLOCK`) run for each reduction block of
        this GEMM block."""
        return KRowBlocks(self.gemm_grid, self.rows_grid, self.repeat, body)


def join_irs(
    gemm: KernelIR, rows: KernelIR, tensor: str, blocks: RowBlocks
) -> tuple[KernelIR, int]:
    """The IR running the lowered ``gemm`` then ``rows`` (for each of the GEMM block's
    reduction blocks, ``blocks``) on one shared pool in which both see the shared array of
    ``tensor`` (the row tile) at offset 0; and the pool's bytes. Named, launched and bounded
    as the GEMM; its parameters are the GEMM's, then the reduction's others."""
    buffer = gemm.namer.shared(tensor)
    g, gbytes = section(gemm, KVar(BLOCK_INDEX), buffer, overlay=True)
    r, rbytes = section(rows, KVar(ROW_BLOCK), rows.namer.shared(tensor), overlay=False)
    pool = max(gbytes, rbytes)
    seen = {p.name for p in gemm.params}
    body = (
        KScope(GEMM_NOTE, (g,)),
        KBarrier(Scope.BLOCK, TILE_NOTE),
        KScope(ROWS_NOTE, (blocks.node((r,)),)),
    )
    joined = replace(
        gemm,
        body=body,
        micrographs=gemm.micrographs + rows.micrographs,
        params=gemm.params + tuple(p for p in rows.params if p.name not in seen),
        allocs=(KAlloc(POOL, MemSpace.SHARED, POOL_DTYPE, (pool,), align=ALIGN),),
        thread_grids=(),
        tiles=(),
        staged=(),
        fragments=(),
    )
    return joined, pool


def join_facts(gemm: KernelFacts, rows: KernelFacts, pool: int) -> KernelFacts:
    """The facts of the joined kernel: one static shared array (the pool)."""
    return replace(
        gemm,
        shared_arrays=(SharedArray(pool, ALIGN),),
        dynamic_shared_bytes=max(gemm.dynamic_shared_bytes, rows.dynamic_shared_bytes),
        barriers=True,
        shuffles=gemm.shuffles or rows.shuffles,
        axes=tuple(sorted({*gemm.axes, *rows.axes})),
    )


def join_kernels(gemm: Lowered, rows: Lowered, tensor: str, blocks: RowBlocks) -> Kernel:
    """One kernel running the lowered ``gemm`` and ``rows`` (same grid and block) on one
    shared pool, both halves seeing the shared array of ``tensor`` at its start
    (:func:`join_irs`), printed by the one printer under the IRs' names (canonical ones
    when the halves have them). Layer 3 does not pack it (it reads its block index)."""
    assert gemm.ir.threads == rows.ir.threads, (gemm.ir.threads, rows.ir.threads)
    assert not gemm.facts.dynamic_shared_bytes and not rows.facts.dynamic_shared_bytes
    ir, pool = join_irs(gemm.ir, rows.ir, tensor, blocks)
    return kernel_of(ir, join_facts(gemm.facts, rows.facts, pool), (*gemm.notes, *rows.notes))
