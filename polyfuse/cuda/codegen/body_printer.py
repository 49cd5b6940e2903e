"""The statement printer: the loads and stores of one statement instance as C.

:func:`c_stores` writes the :class:`polyfuse.cuda.codegen.kernel_access.KStore` nodes that
:mod:`polyfuse.cuda.codegen.lower_accesses` gave a statement instance, on one line: each access as
its
buffer's element (``name[offset]``, a register scalar, ``array[i][j]``), each value node as its
C expression. Which buffer, index and conversion an access has was decided by that pass;
element types and typed integer arithmetic follow the dtype passes
(``cuda/codegen/lower_dtypes.py``).
:mod:`polyfuse.cuda.codegen.printer` writes the kernel around these statements.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from polyfuse.base.errors import UnsupportedOpError
from polyfuse.base.visitor import Visitor
from polyfuse.cuda.codegen.c_text import c_cond, c_index
from polyfuse.cuda.codegen.c_wide import (
    REDUCE_OPS,
    UNARY_F64,
    cast_from_float,
    int_floor,
    wide_identity,
)
from polyfuse.cuda.codegen.kernel_access import (
    KAddr,
    KAllReduce,
    KBinary,
    KCall,
    KCast,
    KCompare,
    KConst,
    KDataIndex,
    KIdentity,
    KIdx,
    KLoad,
    KLogical,
    KOffset,
    KReduce,
    KSelect,
    KStore,
    KUnary,
    KVal,
)
from polyfuse.cuda.codegen.literals import c_double, c_float, c_int
from polyfuse.cuda.codegen.lower_dtypes import (
    C_TYPES,
    FLOAT_TO_HALF,
    HALF_TO_FLOAT,
    is_float_register,
)
from polyfuse.graph.dtypes import NARROW_INTS, is_float, is_int, numpy_dtype

_UNARY = {
    "exp": "expf",
    "log": "logf",
    "sqrt": "sqrtf",
    "rsqrt": "rsqrtf",
    "tanh": "tanhf",
    "erf": "erff",
    "log1p": "log1pf",
    "expm1": "expm1f",
    "sigmoid": "pf_sigmoid",
    "round": "rintf",  # halves to even (the default rounding mode), as numpy.rint
    "floor": "floorf",
    "ceil": "ceilf",
    "sin": "sinf",
    "cos": "cosf",
    "tan": "tanf",
    "asin": "asinf",
    "acos": "acosf",
    "atan": "atanf",
    "sinh": "sinhf",
    "cosh": "coshf",
    "asinh": "asinhf",
    "acosh": "acoshf",
    "atanh": "atanhf",
    "exp2": "exp2f",
    "log2": "log2f",
    "log10": "log10f",
}
_BITWISE = {"bitand": "&", "bitor": "|", "bitxor": "^"}
_CMP = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_IDENTITY = {"sum": "0.0f", "prod": "1.0f", "max": "-INFINITY", "min": "INFINITY"}
#: operations whose C result (an ``int`` for uint8/int8/int16 operands) may leave a narrow
#: integer's range; the others (comparisons, bitwise, the typed ``pf_w_`` helpers) cannot
_WRAPS = frozenset(("neg", "abs", "bitnot", "add", "sub", "mul", "floordiv"))


def narrowed(dtype: str, text: str) -> str:
    """C expression ``text`` (computed in ``int``) cast back to narrow integer ``dtype``,
    which wraps it to its width (torch's arithmetic); unchanged for other dtypes."""
    return f"(({C_TYPES[dtype]}){text})" if dtype in NARROW_INTS else text


def _int_floor(op: str, a: str, b: int, dtype: str = "int32", data: bool = False) -> str:
    """Python's ``a // b`` or ``a % b`` of integer ``a`` by a nonzero constant ``b``.

    Index arithmetic (int32, ``data`` False: bounded loop variables) uses the prelude's
    ``pf_fdiv``/``pf_mod``, which take a positive divisor (for a negative one
    ``a // b == (-a) // -b`` and ``a % b == -((-a) % -b)``); they overflow near INT_MIN.
    Integer data (``data``: the dividend reads a tensor) and int64 use the typed
    ``pf_w_fdiv``/``pf_w_mod``, exact over the whole range; by ``-1`` the quotient is the
    wrapping negation and the remainder 0 (C's ``INT_MIN / -1`` traps on x86)."""
    if dtype != "int32" or data:
        return int_floor(op, a, b, dtype)
    if b > 0:
        return f"pf_fdiv({a}, {b})" if op == "floordiv" else f"pf_mod({a}, {b})"
    if op == "floordiv":
        return f"pf_fdiv((-{a}), {-b})"
    return f"(-pf_mod((-{a}), {-b}))"


def c_type(dtype: str) -> str | None:
    """The C type a value of ``dtype`` is held in (16-bit floats in float registers)."""
    return "float" if is_float_register(dtype) else C_TYPES.get(dtype)


class ValuePrinter(Visitor[str]):
    """C text of the value nodes of a statement instance (one rule per node class)."""

    node_classes = (
        KIdx, KLoad, KAddr, KConst, KUnary, KBinary, KCompare, KLogical, KSelect, KCast,
        KDataIndex, KCall, KIdentity, KReduce, KAllReduce, KOffset,
    )  # fmt: skip

    def visit_KIdx(self, e: KIdx) -> str:
        return c_index(e.expr)

    def visit_KOffset(self, e: KOffset) -> str:
        terms = []
        for t in e.terms:
            v = self.visit(t.value)
            v = f"({v} - {self.visit(t.lo)})" if t.lo is not None else v
            terms.append(v + (f" * {t.stride}" if t.stride != 1 or t.scaled else ""))
        return " + ".join(terms) or "0"

    def visit_KLoad(self, e: KLoad) -> str:
        return e.buffer.name + "".join(f"[{self.visit(i)}]" for i in e.index)

    def visit_KAddr(self, e: KAddr) -> str:
        if e.ctype:  # one scratch serves combines of two types
            return f"reinterpret_cast<{c_type(e.ctype)}*>({e.buffer.name})"
        return e.buffer.name

    def visit_KConst(self, e: KConst) -> str:
        if e.dtype == "bool":
            return "true" if e.value else "false"
        if is_int(e.dtype):  # a narrow integer's constant is an int literal too
            return c_int(int(e.value), "int64" if e.dtype == "int64" else "int32")
        if e.dtype in FLOAT_TO_HALF:  # its value in its dtype, held in a float register
            return c_float(float(numpy_dtype(e.dtype).type(e.value)))
        if e.dtype == "float64":
            return c_double(e.value)
        return c_float(e.value)

    def visit_KUnary(self, e: KUnary) -> str:
        return narrowed(e.dtype, self._unary(e)) if e.op in _WRAPS else self._unary(e)

    def _unary(self, e: KUnary) -> str:
        a = self.visit(e.a)
        if e.op == "neg":
            return f"(-{a})"
        if e.op == "not" or (e.op == "bitnot" and e.dtype == "bool"):
            return f"(!{a})"
        if e.op == "bitnot":
            return f"(~{a})"
        if e.op == "abs":
            if e.dtype == "float64":
                return f"fabs({a})"
            if e.dtype == "int64":
                return f"llabs({a})"
            return f"fabsf({a})" if is_float_register(e.dtype) else f"abs({a})"
        if e.dtype == "float64":
            return f"{UNARY_F64[e.op]}((double){a})"
        return f"{_UNARY[e.op]}({a})"

    def visit_KBinary(self, e: KBinary) -> str:
        return narrowed(e.dtype, self._binary(e)) if e.op in _WRAPS else self._binary(e)

    def _binary(self, e: KBinary) -> str:
        a, b = self.visit(e.a), self.visit(e.b)
        fl = is_float_register(e.dtype)
        if e.op in ("add", "sub", "mul"):
            return f"({a} {'+-*'['add sub mul'.split().index(e.op)]} {b})"
        if e.op == "div":  # true division, also of integers
            if is_float(e.operands[0]) or is_float(e.operands[1]):
                return f"({a} / {b})"
            return f"((float){a} / (float){b})"
        if e.op == "atan2":
            if e.dtype == "float64":
                return f"atan2((double){a}, (double){b})"
            return f"atan2f((float){a}, (float){b})"
        if e.op == "pow":
            if e.dtype == "float64":
                return f"pow((double){a}, (double){b})"
            if is_int(e.dtype):  # exact and wrapping, not through a float
                t = C_TYPES[e.dtype]
                return f"pf_w_ipow<{t}>(({t}){a}, ({t}){b})"
            return f"powf({a}, {b})"
        if e.op in ("max", "min"):
            if fl:
                return f"pf_f{e.op}f({a}, {b})"
            if e.dtype == "int32":
                return f"{e.op}({a}, {b})"
            return f"pf_w_{e.op}<{C_TYPES[e.dtype]}>({a}, {b})"
        if e.op in _BITWISE:  # integers or bools (te checks)
            return f"({a} {_BITWISE[e.op]} {b})"
        if e.op in ("tdiv", "tmod", "shl", "shr"):  # integers only (te checks)
            t = C_TYPES[e.dtype]
            return f"pf_w_{e.op}<{t}>(({t}){a}, ({t}){b})"
        if e.op in ("floordiv", "mod") and not fl and e.dtype != "float64":
            assert isinstance(e.b, KConst)  # by a nonzero constant (te checks)
            return _int_floor(e.op, a, int(e.b.value), e.dtype, e.data)
        if e.dtype == "float64" and e.op in ("floordiv", "mod"):
            q = f"floor((double){a} / (double){b})"
            return q if e.op == "floordiv" else f"({a} - {b} * {q})"
        if e.op == "floordiv":
            return f"floorf({a} / {b})"
        if e.op == "mod":
            return f"({a} - {b} * floorf({a} / {b}))"
        return self.visit_default(e)

    def visit_KCompare(self, e: KCompare) -> str:
        return f"({self.visit(e.a)} {_CMP[e.op]} {self.visit(e.b)})"

    def visit_KLogical(self, e: KLogical) -> str:
        op = "&&" if e.op == "and" else "||"
        return f"({self.visit(e.a)} {op} {self.visit(e.b)})"

    def visit_KSelect(self, e: KSelect) -> str:
        cond, a, b = self.visit(e.cond), self.visit(e.a), self.visit(e.b)
        # A branch of another C type is converted to the result's first: the emulator's
        # global reads are proxies, and ``c ? ref<float> : int`` is an int there (float on
        # the GPU).
        want = "float" if is_float_register(e.dtype) else C_TYPES.get(e.dtype)
        a, b = (
            f"(({want}){v})" if want and c_type(d) != want else v
            for v, d in ((a, e.operands[0]), (b, e.operands[1]))
        )
        return f"({cond} ? {a} : {b})"

    def visit_KCast(self, e: KCast) -> str:
        a = self.visit(e.a)
        if e.dtype in FLOAT_TO_HALF:  # rounded to the 16-bit type, held as float
            return f"{HALF_TO_FLOAT[e.dtype]}({FLOAT_TO_HALF[e.dtype]}((float){a}))"
        if e.dtype == "int32" and is_float_register(e.src):
            # toward zero, saturating, NaN to 0 (a C cast is undefined there: the emulator's
            # x86 gives INT_MIN for NaN, where the GPU's cvt.rzi gives 0)
            return f"__float2int_rz({a})"
        if (conv := cast_from_float(e.src, e.dtype, a)) is not None:
            return conv
        return f"(({C_TYPES[e.dtype]}){a})"

    def visit_KDataIndex(self, e: KDataIndex) -> str:
        return f"((int){self.visit(e.a)})"

    def visit_KCall(self, e: KCall) -> str:
        return f"{e.fn}({', '.join(self.visit(a) for a in e.args)})"

    def visit_KIdentity(self, e: KIdentity) -> str:
        return _IDENTITY[e.op] if is_float_register(e.dtype) else wide_identity(e.op, e.dtype)

    def visit_KReduce(self, e: KReduce) -> str:
        acc, v = self.visit(e.acc), self.visit(e.value)
        if e.op == "sum":
            return f"{acc} + {v}"
        if e.op == "prod":
            return f"{acc} * {v}"
        if is_float_register(e.dtype):
            return f"pf_f{e.op}f({acc}, {v})"
        return f"pf_w_{e.op}<{C_TYPES[e.dtype]}>({acc}, {v})"

    def visit_KAllReduce(self, e: KAllReduce) -> str:
        # one helper for every accumulator type (its C type deduced from the arguments),
        # combining by the float functor or the typed one of a wider type
        op = f"pf_{e.op}"
        if not is_float_register(e.dtype):
            op = f"{REDUCE_OPS[e.op]}<{C_TYPES[e.dtype]}>"
        # lanes across thread rows ("x") or consecutive threads (every other form)
        x = e.form == "x"
        fn, args = ("pf_allreduce_x", f"{e.lanes}, {e.kept}") if x else ("pf_allreduce_y", e.lanes)
        return f"{fn}<{op}, {args}>({self.visit(e.value)}, {self.visit(e.scratch)})"

    def visit_default(self, e: Any, *args: object) -> str:
        raise UnsupportedOpError(f"cannot print expression {e!r}")


_VALUES = ValuePrinter()


def c_value(v: KVal) -> str:
    """C text of a value node."""
    return _VALUES.visit(v)


def c_store(s: KStore) -> str:
    """One store as a C statement (``if (guard)`` where it has one)."""
    dst = _VALUES.visit(KLoad(s.buffer, s.index))
    text = f"{dst} = {c_value(s.value)};"
    return f"if ({c_cond(s.guard)}) {text}" if s.guard is not None else text


def c_stores(stores: Sequence[KStore]) -> str:
    """A statement instance's stores on one line."""
    return " ".join(c_store(s) for s in stores)
