"""Lowering pass: the register micro-tile of a GEMM kernel and its guarded epilogue.

The accumulator becomes a register array indexed by the micro-tile loop variables (declared
first among the registers); those loops have constant trip counts and are marked for
unrolling, so the array stays in registers. The schedule runs on whole tiles: statements that
store (the epilogue) get their domain's upper bounds as guards.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KernelIR,
    KExpr,
    KFor,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStmt,
    MemSpace,
)


def lower_register_tile(
    ir: KernelIR,
    acc: str,
    shape: Sequence[int],
    index_vars: Sequence[str],
    bounds: Mapping[str, Sequence[int | None]],
    stmts: frozenset[str] | None = None,
) -> KernelIR:
    """A new IR with register array ``acc`` of ``shape`` indexed by ``index_vars`` (unrolled
    loops: those that hold a statement of ``stmts``, None: any) and each statement in
    ``bounds`` guarded by ``arg_d <= bound_d`` (None: no bound). (isl names loops by schedule
    position: a copy's loop may share a micro-tile variable's name.)"""
    regs = [a for a in ir.allocs if a.space is MemSpace.REGISTER]
    others = [a for a in ir.allocs if a.space is not MemSpace.REGISTER]
    array = KAlloc(acc, MemSpace.REGISTER, "", tuple(shape) or (1,), None, (), tuple(index_vars))
    regs = [array] + [a for a in regs if a.name != acc]
    unrolled = frozenset(index_vars)

    def guard(n: KStmt) -> KExpr | None:
        conds: list[KExpr] = [
            KOp("<=", (a, KInt(hi)))
            for a, hi in zip(n.args, bounds[n.stmt], strict=False)
            if hi is not None
        ]
        return None if not conds else conds[0] if len(conds) == 1 else KOp("&&", tuple(conds))

    def holds(nodes) -> bool:
        if stmts is None:
            return True
        return any(
            (isinstance(n, KStmt) and n.stmt in stmts)
            or any(holds(getattr(n, c, [])) for c in ("body", "then", "orelse"))
            for n in nodes
        )

    class Walk(KMutator):
        def visit_KFor(self, n: KFor) -> KNode:
            if n.var in unrolled and isinstance(n.init, KInt) and holds(n.body):
                return replace(n, body=self.body(n.body), unroll=True)
            return self.visit_default(n)

        def visit_KStmt(self, n: KStmt) -> KNode:
            return replace(n, guard=guard(n)) if n.stmt in bounds else n

    return ir.with_(allocs=tuple(others + regs), body=tuple(Walk().body(ir.body)))
