"""Dead-code elimination: primitives no output depends on, and constants nothing reads.

``build_graph`` only collects what the outputs need, so dead primitives come from the other
passes: the duplicate CSE forwarded, the constant-only computation folded, the batch-norm
scale folded into a weight. A dead primitive is removed; a constant that no primitive reads
any more (a weight replaced by its folded copy) is unbound, so it is neither stored in the
compiled graph nor uploaded. Graph inputs the caller passes stay call arguments even when
nothing reads them (the call signature does not change).
"""

from __future__ import annotations

from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter

NAME = "dce"


def dce(graph: Graph) -> Graph:
    """``graph`` without dead primitives and unread constants."""
    rw = Rewriter(graph, NAME)
    live: set[str] = set()
    stack = [graph.ident(o) for o in graph.outputs]
    while stack:
        n = stack.pop()
        if n in live:
            continue
        live.add(n)
        stack.extend(graph.dag.predecessors(n))
    dead = [n for n in graph.topo_order() if n not in live]
    for n in dead:
        rw.remove(graph.prims[n].tensor)
    if dead:
        rw.record(PassAction.REMOVED, dead, f"{len(dead)} dead primitives: {_names(dead)}")
    read: set[int] = set()
    for n in live:
        op = graph.prims[n].tensor.op
        assert op is not None
        read.update(t.uid for t in op.inputs())
    unread = [t for t in graph.inputs if graph.is_constant(t) and t.uid not in read]
    for t in unread:
        rw.drop_constant(t)
    if unread:
        nbytes = sum(graph.constants[t.uid].nbytes for t in unread)
        names = [graph.ident(t) for t in unread]
        rw.record(
            PassAction.REMOVED,
            names,
            f"{len(unread)} constants no primitive reads ({nbytes} bytes) unbound: {_names(names)}",
        )
    return rw.result()


def _names(names: list[str], n: int = 8) -> str:
    more = f" +{len(names) - n} more" if len(names) > n else ""
    return ", ".join(names[:n]) + more
