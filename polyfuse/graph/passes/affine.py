"""Primitives that are affine in one tensor: ``y[i] = a(i) * x[i] + b(i)``.

:func:`affine_in` writes a body as ``a * x[i] + b`` for one tensor ``x`` read at the
primitive's own index (the identity read), by the rules of linear algebra on the expression
tree: ``+``, ``-``, negation, multiplication by and division by an expression that does not
read ``x``. ``a`` and ``b`` are expressions that do not read ``x`` (None: 1 and 0). Anything
else that reads ``x`` (a ReLU, ``x * x``, ``x`` at another index) is not affine.

An inference batch norm ``(x - mean[c]) * scale[c] + beta[c]`` is affine in ``x`` with
``a = scale[c]`` and ``b = -mean[c] * scale[c] + beta[c]``; both read only constants and vary
along one axis (the channel), which is what :mod:`polyfuse.graph.passes.batchnorm_fold`
checks with :func:`const_axis` before folding ``a`` into a weight and ``b`` into a bias. Writing
the body this way reassociates it, so a folded result differs from the original by float32
rounding only.
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.graph.expr import Binary, Const, Expr, ExprVisitor, Read, Tensor, Unary, walk
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.rewrite import is_identity_read, loop_vars, reads_of


@dataclass(frozen=True)
class Affine:
    """``body = a * x[i] + b`` (``a`` None: 1; ``b`` None: 0)."""

    x: Tensor
    a: Expr | None
    b: Expr | None


@dataclass(frozen=True)
class _Lin:
    has_x: bool
    a: Expr | None = None  # with has_x: the coefficient (None: 1)
    b: Expr | None = None  # the rest (None: 0); without has_x: the whole expression


def _add(p: Expr | None, q: Expr | None) -> Expr | None:
    return q if p is None else p if q is None else Binary("add", p, q)


def _mul(b: Expr | None, k: Expr) -> Expr | None:
    return None if b is None else Binary("mul", b, k)


def _coef(a: Expr | None) -> Expr:
    """A coefficient as an expression (None is 1)."""
    return Const(1.0) if a is None else a


def _negated(s: _Lin) -> _Lin:
    return _Lin(
        s.has_x,
        Unary("neg", _coef(s.a)) if s.has_x else None,
        None if s.b is None else Unary("neg", s.b),
    )


class _Linear(ExprVisitor[_Lin | None]):
    """A subexpression of compute ``t``'s body as ``a * x + b``, or None (not affine)."""

    def __init__(self, t: Tensor, x: Tensor) -> None:
        self.t, self.x = t, x

    def lin(self, e: Expr) -> _Lin | None:
        if not any(isinstance(n, Read) and n.tensor.uid == self.x.uid for n in walk(e)):
            return _Lin(False, b=e)
        return self.visit(e)

    def visit_default(self, e: Expr, *args: object) -> _Lin | None:
        return None  # reads x under something that is not linear (exp, max, a reduction)

    def visit_Read(self, e: Read) -> _Lin | None:
        return _Lin(True) if is_identity_read(e, self.t) else None

    def visit_Unary(self, e: Unary) -> _Lin | None:
        if e.op != "neg":
            return None
        s = self.lin(e.a)
        return None if s is None else _negated(s)

    def visit_Binary(self, e: Binary) -> _Lin | None:
        if e.op not in ("add", "sub", "mul", "div"):
            return None
        p, q = self.lin(e.a), self.lin(e.b)
        if p is None or q is None:
            return None
        if e.op in ("add", "sub"):
            if e.op == "sub":
                q = _negated(q)
            if p.has_x and q.has_x:
                a = Binary("add", _coef(p.a), _coef(q.a))
            else:
                a = p.a if p.has_x else q.a
            return _Lin(True, a, _add(p.b, q.b))
        if e.op == "mul" and p.has_x != q.has_x:
            s, k = (p, q.b) if p.has_x else (q, p.b)
            assert k is not None
            return _Lin(True, k if s.a is None else Binary("mul", s.a, k), _mul(s.b, k))
        if e.op == "div" and p.has_x and not q.has_x:
            assert q.b is not None
            k = q.b
            b = None if p.b is None else Binary("div", p.b, k)
            return _Lin(True, Binary("div", _coef(p.a), k), b)
        return None


def affine_in(t: Tensor, x: Tensor) -> Affine | None:
    """Compute ``t``'s body as ``a * x[i] + b`` (``x`` read at ``t``'s index), or None."""
    assert t.op is not None
    if t.op.reduce is not None or t.dtype != "float32" or x.dtype != "float32":
        return None
    s = _Linear(t, x).lin(t.op.body)
    if s is None or not s.has_x:
        return None
    return Affine(x, s.a, s.b)


def const_axis(e: Expr | None, t: Tensor, graph: Graph) -> tuple[bool, int | None]:
    """Whether coefficient ``e`` of compute ``t`` is known at compile time and varies along
    at most one data axis: ``(True, k)`` along axis ``k``, ``(True, None)`` a scalar (or
    absent), ``(False, None)`` when it reads a non-constant tensor, uses a reduction axis or
    varies along several axes."""
    assert t.op is not None
    if e is None:
        return True, None
    if any(not graph.is_constant(r.tensor) for r in reads_of(e)):
        return False, None
    used = loop_vars(e)
    axes = [k for k, a in enumerate(t.op.axes) if a.uid in used]
    if len(axes) > 1 or len(used) > len(axes) or (axes and t.op.axes[axes[0]].lo != 0):
        return False, None
    return True, (axes[0] if axes else None)
