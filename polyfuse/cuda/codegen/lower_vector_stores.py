"""Lowering pass: an epilogue's global stores staged in registers and written as vectors.

When :mod:`polyfuse.poly.promote` proved a GEMM epilogue's stores vectorisable, each thread
owns runs of ``width`` consecutive columns, iterated by the unrolled loop ``var``. Inside that
loop the storing statements write a register array ``r_<tensor>_v[var]``; right after it, one
:class:`KVectorStore` writes the run, guarded like the statement's first element (isl proved a
run is wholly inside or wholly outside the array).
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KernelIR,
    KFor,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStage,
    KStmt,
    KVar,
    KVectorStore,
    MemSpace,
    substitute,
)


def lower_vector_stores(
    ir: KernelIR,
    var: str,
    width: int,
    stores: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
) -> KernelIR:
    """A new IR in which statements ``stores`` (statement -> tensor of shape ``shapes``) stage
    their values per element of loop ``var`` and each run is stored as one vector."""
    if not stores:
        return ir
    tensors = sorted(set(stores.values()))
    staged_name = ir.namer.staged  # r_<name>_v
    staged = tuple(
        KStage(t, staged_name(t), var, frozenset(s for s, u in stores.items() if u == t))
        for t in tensors
    )
    allocs = ir.allocs + tuple(
        KAlloc(staged_name(t), MemSpace.REGISTER, "", (width,)) for t in tensors
    )

    def found(nodes) -> list[KStmt]:
        out: list[KStmt] = []
        for n in nodes:
            if isinstance(n, KStmt) and n.stmt in stores:
                out.append(n)
            for child in ("body", "then", "orelse"):
                out += found(getattr(n, child, []))
        return out

    class Walk(KMutator):
        def visit_KFor(self, n: KFor) -> list[KNode]:
            out: list[KNode] = [self.visit_default(n)]
            runs = found(n.body) if n.var == var else []
            if runs:  # (isl may name other loops at this schedule depth ``var`` too)
                full = KOp("<=", (KVar(var), KInt(width - 1)))
                assert n.init == KInt(0) and n.cond == full, f"partial vector loop {n}"
                for st in runs:  # the run, from its first element
                    zero = KInt(0)
                    idx = tuple(substitute(a, var, zero) for a in st.args)
                    guard = None if st.guard is None else substitute(st.guard, var, zero)
                    t = stores[st.stmt]
                    dst = ir.namer.tensor(t)
                    out.append(KVectorStore(dst, idx, shapes[t], staged_name(t), width, guard))
            return out

    return ir.with_(allocs=allocs, staged=ir.staged + staged, body=tuple(Walk().body(ir.body)))
