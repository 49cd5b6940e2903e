"""Constant folding: computations on constants are done once, at compile time.

A primitive that reads only constants (placeholders bound through
   ``compile(constants=...)``, or primitives folded earlier in the same walk) is evaluated with
the injected evaluator — ``polyfuse.reference`` semantics: float64 inside one body, the
result rounded to float32, the storage type, exactly as the reference rounds every tensor —
and becomes a new constant; its readers read the constant (DCE drops the primitive). The
batch-norm scale ``gamma * rsqrt(var + eps)`` of an inference batch norm with constant
statistics is such a primitive, and so is a transposed or reshaped weight.

Not folded, with the reason recorded: graph outputs (an output stays a primitive); a
primitive that reads nothing (an iota or a mask computed from loop variables costs nothing
to recompute and would cost a load as a constant); a result with more elements than all its
constant inputs together (a broadcast: recomputed inside its reader's kernel it costs
nothing, stored it would grow the constants the graph uploads and reads).
Whether a primitive is folded depends on shapes only, never on the constants' values, so a
model compiled with placeholder zeros (``polyfuse zoo``) gets the same graph as with weights
(for the same reason a one-element constant is not turned into an immediate: the simplifier
would then drop a zero bias that is only a placeholder).
"""

from __future__ import annotations

from polyfuse.graph.expr import Tensor
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Evaluator, Rewriter, repointed

NAME = "constant_fold"


def constant_fold(graph: Graph, evaluate: Evaluator) -> Graph:
    """``graph`` with every computation on constants evaluated at compile time."""
    rw = Rewriter(graph, NAME)
    folded: dict[int, Tensor] = {}  # primitive uid -> the constant holding its value
    values = {t.uid: graph.constants[t.uid] for t in graph.inputs if graph.is_constant(t)}
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        assert t.op is not None
        ins = t.op.inputs()
        if not ins or not all(graph.is_constant(s) or s.uid in folded for s in ins):
            continue
        why = _refusal(graph, t, ins)
        if why:
            rw.record(PassAction.REFUSED, (name,), f"{name} reads only constants: {why}")
            continue
        local = repointed(t, lambda s: folded.get(s.uid, s))
        feeds = {s: values[s.uid] for s in local.op.inputs()}  # type: ignore[union-attr]
        value = evaluate(local, feeds)
        assert value.shape == t.shape, (name, value.shape)
        c = rw.constant(f"{name}_folded", value, t.dtype)
        folded[t.uid] = c
        values[c.uid] = value
        rw.forward(t, c)
        rw.record(
            PassAction.FOLDED,
            (name,),
            f"{name} [{t.op.tag or 'compute'}] reads only constants "
            f"({', '.join(graph.ident(s) for s in ins)}): evaluated at compile time "
            f"({value.size} elements)",
        )
    return rw.result()


def _refusal(graph: Graph, t: Tensor, ins: list[Tensor]) -> str:
    """Why compute ``t`` (all of whose inputs are constant) stays a primitive; '' to fold."""
    if graph.is_output(t):
        return "it is a graph output"
    in_size = sum(s.size for s in ins)
    if t.size > in_size:
        return (
            f"its {t.size} elements outnumber its constant inputs' {in_size}: a broadcast is "
            "cheaper recomputed in its reader's kernel than stored"
        )
    return ""
