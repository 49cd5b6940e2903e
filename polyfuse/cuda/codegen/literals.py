"""C text of constants: every literal a kernel prints holds exactly its value in its dtype.

A float64 constant is the shortest decimal that reads back as the same double (C reads
decimal literals correctly rounded). A float32 constant is written as the float32 value
numpy gives it (``x * 1e39`` multiplies by inf, ``x * 1e-50`` by 0), so NVRTC never sees a
literal out of the float range and every
literal reads back as the same float32; integers are int32 or ``LL`` int64 literals.
"""

from __future__ import annotations

import math

import numpy as np

from polyfuse.graph import expr as ex

__all__ = ["c_double", "c_float", "c_int"]


def c_float(v: float) -> str:
    """A float32 literal holding exactly ``v`` rounded to float32, the value numpy's float32
    gives it: ``INFINITY`` past the float range (``1e39``, ``3.4028236e38``), ``0.0f`` below
    it (``1e-50``), a denormal as a hex float (``0x1p-149f``), NaN by its bits; otherwise the
    shortest decimal that reads back as the same float32."""
    x = np.float32(ex.float32_value(v))
    if math.isnan(x):
        bits = int(np.array(x).view(np.uint32))
        return f"__uint_as_float(0x{bits:08x}u)"
    if math.isinf(x):
        return "INFINITY" if x > 0 else "(-INFINITY)"
    if x != 0 and abs(x) < np.finfo(np.float32).tiny:  # denormal: decimal text would round
        mant, _, exp = float(abs(x)).hex().removeprefix("0x").partition("p")
        s = f"0x{mant.rstrip('0').rstrip('.')}p{exp}"
    else:
        s = str(abs(x))  # numpy prints the shortest decimal that round-trips the float32
        if "e" not in s and "." not in s:
            s += ".0"
    return f"(-{s}f)" if math.copysign(1.0, x) < 0 else f"{s}f"


def c_double(v: float) -> str:
    """A float64 literal holding exactly ``v`` rounded to float64: the shortest decimal that
    reads back as the same double (Python's ``repr``), ``INFINITY`` as a double, NaN by its
    bits."""
    x = ex.float64_value(v)
    if math.isnan(x):
        bits = int(np.array(x, np.float64).view(np.uint64))
        return f"__longlong_as_double(0x{bits:016x}LL)"
    if math.isinf(x):
        return "((double)INFINITY)" if x > 0 else "(-(double)INFINITY)"
    s = repr(abs(x))
    if "e" not in s and "." not in s:
        s += ".0"
    return f"(-{s})" if math.copysign(1.0, x) < 0 else s


def c_int(v: int, dtype: str) -> str:
    """An int32 or int64 (``LL``) literal; negatives in parentheses, INT_MIN as ``-MAX - 1``
    (C has no negative literals, and ``2147483648`` alone is not an int)."""
    suffix = "LL" if dtype == "int64" else ""
    if v >= 0:
        return f"{v}{suffix}"
    lo = ex.INT64_RANGE[0] if dtype == "int64" else ex.INT32_RANGE[0]
    if v == lo:
        return f"(-{-v - 1}{suffix} - 1)"
    return f"({v}{suffix})"
