"""ONNX losses: ``NegativeLogLikelihoodLoss`` and ``SoftmaxCrossEntropyLoss``.

Both pick, per sample ``n`` and position ``d...``, the entry of class ``target[n, d...]``
along axis 1 of ``x`` (of its log-softmax for the cross entropy), negate it and weigh it by
``weight[target]``: a run-time gather (``te.data_index``) whose index is clamped into
``[0, C)``, so an ignored or out-of-range target never reads outside ``x``. A target equal
to ``ignore_index`` contributes 0 and weighs 0; any other target outside ``[0, C)`` (which
ONNX leaves undefined) gives a NaN loss, never another class's score. ``reduction``:
``none`` keeps the per-element losses, ``sum`` adds them, ``mean`` divides their sum by the
sum of the weights (by the number of elements when neither ``weight`` nor ``ignore_index``
is given). A 16-bit loss is summed in float32 and rounded once.
"""

from __future__ import annotations

import math
from typing import Any

import onnx

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.dtypes import HALF_DTYPES
from polyfuse.graph.expr import Expr, IterVar
from polyfuse.onnx.common import (
    Ctx,
    Value,
    map_elementwise,
    optional_input,
    reduce_op,
    register_op,
    str_attr,
)
from polyfuse.ops._common import narrow, wide


@register_op("NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss")
def _loss(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, target = ctx.tensor(ins[0]), ctx.tensor(ins[1])
    weight = ctx.tensor(ins[2], like=x.dtype) if optional_input(ins, 2) is not None else None
    op = node.op_type
    if not dtypes.is_float(x.dtype):
        raise UnsupportedOpError(f"{op} of {x.dtype} scores (floating point only)")
    if x.ndim < 2 or target.shape != (x.shape[0], *x.shape[2:]):
        raise ExpressionError(
            f"{op}: target {target.shape} must be the scores {x.shape} without their class axis 1"
        )
    if not dtypes.is_int(target.dtype):
        raise ExpressionError(f"{op}: target must hold integer classes (it is {target.dtype})")
    classes = x.shape[1]
    if weight is not None and weight.shape != (classes,):
        raise ExpressionError(
            f"{op}: weight {weight.shape} must have one entry per class ({classes})"
        )
    red = str_attr(at, "reduction", "mean")
    if red not in ("none", "sum", "mean"):
        raise UnsupportedOpError(f"{op} reduction='{red}' (none, sum and mean are defined)")
    ignore = int(at["ignore_index"]) if "ignore_index" in at else None
    scores = x
    if op == "SoftmaxCrossEntropyLoss":
        scores = ops.log_softmax(x, axis=1, name=ctx.fresh("log_prob"))
    up = wide(x)

    def cls(i: tuple[IterVar, ...]) -> tuple[Expr, Expr]:
        t = target[i]
        return t, te.data_index(te.minimum(te.maximum(t, 0), classes - 1))

    def kept(t: Expr, v: Expr) -> Expr:
        return v if ignore is None else te.where(te.equal(t, ignore), te.const(0.0, v.dtype), v)

    def picked(*i: IterVar) -> Expr:
        t, c = cls(i)
        v = -up(scores[(i[0], c, *i[1:])])
        v = v * up(weight[c]) if weight is not None else v
        bad = (t < 0) | (t >= classes)  # no such class: NaN, never a neighbour's score
        return kept(t, te.where(bad, te.const(math.nan, v.dtype), v))

    losses = ctx.compute(target.shape, picked, "loss")
    axes = list(range(len(target.shape)))
    down = narrow(x)
    if red == "none":
        out = map_elementwise(ctx, [losses], down, "loss") if x.dtype in HALF_DTYPES else losses
    elif red == "sum":
        out = reduce_op(ctx, losses, axes, False, "sum", post=down)
    elif weight is None and ignore is None:
        each = 1.0 / math.prod(target.shape)
        out = reduce_op(ctx, losses, axes, False, "sum", post=lambda v: down(v * each))
    else:

        def weighed(*i: IterVar) -> Expr:
            t, c = cls(i)
            w = up(weight[c]) if weight is not None else te.const(1.0, losses.dtype)
            return kept(t, w)

        total = reduce_op(
            ctx, ctx.compute(target.shape, weighed, "loss_weight"), axes, False, "sum"
        )
        summed = reduce_op(ctx, losses, axes, False, "sum")
        out = map_elementwise(ctx, [summed, total], lambda a, b: down(a / b), "loss_mean")
    if op == "SoftmaxCrossEntropyLoss":
        return [out, scores]
    return [out]
