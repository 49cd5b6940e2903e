"""Lowering pass: the combine of a parallel reduction's lanes, and its scratch buffer.

A reduction mapped to ``lanes > 1`` threads per result combines the partial results at its
final statement. Form "y" (lanes are consecutive threads): warp shuffles, which need no shared
memory while the lanes fit one warp (a one-element placeholder scratch is declared), and a
per-warp shared scratch beyond. Form "x" (lane rows of ``kept`` threads): a tree in a shared
scratch of one float per thread. The scratch is declared before the register allocations.
"""

from __future__ import annotations

from polyfuse.cuda.codegen.kernel_ast import KAlloc, KCombine, KernelIR, MemSpace, Scope

SCRATCH = "pf_scratch"
WARP_SIZE = 32


def lower_combines(
    ir: KernelIR, form: str, lanes: int, kept: int, reductions: frozenset[str]
) -> KernelIR:
    """A new IR with a :class:`KCombine` and its scratch when ``lanes > 1``; else ``ir``."""
    if lanes <= 1:
        return ir
    within_warp = form != "x" and lanes <= WARP_SIZE
    size = 1 if within_warp else ir.threads
    scope = Scope.WARP if within_warp else Scope.BLOCK
    scratch = KAlloc(SCRATCH, MemSpace.SHARED, "", (size,))
    allocs = list(ir.allocs)
    first_reg = next((i for i, a in enumerate(allocs) if a.space is MemSpace.REGISTER), len(allocs))
    allocs.insert(first_reg, scratch)
    combine = KCombine(form, lanes, kept, scope, SCRATCH, frozenset(reductions))
    return ir.with_(allocs=tuple(allocs), combine=combine)
