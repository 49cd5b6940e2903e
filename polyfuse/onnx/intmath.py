"""Integer arithmetic with ONNX's rules that te has no single operator for: ``Div`` of
integers truncates toward zero (C++), ``Mod`` with ``fmod=0`` takes the divisor's sign
(numpy ``mod``) and with ``fmod=1`` the dividend's (C ``fmod``); a zero divisor gives 0 (the
ONNX reference's numpy result).

te divides integers by constants only (``//`` floors, ``%`` takes the divisor's sign), so:

- a constant divisor ``c``: ``a // c`` and ``a % c`` corrected by one where the remainder is
  nonzero and the signs differ (the ONNX reference's own formula) — exact over the whole
  int32/int64 range;
- a run-time int32 divisor: the quotient of the operands as float64, truncated. It is exact:
  a non-integral quotient ``a / b`` lies at least ``1 / |b|`` from every integer, and float64
  rounds it by at most ``|a / b| * 2**-53 < 1 / |b|`` (``|a| < 2**31``), so truncation (and
  floor) never cross an integer; the remainder ``a - b * q`` is then exact in wrapping int32;
- a run-time int64 divisor (:func:`_int64_quotient`): the float64 quotient is only an
  estimate there (the operands round beyond 2**53); its remainder ``a - q0 * b``, exact in
  wrapping int64, is divided again in float64 and the result corrected by one where the
  remainder has the wrong sign or is not smaller than the divisor. A divisor of magnitude
  ``>= 2**62`` (where a remainder may leave int64) gives ``|q| <= 2``, decided by comparisons.
"""

from __future__ import annotations

from polyfuse import te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Const, Expr


def _const_int(e: Expr) -> int | None:
    if isinstance(e, Const) and isinstance(e.value, int | bool) and not dtypes.is_float(e.dtype):
        return int(e.value)
    return None


def _check(a: Expr, b: Expr, what: str) -> str:
    dt = dtypes.promote(a.dtype, b.dtype)
    if not dtypes.is_int(dt):
        raise UnsupportedOpError(f"{what}: integer operands expected, got {a.dtype}, {b.dtype}")
    return dt


def _int64_quotient(a: Expr, b: Expr) -> Expr:
    """``trunc(a / b)`` of int64 ``a`` and a nonzero run-time int64 ``b``, exact.

    ``q0``, the truncated float64 quotient, is within ``|q| * 2**-51 + 1`` of ``q``: within
    one where ``|q| < 2**51``, and otherwise ``|b| <= 2**12``, so ``r0 = a - q0 * b`` holds its
    true value while ``|b| < 2**62`` (``|r0| < 2 |b|`` or ``< 2**24``). ``q0 + trunc(r0 / b)``
    (float64 again, now of small or exactly held values) is within one of ``q``; a last step
    moves it by one where the remainder has the wrong sign (too far) or reaches ``|b|`` (not
    far enough). For ``|b| >= 2**62``, ``|q| <= 2`` is decided by comparisons."""
    i64 = "int64"

    def q_of(x: Expr, y: Expr) -> Expr:
        return te.cast(te.cast(x, "float64") / te.cast(y, "float64"), i64)

    q0 = q_of(a, b)
    q1 = q0 + q_of(a - q0 * b, b)
    r1 = a - q1 * b
    s = te.where(te.not_equal(a < 0, b < 0), te.const(-1, i64), te.const(1, i64))
    mag_b = te.where(b < 0, -b, b)
    over = te.not_equal(r1, 0) & te.not_equal(r1 < 0, a < 0)  # the remainder's sign is wrong
    under = te.where(r1 < 0, -r1, r1) >= mag_b
    small = te.where(over, q1 - s, te.where(under, q1 + s, q1))
    # |b| >= 2**62 (b = -2**63 included, whose magnitude wraps to itself)
    lo = te.const(-(2**63), i64)
    qa = te.where(
        a >= mag_b,
        te.const(1, i64),
        te.where(
            te.equal(a, lo) & te.equal(mag_b, te.const(2**62, i64)),
            te.const(-2, i64),
            te.where(a <= -mag_b, te.const(-1, i64), te.const(0, i64)),
        ),
    )
    big = te.where(
        te.equal(b, lo),
        te.cast(te.equal(a, lo), i64),
        te.where(b > 0, qa, -qa),
    )
    is_big = (b >= te.const(2**62, i64)) | (b <= te.const(-(2**62), i64))
    return te.where(is_big, big, small)


def _trunc_quotient(a: Expr, b: Expr, dt: str) -> Expr:
    """``trunc(a / b)`` (0 where ``b == 0``) of integer ``a``, ``b`` in dtype ``dt``."""
    c = _const_int(b)
    if c is not None:
        if c == 0:
            return te.cast(a * 0, dt)
        q, r = a // c, a % c
        adj = te.not_equal(r, 0) & ((a < 0) if c > 0 else (a > 0))
        return q + te.cast(adj, dt)
    if dt == "int64":
        q = _int64_quotient(te.cast(a, dt), te.cast(b, dt))
    else:  # int32: exact through float64 (module docstring); int64 → int32 wraps -2**31 / -1
        f = te.cast(a, "float64") / te.cast(b, "float64")
        q = te.cast(te.cast(f, "int64"), dt)
    return te.where(te.equal(b, 0), te.cast(0, dt), q)


def int_div(a: Expr, b: Expr, what: str = "Div") -> Expr:
    """ONNX ``Div`` of integers: the quotient truncated toward zero; 0 for a zero divisor."""
    dt = _check(a, b, what)
    return _trunc_quotient(a, b, dt)


def int_mod(a: Expr, b: Expr, fmod: bool, what: str = "Mod") -> Expr:
    """ONNX ``Mod`` of integers: ``fmod`` the remainder of the truncated quotient (the
    dividend's sign), else of the floored one (the divisor's sign); 0 for a zero divisor."""
    dt = _check(a, b, what)
    c = _const_int(b)
    if c is not None:
        if c == 0:
            return te.cast(a * 0, dt)
        r = a % c  # the divisor's sign
        if not fmod:
            return te.cast(r, dt)
        adj = te.not_equal(r, 0) & ((a < 0) if c > 0 else (a > 0))
        return r - te.cast(adj, dt) * c
    rt = a - b * _trunc_quotient(a, b, dt)  # the dividend's sign; exact in wrapping integers
    if not fmod:
        flip = te.not_equal(rt, 0) & te.not_equal(rt < 0, b < 0)
        rt = te.where(flip, rt + b, rt)
    return te.where(te.equal(b, 0), te.cast(0, dt), rt)


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
    small = _int64_quotient(a, b)
    big_b = te.cast(flip_sign_bit(a) >= flip_sign_bit(b), i64)
    q2 = _int64_quotient(flip_sign_bit(a // 2), b) * 2
    big_a = q2 + te.cast(flip_sign_bit(a - q2 * b) >= flip_sign_bit(b), i64)
    q = te.where(b < 0, big_b, te.where(a < 0, big_a, small))
    return te.where(te.equal(b, 0), te.const(0, i64), q)


def uint64_mod(a: Expr, b: Expr) -> Expr:
    """Unsigned 64-bit ``a % b`` (both ONNX modes agree on unsigned values); 0 where ``b == 0``."""
    a, b = te.cast(a, "int64"), te.cast(b, "int64")
    return te.where(te.equal(b, 0), te.const(0, "int64"), a - b * uint64_div(a, b))
