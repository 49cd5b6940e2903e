"""Structural keys: identical subgraphs (same computation, shapes and boundary) hash alike.

Two groups of primitives have the same key when they compute the same expressions over the
same shapes and touch the outside world the same way (which tensors come in, which leave),
whatever their names. Tensors are numbered in order of first appearance and loop variables
by position, so the twelve layers of a transformer share one key per kernel. The compiler
uses keys to schedule and generate each distinct kernel once, in memory and on disk.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.graph import expr as ex
from polyfuse.graph.graph import Graph


@dataclass(frozen=True)
class StructuralKey:
    """A digest plus the group's tensor identifiers in canonical order (``pfT0``, ``pfT1``…)."""

    digest: str
    tensors: tuple[str, ...]

    def canonical(self) -> dict[str, str]:
        """Actual identifier → canonical identifier."""
        return {t: f"pfT{i}" for i, t in enumerate(self.tensors)}


def structural_key(graph: Graph, prims: list[str], salt: str = "") -> StructuralKey:
    """The key of the primitives ``prims`` (in order) of ``graph``; ``salt`` adds context
    such as the target architecture and compiler version."""
    order: dict[int, int] = {}
    seen: dict[int, ex.Tensor] = {}
    idents: list[str] = []
    inside = set(prims)

    def tid(t: ex.Tensor) -> int:
        if t.uid not in order:
            order[t.uid] = len(order)
            seen[t.uid] = t
            idents.append(graph.ident(t))
        return order[t.uid]

    parts = [salt]
    for name in prims:
        t = graph.prims[name].tensor
        assert t.op is not None
        me = tid(t)
        external = graph.is_output(t) or any(c not in inside for c in graph.consumers(name))
        loops = {a.uid: f"a{i}" for i, a in enumerate(t.op.axes)}
        loops.update({a.uid: f"k{i}" for i, a in enumerate(t.op.reduce_axes)})
        ranges = [(a.lo, a.hi) for a in t.op.axes + t.op.reduce_axes]
        body = _expr(t.op.body, loops, tid)
        parts.append(f"T{me}{t.shape}{t.dtype}{'out' if external else ''}{ranges}={body}")
    for uid, i in order.items():  # shapes of tensors read from outside the group
        t = seen[uid]
        if graph.ident(t) not in inside:
            parts.append(f"in T{i}{t.shape}{t.dtype}")
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:32]
    return StructuralKey(digest, tuple(idents))


def compute_text(t: ex.Tensor, tid: Callable[[ex.Tensor], object]) -> str:
    """What compute ``t`` computes, as text: shape, dtype, loop ranges and body with loop
    variables by position and each tensor read as ``T<tid(tensor)>``. Two computes with the
    same text and the same ``tid`` of their inputs compute the same values (CSE's key)."""
    assert t.op is not None
    loops = {a.uid: f"a{i}" for i, a in enumerate(t.op.axes)}
    loops.update({a.uid: f"k{i}" for i, a in enumerate(t.op.reduce_axes)})
    ranges = [(a.lo, a.hi) for a in t.op.axes + t.op.reduce_axes]
    return f"{t.shape}{t.dtype}{ranges}={_expr(t.op.body, loops, tid)}"


def _expr(e: ex.Expr, loops: dict[int, str], tid: Callable[[ex.Tensor], object]) -> str:
    return _KeyText(loops, tid).visit(e)


class _KeyText(ex.ExprVisitor[str]):
    """An expression as key text: loop variables by position, tensors by first appearance."""

    def __init__(self, loops: dict[int, str], tid: Callable[[ex.Tensor], object]) -> None:
        self.loops = loops
        self.tid = tid

    def _args(self, e: ex.Expr) -> str:
        return ",".join(self.visit(c) for c in e.children())

    def visit_IterVar(self, e: ex.IterVar) -> str:
        return self.loops.get(e.uid, "?")

    def visit_Const(self, e: ex.Const) -> str:
        return f"{e.dtype}:{e.value!r}" + ("" if e.weak else "!")  # te.const promotes

    def visit_Read(self, e: ex.Read) -> str:
        return f"T{self.tid(e.tensor)}[{self._args(e)}]"

    def visit_Unary(self, e: ex.Expr) -> str:  # also Binary, Compare, Logical
        return f"{e.op}({self._args(e)})"  # type: ignore[attr-defined]

    visit_Binary = visit_Compare = visit_Logical = visit_Unary

    def visit_Select(self, e: ex.Select) -> str:
        return f"where({self._args(e)})"

    def visit_Cast(self, e: ex.Cast) -> str:
        return f"cast<{e.dtype}>({self.visit(e.a)})"

    def visit_DataIndex(self, e: ex.DataIndex) -> str:
        return f"data({self.visit(e.a)})"

    def visit_Reduce(self, e: ex.Reduce) -> str:
        axes = ",".join(self.loops[a.uid] for a in e.axes)
        acc = f"@{e.accumulate}" if e.accumulate else ""
        return f"{e.op}<{axes}>{acc}({self.visit(e.body)})"
