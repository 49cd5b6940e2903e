"""Algebraic simplification of primitive bodies, and primitives that only copy.

Identities applied bottom-up to every body (float32 arithmetic only; an identity that would
change an expression's dtype is not applied):

- ``x * 1``, ``1 * x``, ``x / 1``, ``x - 0``, ``x + 0``, ``0 + x`` → ``x``. All are exact in
  IEEE arithmetic except that ``-0.0 + 0`` is ``+0.0``: the sign of a zero may differ, no
  value does; NaN and ±inf pass through unchanged.
- ``where(c, a, b)`` with a constant condition → ``a`` or ``b`` (comparisons and ``&``/``|``
  of constants are evaluated first; ``True & e`` is ``e``, ``False | e`` is ``e``).

A primitive whose simplified body reads another tensor of its own shape at the same index
(``y[i, j] = x[i, j]``: what ``x + 0``, a reshape to the same shape or an identity transpose
leave) is *forwarded*: its readers read ``x`` and dead-code elimination removes it. Graph
outputs stay primitives (a copy) — an output must be written by a kernel.

Transposes of transposes and reshapes of reshapes are composed by
:mod:`polyfuse.graph.passes.layout` in the same pass.
"""

from __future__ import annotations

import operator

from polyfuse.graph.expr import (
    Binary,
    Cast,
    Compare,
    Const,
    Expr,
    ExprVisitor,
    Logical,
    Read,
    Select,
    Unary,
    rewrite,
)
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.layout import compose_moves
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, is_identity_read, with_body

NAME = "simplify"

_COMPARE = {
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}


def _is(e: Expr, v: float) -> bool:
    return isinstance(e, Const) and e.dtype != "bool" and e.value == v


def _bool(e: Expr) -> bool | None:
    return bool(e.value) if isinstance(e, Const) and e.dtype == "bool" else None


def _keep_dtype(e: Expr, dtype: str) -> Expr:
    return e if e.dtype == dtype else Cast(e, dtype)


class _Identity(ExprVisitor[Expr | None]):
    """The simpler equal expression for node ``e`` with new children ``kids``, or None."""

    def visit_default(self, e: Expr, *args: object) -> Expr | None:
        return None

    def visit_Binary(self, e: Binary, kids: tuple[Expr, ...]) -> Expr | None:
        if e.dtype != "float32":
            return None
        a, b = kids
        pick = None
        if e.op == "mul":
            pick = a if _is(b, 1) else b if _is(a, 1) else None
        elif e.op == "add":
            pick = a if _is(b, 0) else b if _is(a, 0) else None
        elif e.op == "sub" or e.op == "div":
            pick = a if _is(b, 0 if e.op == "sub" else 1) else None
        return pick if pick is not None and pick.dtype == e.dtype else None

    def visit_Compare(self, e: Compare, kids: tuple[Expr, ...]) -> Expr | None:
        a, b = kids
        if isinstance(a, Const) and isinstance(b, Const):
            return Const(bool(_COMPARE[e.op](a.value, b.value)), "bool")
        return None

    def visit_Logical(self, e: Logical, kids: tuple[Expr, ...]) -> Expr | None:
        a, b = kids
        va, vb = _bool(a), _bool(b)
        absorbing = e.op == "or"  # True absorbs `or`, False absorbs `and`
        if va is not None:
            return Const(absorbing, "bool") if va == absorbing else _keep_dtype(b, "bool")
        if vb is not None:
            return Const(absorbing, "bool") if vb == absorbing else _keep_dtype(a, "bool")
        return None

    def visit_Unary(self, e: Unary, kids: tuple[Expr, ...]) -> Expr | None:
        if e.op == "not" and (v := _bool(kids[0])) is not None:
            return Const(not v, "bool")
        return None

    def visit_Select(self, e: Select, kids: tuple[Expr, ...]) -> Expr | None:
        if (v := _bool(kids[0])) is not None:
            return _keep_dtype(kids[1] if v else kids[2], e.dtype)
        return None


_identity = _Identity().visit


def _clip(text: str, n: int = 100) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def simplify_expr(e: Expr) -> Expr:
    """``e`` with the identities applied (``e`` itself when none applies)."""
    return rewrite(e, _identity)


def simplify(graph: Graph) -> Graph:
    """``graph`` with simplified bodies, copies forwarded and layout moves composed."""
    rw = Rewriter(graph, NAME)
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        assert t.op is not None
        body = simplify_expr(t.op.body)
        if isinstance(body, Read) and is_identity_read(body, t) and not graph.is_output(t):
            src = graph.ident(body.tensor)
            rw.forward(t, body.tensor)
            rw.record(
                PassAction.FORWARDED,
                (name, src),
                f"{name} [{t.op.tag or 'compute'}] equals {src} element for element: its "
                f"readers read {src}",
            )
        elif body is not t.op.body:
            rw.define(with_body(t, body))
            rw.record(
                PassAction.SIMPLIFIED,
                (name,),
                f"{name} [{t.op.tag or 'compute'}]: {_clip(repr(t.op.body))} -> "
                f"{_clip(repr(body))}",
            )
    compose_moves(graph, rw, NAME)
    return rw.result()
