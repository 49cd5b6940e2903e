"""isl relations of one primitive op: its iteration domain, its write and its reads.

A compute ``T[d0..dn-1] = body`` (with reduce axes r0..rm-1 when the body is a reduction) is
modelled as the isl set ``{ S_T[d0..dn-1, r0..rm-1] : bounds }``, the write
``{ S_T[d, r] -> T[d] }`` and, for every read ``X[f(d, r)]`` in the body, the read
``{ S_T[d, r] -> X[f(d, r)] }`` clipped to X's bounds (reads a ``te.where`` guards may reach
outside; the clipped relation is what actually executes). Loop variables are named by
position (``d0``, ``r0``) so user names never clash with isl keywords.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import islpy as isl

from polyfuse.errors import ExpressionError
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


class _AffineText(ex.ExprVisitor[str]):
    """isl text of an affine subscript; anything else raises :class:`ExpressionError`."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names

    def visit_IterVar(self, e: ex.IterVar) -> str:
        return self.names[e.uid]

    def visit_Const(self, e: ex.Const) -> str:
        return str(int(e.value))

    def visit_Unary(self, e: ex.Unary) -> str:
        if e.op != "neg":
            return self.visit_default(e)
        return f"(-{self.visit(e.a)})"

    def visit_Binary(self, e: ex.Binary) -> str:
        if e.op not in _AFFINE_BINARY:
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


def primitive_relations(
    t: ex.Tensor, idents: dict[int, str], ctx: isl.Context, memo: dict | None = None
) -> PrimitiveRelations:
    """Build the domain, write and read relations of compute tensor ``t``.

    ``idents`` maps tensor uid → isl identifier (unique within the graph). With ``memo`` (a
    dict shared across one graph build) a primitive whose relations differ from an earlier
    one's only in tuple names (the same op in another layer) reuses the parsed relations,
    renamed, instead of parsing isl text again.
    """
    assert t.op is not None
    dn, rn = loop_names(t)
    names = axis_names(t)
    cons = [
        f"{a.lo} <= {names[a.uid]} < {a.hi}" for a in t.op.axes + t.op.reduce_axes if a.extent > 1
    ]
    stmt = f"S_{idents[t.uid]}"
    it = ", ".join(dn + rn)
    domain_s = f"{{ S[{it}] : {' and '.join(cons) or 'true'} }}"
    write_s = f"{{ S[{it}] -> T[{', '.join(out_index(t))}] }}"
    reads_s = []
    guarded = guarded_reads(t.op.body, names)
    for r, guard in guarded:
        # a data-dependent subscript may select any element along its dimension
        subs = ", ".join(
            f"z{d}" if isinstance(s, ex.DataIndex) else affine_str(s, names)
            for d, s in enumerate(r.indices)
        )
        cond = f" : {guard}" if guard else ""
        reads_s.append((f"{{ S[{it}] -> X[{subs}]{cond} }}", r.tensor.shape))
    key = (domain_s, write_s, tuple(reads_s))
    hit = memo.get(key) if memo is not None else None
    if hit is None:
        domain = isl.Set(domain_s, context=ctx)
        write = isl.Map(write_s, context=ctx).intersect_domain(domain)
        reads_t = []
        for m_s, shape in reads_s:
            m = isl.Map(m_s, context=ctx)
            reads_t.append(m.intersect_domain(domain).intersect_range(bounds_set("X", shape, ctx)))
        hit = (domain, write, reads_t)
        if memo is not None:
            memo[key] = hit
    domain, write, reads_t = hit
    ins, outs = isl.dim_type.in_, isl.dim_type.out
    domain = domain.set_tuple_name(stmt)
    write = write.set_tuple_name(ins, stmt).set_tuple_name(outs, idents[t.uid])
    reads = [
        (r, m.set_tuple_name(ins, stmt).set_tuple_name(outs, idents[r.tensor.uid]))
        for (r, _), m in zip(guarded, reads_t, strict=True)
    ]
    return PrimitiveRelations(stmt, domain, write, reads)


def affine_condition(e: ex.Expr, names: dict[int, str]) -> str | None:
    """An affine te condition as isl syntax, or None when it is not affine."""
    return _AffineCondition(names).visit(e)


def guarded_reads(body: ex.Expr, names: dict[int, str]) -> list[tuple[ex.Read, str | None]]:
    """Every read of ``body`` with the affine condition under which it executes (None: always).

    ``te.where(c, a, b)`` evaluates only one side, so reads in ``a`` happen only where ``c``
    holds and reads in ``b`` only where it does not; isl then sees exactly the elements read.
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

    def visit_Select(self, e: ex.Select, guard: str | None) -> None:
        c = affine_condition(e.cond, self.names)
        self.visit(e.cond, guard)
        self.visit(e.a, _both(guard, c))
        self.visit(e.b, _both(guard, None if c is None else f"(not {c})"))
