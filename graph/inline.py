"""Inline a producer's expression into a consumer (recompute instead of storing).

``inline(consumer, producer)`` returns a new compute tensor equal to ``consumer`` in which
every read ``producer[idx]`` is replaced by the producer's body with its loop variables set to
``idx`` (affine substitutions compose, so the result stays affine). Stitching uses this when an
intermediate's per-block footprint does not fit in shared memory: the consumer recomputes it
from the producer's inputs instead of reading it back from global memory.
"""

from __future__ import annotations

from polyfuse.graph.expr import ComputeOp, Expr, IterVar, Read, Tensor, rewrite


def substitute(e: Expr, env: dict[int, Expr]) -> Expr:
    """Replace IterVars (by uid) in ``e``."""
    return rewrite(e, lambda n, _k: env.get(n.uid) if isinstance(n, IterVar) else None)


def inline(consumer: Tensor, producer: Tensor) -> Tensor:
    """``consumer`` with every read of ``producer`` replaced by its defining expression."""
    assert consumer.op is not None and producer.op is not None
    if producer.op.reduce is not None:
        raise ValueError(f"cannot inline reduction '{producer.name}'")
    pbody = producer.op.body

    def repl(n: Expr, kids: tuple[Expr, ...]) -> Expr | None:
        if isinstance(n, Read) and n.tensor.uid == producer.uid:
            env = {a.uid: i for a, i in zip(producer.op.axes, kids, strict=True)}
            return substitute(pbody, env)
        return None

    body = rewrite(consumer.op.body, repl)
    out = Tensor(consumer.shape, consumer.dtype, consumer.name, uid=consumer.uid)
    out.op = ComputeOp(consumer.op.axes, body, consumer.op.tag)
    return out
