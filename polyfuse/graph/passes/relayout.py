"""Re-laying out an operand of a contraction on the graph: the permutation that moves one dim
innermost, reads re-pointed at a permuted tensor, a primitive computing its tensor in the
permuted layout itself, or a transposing copy. Used by the layout decisions made for tensor
cores (:mod:`polyfuse.graph.passes.channels_last`, :mod:`polyfuse.graph.passes.bytes_k_inner`).
"""

from __future__ import annotations

import numpy as np

from polyfuse.graph.dtypes import DTYPES
from polyfuse.graph.expr import (
    ComputeOp,
    Expr,
    ExprMutator,
    IterVar,
    Read,
    Tensor,
    substitute,
)
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.rewrite import Rewriter


def has_mma(arch: str) -> bool:
    """Whether ``arch`` has ``mma.sync`` (m16n8k16, m16n8k32: sm_80 and later)."""
    digits = arch[3:].rstrip("a") if arch.startswith("sm_") else ""
    return digits.isdigit() and int(digits) >= 80


def plain_dims(r: Read, v: IterVar) -> list[int]:
    """The dims of ``r`` whose whole subscript is loop variable ``v``."""
    return [i for i, s in enumerate(r.indices) if isinstance(s, IterVar) and s.uid == v.uid]


def innermost(n: int, d: int) -> list[int]:
    """The permutation of ``n`` dims moving dim ``d`` innermost (new dim i is old dim p[i])."""
    return [i for i in range(n) if i != d] + [d]


class Permute(ExprMutator):
    """Reads of the tensors in ``perms`` (uid -> (new tensor, permutation)) re-pointed."""

    def __init__(self, perms: dict[int, tuple[Tensor, list[int]]]) -> None:
        self.perms = perms

    def visit_Read(self, e: Read) -> Expr:
        if e.tensor.uid not in self.perms:
            return e
        new, p = self.perms[e.tensor.uid]
        return Read(new, tuple(e.indices[i] for i in p))


def transposed(x: Tensor, p: list[int], name: str, tag: str) -> Tensor:
    """A primitive ``out[i] = x[j]`` with ``out``'s dim ``k`` being ``x``'s dim ``p[k]``."""
    axes = tuple(IterVar(f"i{k}", 0, x.shape[d]) for k, d in enumerate(p))
    idx: list[Expr] = [axes[0]] * x.ndim
    for k, d in enumerate(p):
        idx[d] = axes[k]
    out = Tensor(tuple(x.shape[d] for d in p), x.dtype, name)
    out.op = ComputeOp(axes, Read(x, tuple(idx)), tag)
    return out


def sole_producer(graph: Graph, src: Tensor, reader: str) -> str | None:
    """The primitive computing ``src`` where it can compute another layout itself: no graph
    output, read by ``reader`` alone, no reduction (its loop nest permuted is the same
    computation stored in the other layout)."""
    name = graph.idents.get(src.uid)
    if name not in graph.prims or graph.is_output(src) or src.op is None or src.op.reduce:
        return None
    return name if graph.consumers(name) == [reader] else None


def permuted(src: Tensor, p: list[int]) -> Tensor:
    """``src``'s computation in the layout whose dim ``k`` is ``src``'s dim ``p[k]`` (same
    uid: its readers are re-pointed; its loop variables permuted alike)."""
    assert src.op is not None
    axes = tuple(IterVar(a.name, a.lo, a.hi) for a in (src.op.axes[d] for d in p))
    env: dict[int, Expr] = {src.op.axes[d].uid: axes[k] for k, d in enumerate(p)}
    out = Tensor(tuple(src.shape[d] for d in p), src.dtype, src.name, uid=src.uid)
    out.op = ComputeOp(axes, substitute(src.op.body, env), src.op.tag)
    return out


def relaid(
    graph: Graph, rw: Rewriter, src: Tensor, p: list[int], reader: Tensor, how: tuple[str, str]
) -> tuple[Tensor, str, int]:
    """``src`` in the layout of permutation ``p`` for the primitive ``reader`` alone reads it
    through: a constant permuted at compile time; else its producer's loop nest permuted
    (:func:`sole_producer`); else a transposing primitive added before ``reader``. With the
    record's words for it and the bytes a copy moves (one read and one write; 0 otherwise).
    ``how``: the new tensors' name suffix and tag, and the layout's name for the record."""
    suffix, layout = how
    if graph.is_constant(src):
        value = np.transpose(graph.constants[src.uid], p)
        new = rw.constant(f"{src.name}_{suffix}", value, src.dtype)
        return new, f"{src.name} (constant, permuted at compile time)", 0
    name = graph.idents[reader.uid]
    if (prod := sole_producer(graph, src, name)) is not None:
        new = permuted(src, p)
        rw.define(new)
        return new, f"{src.name} (its producer {prod} stores it {layout}, no copy)", 0
    new = transposed(src, p, f"{src.name}_{suffix}", rw.pass_name)
    rw.add(new, before=reader)
    moved = 2 * src.size * DTYPES[src.dtype].itemsize
    return new, f"{src.name} (a transposing primitive, {moved} bytes moved)", moved
