"""Fold per-channel scale/shift primitives into the convolution or matmul before them.

Recognised by structure, not by op name: a primitive ``y`` that is affine in one compute
``p`` read at its own index (:func:`polyfuse.graph.passes.affine.affine_in`),
``y = a * p[i] + b``, whose coefficient ``a`` is known at compile time and varies along at
most one axis (``const_axis``). An inference batch norm with constant statistics is exactly
that once constant folding has turned its ``gamma * rsqrt(var + eps)`` into a constant:
``a = scale[c]``, ``b = beta[c] - mean[c] * scale[c]``.

1. **Into a reduction** — ``p = sum(... * W[.., c, ..] * ...)`` with a constant factor ``W``
   read with the channel's loop variable as a plain subscript (a conv's ``w[oc, rc, rh, rw]``,
   a matmul's ``b[k, j]``): ``a`` does not depend on the reduced axes, so
   ``a[c] * sum(x * W) = sum(x * (W * a[c]))``. ``W * a`` is computed now (a float32 product,
   correctly rounded) into a new constant; ``y`` becomes ``p[i] + bias[c]`` (the form
   ``ops.conv2d(..., bias=)`` builds, tagged like ``p``), with ``bias = b`` evaluated now when
   it is constant along one axis, else kept as an expression (a residual read stays a read).
   The batch-norm primitive is gone; its shift is the convolution's bias epilogue.
2. **A chain** — ``y`` affine in ``q`` and ``q`` affine in ``x`` (``q`` read by ``y`` only),
   all coefficients constant along one axis and at least one a constant tensor:
   ``y = (a_y a_q) x + (a_y b_q + b_y)`` becomes one primitive ``x * A + B`` with ``A`` and
   ``B`` evaluated now (a batch norm after a per-channel scale, a Caffe-style Scale after a
   BatchNorm); when ``x`` is a convolution, step 1 then folds the whole chain into it. A chain
   of immediates only (``x * 2 + 1``) is left as written: it fuses into one kernel anyway, and
   collapsing it would only reassociate its rounding.

Legality: ``p`` must be a ``sum``, not a graph output, and read by ``y`` alone. When it has
other readers the fold is refused, not done by duplicating ``p``: a second convolution costs
far more than the elementwise pass the fold would save (recorded as a refusal). Values: the
reassociation and the rounding of ``W * a`` to float32 change results by float32 rounding
only (the tests bound it). Whether a fold happens depends on shapes and structure only, never
on the constants' values.
"""

from __future__ import annotations

import numpy as np

from polyfuse.graph.expr import (
    Binary,
    ComputeOp,
    Const,
    Expr,
    ExprMutator,
    IterVar,
    Read,
    Tensor,
    float32_value,
    substitute,
)
from polyfuse.graph.graph import Graph
from polyfuse.graph.inline import inline
from polyfuse.graph.passes.affine import Affine, affine_in, const_axis
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Evaluator, Rewriter, reads_of, with_body

NAME = "batchnorm_fold"


def coefficient(
    e: Expr, t: Tensor, axis: int | None, graph: Graph, evaluate: Evaluator
) -> np.ndarray:
    """The values of constant coefficient ``e`` of compute ``t`` along data axis ``axis``
    (1-D, the axis' extent), or a one-element array when ``axis`` is None."""
    assert t.op is not None
    if axis is None:
        v, body = IterVar("c", 0, 1), e
    else:
        a = t.op.axes[axis]
        v = IterVar("c", 0, a.hi)
        body = substitute(e, {a.uid: v})
    tmp = Tensor((v.hi,), "float32", f"{t.name}_coefficient", ComputeOp((v,), body))
    feeds = {r.tensor: graph.constants[r.tensor.uid] for r in reads_of(body)}
    return np.asarray(evaluate(tmp, feeds), dtype=np.float32)


def _term(
    e: Expr | None, t: Tensor, rw: Rewriter, graph: Graph, evaluate: Evaluator, what: str
) -> Expr | None:
    """Constant coefficient ``e`` of ``t`` as a read of a new 1-D constant along its axis, an
    immediate when it is a scalar, or ``e`` itself when it is not constant."""
    if e is None:
        return None
    ok, axis = const_axis(e, t, graph)
    if not ok:
        return e
    value = coefficient(e, t, axis, graph, evaluate)
    if axis is None:
        return Const(float32_value(float(value[0])))
    assert t.op is not None
    c = rw.constant(f"{graph.ident(t)}_{what}", value)
    return Read(c, (t.op.axes[axis],))


def _affine_body(x: Tensor, t: Tensor, a: Expr | None, b: Expr | None) -> Expr:
    assert t.op is not None
    e: Expr = Read(x, t.op.axes)
    e = e if a is None else Binary("mul", e, a)
    return e if b is None else Binary("add", e, b)


def _factors(e: Expr) -> list[Expr]:
    """The factors of a product tree (``e`` itself when it is not a product)."""
    if isinstance(e, Binary) and e.op == "mul":
        return _factors(e.a) + _factors(e.b)
    return [e]


class _Swap(ExprMutator):
    """Replaces the first visit of one read node (by identity) with another. Only the first:
    a body may use one Read object twice (``r * r`` with ``r = w[k, j]``), and scaling both
    uses would scale the product twice."""

    def __init__(self, old: Read, new: Read) -> None:
        self.old, self.new = old, new
        self.done = False

    def visit_Read(self, e: Read) -> Expr:
        if e is self.old and not self.done:
            self.done = True
            return self.new
        return self.visit_default(e)


