"""Building the kernel IR's integer expressions by hand (the tensor-core lowering's index
arithmetic): small constructors over :class:`KInt`/:class:`KVar`/:class:`KOp` that fold
constants and drop identities, and a shared tile's element offset through its layout
(:class:`polyfuse.poly.swizzle.SharedLayout`) as an expression.

Every operand may be given as an ``int`` (a constant), a ``str`` (a variable's name) or a
:class:`KExpr`. The C operators ``/`` ``%`` ``&`` ``>>`` are C's: the callers use them on
values they know are non-negative (lane and thread indices, tile offsets).
"""

from __future__ import annotations

from polyfuse.cuda.codegen.kernel_expr import KExpr, KInt, KOp, KRef, KVar
from polyfuse.poly.swizzle import SharedLayout

Operand = KExpr | int | str


def e(x: Operand) -> KExpr:
    """``x`` as an expression (an int: a constant; a str: a variable)."""
    if isinstance(x, KExpr):
        return x
    if isinstance(x, bool):
        return KInt(int(x))
    return KInt(x) if isinstance(x, int) else KVar(x)


def _const(x: KExpr) -> int | None:
    return x.value if isinstance(x, KInt) else None


def add(*xs: Operand) -> KExpr:
    """The sum (constants folded into one trailing term, zeros dropped, nested sums
    flattened: C adds left to right, so ``a + (b + c)`` is written ``a + b + c``)."""
    terms, const = [], 0
    for x in map(e, xs):
        for y in x.args if isinstance(x, KOp) and x.op == "+" else (x,):
            c = _const(y)
            if c is None:
                terms.append(y)
            else:
                const += c
    if const or not terms:
        terms.append(KInt(const))
    return terms[0] if len(terms) == 1 else KOp("+", tuple(terms))


def sub(a: Operand, b: Operand) -> KExpr:
    a, b = e(a), e(b)
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return KInt(ca - cb)
    return a if cb == 0 else KOp("-", (a, b))


def mul(a: Operand, b: Operand) -> KExpr:
    """The product (a constant 0 or 1 folded)."""
    a, b = e(a), e(b)
    ca, cb = _const(a), _const(b)
    if ca is not None and cb is not None:
        return KInt(ca * cb)
    if ca == 0 or cb == 0:
        return KInt(0)
    if ca == 1:
        return b
    if cb == 1:
        return a
    return KOp("*", (a, b))


def _binary(op: str, a: Operand, b: Operand) -> KExpr:
    return KOp(op, (e(a), e(b)))


def div(a: Operand, b: Operand) -> KExpr:
    """C's ``a / b`` (non-negative ``a``; ``b`` 1 dropped)."""
    return e(a) if _const(e(b)) == 1 else _binary("/", a, b)


def mod(a: Operand, b: Operand) -> KExpr:
    return _binary("%", a, b)


def band(a: Operand, b: Operand) -> KExpr:
    return _binary("&", a, b)


def shr(a: Operand, b: Operand) -> KExpr:
    return e(a) if _const(e(b)) == 0 else _binary(">>", a, b)


def shl(a: Operand, b: Operand) -> KExpr:
    return e(a) if _const(e(b)) == 0 else _binary("<<", a, b)


def bor(a: Operand, b: Operand) -> KExpr:
    return _binary("|", a, b)


def xor(a: Operand, b: Operand) -> KExpr:
    return _binary("^", a, b)


def cmp(op: str, a: Operand, b: Operand) -> KExpr:
    """A comparison (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``) as 0/1."""
    return _binary(op, a, b)


def select(c: Operand, a: Operand, b: Operand) -> KExpr:
    """``c ? a : b`` (a constant ``c`` folded)."""
    c = e(c)
    if isinstance(c, KInt):
        return e(a) if c.value else e(b)
    return KOp("?:", (c, e(a), e(b)))


def all_of(*xs: Operand, op: str = "&&") -> KExpr:
    """The conjunction of ``xs`` (``op`` ``&``: evaluated whole, one predicate); constant
    true terms dropped (none left: the constant 1)."""
    terms = [t for t in map(e, xs) if not (isinstance(t, KInt) and t.value)]
    if not terms:
        return KInt(1)
    return terms[0] if len(terms) == 1 else KOp(op, tuple(terms))


def in_range(x: Operand, n: int) -> KExpr:
    """``0 <= x < n`` by one unsigned compare."""
    return KOp("ult", (e(x), KInt(n)))


def addr(ref: KRef) -> KExpr:
    """``&ref``."""
    return KOp("addr", (ref,))


def layout_offset(lay: SharedLayout, r: Operand, c: Operand, aligned: bool = True) -> KExpr:
    """:meth:`SharedLayout.offset` of tile row ``r`` and column ``c`` (non-negative
    expressions) as an expression; ``aligned``: the column is a multiple of the 16-byte chunk.
    The same arithmetic as :meth:`SharedLayout.offset_text`."""
    r, c = e(r), e(c)
    if not (lay.swizzled or lay.blocked):
        return add(mul(r, lay.stride), c)
    per_row = lay.row // lay.chunk
    chunk = xor(band(div(c, lay.chunk), per_row - 1), band(shr(r, lay.shift), lay.mask))
    terms = [mul(div(c, lay.row), lay.block), mul(r, lay.stride), mul(chunk, lay.chunk)]
    if not aligned:
        terms.append(mod(c, lay.chunk))
    return add(*terms)


__all__ = [
    "Operand",
    "add",
    "addr",
    "all_of",
    "band",
    "bor",
    "cmp",
    "div",
    "e",
    "in_range",
    "layout_offset",
    "mod",
    "mul",
    "select",
    "shl",
    "shr",
    "sub",
    "xor",
]
