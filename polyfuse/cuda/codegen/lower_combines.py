"""Lowering pass: the combine of a parallel reduction's lanes, and its scratch buffer.

A reduction mapped to ``lanes > 1`` threads per result combines the partial results at its
final statement: the pass wraps every instance of that statement in a :class:`KCombine` node
(the combine stands in the body where it happens; :mod:`polyfuse.cuda.codegen.lower_accesses`
turns the statement's accumulator store into the lanes' total). Form "y" (lanes are
consecutive threads): warp shuffles, which need no shared memory while the lanes fit one warp
(a one-element placeholder scratch is declared), and a per-warp shared scratch beyond. Form "x"
(lane rows of ``kept`` threads): a tree in a shared scratch of one float per thread. The
scratch is declared before the register allocations.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KCombine,
    KernelIR,
    KMutator,
    KNode,
    KStmt,
    MemSpace,
    Scope,
)

SCRATCH = "pf_scratch"
WARP_SIZE = 32


def lower_combines(
    ir: KernelIR, form: str, lanes: int, kept: int, finals: Mapping[str, str]
) -> KernelIR:
    """A new IR whose final statements of combined reductions (``finals``: statement name →
    reduction) stand in :class:`KCombine` nodes, with the combine's scratch, when
    ``lanes > 1``; else ``ir``."""
    if lanes <= 1:
        return ir
    within_warp = form != "x" and lanes <= WARP_SIZE
    size = 1 if within_warp else ir.threads
    scope = Scope.WARP if within_warp else Scope.BLOCK
    scratch = KAlloc(SCRATCH, MemSpace.SHARED, "", (size,))
    allocs = list(ir.allocs)
    first_reg = next((i for i, a in enumerate(allocs) if a.space is MemSpace.REGISTER), len(allocs))
    allocs.insert(first_reg, scratch)
    wrap = _Wrap(form, lanes, kept, scope, finals)
    return ir.with_(allocs=tuple(allocs), body=tuple(wrap.body(ir.body)))


class _Wrap(KMutator):
    """Each instance of a combined reduction's final statement inside its :class:`KCombine`."""

    def __init__(self, form: str, lanes: int, kept: int, scope: Scope, finals: Mapping[str, str]):
        self.form, self.lanes, self.kept, self.scope = form, lanes, kept, scope
        self.finals = finals

    def visit_KStmt(self, n: KStmt) -> KNode:
        red = self.finals.get(n.stmt)
        if red is None:
            return n
        return KCombine(self.form, self.lanes, self.kept, self.scope, SCRATCH, red, (n,))
