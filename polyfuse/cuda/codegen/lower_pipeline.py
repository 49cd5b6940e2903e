"""Lowering passes: multi-stage (ALCOP) pipelining of shared tiles over a k-tile loop.

The schedule (:func:`polyfuse.poly.promote.build_gemm_kernel`) already runs each tile copy
S-1 k-tiles before the k-tile that reads it, and places one commit statement per k-tile
(from k-tile 1-S on) and one wait statement per k-tile (from 0 on); the promotion pass
(:func:`polyfuse.cuda.codegen.lower_promotions.lower_promotions`) turns each copy instance into a
:class:`KCopy` whose first destination coordinate is the k-tile it fills. These passes then
make the pipeline, one ALCOP transformation step each:

1. :func:`expand_stages` — buffer expansion: each pipelined tile gets S buffers, the stage
   its first dimension;
2. :func:`stage_producers` — producer index rewriting: a copy fills stage ``k-tile mod S``
   and is issued asynchronously (``cp.async``, :class:`KAsyncCopy`);
3. :func:`stage_consumers` — consumer index rewriting: the reads of k-tile ``kt`` use stage
   ``kt mod S``;
4. :func:`lower_pipeline_sync` — synchronisation: each commit statement becomes
   :class:`KCommit` (one group per k-tile, empty in the last S-1), each wait statement
   :class:`KWait` with the exact count: after k-tile kt's commit the groups of k-tiles
   kt+1..kt+S-1 may still fly, so ``pending <= S-1`` and k-tile kt has landed.

The prologue (the S-1 iterations before k-tile 0, copies only), the steady state and the
epilogue (the last S-1 k-tiles, reads only) come from the loop pass
(:func:`polyfuse.cuda.codegen.lower_loops.peel_loop`) splitting the k-tile loop where the copies'
and the reads' bounds change; the barriers around the reads from the schedule's barrier
statements (:func:`polyfuse.cuda.codegen.lower_barriers.lower_sync_statements`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from polyfuse.cuda.codegen.kernel_ast import (
    KAsyncCopy,
    KCommit,
    KCopy,
    KernelIR,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStmt,
    KVar,
    KWait,
)


@dataclass(frozen=True)
class Pipeline:
    """Multi-stage tiles: ``stages`` buffers alternate over k-tile loop ``loop`` (``ktiles``:
    all k-tile loop variables, leading each copy's coordinates); instances of ``commit`` and
    ``wait`` become :class:`KCommit` and :class:`KWait` (all but the S-1 newest groups
    landed)."""

    stages: int
    loop: str
    ktiles: tuple[str, ...]
    commit: str
    wait: str


def expand_stages(ir: KernelIR, buffers: frozenset[str], stages: int) -> KernelIR:
    """Step 1: the allocations of ``buffers`` with ``stages`` buffers each (first dim)."""
    allocs = tuple(
        replace(a, shape=(stages, *a.shape)) if a.name in buffers else a for a in ir.allocs
    )
    return ir.with_(allocs=allocs)


def stage_producers(ir: KernelIR, buffers: frozenset[str], stages: int) -> KernelIR:
    """Step 2: copies into ``buffers``, whose first coordinate is the k-tile they fill,
    write stage ``k-tile % stages`` and are issued asynchronously."""

    class Walk(KMutator):
        def visit_KCopy(self, n: KCopy) -> KNode:
            if n.dst not in buffers:
                return n
            stage = KOp("%", (n.dst_index[0], KInt(stages)))
            fields = {k: getattr(n, k) for k in KCopy.__dataclass_fields__}
            fields["dst_index"] = (stage, *n.dst_index[1:])
            return KAsyncCopy(**fields)

    return ir.with_(body=tuple(Walk().body(ir.body)))


def stage_consumers(ir: KernelIR, buffers: frozenset[str], loop: str, stages: int) -> KernelIR:
    """Step 3: the reads through the tiles in ``buffers`` use stage ``loop % stages``."""
    stage = KOp("%", (KVar(loop), KInt(stages)))
    tiles = tuple(replace(t, stage=stage) if t.buffer in buffers else t for t in ir.tiles)
    return ir.with_(tiles=tiles)


def lower_pipeline_sync(ir: KernelIR, commit: str, wait: str, stages: int) -> KernelIR:
    """Step 4: ``commit`` statements become :class:`KCommit`, ``wait`` statements
    :class:`KWait` letting the ``stages - 1`` newest groups fly (see the module doc)."""

    class Walk(KMutator):
        def visit_KStmt(self, n: KStmt) -> KNode:
            if n.stmt == commit:
                return KCommit()
            if n.stmt == wait:
                return KWait(stages - 1)
            return n

    return ir.with_(body=tuple(Walk().body(ir.body)))


def pipeline_tiles(ir: KernelIR, buffers: frozenset[str], p: Pipeline) -> KernelIR:
    """Steps 1-4 on the tiles ``buffers`` of the promotion pass's output."""
    ir = expand_stages(ir, buffers, p.stages)
    ir = stage_producers(ir, buffers, p.stages)
    ir = stage_consumers(ir, buffers, p.loop, p.stages)
    return lower_pipeline_sync(ir, p.commit, p.wait, p.stages)
