"""Integer arithmetic with ONNX's rules: ``Div`` of integers truncates toward zero (C++),
``Mod`` with ``fmod=0`` takes the divisor's sign (numpy ``mod``) and with ``fmod=1`` the
dividend's (C ``fmod``); a zero divisor gives 0 (the ONNX reference's numpy result). All of
them are te's :func:`~polyfuse.te.truncdiv`/:func:`~polyfuse.te.truncmod` (exact over the whole
int32/int64 range, by constants and tensor values alike, 0 by zero), with the divisor's sign
restored for ``fmod=0``; uint64 values held in int64 divide unsigned here too.
"""

from __future__ import annotations

from polyfuse import te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr


def _check(a: Expr, b: Expr, what: str) -> str:
    dt = dtypes.promote(a.dtype, b.dtype)
    if not dtypes.is_int(dt):
        raise UnsupportedOpError(f"{what}: integer operands expected, got {a.dtype}, {b.dtype}")
    return dt


def _as(x: Expr, dt: str) -> Expr:
    return x if x.dtype == dt else te.cast(x, dt)


def int_div(a: Expr, b: Expr, what: str = "Div") -> Expr:
    """ONNX ``Div`` of integers: the quotient truncated toward zero; 0 for a zero divisor."""
    dt = _check(a, b, what)
    return te.truncdiv(_as(a, dt), _as(b, dt))


def int_mod(a: Expr, b: Expr, fmod: bool, what: str = "Mod") -> Expr:
    """ONNX ``Mod`` of integers: ``fmod`` the remainder of the truncated quotient (the
    dividend's sign), else of the floored one (the divisor's sign); 0 for a zero divisor."""
    dt = _check(a, b, what)
    a, b = _as(a, dt), _as(b, dt)
    rt = te.truncmod(a, b)  # the dividend's sign; 0 where b == 0
    if fmod:
        return rt
    flip = te.not_equal(rt, 0) & te.not_equal(rt < 0, b < 0)
    return te.where(flip, rt + b, rt)


def flip_sign_bit(x: Expr) -> Expr:
    """``x + 2**63`` (wrapping): the top bit flipped, which maps the unsigned order of uint64
    bits held in int64 onto the signed order."""
    return x + te.const(-(2**63), "int64")


def uint64_div(a: Expr, b: Expr) -> Expr:
    """Unsigned 64-bit ``a // b`` of uint64 bits held in int64 (0 where ``b == 0``).

    Both below 2**63: the signed quotient. ``b >= 2**63``: ``a >= b`` (unsigned), 0 or 1.
    ``a >= 2**63 > b``: ``a >> 1`` (``a // 2 + 2**63``, wrapping) divided by ``b``, doubled,
    then one more where the remainder (in ``[0, 2b)``) reaches ``b``."""
    i64 = "int64"
    a, b = te.cast(a, i64), te.cast(b, i64)
    small = te.truncdiv(a, b)
    big_b = te.cast(flip_sign_bit(a) >= flip_sign_bit(b), i64)
    q2 = te.truncdiv(flip_sign_bit(a // 2), b) * 2
    big_a = q2 + te.cast(flip_sign_bit(a - q2 * b) >= flip_sign_bit(b), i64)
    q = te.where(b < 0, big_b, te.where(a < 0, big_a, small))
    return te.where(te.equal(b, 0), te.const(0, i64), q)


def uint64_mod(a: Expr, b: Expr) -> Expr:
    """Unsigned 64-bit ``a % b`` (both ONNX modes agree on unsigned values); 0 where ``b == 0``."""
    a, b = te.cast(a, "int64"), te.cast(b, "int64")
    return te.where(te.equal(b, 0), te.const(0, "int64"), a - b * uint64_div(a, b))
