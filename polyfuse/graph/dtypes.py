"""The dtypes of polyfuse and the typing rules of tensor expressions.

Every tensor (placeholder, compute, constant) and every expression node has one of
:data:`DTYPES`. The rules, written once here and in the README's *Dtypes* section:

Promotion of two operands (``+ - * max min pow``, ``where``'s branches) follows PyTorch:
categories rank bool < integer < floating; a higher category wins, and within a category the
wider dtype wins. float16 with bfloat16 gives float32 and uint8 with int8 gives int16 (neither
holds the other)::

    promote | bool  u8    i8    i16   i32   i64   f16   bf16  f32   f64
    --------+------------------------------------------------------------
    bool    | bool  u8    i8    i16   i32   i64   f16   bf16  f32   f64
    u8      | u8    u8    i16   i16   i32   i64   f16   bf16  f32   f64
    i8      | i8    i16   i8    i16   i32   i64   f16   bf16  f32   f64
    i16     | i16   i16   i16   i16   i32   i64   f16   bf16  f32   f64
    i32     | i32   i32   i32   i32   i32   i64   f16   bf16  f32   f64
    i64     | i64   i64   i64   i64   i64   i64   f16   bf16  f32   f64
    f16     | f16   f16   f16   f16   f16   f16   f16   f32   f32   f64
    bf16    | bf16  bf16  bf16  bf16  bf16  bf16  f32   bf16  f32   f64
    f32     | f32   f32   f32   f32   f32   f32   f32   f32   f32   f64
    f64     | f64   f64   f64   f64   f64   f64   f64   f64   f64   f64

(u8 = uint8, i8 = int8, i16 = int16, i32 = int32, i64 = int64, f16 = float16,
bf16 = bfloat16, f32 = float32, f64 = float64.)

(numpy differs in one corner: int32 with float16 is float64 there; here, as in torch, the
float operand's dtype wins.)

Python numbers are *weak*: beside a tensor value of the same or a higher category they take
that value's dtype (``x_f16 * 2.5`` is float16, ``i + 1`` stays int32); beside a lower category
they take the default dtype of their own category, float32 or int32 (``i * 0.5`` is float32).
An int literal that does not fit int32 is int64. Beside a uint8, int8 or int16 value an int
keeps that dtype (``x_u8 + 1`` is uint8) and must fit it (``te.compute`` refuses ``x_u8 + 300``,
as torch does).

Division: ``/`` is true division; of two integer or bool operands it gives float32, otherwise
the promoted float dtype. ``//`` and ``%`` floor (Python, numpy, ``torch.floor_divide`` and
``torch.remainder``): ``-7 // 2 == -4``, ``-7 % 2 == 1``, the remainder takes the divisor's
sign. Integer ``//`` and ``%`` need a nonzero constant divisor (``te.compute`` checks);
``te.truncdiv``/``te.truncmod`` take any integer divisor and round toward zero (C's ``/`` and
``%``), 0 by zero and ``INT_MIN / -1`` wrapping.

Integer overflow: integer arithmetic wraps in two's complement at every operation (numpy's
and torch's integers, CUDA's integer units); kernels compute uint8, int8 and int16 in C's
``int`` and wrap the result of each operation to its width; kernels and
:func:`polyfuse.reference.evaluate` agree.

Comparisons, ``te.isnan``/``isinf`` and ``&``/``|`` give bool. ``te.cast(x, dtype)`` converts
explicitly: to an integer it truncates toward zero (a float out of the integer's range
saturates, NaN gives 0; an integer wraps to the narrower width), to bool it tests ``!= 0``,
to a float it rounds to nearest even. Unary math (``exp``, ``tanh``, …) keeps a float
operand's dtype and gives float32 for an integer or bool one; ``-x`` and ``abs`` keep the
dtype.

Reductions (``te.sum``/``max``/``min``) give the body's dtype (the sum of bools is int32) and
*accumulate* in :func:`accumulate_dtype`: float32 for float16 and bfloat16 bodies (so a
4096-long float16 sum does not stall at 2048), the body's own dtype otherwise; ``accumulate=``
overrides it and the compute records it for the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

import ml_dtypes
import numpy as np

from polyfuse.base.errors import DtypeError

__all__ = [
    "DTYPES",
    "DType",
    "Tolerance",
    "accumulate_dtype",
    "check_dtype",
    "info",
    "is_float",
    "is_int",
    "numpy_dtype",
    "promote",
    "promote_weak",
    "register_dtype",
    "tolerance",
    "true_divide_dtype",
]


@dataclass(frozen=True)
class DType:
    """One dtype: its name, size in bytes, category (``"b"`` bool, ``"i"`` integer, ``"f"``
    floating) and the numpy dtype that stores it (``ml_dtypes.bfloat16`` for bfloat16)."""

    name: str
    itemsize: int
    kind: str
    numpy: np.dtype

    @property
    def rank(self) -> int:
        """Category rank for promotion: bool 0, integer 1, floating 2."""
        return "bif".index(self.kind)


DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType("bool", 1, "b", np.dtype(np.bool_)),
        DType("uint8", 1, "i", np.dtype(np.uint8)),
        DType("int8", 1, "i", np.dtype(np.int8)),
        DType("int16", 2, "i", np.dtype(np.int16)),
        DType("int32", 4, "i", np.dtype(np.int32)),
        DType("int64", 8, "i", np.dtype(np.int64)),
        DType("float16", 2, "f", np.dtype(np.float16)),
        DType("bfloat16", 2, "f", np.dtype(ml_dtypes.bfloat16)),
        DType("float32", 4, "f", np.dtype(np.float32)),
        DType("float64", 8, "f", np.dtype(np.float64)),
    )
}

#: The dtype of a Python float (and of integer true division), and of a Python int.
DEFAULT_FLOAT = "float32"
DEFAULT_INT = "int32"
#: Half-precision floats: reductions over them accumulate in float32 unless told otherwise.
HALF_DTYPES = ("float16", "bfloat16")
#: Integers narrower than int32: computed in C's int and wrapped to their width after every
#: operation (torch's and numpy's arithmetic on them).
NARROW_INTS = ("uint8", "int8", "int16")


def check_dtype(dtype: object, what: str) -> str:
    """``dtype`` as a name of :data:`DTYPES` (a numpy dtype or ``np.float16`` is accepted);
    a :class:`DtypeError` naming ``what`` and every valid dtype otherwise."""
    name = dtype if isinstance(dtype, str) else None
    if name is None:
        try:
            name = np.dtype(dtype).name  # type: ignore[call-overload]
        except TypeError:
            name = None
    if name not in DTYPES:
        raise DtypeError(f"{what}: unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    return name


def info(dtype: str) -> DType:
    """The :class:`DType` of a dtype name."""
    return DTYPES[check_dtype(dtype, "dtype")]


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype that stores ``dtype``."""
    return info(dtype).numpy


