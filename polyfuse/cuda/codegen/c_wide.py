"""C text of the float64, int32, int64 and bool kernels, apart from the float-only printer
text they share (:mod:`polyfuse.cuda.codegen.printer` calls these; it decides nothing here either).

Values of these dtypes live in their own C types (``double``, ``int``, ``long long``,
``bool``: :func:`polyfuse.graph.dtypes.register_dtype`), so their helpers are templates typed
by that C type: max/min that propagate NaN like numpy, Python's floor ``//`` and ``%``,
exact wrapping integer ``**``, and the combine functors of a parallel reduction (the
warp/block combine itself, ``pf_allreduce_*``, is the float prelude's, typed by its
argument). The prelude is printed only where a kernel calls a ``pf_w_`` helper, so float32
kernels keep their text. 128-bit vector words hold 4 ints (``int4``) or 2 doubles/int64
(``double2``/``longlong2``).
"""

from __future__ import annotations

import numpy as np

from polyfuse.cuda.codegen.literals import c_int
from polyfuse.graph.dtypes import DTYPES, NARROW_INTS, numpy_dtype

__all__ = [
    "REDUCE_OPS",
    "UNARY_F64",
    "WIDE_PRELUDE",
    "WORDS",
    "cast_from_float",
    "int_floor",
    "wide_identity",
    "word_load",
    "word_store",
]

#: The C types of the dtypes this module prints.
_C = {"float64": "double", "int32": "int", "int64": "long long", "bool": "bool",
      "uint8": "unsigned char", "int8": "signed char", "int16": "short"}  # fmt: skip

#: Helpers of kernels over float64, int32, int64 and bool tensors (typed by their template
#: argument), printed only where a kernel calls one (``pf_w_``).
WIDE_PRELUDE = """\
// Typed helpers of float64 / integer / bool kernels.
template <typename T> PF_INLINE T pf_w_max(T a, T b) { return (a > b || a != a) ? a : b; }
template <typename T> PF_INLINE T pf_w_min(T a, T b) { return (a < b || a != a) ? a : b; }
// Python's a // b and a % b of integers (floor; the remainder takes the divisor's sign).
template <typename T> PF_INLINE T pf_w_fdiv(T a, T b) {
  const T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> PF_INLINE T pf_w_mod(T a, T b) {
  const T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
// C's a / b and a % b of integers (toward zero; te.truncdiv/truncmod), defined everywhere:
// 0 by a zero divisor, INT_MIN / -1 wraps to INT_MIN (-fwrapv on the emulator, as the GPU);
// -1 only of a signed type (T(-1) of unsigned char is 255, an ordinary divisor).
template <typename T> PF_INLINE T pf_w_tdiv(T a, T b) {
  return b == 0 ? T(0) : (T(-1) < T(0) && b == T(-1)) ? T(0) - a : a / b;
}
template <typename T> PF_INLINE T pf_w_tmod(T a, T b) {
  return (b == 0 || (T(-1) < T(0) && b == T(-1))) ? T(0) : a % b;
}
// te.shift_left / shift_right (logical): through the unsigned type, 0 outside [0, width).
template <typename T> struct pf_w_unsigned;
template <> struct pf_w_unsigned<unsigned char> { typedef unsigned char U; };
template <> struct pf_w_unsigned<signed char> { typedef unsigned char U; };
template <> struct pf_w_unsigned<short> { typedef unsigned short U; };
template <> struct pf_w_unsigned<int> { typedef unsigned int U; };
template <> struct pf_w_unsigned<long long> { typedef unsigned long long U; };
template <typename T> PF_INLINE T pf_w_shl(T a, T b) {
  typedef typename pf_w_unsigned<T>::U U;
  return (b < 0 || b >= T(8 * sizeof(T))) ? T(0) : (T)(U)((U)a << b);
}
template <typename T> PF_INLINE T pf_w_shr(T a, T b) {
  typedef typename pf_w_unsigned<T>::U U;
  return (b < 0 || b >= T(8 * sizeof(T))) ? T(0) : (T)(U)((U)a >> b);
}
PF_INLINE double pf_w_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
// a ** b of integers, wrapping like every integer product (numpy's); b < 0 truncates 1 / a**-b.
template <typename T> PF_INLINE T pf_w_ipow(T a, T b) {
  if (b < 0) return a == 1 ? T(1) : a == -1 ? ((b & 1) ? T(-1) : T(1)) : T(0);
  T r = 1;
  for (; b > 0; b >>= 1) {
    if (b & 1) r = r * a;
    a = a * a;
  }
  return r;
}
template <typename T> struct pf_w_sum {
  PF_INLINE T operator()(T a, T b) const { return a + b; }
};
template <typename T> struct pf_w_prod {
  PF_INLINE T operator()(T a, T b) const { return a * b; }
};
template <typename T> struct pf_w_maxop {
  PF_INLINE T operator()(T a, T b) const { return pf_w_max<T>(a, b); }
};
template <typename T> struct pf_w_minop {
  PF_INLINE T operator()(T a, T b) const { return pf_w_min<T>(a, b); }
};
"""


#: float64 math: the double overloads of the float functions.
UNARY_F64 = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "erf": "erf",
    "log1p": "log1p",
    "expm1": "expm1",
    "sigmoid": "pf_w_sigmoid",
    "round": "rint",
    "floor": "floor",
    "ceil": "ceil",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "exp2": "exp2",
    "log2": "log2",
    "log10": "log10",
}
#: The combine functors of reductions accumulated in a C type other than float.
REDUCE_OPS = {"sum": "pf_w_sum", "prod": "pf_w_prod", "max": "pf_w_maxop", "min": "pf_w_minop"}
#: 128-bit vector types of the 4- and 8-byte dtypes other than float32, and lanes per word.
WORDS = {"int32": ("int4", 4), "float64": ("double2", 2), "int64": ("longlong2", 2)}


