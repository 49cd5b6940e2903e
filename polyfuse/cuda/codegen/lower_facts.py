"""The typed facts of a lowered kernel, read from its final IR (:mod:`polyfuse.stitch.facts`).

Not a rewrite: the last step of lowering walks the IR once and records what the printer will
declare and emit — static shared arrays from the allocations, the dynamic pool, barrier,
shuffle, mma and asynchronous-copy nodes, the combine's synchronisation — so that nothing
downstream has to read the CUDA text for them.
"""

from __future__ import annotations

from typing import Any

from polyfuse.cuda.codegen.kernel_ast import (
    KAsyncCopy,
    KBarrier,
    KChunkCopy,
    KCommit,
    KernelIR,
    KMma,
    KVisitor,
    KWait,
    MemSpace,
    Scope,
    map_children,
)
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES
from polyfuse.graph.dtypes import info
from polyfuse.poly.costs import Work
from polyfuse.stitch.facts import KernelFacts, SharedArray

#: bytes per element of each buffer dtype (:data:`polyfuse.cuda.codegen.lower_dtypes.C_TYPES`)
ITEMSIZE = {d: info(d).itemsize for d in C_TYPES}


class _Uses(KVisitor[None]):
    """Which synchronising nodes a body holds."""

    def __init__(self) -> None:
        self.barriers = self.mma = self.async_copies = False

    def visit_default(self, n: Any) -> None:
        map_children(n, self._walk)

    def _walk(self, nodes: list) -> list:
        for c in nodes:
            self.visit(c)
        return nodes

    def visit_KBarrier(self, n: KBarrier) -> None:
        self.barriers = True

    def visit_KMma(self, n: KMma) -> None:
        self.mma = True

    def visit_KAsyncCopy(self, n: KAsyncCopy) -> None:
        self.async_copies = True

    def visit_KChunkCopy(self, n: KChunkCopy) -> None:
        self.async_copies = True

    def visit_KCommit(self, n: KCommit) -> None:
        self.async_copies = True

    def visit_KWait(self, n: KWait) -> None:
        self.async_copies = True


def kernel_facts(
    ir: KernelIR, registers: int | None = None, work: Work | None = None
) -> KernelFacts:
    """The facts of the lowered ``ir`` (``registers``: a model's estimate, if any; ``work``:
    its per-thread work, :func:`polyfuse.cuda.codegen.kernel_cost.ir_work`).

    A warp combine's scratch is declared but never touched (the warp's lanes combine by
    shuffles; the block step is compiled out), so it takes no shared memory: the CUDA
    compiler drops the array.
    """
    uses = _Uses()
    uses._walk(list(ir.body))
    c = next(iter(ir.combines), None)  # every combine of a kernel spans the same lanes
    unused = {c.scratch} if c is not None and c.scope is Scope.WARP else set()
    arrays = tuple(
        SharedArray(a.elements * ITEMSIZE[a.dtype], a.align or ITEMSIZE[a.dtype])
        for a in ir.allocs
        if a.space is MemSpace.SHARED and a.offset is None and a.name not in unused
    )
    # form "y" combines lanes by shuffles, and across warps through the scratch (barriers);
    # form "x" combines lane rows in the scratch between barriers
    combine_barriers = c is not None and (c.form == "x" or c.scope is Scope.BLOCK)
    return KernelFacts(
        shared_arrays=arrays,
        dynamic_shared_bytes=ir.dynamic_smem_bytes,
        registers=registers,
        barriers=uses.barriers or combine_barriers,
        shuffles=c is not None and c.form != "x",
        mma=uses.mma,
        async_copies=uses.async_copies,
        work=work,
    )