def is_float(dtype: str) -> bool:
    return DTYPES[dtype].kind == "f"


def is_int(dtype: str) -> bool:
    return DTYPES[dtype].kind == "i"


def promote(a: str, b: str) -> str:
    """The dtype of a binary operation on values of dtypes ``a`` and ``b`` (the table above)."""
    da, db = DTYPES[a], DTYPES[b]
    if da.rank != db.rank:
        return a if da.rank > db.rank else b
    if a == b:
        return a
    if {a, b} == set(HALF_DTYPES):
        return "float32"
    if {a, b} == {"uint8", "int8"}:  # neither holds the other
        return "int16"
    return a if da.itemsize > db.itemsize else b


def promote_weak(strong: str, weak: str) -> str:
    """The dtype of an operation between a value of dtype ``strong`` and a Python number whose
    own dtype is ``weak`` (float32, int32/int64 by its size, or bool): the strong dtype unless
    the number is of a higher category, or an int too wide for an int32 operand."""
    ds, dw = DTYPES[strong], DTYPES[weak]
    if dw.rank > ds.rank:
        return weak
    if dw.rank == ds.rank == 1:
        # a narrow integer keeps its dtype (torch's: ``x_u8 + 1`` is uint8); te.compute
        # refuses a number outside its range
        return strong if strong in NARROW_INTS else promote(strong, weak)
    return strong


def true_divide_dtype(a: str, b: str) -> str:
    """The dtype of ``a / b``: float32 for two integer or bool operands, else the promoted
    float dtype."""
    p = promote(a, b)
    return p if is_float(p) else DEFAULT_FLOAT


def accumulate_dtype(op: str, body: str) -> str:
    """The default accumulator of reduction ``op`` over values of dtype ``body``: float32 for
    half precision, the reduction's result dtype otherwise (int32 for a sum of bools)."""
    if body in HALF_DTYPES:
        return "float32"
    return reduce_dtype(op, body)


def register_dtype(dtype: str) -> str:
    """The dtype a kernel holds values of ``dtype`` in (registers, shared memory, reduction
    accumulators): float32 for float16/bfloat16/float32 (16-bit values are widened when
    loaded), the dtype itself otherwise (float64 in doubles, integers and bools as such)."""
    return "float32" if dtype in HALF_DTYPES else dtype


def reduce_dtype(op: str, body: str) -> str:
    """The result dtype of reduction ``op`` over values of dtype ``body``: the body's dtype,
    except that a sum counts bools in int32."""
    return DEFAULT_INT if op == "sum" and body == "bool" else body


@dataclass(frozen=True)
class Tolerance:
    """How far a computed value may be from the float64 reference: ``|got - want| <= atol +
    rtol * |want|``. Integers and bools compare exactly."""

    rtol: float
    atol: float

    def allclose(self, got: np.ndarray, want: np.ndarray) -> bool:
        """NaN-aware ``np.allclose`` with this tolerance (in float64)."""
        g = np.asarray(got).astype(np.float64)
        w = np.asarray(want).astype(np.float64)
        return bool(np.allclose(g, w, rtol=self.rtol, atol=self.atol, equal_nan=True))


#: Per dtype, the tolerance of a result stored in it against the float64 reference: about
#: eight units of roundoff (a few roundings of a short chain plus storage) for the half types;
#: float32 keeps the figures the fuzzer has always used (transcendental functions included).
TOLERANCES: dict[str, Tolerance] = {
    "float16": Tolerance(rtol=4e-3, atol=1e-3),
    "bfloat16": Tolerance(rtol=3.2e-2, atol=1e-2),
    "float32": Tolerance(rtol=1e-4, atol=1e-5),
    "float64": Tolerance(rtol=1e-9, atol=1e-12),
    "uint8": Tolerance(rtol=0.0, atol=0.0),
    "int8": Tolerance(rtol=0.0, atol=0.0),
    "int16": Tolerance(rtol=0.0, atol=0.0),
    "int32": Tolerance(rtol=0.0, atol=0.0),
    "int64": Tolerance(rtol=0.0, atol=0.0),
    "bool": Tolerance(rtol=0.0, atol=0.0),
}


def tolerance(dtype: str) -> Tolerance:
    """The tolerance of results of dtype ``dtype`` (:data:`TOLERANCES`); the one table tests
    and the fuzzer compare with."""
    return TOLERANCES[check_dtype(dtype, "tolerance")]
