"""Static analysis of an ONNX graph before conversion: which values are known at import time,
which nodes polyfuse cannot import (listed up front, by node), and the outer values a node with
subgraphs (``Loop``, ``If``, ``Scan``) captures.

A subgraph reads values of the enclosing graphs by name without listing them as node inputs
(ONNX lexical scoping). Such *captured* values count as inputs of the node everywhere: a node
folds at import time only when its inputs and its captured values are all known.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from polyfuse.onnx.common import HANDLERS, NODE_CHECKS, node_label
from polyfuse.onnx.fold import HOST_ONLY_ALWAYS

__all__ = [
    "UnsupportedNode",
    "captured",
    "describe_unsupported",
    "foldable_values",
    "node_reads",
    "subgraphs",
    "unsupported_nodes",
]

_STD = ("", "ai.onnx")


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graph-valued attributes of ``node`` (a Loop's body, an If's two branches, ...)."""
    out: list[onnx.GraphProto] = []
    for a in node.attribute:
        if a.type == onnx.AttributeProto.GRAPH:
            out.append(a.g)
        elif a.type == onnx.AttributeProto.GRAPHS:
            out.extend(a.graphs)
    return out


def captured(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` reads (in its nodes or, recursively, their subgraphs) that it does not
    define: values of the enclosing scopes, in first-use order."""
    defined = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    out: dict[str, None] = {}
    for n in graph.node:
        for name in node_reads(n):
            if name not in defined:
                out.setdefault(name)
        defined.update(n.output)
    return list(out)


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every value ``node`` reads: its inputs, then the outer values its subgraphs capture."""
    reads = dict.fromkeys(i for i in node.input if i)
    for g in subgraphs(node):
        reads.update(dict.fromkeys(captured(g)))
    return list(reads)


def foldable_values(model: onnx.ModelProto, known: Sequence[str] = ()) -> set[str]:
    """Names of the values of ``model`` known at import time (static analysis).

    Initializers, the graph inputs named in ``known``, ``Constant``-like nodes, ``Shape``/``Size``
    (shapes are static) and every node whose inputs and captured values are all known: such a
    node is evaluated on the host by the ONNX reference implementation whatever its operator, so
    it needs no handler.
    """
    vals = {t.name for t in model.graph.initializer} | set(known) | {""}
    for n in model.graph.node:
        if n.domain not in _STD:
            continue
        reads = [*n.input, *node_reads(n)]
        if (
            n.op_type in HOST_ONLY_ALWAYS
            or n.op_type in ("Shape", "Size")
            or (reads and all(i in vals for i in reads))
        ):
            vals.update(o for o in n.output if o)
    return vals


@dataclass(frozen=True)
class UnsupportedNode:
    """A node polyfuse cannot import: its position in the main graph, its name (as the import
    errors name nodes), its operator (``domain.Op`` outside the standard domain) and why."""

    position: int
    name: str
    op: str
    reason: str = ""

    def __str__(self) -> str:
        return f"#{self.position} '{self.name}'" + (f": {self.reason}" if self.reason else "")


def supported_ops() -> frozenset[str]:
    """Operators with a run-time form (a handler) or always evaluated on the host."""
    return frozenset(HANDLERS) | HOST_ONLY_ALWAYS


def unsupported_nodes(model: onnx.ModelProto, known: Sequence[str] = ()) -> list[UnsupportedNode]:
    """The nodes of ``model``'s main graph that polyfuse cannot import, in graph order.

    Nodes that fold at import time (inputs and captured values known, see
    :func:`foldable_values`) never count; an operator with a handler counts when its node check
    (``NODE_CHECKS``, e.g. a Loop body that has no vectorised form) gives a reason.
    """
    vals = foldable_values(model, known)
    ops = supported_ops()
    out: list[UnsupportedNode] = []
    for pos, n in enumerate(model.graph.node):
        std = n.domain in _STD
        reads = [*n.input, *node_reads(n)]
        if std and n.output and all(o in vals for o in n.output if o) and reads:
            continue
        label = node_label(n)
        if not std:
            out.append(UnsupportedNode(pos, label, f"{n.domain}.{n.op_type}"))
        elif n.op_type not in ops:
            why = "its subgraphs read run-time values" if subgraphs(n) else ""
            out.append(UnsupportedNode(pos, label, n.op_type, why))
        elif n.op_type in NODE_CHECKS:
            why = NODE_CHECKS[n.op_type](n)
            if why:
                out.append(UnsupportedNode(pos, label, n.op_type, why))
    return out


def describe_unsupported(model_name: str, nodes: Iterable[UnsupportedNode], shown: int = 4) -> str:
    """One line: the unsupported operators by count, each with its first nodes (position, name,
    reason), e.g. ``model 'm' uses unsupported ONNX operators: Unique x2 (#0 'u1', #3 'u2')``."""
    by_op: dict[str, list[UnsupportedNode]] = {}
    for n in nodes:
        by_op.setdefault(n.op, []).append(n)
    parts = []
    for op, ns in sorted(by_op.items(), key=lambda kv: (-len(kv[1]), kv[1][0].position)):
        listed = ", ".join(str(n) for n in ns[:shown])
        more = f", and {len(ns) - shown} more" if len(ns) > shown else ""
        parts.append(f"{op} x{len(ns)} ({listed}{more})")
    return f"model '{model_name}' uses unsupported ONNX operators: " + ", ".join(parts)
