"""isl relations of one primitive op: its iteration domain, its write and its reads.

A compute ``T[d0..dn-1] = body`` (with reduce axes r0..rm-1 when the body is a reduction) is
modelled as the isl set ``{ S_T[d0..dn-1, r0..rm-1] : bounds }``, the write
``{ S_T[d, r] -> T[d] }`` and, for every read ``X[f(d, r)]`` in the body, the read
``{ S_T[d, r] -> X[f(d, r)] : guard }`` over the points where it is evaluated (a ``te.where``
condition restricts the reads of its branches). Reads are not clipped to X's bounds:
:mod:`polyfuse.graph.bounds` proves at ``te.compute`` time that every access stays inside its
tensor, so the relation is exactly what executes. Loop variables are named by position
(``d0``, ``r0``) so user names never clash with isl keywords.
"""

from __future__ import annotations

import re
import weakref
from dataclasses import dataclass

import islpy as isl

from polyfuse.base.errors import ExpressionError
from polyfuse.graph import expr as ex

# Names generated code uses for itself (loop iterators c0.., block/thread/lane parameters b0..,
# t0.., r0.., l0.., helpers pf*, registers r_*, shared s_*, statements S_*, derived suffixes
# _init/_update/_final/_acc/_lo0, CUDA and C words): tensors never take them.
_RESERVED = re.compile(
    r"^([bctrldz]\d+|_[bt]|pf\w*|[rsS]_\w*|\w*_(init|update|final|acc|lo\d+)|"
    r"int|float|bool|const|for|if|else|return|void|"
    r"min|max|floor|mod|and|or|not|exists|true|false|blockIdx|threadIdx|blockDim|gridDim)$"
)


def isl_ident(name: str) -> str:
    """An isl/C-safe identifier for a user name, never one generated code uses itself."""
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    s = s if s and not s[0].isdigit() else f"t_{s}"
    return f"{s}_" if _RESERVED.match(s) else s


def loop_names(t: ex.Tensor) -> tuple[list[str], list[str]]:
    """isl names of a compute's loop dimensions: data axes, then reduce axes.

    Axes of extent 1 are not loop dimensions (they are the constant ``lo``); dropping them
    keeps keepdims-style reductions and broadcasts aligned with their neighbours for isl.
    """
    assert t.op is not None
    data = [f"d{i}" for i, a in enumerate(t.op.axes) if a.extent > 1]
    red = [f"r{i}" for i, a in enumerate(t.op.reduce_axes) if a.extent > 1]
    return data, red


def axis_names(t: ex.Tensor) -> dict[int, str]:
    """IterVar uid -> its isl dimension name, or the constant it is fixed to (extent 1)."""
    assert t.op is not None
    names = {a.uid: (f"d{i}" if a.extent > 1 else str(a.lo)) for i, a in enumerate(t.op.axes)}
    names.update(
        {a.uid: (f"r{i}" if a.extent > 1 else str(a.lo)) for i, a in enumerate(t.op.reduce_axes)}
    )
    return names


def out_index(t: ex.Tensor) -> list[str]:
    """The subscripts of the element a statement instance writes (isl syntax)."""
    assert t.op is not None
    names = axis_names(t)
    return [names[a.uid] for a in t.op.axes]


def affine_str(e: ex.Expr, names: dict[int, str]) -> str:
    """An affine te index expression as isl syntax; ``names`` maps IterVar uid → isl name."""
    return _AffineText(names).visit(e)


_AFFINE_BINARY = {
    "add": "({a} + {b})",
    "sub": "({a} - {b})",
    "mul": "({a} * {b})",
    "floordiv": "floor(({a}) / {b})",
    "mod": "(({a}) mod {b})",
}
_ISL_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "=", "ne": "!="}
_NEGATED = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt", "eq": "ne", "ne": "eq"}


def _int_const(e: ex.Expr) -> int | None:
    """The value of an integer constant (an integral float counts: ``i < 4.0``), else None."""
    if not isinstance(e, ex.Const) or isinstance(e.value, bool):
        return None
    v = e.value
    if isinstance(v, float) and not v.is_integer():
        return None
    return int(v)


