"""Structural keys: identical subgraphs (same computation, shapes and boundary) hash alike.

Two groups of primitives have the same key when they compute the same expressions over the
same shapes and touch the outside world the same way (which tensors come in, which leave),
whatever their names. Tensors are numbered in order of first appearance and loop variables
by position, so the twelve layers of a transformer share one key per kernel. The compiler
uses keys to schedule and generate each distinct kernel once, in memory and on disk.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from polyfuse.graph.expr import (
    Binary,
    Cast,
    Compare,
    Const,
    DataIndex,
    Expr,
    IterVar,
    Logical,
    Read,
    Reduce,
    Select,
    Tensor,
    Unary,
)
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
    seen: dict[int, Tensor] = {}
    idents: list[str] = []
    inside = set(prims)

    def tid(t: Tensor) -> int:
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


def _expr(e: Expr, loops: dict[int, str], tid) -> str:
    def rec(x: Expr) -> str:
        if isinstance(x, IterVar):
            return loops.get(x.uid, "?")
        if isinstance(x, Const):
            return f"{x.dtype}:{x.value!r}"
        if isinstance(x, Read):
            return f"T{tid(x.tensor)}[{','.join(rec(i) for i in x.indices)}]"
        if isinstance(x, Unary | Binary | Compare | Logical):
            return f"{x.op}({','.join(rec(c) for c in x.children())})"
        if isinstance(x, Select):
            return f"where({','.join(rec(c) for c in x.children())})"
        if isinstance(x, Cast):
            return f"cast<{x.dtype}>({rec(x.a)})"
        if isinstance(x, DataIndex):
            return f"data({rec(x.a)})"
        if isinstance(x, Reduce):
            return f"{x.op}<{','.join(loops[a.uid] for a in x.axes)}>({rec(x.body)})"
        raise TypeError(type(x))

    return rec(e)
