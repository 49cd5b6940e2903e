"""ONNX's 8- and 4-bit floats and 4- and 2-bit integers, held in float32 (which holds every
one of their values exactly; see :func:`~polyfuse.onnx.common.storage_dtype`): converting a
value onto their grids.

A float8/float4 value is ``rint(|v| / q) * q`` with the quantum ``q = 2**(max(e, emin) - m)``
(``e`` the exponent of ``|v|``, ``m`` mantissa bits, ``emin`` the smallest normal exponent).
The division and product are by powers of two, so every step is exact in float32 (no
approximate division on a GPU either), and ``rint`` rounds halves to even as IEEE
conversions do. ``e`` comes from ``floor(log2|v|)`` corrected by two exact ``exp2``
comparisons, so a ``log2`` that rounds up just below a power of two cannot pick the wrong
binade. Past the largest finite value (an infinity too): ``saturate`` clips to it, as ONNX's
reference does; otherwise the type's infinity, or NaN where it has none. float4e2m1 always
saturates. 4- and 2-bit integers wrap (two's complement: int4 -9 is 7), as ONNX's Cast does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from polyfuse import te
from polyfuse.graph.expr import Expr


@dataclass(frozen=True)
class FloatFormat:
    """A narrow float: mantissa bits, smallest normal exponent, largest finite value, and
    whether it has an infinity."""

    mantissa: int
    emin: int
    largest: float
    has_inf: bool


#: the narrow floats a Cast or QuantizeLinear can produce, by numpy (ml_dtypes) name
FLOAT_FORMATS = {
    "float8_e4m3fn": FloatFormat(3, -6, 448.0, False),
    "float8_e4m3fnuz": FloatFormat(3, -7, 240.0, False),
    "float8_e5m2": FloatFormat(2, -14, 57344.0, True),
    "float8_e5m2fnuz": FloatFormat(2, -15, 57344.0, False),
    "float4_e2m1fn": FloatFormat(1, 0, 6.0, False),
}

#: the narrow integers, with their bit widths
INT_BITS = {"int4": 4, "uint4": 4, "int2": 2, "uint2": 2}


def round_to_float(v: Expr, name: str, saturate: bool) -> Expr:
    """``v`` (any float dtype) rounded onto the grid of narrow float ``name``, as float32."""
    fmt = FLOAT_FORMATS[name]
    if name == "float4_e2m1fn":
        saturate = True  # no infinity, no NaN: ONNX and ml_dtypes clip
    x = te.cast(v, "float32") if v.dtype != "float32" else v
    a = te.abs(x)
    e = te.floor(te.log2(a))
    e = te.where(te.exp2(e) > a, e - 1.0, e)
    e = te.where(te.exp2(e + 1.0) <= a, e + 1.0, e)
    e = te.maximum(e, float(fmt.emin))
    m = float(fmt.mantissa)
    r = te.round(a * te.exp2(m - e)) * te.exp2(e - m)  # products by powers of two: exact
    inf = te.const(math.inf, "float32")
    beyond = te.const(math.inf if fmt.has_inf else math.nan, "float32")
    big = te.const(fmt.largest, "float32")
    over = big if saturate else beyond
    r = te.where(r > fmt.largest, over, r)
    r = te.where(te.equal(a, inf), over, r)
    r = te.where(te.isnan(x), te.const(math.nan, "float32"), r)
    return te.where(x < 0.0, -r, r)


def wrap_to_int(v: Expr, name: str) -> Expr:
    """``v`` truncated toward zero and wrapped into narrow integer ``name``, as float32."""
    bits = INT_BITS[name]
    x = te.cast(v, "float32") if v.dtype != "float32" else v
    t = te.where(x < 0.0, te.ceil(x), te.floor(x))
    span = float(1 << bits)
    lo = 0.0 if name.startswith("u") else -float(1 << (bits - 1))
    s = t - lo
    return s - te.floor(s / span) * span + lo


def is_narrow(dt: np.dtype) -> bool:
    """Is ``dt`` one of the narrow floats or integers this module rounds onto?"""
    return dt.name in FLOAT_FORMATS or dt.name in INT_BITS