class _AffineText(ex.ExprVisitor[str]):
    """isl text of an affine subscript; anything else raises :class:`ExpressionError`.

    Affine means: loop variables and integer constants combined by ``+``, ``-``, negation,
    multiplication by a constant, and ``//`` / ``%`` by a positive constant (isl's ``floor``
    and ``mod``, which agree with Python's for a positive divisor).
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def visit_IterVar(self, e: ex.IterVar) -> str:
        return self.names[e.uid]

    def visit_Const(self, e: ex.Const) -> str:
        v = _int_const(e)
        return self.visit_default(e) if v is None else str(v)

    def visit_Unary(self, e: ex.Unary) -> str:
        if e.op != "neg":
            return self.visit_default(e)
        return f"(-{self.visit(e.a)})"

    def visit_Binary(self, e: ex.Binary) -> str:
        if e.op not in _AFFINE_BINARY:
            return self.visit_default(e)
        if e.op == "mul" and _int_const(e.a) is None and _int_const(e.b) is None:
            return self.visit_default(e)
        if e.op in ("floordiv", "mod") and (_int_const(e.b) or 0) <= 0:
            return self.visit_default(e)
        return _AFFINE_BINARY[e.op].format(a=self.visit(e.a), b=self.visit(e.b))

    def visit_default(self, e: ex.Expr, *args: object) -> str:
        raise ExpressionError(f"subscript {e!r} is not affine")


class _AffineCondition(ex.ExprVisitor["str | None"]):
    """isl text of an affine condition, or None when it is not affine."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def visit_Compare(self, e: ex.Compare) -> str | None:
        try:
            a, b = affine_str(e.a, self.names), affine_str(e.b, self.names)
        except ExpressionError:
            return None
        return f"({a} {_ISL_COMPARE[e.op]} {b})"

    def visit_Logical(self, e: ex.Logical) -> str | None:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is None or b is None:
            return None
        return f"({a} {'and' if e.op == 'and' else 'or'} {b})"

    def visit_Unary(self, e: ex.Unary) -> str | None:
        a = self.visit(e.a) if e.op == "not" else None
        return None if a is None else f"(not {a})"

    def visit_default(self, e: ex.Expr, *args: object) -> None:
        return None


class _ImpliedCondition(ex.ExprVisitor["str | None"]):
    """An affine condition implied by a condition that is only partly affine.

    ``visit(e, negated)`` gives isl text that holds wherever ``e`` (or ``not e``) holds, or
    None (no constraint). Negation is pushed down to the comparisons; an ``and`` keeps its
    affine conjuncts, an ``or`` needs both sides. A read under a data-dependent guard is thus
    constrained by the guard's affine part and checked everywhere else (at its worst).
    """

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def visit_Compare(self, e: ex.Compare, negated: bool) -> str | None:
        op = _NEGATED[e.op] if negated else e.op
        return _AffineCondition(self.names).visit(ex.Compare(op, e.a, e.b))

    def visit_Logical(self, e: ex.Logical, negated: bool) -> str | None:
        a, b = self.visit(e.a, negated), self.visit(e.b, negated)
        if (e.op == "and") != negated:  # a conjunction: what either side implies holds
            return _both(a, b)
        return None if a is None or b is None else f"({a} or {b})"

    def visit_Unary(self, e: ex.Unary, negated: bool) -> str | None:
        return self.visit(e.a, not negated) if e.op == "not" else None

    def visit_default(self, e: ex.Expr, *args: object) -> None:
        return None


@dataclass
class PrimitiveRelations:
    """The isl view of one primitive: ``domain``, ``write`` and one ``reads`` entry per read."""

    stmt: str
    domain: isl.Set
    write: isl.Map
    reads: list[tuple[ex.Read, isl.Map]]


def bounds_set(ident: str, shape: tuple[int, ...], ctx: isl.Context) -> isl.Set:
    """``{ ident[a0..] : 0 <= ai < shape_i }``."""
    vs = [f"a{i}" for i in range(len(shape))]
    cons = " and ".join(f"0 <= {v} < {n}" for v, n in zip(vs, shape, strict=True)) or "true"
    return isl.Set(f"{{ {ident}[{', '.join(vs)}] : {cons} }}", context=ctx)


@dataclass(frozen=True)
class RelationText:
    """isl text of one compute's relations, with anonymous tuples ``S``, ``T`` and ``X``.

    Identical ops (the same layer repeated) give identical text, which is what the relation
    memo and the bounds-check cache key on.
    """

    domain: str
    write: str
    reads: tuple[tuple[str, tuple[int, ...]], ...]  # (read map text, read tensor's shape)


#: ComputeOp → its relation text: the bounds check at ``te.compute`` and the graph build at
#: compile time share one walk of the body (ops are never changed once built).
_TEXTS: weakref.WeakKeyDictionary[ex.ComputeOp, tuple[RelationText, list[ex.Read]]] = (
    weakref.WeakKeyDictionary()
)


def relation_text(t: ex.Tensor) -> tuple[RelationText, list[ex.Read]]:
    """The isl text of compute ``t``'s domain, write and guarded reads (reads in body order).

    A data-dependent subscript (``te.data_index``) may select any element along its
    dimension: that output dimension ranges over the whole extent.
    """
    assert t.op is not None
    hit = _TEXTS.get(t.op)
    if hit is None:
        hit = _TEXTS[t.op] = _relation_text(t)
    return hit


