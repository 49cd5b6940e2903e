"""Inline a producer's expression into a consumer (recompute instead of storing).

``inline(consumer, producer)`` returns a new compute tensor equal to ``consumer`` in which
every read ``producer[idx]`` is replaced by the producer's body with its loop variables set to
``idx`` (affine substitutions compose, so the result stays affine), converted to the
producer's dtype as its store would (:func:`stored`). Stitching uses this when an
intermediate's per-block footprint does not fit in shared memory: the consumer recomputes it
from the producer's inputs instead of reading it back from global memory.
"""

from __future__ import annotations

from polyfuse.graph.dtypes import HALF_DTYPES
from polyfuse.graph.expr import (
    Cast,
    ComputeOp,
    DataIndex,
    Expr,
    ExprMutator,
    Read,
    Tensor,
    substitute,
    walk,
)

__all__ = ["inline", "inlinable", "stored", "substitute"]


class _Inline(ExprMutator):
    """Replaces reads of ``producer`` by its body at the (rebuilt) subscripts."""

    def __init__(self, producer: Tensor) -> None:
        assert producer.op is not None
        self.producer = producer
        self.axes = producer.op.axes
        self.body = producer.op.body

    def visit_Read(self, e: Read) -> Expr:
        kids = tuple(self.visit(i) for i in e.indices)
        if e.tensor.uid != self.producer.uid:
            return self.rebuild(e, kids)
        value = substitute(self.body, {a.uid: i for a, i in zip(self.axes, kids, strict=True)})
        return stored(value, self.producer.dtype)


def stored(value: Expr, dtype: str) -> Expr:
    """``value`` as a tensor of ``dtype`` holds it: converted where its body computes in
    another dtype (an int32 compute of a float body truncates), and rounded where ``dtype`` is
    a 16-bit float (its body computes in float32 registers)."""
    if value.dtype != dtype or dtype in HALF_DTYPES:
        return Cast(value, dtype)
    return value


def inline(consumer: Tensor, producer: Tensor) -> Tensor:
    """``consumer`` with every read of ``producer`` replaced by its defining expression."""
    assert consumer.op is not None and producer.op is not None
    if producer.op.reduce is not None:
        raise ValueError(f"cannot inline reduction '{producer.name}'")
    body = _Inline(producer).visit(consumer.op.body)
    out = Tensor(consumer.shape, consumer.dtype, consumer.name, uid=consumer.uid)
    out.op = ComputeOp(consumer.op.axes, body, consumer.op.tag)
    return out


def inlinable(consumer: Tensor, producer: Tensor) -> bool:
    """Whether :func:`inline` of ``producer`` into ``consumer`` gives subscripts isl can model:
    a data-dependent subscript (``te.data_index``) must stay a whole subscript. A gather
    ``c[data_index(k)]`` of a concatenation that reads ``v[i - 5]`` would read
    ``v[data_index(k) - 5]`` (torch fuzz seed 13436: a topk of a ``torch.cat``)."""
    assert consumer.op is not None and producer.op is not None
    if producer.op.reduce is not None:
        return False
    body = _Inline(producer).visit(consumer.op.body)
    return all(
        isinstance(i, DataIndex) or not any(isinstance(n, DataIndex) for n in walk(i))
        for r in walk(body)
        if isinstance(r, Read)
        for i in r.indices
    )
