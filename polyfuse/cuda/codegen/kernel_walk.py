"""The kernel IR's node tables and walkers: every node class (:data:`NODE_CLASSES`) for
visitor dispatch, the one place that knows which nodes nest (:func:`map_children`), and the
walker bases :class:`KVisitor` and :class:`KMutator`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

from polyfuse.base.visitor import R, Visitor
from polyfuse.cuda.codegen.kernel_expr import KExpr, KInt, KOp, KRef, KVar
from polyfuse.cuda.codegen.kernel_nodes import (
    KAlloc,
    KAssign,
    KAsyncCopy,
    KBarrier,
    KChunkCopy,
    KCombine,
    KCommit,
    KCopy,
    KDef,
    KFor,
    KFragmentLoad,
    KGuardedCopy,
    KIf,
    KLdmatrix,
    KLet,
    KMark,
    KMma,
    KNode,
    KRegisters,
    KRowBlocks,
    KScope,
    KSection,
    KStmt,
    KVector,
    KVectorStore,
    KWait,
)

N = TypeVar("N", bound=KNode)

#: Every kernel-IR node class (statements and integer expressions), for visitor dispatch.
NODE_CLASSES: tuple[type, ...] = (
    KInt,
    KVar,
    KOp,
    KRef,
    KFor,
    KIf,
    KDef,
    KMark,
    KVector,
    KStmt,
    KAlloc,
    KVectorStore,
    KBarrier,
    KCopy,
    KAsyncCopy,
    KCommit,
    KWait,
    KMma,
    KLet,
    KAssign,
    KRegisters,
    KLdmatrix,
    KFragmentLoad,
    KChunkCopy,
    KGuardedCopy,
    KCombine,
    KScope,
    KSection,
    KRowBlocks,
)

#: Node class with child lists → constructor from (old node, child-list walk).
_REBUILD: dict[type, Callable[[Any, Callable[[list[KNode]], list[KNode]]], KNode]] = {
    KMark: lambda n, walk: KMark(n.name, walk(n.body)),
    KFor: lambda n, walk: replace(n, body=walk(n.body)),
    KIf: lambda n, walk: KIf(n.cond, walk(n.then), walk(n.orelse)),
    KDef: lambda n, walk: KDef(n.var, n.value, walk(n.body)),
    KVector: lambda n, walk: replace(n, body=tuple(walk(n.body))),
    KCombine: lambda n, walk: replace(n, body=tuple(walk(n.body))),
    KScope: lambda n, walk: replace(n, body=tuple(walk(n.body))),
    KSection: lambda n, walk: replace(n, body=tuple(walk(n.body))),
    KRowBlocks: lambda n, walk: replace(n, body=tuple(walk(n.body))),
}


def map_children(n: KNode, walk: Callable[[list[KNode]], list[KNode]]) -> KNode:
    """A copy of ``n`` whose child lists went through ``walk`` (a node without children as is):
    the one place a pass's tree walk needs to know which nodes nest."""
    rebuild = _REBUILD.get(type(n))
    return n if rebuild is None else rebuild(n, walk)


class KVisitor(Visitor[R]):
    """Base of every walker of kernel IR: ``visit(n, *args)`` calls ``visit_<Node>(n, *args)``
    (:class:`polyfuse.base.visitor.Visitor` over :data:`NODE_CLASSES`; exact-class dispatch, so
    :class:`KAsyncCopy` needs its own rule apart from :class:`KCopy`)."""

    node_classes = NODE_CLASSES


class KMutator(KVisitor["KNode | list[KNode]"]):
    """A pass's tree rewrite: ``visit_<Node>`` returns a node or a list of nodes (several or
    none in its place); by default a node is rebuilt with its child lists rewritten
    (:func:`map_children`). :meth:`body` rewrites a list of nodes."""

    def visit_default(self, n: Any, *args: Any) -> KNode | list[KNode]:
        return map_children(n, lambda nodes: self.body(nodes, *args))

    def body(self, nodes: list[KNode] | tuple[KNode, ...], *args: Any) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            r = self.visit(n, *args)
            if isinstance(r, list):
                out += r
            else:
                out.append(r)
        return out


def nodes_of(nodes: tuple[KNode, ...] | list[KNode], cls: type[N]) -> tuple[N, ...]:
    """The nodes of class ``cls`` in a body, at any depth, in order."""
    out: list[N] = []

    def walk(ns: list[KNode]) -> list[KNode]:
        for n in ns:
            if isinstance(n, cls):
                out.append(n)
            map_children(n, walk)
        return ns

    walk(list(nodes))
    return tuple(out)


def combines(nodes: tuple[KNode, ...] | list[KNode]) -> tuple[KCombine, ...]:
    """The :class:`KCombine` nodes of a body, in order (a kernel's lanes combine the same
    way at every one: they differ by reduction only)."""
    return nodes_of(nodes, KCombine)


class KExprMapper(KVisitor[KExpr]):
    """An integer expression rebuilt bottom-up: override ``visit_KVar`` / ``visit_KRef`` to
    replace variables or array references (the others are rebuilt from their children)."""

    def visit_KInt(self, x: KInt) -> KExpr:
        return x

    def visit_KVar(self, x: KVar) -> KExpr:
        return x

    def visit_KOp(self, x: KOp) -> KExpr:
        return KOp(x.op, tuple(self.visit(a) for a in x.args))

    def visit_KRef(self, x: KRef) -> KExpr:
        return KRef(x.name, tuple(self.visit(i) for i in x.index))


class _Substitute(KExprMapper):
    def __init__(self, var: str, value: KExpr):
        self.var, self.value = var, value

    def visit_KVar(self, x: KVar) -> KExpr:
        return self.value if x.name == self.var else x


def substitute(e: KExpr, var: str, value: KExpr) -> KExpr:
    """``e`` with variable ``var`` replaced by ``value``."""
    return _Substitute(var, value).visit(e)


class _Variables(KExprMapper):
    def __init__(self) -> None:
        self.names: set[str] = set()

    def visit_KVar(self, x: KVar) -> KExpr:
        self.names.add(x.name)
        return x

    def visit_KRef(self, x: KRef) -> KExpr:
        self.names.add(x.name)
        return super().visit_KRef(x)


def variables(e: KExpr) -> frozenset[str]:
    """The names ``e`` reads (variables and arrays)."""
    v = _Variables()
    v.visit(e)
    return frozenset(v.names)