def _relation_text(t: ex.Tensor) -> tuple[RelationText, list[ex.Read]]:
    assert t.op is not None
    dn, rn = loop_names(t)
    names = axis_names(t)
    cons = [
        f"{a.lo} <= {names[a.uid]} < {a.hi}" for a in t.op.axes + t.op.reduce_axes if a.extent > 1
    ]
    it = ", ".join(dn + rn)
    domain_s = f"{{ S[{it}] : {' and '.join(cons) or 'true'} }}"
    write_s = f"{{ S[{it}] -> T[{', '.join(out_index(t))}] }}"
    reads_s = []
    guarded = guarded_reads(t.op.body, names)
    for r, guard in guarded:
        subs, conds = [], [guard] if guard else []
        for d, sub in enumerate(r.indices):
            if isinstance(sub, ex.DataIndex):
                subs.append(f"z{d}")
                conds.append(f"0 <= z{d} < {r.tensor.shape[d]}")
            else:
                subs.append(affine_str(sub, names))
        cond = f" : {' and '.join(conds)}" if conds else ""
        reads_s.append((f"{{ S[{it}] -> X[{', '.join(subs)}]{cond} }}", r.tensor.shape))
    return RelationText(domain_s, write_s, tuple(reads_s)), [r for r, _ in guarded]


def primitive_relations(
    t: ex.Tensor, idents: dict[int, str], ctx: isl.Context, memo: dict | None = None
) -> PrimitiveRelations:
    """Build the domain, write and read relations of compute tensor ``t``.

    ``idents`` maps tensor uid → isl identifier (unique within the graph). With ``memo`` (a
    dict shared across one graph build) a primitive whose relations differ from an earlier
    one's only in tuple names (the same op in another layer) reuses the parsed relations,
    renamed, instead of parsing isl text again.
    """
    text, reads_in_order = relation_text(t)
    stmt = f"S_{idents[t.uid]}"
    hit = memo.get(text) if memo is not None else None
    if hit is None:
        domain = isl.Set(text.domain, context=ctx)
        write = isl.Map(text.write, context=ctx).intersect_domain(domain)
        reads_t = [isl.Map(m_s, context=ctx).intersect_domain(domain) for m_s, _ in text.reads]
        hit = (domain, write, reads_t)
        if memo is not None:
            memo[text] = hit
    domain, write, reads_t = hit
    ins, outs = isl.dim_type.in_, isl.dim_type.out
    domain = domain.set_tuple_name(stmt)
    write = write.set_tuple_name(ins, stmt).set_tuple_name(outs, idents[t.uid])
    reads = [
        (r, m.set_tuple_name(ins, stmt).set_tuple_name(outs, idents[r.tensor.uid]))
        for r, m in zip(reads_in_order, reads_t, strict=True)
    ]
    return PrimitiveRelations(stmt, domain, write, reads)


def affine_condition(e: ex.Expr, names: dict[int, str]) -> str | None:
    """An affine te condition as isl syntax, or None when it is not affine."""
    return _AffineCondition(names).visit(e)


def guarded_reads(body: ex.Expr, names: dict[int, str]) -> list[tuple[ex.Read, str | None]]:
    """Every read of ``body`` with the affine condition under which it executes (None: always).

    ``te.where(c, a, b)`` evaluates only one side, so reads in ``a`` happen only where ``c``
    holds and reads in ``b`` only where it does not; isl then sees exactly the elements read.
    Likewise ``c & e`` reads ``e`` only where ``c`` holds and ``c | e`` only where it does not.
    A condition that is not affine guards by its affine part only (an over-approximation).
    """
    walker = _GuardedReads(names)
    walker.visit(body, None)
    return walker.out


def _both(a: str | None, b: str | None) -> str | None:
    return b if a is None else a if b is None else f"({a} and {b})"


class _GuardedReads(ex.ExprVisitor[None]):
    """Collects (read, guard) pairs; ``visit(e, guard)``."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.out: list[tuple[ex.Read, str | None]] = []

    def visit_default(self, e: ex.Expr, *args: object) -> None:
        for k in e.children():
            self.visit(k, *args)

    def visit_Read(self, e: ex.Read, guard: str | None) -> None:
        self.out.append((e, guard))
        self.visit_default(e, guard)

    def _split(self, cond: ex.Expr) -> tuple[str | None, str | None]:
        """The guards under which ``cond`` holds and does not hold."""
        c = affine_condition(cond, self.names)
        if c is not None:
            return c, f"(not {c})"
        implied = _ImpliedCondition(self.names)  # partly data-dependent: its affine part
        return implied.visit(cond, False), implied.visit(cond, True)

    def visit_Select(self, e: ex.Select, guard: str | None) -> None:
        then, other = self._split(e.cond)
        self.visit(e.cond, guard)
        self.visit(e.a, _both(guard, then))
        self.visit(e.b, _both(guard, other))

    def visit_Logical(self, e: ex.Logical, guard: str | None) -> None:
        # ``a & b`` evaluates b only where a holds, ``a | b`` only where it does not (C's
        # && and ||, as printed)
        then, other = self._split(e.a)
        self.visit(e.a, guard)
        self.visit(e.b, _both(guard, then if e.op == "and" else other))