def wide_identity(op: str, dtype: str) -> str:
    """The start value of reduction ``op`` accumulated in ``dtype`` (float64, an integer or
    bool)."""
    if dtype == "float64":
        return {"sum": "0.0", "prod": "1.0", "max": "(-(double)INFINITY)",
                "min": "((double)INFINITY)"}[op]  # fmt: skip
    if dtype == "bool":
        return {"sum": "false", "prod": "true", "max": "false", "min": "true"}[op]
    info = np.iinfo(numpy_dtype(dtype))
    return c_int({"sum": 0, "prod": 1, "max": int(info.min), "min": int(info.max)}[op], dtype)


def cast_from_float(src: str, dst: str, a: str) -> str | None:
    """CUDA's saturating, toward-zero conversion of a float or double ``a`` (``src`` a float
    dtype) to an integer dtype (NaN to 0: a C cast is undefined there; saturated to a narrow
    integer's range), or None for another pair of dtypes."""
    if src not in ("float16", "bfloat16", "float32", "float64"):
        return None
    frm = "double" if src == "float64" else "float"
    if dst in ("int32", "int64"):
        return f"__{frm}2{'int' if dst == 'int32' else 'll'}_rz({a})"
    if dst not in NARROW_INTS:
        return None
    lim = np.iinfo(numpy_dtype(dst))  # through int32, then saturated to the narrow range
    return f"(({_C[dst]})max({lim.min}, min({lim.max}, __{frm}2int_rz({a}))))"


def int_floor(op: str, a: str, b: int, dtype: str) -> str:
    """Python's ``a // b`` or ``a % b`` of integer ``a`` of ``dtype`` by nonzero constant
    ``b``, exact over the whole range (``pf_w_fdiv``/``pf_w_mod``); by ``-1`` the quotient is
    the wrapping negation and the remainder 0 (C's ``INT_MIN / -1`` traps on x86)."""
    t = _C[dtype]
    if b == -1:
        return f"(-{a})" if op == "floordiv" else f"(({t})0)"
    return f"pf_w_{'fdiv' if op == 'floordiv' else 'mod'}<{t}>({a}, {c_int(b, dtype)})"


def word_load(pad: str, ref: str, dtype: str, qs: list[str]) -> tuple[list[str], str]:
    """Lines loading one 128-bit word of ``dtype`` (:data:`WORDS`) per name of ``qs`` from
    ``ref`` on, and the initializer of the lane array."""
    word, per = WORDS[dtype]
    lines = [
        f"{pad}  const {word} {q} = *reinterpret_cast<const {word}*>(&{ref}"
        + (f" + {per * j}" if j else "")
        + ");"
        for j, q in enumerate(qs)
    ]
    return lines, ", ".join(f"{q}.{c}" for q in qs for c in "xyzw"[:per])


def word_store(pad: str, ref: str, dtype: str, width: int, src: str) -> list[str]:
    """Lines storing lane array ``src`` (``width`` lanes of ``dtype``) at ``ref`` as whole
    128-bit words."""
    word, per = WORDS[dtype]
    return [
        f"{pad}  *reinterpret_cast<{word}*>(&{ref}"
        + (f" + {per * j}" if j else "")
        + f") = make_{word}("
        + ", ".join(f"{src}[{per * j + k}]" for k in range(per))
        + ");"
        for j in range(width // per)
    ]


#: the word of 4, 8 or 16 bytes a group of narrow-integer lanes moves in, and its 32-bit parts
_NARROW_WORDS = {4: ("unsigned", ""), 8: ("uint2", "xy"), 16: ("uint4", "xyzw")}


def narrow_load(pad: str, ref: str, dtype: str, width: int, q: str) -> tuple[list[str], str]:
    """The line loading ``width`` lanes of narrow integer ``dtype`` (uint8, int8, int16) at
    ``ref`` as one word of 4, 8 or 16 bytes, and the initializer of the lane array: each lane
    shifted out of its 32-bit part (little-endian, as the GPU and x86 store it)."""
    size = DTYPES[dtype].itemsize
    word, parts = _NARROW_WORDS[width * size]
    per, bits = 4 // size, 8 * size
    line = f"{pad}  const {word} {q} = *reinterpret_cast<const {word}*>(&{ref});"
    vals = []
    for k in range(width):
        part = f"{q}.{parts[k // per]}" if parts else q
        shift = (k % per) * bits
        vals.append(f"(({_C[dtype]})({part} >> {shift}))" if shift else f"(({_C[dtype]}){part})")
    return [line], ", ".join(vals)


def narrow_store(pad: str, ref: str, dtype: str, width: int, src: str) -> list[str]:
    """The line storing lane array ``src`` (``width`` lanes of narrow integer ``dtype``) at
    ``ref`` as one word: each 32-bit part the lanes' bits or-ed into place."""
    size = DTYPES[dtype].itemsize
    word, parts = _NARROW_WORDS[width * size]
    per, bits = 4 // size, 8 * size
    bare = "unsigned char" if size == 1 else "unsigned short"
    values = []
    for p in range(max(1, len(parts))):
        terms = [f"(unsigned)({bare}){src}[{p * per + j}]" for j in range(per)]
        terms = [t if j == 0 else f"({t} << {j * bits})" for j, t in enumerate(terms)]
        values.append(" | ".join(terms))
    value = values[0] if not parts else f"make_{word}({', '.join(values)})"
    return [f"{pad}  *reinterpret_cast<{word}*>(&{ref}) = {value};"]
