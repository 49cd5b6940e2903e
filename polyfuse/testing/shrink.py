"""Shrink a failing graph to a minimal one that still fails the same way.

Greedy delta debugging over :class:`~polyfuse.testing.generate.GraphSpec` edits, biggest first:
keep one output, drop an output, output a producer instead of its consumer, cut a compute off
its producers (it becomes an input of the same shape), bypass a compute (its consumers read one
of its same-shaped operands instead; a cut keeps the dtype), make a dimension smaller (1, 2, 3,
half, one less), and simplify an op (no casts, float32 instead of another dtype, plain inputs
instead of NaN/inf ones, ``sum`` for other reductions, ``add`` for other binary ops, no
function inside a reduction). The first edit after which the graph still
fails is kept and the search restarts; it stops when no edit keeps the failure (a local
minimum: every single edit fixes it) or after ``max_checks`` compiles.

"Fails the same way" is decided by :func:`same_failure`: the same outcome status and, for
exceptions, the same exception type — so a shrink cannot wander from the bug it was given onto
another one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from dataclasses import replace

from .generate import ONE, GraphSpec, Node
from .run import Outcome, check_spec

__all__ = ["candidates", "same_failure", "shrink"]


def same_failure(a: Outcome, b: Outcome) -> bool:
    """True when ``b`` fails like ``a``: same status, and for exceptions the same type."""
    if not b.failed or a.status != b.status:
        return False
    if a.status in ("crash", "error"):
        return a.detail.split(":", 1)[0] == b.detail.split(":", 1)[0]
    return True


def _rename_uses(spec: GraphSpec, old: str, new: str) -> GraphSpec:
    nodes = [
        replace(n, args=tuple(new if a == old else a for a in n.args))
        for n in spec.nodes
        if n.name != old
    ]
    outputs = list(dict.fromkeys(new if o == old else o for o in spec.outputs))
    outputs = [o for o in outputs if _kind(nodes, o) != "input"]
    return spec.copy(nodes=nodes, outputs=outputs)


def _kind(nodes: list[Node], name: str) -> str:
    return next((n.kind for n in nodes if n.name == name), "")


def _with_node(spec: GraphSpec, node: Node) -> GraphSpec:
    return spec.copy(nodes=[node if n.name == node.name else n for n in spec.nodes])


def candidates(spec: GraphSpec) -> Iterator[GraphSpec]:
    """Every one-step simplification of ``spec``, biggest first (all pruned)."""
    outs = spec.outputs
    if len(outs) > 1:
        for o in outs:
            yield spec.copy(outputs=[o])
        for o in outs:
            yield spec.copy(outputs=[x for x in outs if x != o])
    computes = [n for n in spec.nodes if n.kind != "input"]
    for o in outs:  # an output's producer becomes the output instead
        for a in dict.fromkeys(spec.node(o).args):
            if spec.node(a).kind != "input":
                yield spec.copy(outputs=list(dict.fromkeys(a if x == o else x for x in outs)))
    for n in computes:  # cut: the compute becomes an input
        if any(spec.node(a).kind != "input" for a in n.args):
            seed = zlib.crc32(n.name.encode())
            cut = Node(n.name, "input", n.shape, fill="normal", seed=seed, dtype=n.dtype)
            cand = _with_node(spec, cut)
            cand.outputs = [o for o in cand.outputs if o != n.name]
            if cand.outputs:
                yield cand
    for n in computes:  # bypass
        for a in dict.fromkeys(n.args):
            if spec.node(a).shape == n.shape:
                cand = _rename_uses(spec, n.name, a)
                if cand.outputs:
                    yield cand
    for d, v in sorted(spec.dims.items(), key=lambda kv: -kv[1]):
        for smaller in dict.fromkeys((1, 2, 3, v // 2, v - 1)):
            if 1 <= smaller < v:
                yield spec.copy(dims={**spec.dims, d: smaller})
    for n in spec.nodes:
        for simpler in _simpler(n):
            yield _with_node(spec, simpler)


def _simpler(n: Node) -> Iterator[Node]:
    if n.casts:
        yield replace(n, casts=())
    if n.dtype != "float32":
        yield replace(n, dtype="float32")
    if n.kind == "input" and n.fill != "normal":
        yield replace(n, fill="normal")
    if n.kind == "reduce":
        if n.pre:
            yield replace(n, pre="")
        if n.op != "sum":
            yield replace(n, op="sum")
        if n.shape == (ONE,):
            yield replace(n, shape=())
    if n.kind == "binary" and n.op not in ("add", "pow"):
        yield replace(n, op="add")
    if n.kind == "unary" and n.op not in ("neg", "abs"):
        yield replace(n, op="neg")
    if n.kind == "matmul" and n.pre:
        yield replace(n, pre="")
    if n.kind == "matmul" and n.op == "nt":
        pass  # the operand's shape would change: not a one-node edit


def shrink(
    spec: GraphSpec,
    fails: Callable[[GraphSpec], bool] | None = None,
    *,
    max_checks: int = 400,
    log: Callable[[str], None] | None = None,
) -> GraphSpec:
    """A minimal spec that still ``fails`` (default: fails like ``check_spec(spec)`` does)."""
    if fails is None:
        first = check_spec(spec)
        if not first.failed:
            return spec.pruned()

        def fails(s: GraphSpec) -> bool:
            return same_failure(first, check_spec(s))

    def safe(s: GraphSpec) -> bool:
        try:
            return fails(s)
        except Exception:  # an edit that made the spec unbuildable
            return False

    best = spec.pruned()
    checks = 0
    progress = True
    while progress and checks < max_checks:
        progress = False
        for cand in candidates(best):
            cand = cand.pruned()
            if not cand.outputs:
                continue
            checks += 1
            if safe(cand):
                best = cand
                progress = True
                if log is not None:
                    log(f"shrink: {len(best.nodes)} nodes, dims {best.dims}")
                break
            if checks >= max_checks:
                break
    return best
