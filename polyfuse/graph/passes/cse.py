"""Common-subexpression elimination: one primitive per distinct computation.

Two primitives are the same computation when they have the same shape, dtype, loop ranges and
body (loop variables by position, :func:`polyfuse.graph.structure.compute_text`) and read the
same tensors. Walking in topological order, each primitive's inputs are first named by their
surviving representative, so duplicates of duplicates merge too (two identical layer norms of
the same input merge their means, then their variances, then the results). A duplicate is
forwarded to the first primitive computing the same thing (its readers read that one) and dead
code elimination removes it. Graph outputs are never forwarded (an output must stay a
primitive of its own); a duplicate that is an output is kept and recorded.

Bodies are compared as written: ``a + b`` and ``b + a`` are different texts (no reassociation,
which would change float rounding).
"""

from __future__ import annotations

from polyfuse.graph.expr import Tensor
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter
from polyfuse.graph.structure import compute_text

NAME = "cse"


def cse(graph: Graph) -> Graph:
    """``graph`` with structurally equal primitives on the same inputs merged."""
    rw = Rewriter(graph, NAME)
    rep: dict[int, Tensor] = {}  # uid of a merged duplicate -> its representative
    first: dict[str, Tensor] = {}

    def tid(t: Tensor) -> int:
        return rep[t.uid].uid if t.uid in rep else t.uid

    for name in graph.topo_order():
        t = graph.prims[name].tensor
        key = compute_text(t, tid)
        same = first.get(key)
        if same is None:
            first[key] = t
            continue
        if graph.is_output(t):
            rw.record(
                PassAction.REFUSED,
                (name, graph.ident(same)),
                f"{name} computes what {graph.ident(same)} computes but is a graph output: kept",
            )
            continue
        rep[t.uid] = same
        rw.forward(t, same)
        rw.record(
            PassAction.MERGED,
            (name, graph.ident(same)),
            f"{name} computes what {graph.ident(same)} computes: its readers read "
            f"{graph.ident(same)}",
        )
    return rw.result()
