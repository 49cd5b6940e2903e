"""Lowering pass: the loop decisions of a GEMM kernel (:mod:`polyfuse.poly.gemm_loops`).

The reduction-step loops the plan unrolls are marked ``unroll`` (printed ``#pragma unroll``):
only the loops of those variables that hold an update statement and have constant bounds —
isl reuses the variable names for the copy statements' loops, which stay as they are. The
launch bounds' minimum blocks per SM go on the IR (printed ``__launch_bounds__(T, B)``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from polyfuse.cuda.codegen.kernel_ast import (
    KDef,
    KernelIR,
    KFor,
    KIf,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStmt,
    KVar,
)


def _holds(nodes: Iterable[KNode], stmts: frozenset[str]) -> bool:
    for n in nodes:
        if isinstance(n, KStmt) and n.stmt in stmts:
            return True
        if any(_holds(getattr(n, c, []), stmts) for c in ("body", "then", "orelse")):
            return True
    return False


def _constant_bounds(n: KFor) -> bool:
    cond = n.cond
    return (
        isinstance(n.init, KInt)
        and isinstance(cond, KOp)
        and len(cond.args) == 2
        and isinstance(cond.args[1], KInt)
    )


def unroll_loops(
    ir: KernelIR, loops: Iterable[tuple[str, str, int, int]], min_blocks: int = 0
) -> KernelIR:
    """A new IR whose loops ``(variable, statement, trips, factor)`` — a loop over the
    variable that holds the statement — are unrolled (by ``factor``; 0: whole), launched with
    at least ``min_blocks`` blocks per SM (0: no bound). A loop from 0 whose bound depends on
    the thread (a copy loop whose last round only some threads take) runs ``trips``
    iterations, its body guarded by the bound."""
    by_var: dict[str, dict[str, tuple[int, int]]] = {}
    for var, stmt, trips, factor in loops:
        by_var.setdefault(var, {})[stmt] = (trips, factor)

    class Walk(KMutator):
        def visit_KFor(self, n: KFor) -> KNode:
            body = self.body(n.body)
            want = by_var.get(n.var, {})
            held = [t for s, t in want.items() if _holds(body, frozenset({s}))]
            if not held:
                return replace(n, body=body)
            trips, factor = max(held)
            if _constant_bounds(n):
                return replace(n, body=body, unroll=True, unroll_by=factor)
            if isinstance(n.init, KInt) and n.init.value == 0 and n.step == 1 and not factor:
                last = KOp("<=", (KVar(n.var), KInt(trips - 1)))
                return replace(n, cond=last, body=[KIf(n.cond, body)], unroll=True)
            return replace(n, body=body)

    body = tuple(Walk().body(ir.body)) if by_var else ir.body
    return ir.with_(body=body, min_blocks=min_blocks)


_FLIP = {"<": ">", "<=": ">=", ">": "<", ">=": "<=", "==": "=="}


def _bound_test(cond, var: str) -> tuple[str, int] | None:
    """``(op, c)`` when ``cond`` is ``var op c`` (or ``c op var``) for an integer ``c``."""
    if not isinstance(cond, KOp) or cond.op not in _FLIP or len(cond.args) != 2:
        return None
    a, b = cond.args
    if isinstance(a, KVar) and a.name == var and isinstance(b, KInt):
        return cond.op, b.value
    if isinstance(b, KVar) and b.name == var and isinstance(a, KInt):
        return _FLIP[cond.op], a.value
    return None


def _holds_at(test: tuple[str, int], v: int) -> bool:
    op, c = test
    return {"<": v < c, "<=": v <= c, ">": v > c, ">=": v >= c, "==": v == c}[op]


def _tests(nodes: Iterable[KNode], var: str) -> list[tuple[str, int]]:
    """The bound tests on ``var`` of the ``if``s directly in ``nodes`` (not in inner loops)."""
    out = []
    for n in nodes:
        if isinstance(n, KIf):
            t = _bound_test(n.cond, var)
            if t is not None:
                out.append(t)
            out += _tests(n.then, var) + _tests(n.orelse, var)
    return out


def _decided(nodes: list[KNode], var: str, lo: int, hi: int) -> list[KNode]:
    """``nodes`` for ``var`` in ``[lo, hi]``: the bound tests on ``var`` that hold (or fail)
    on the whole range replaced by their branch."""
    out: list[KNode] = []
    for n in nodes:
        if isinstance(n, KIf):
            t = _bound_test(n.cond, var)
            then, orelse = _decided(n.then, var, lo, hi), _decided(n.orelse, var, lo, hi)
            if t is not None and _holds_at(t, lo) == _holds_at(t, hi):
                out += then if _holds_at(t, lo) else orelse
                continue
            out.append(replace(n, then=then, orelse=orelse))
        else:
            out.append(n)
    return out


def peel_loop(ir: KernelIR, var: str) -> KernelIR:
    """A new IR in which the loop over ``var`` (constant bounds, step 1) is split where the
    bound tests on ``var`` directly in its body change value: each piece runs without them;
    a piece of one iteration is a block with ``var`` defined (:class:`KDef`)."""
    if not var:
        return ir

    class Walk(KMutator):
        def visit_KFor(self, n: KFor) -> list[KNode] | KNode:
            if n.var != var or n.step != 1 or not _constant_bounds(n):
                return replace(n, body=self.body(n.body))
            assert isinstance(n.init, KInt) and isinstance(n.cond, KOp)
            test = _bound_test(n.cond, var)
            if test is None or test[0] not in ("<", "<="):
                return n
            lo, hi = n.init.value, test[1] - (test[0] == "<")
            # the values where a test changes: a piece starts at each
            cuts = {lo}
            for op, c in _tests(n.body, var):
                for v in (c, c + 1):
                    if lo < v <= hi and _holds_at((op, c), v) != _holds_at((op, c), v - 1):
                        cuts.add(v)
            starts = sorted(cuts)
            pieces: list[KNode] = []
            for a, b in zip(starts, starts[1:] + [hi + 1], strict=True):
                body = _decided(n.body, var, a, b - 1)
                if b - 1 == a:
                    pieces.append(KDef(var, KInt(a), body))
                else:
                    cond = KOp("<=", (KVar(var), KInt(b - 1)))
                    pieces.append(replace(n, init=KInt(a), cond=cond, body=body))
            return pieces

    return ir.with_(body=tuple(Walk().body(ir.body)))