def _weight(graph: Graph, p: Tensor, axis: int | None) -> tuple[Read, int | None] | None:
    """A constant factor of sum-reduction ``p``'s body read with ``p``'s data axis ``axis`` as
    a plain subscript (its position), or any constant factor when ``axis`` is None."""
    assert p.op is not None and p.op.reduce is not None
    for f in _factors(p.op.reduce.body):
        if not (isinstance(f, Read) and graph.is_constant(f.tensor)):
            continue
        if axis is None:
            return f, None
        v = p.op.axes[axis]
        for pos, s in enumerate(f.indices):
            if s is v:
                return f, pos
    return None


def _into_reduction(
    graph: Graph, rw: Rewriter, y: Tensor, p: Tensor, aff: Affine, axis: int | None, ev: Evaluator
) -> None:
    assert y.op is not None and p.op is not None and p.op.reduce is not None
    yn, pn = graph.ident(y), graph.ident(p)
    head = f"{yn} [{y.op.tag or 'compute'}] scales {pn} [{p.op.tag or 'compute'}]"
    readers = [n for n in graph.consumers(pn) if n != yn]
    why = ""
    if p.op.reduce.op != "sum":
        why = f"{pn} is a {p.op.reduce.op} reduction, which a scale does not commute with"
    elif graph.is_output(p):
        why = f"{pn} is a graph output"
    elif readers:
        why = (
            f"{pn} is also read by {', '.join(readers)}: folding would duplicate it (not "
            "done: recomputing it costs more than the elementwise pass the fold saves)"
        )
    found = None if why else _weight(graph, p, axis)
    if not why and found is None:
        where = "" if axis is None else f" indexed by its axis {axis}"
        why = f"{pn} has no constant factor{where} to scale"
    if why:
        rw.record(PassAction.REFUSED, (yn, pn), f"{head}: {why}")
        return
    assert found is not None
    r, pos = found
    # float32 products of float32 values are correctly rounded: the float64 product rounded
    w = graph.constants[r.tensor.uid]
    scale = coefficient(aff.a, y, axis, graph, ev)  # type: ignore[arg-type]
    if pos is None:
        folded = w * scale[0]
    else:
        full = np.ones(w.shape[pos], np.float32)
        full[: scale.size] = scale
        shape = [1] * w.ndim
        shape[pos] = w.shape[pos]
        folded = w * full.reshape(shape)
    wc = rw.constant(f"{graph.ident(r.tensor)}_{yn}", folded)
    reduce = _Swap(r, Read(wc, r.indices)).visit(p.op.reduce)
    rw.define(with_body(p, reduce))
    bias = _term(aff.b, y, rw, graph, ev, "shift")
    rw.define(with_body(y, _affine_body(p, y, None, bias), tag=p.op.tag))
    ax = "a scalar" if axis is None else f"{scale.size} values along axis {axis}"
    shift = (
        "no shift"
        if aff.b is None
        else f"shift into {bias.tensor.name}"
        if isinstance(bias, Read) and bias.tensor.is_placeholder
        else "shift as an epilogue"
    )
    rw.record(
        PassAction.FOLDED,
        (yn, pn),
        f"{head}: scale ({ax}) into weight {graph.ident(r.tensor)} -> "
        f"{wc.name}, {shift}; {yn} = {pn} + shift",
    )


def _chain(graph: Graph, rw: Rewriter, y: Tensor, q: Tensor, aff: Affine, ev: Evaluator) -> None:
    assert y.op is not None and q.op is not None
    yn, qn = graph.ident(y), graph.ident(q)
    if graph.is_output(q) or graph.consumers(qn) != [yn] or not const_axis(aff.b, y, graph)[0]:
        return
    for x in q.op.inputs():
        inner = affine_in(q, x)
        if inner is None or not all(const_axis(e, q, graph)[0] for e in (inner.a, inner.b)):
            continue
        coefs = (aff.a, aff.b, inner.a, inner.b)
        if not any(e is not None and reads_of(e) for e in coefs):
            continue  # immediates only (x * 2 + 1): one kernel already, nothing to fold away
        whole = affine_in(inline(y, q), x)
        if whole is None:
            continue
        if not all(const_axis(e, y, graph)[0] for e in (whole.a, whole.b)):
            continue
        a = _term(whole.a, y, rw, graph, ev, "scale")
        b = _term(whole.b, y, rw, graph, ev, "shift")
        rw.define(with_body(y, _affine_body(x, y, a, b)))
        rw.touched.add(q.uid)
        rw.record(
            PassAction.FOLDED,
            (yn, qn),
            f"{yn} [{y.op.tag or 'compute'}] of {qn} [{q.op.tag or 'compute'}]: scale/shift "
            f"chain collapsed into one: {yn} = {graph.ident(x)} * scale + shift",
        )
        return


def batchnorm_fold(graph: Graph, evaluate: Evaluator) -> Graph:
    """``graph`` with per-channel scale/shift primitives folded into the weights and bias of
    the convolution or matmul before them, and scale/shift chains collapsed."""
    rw = Rewriter(graph, NAME)
    for name in graph.topo_order():
        y = graph.prims[name].tensor
        assert y.op is not None
        if y.op.reduce is not None or y.uid in rw.touched:
            continue
        for x in y.op.inputs():
            if x.is_placeholder or x.uid in rw.touched:
                continue
            aff = affine_in(y, x)
            if aff is None:
                continue
            ok, axis = const_axis(aff.a, y, graph)
            if not ok:
                continue
            assert x.op is not None
            if x.op.reduce is not None:
                if aff.a is not None:
                    _into_reduction(graph, rw, y, x, aff, axis, evaluate)
            else:
                _chain(graph, rw, y, x, aff, evaluate)
            break
    return rw.result()
