"""Instruction estimate of a tensor expression: what one evaluation costs one thread.

Each multiply feeding an add becomes one FFMA (ptxas contracts ``a * b + c``); special
functions cost what NVIDIA's math library spends on them (:data:`SPECIAL`: MUFU instructions,
FP32 instructions, other slots — e.g. ``erff`` is a polynomial, no MUFU; ``expf`` is one
``MUFU.EX2`` around two FP32 operations); compares, selects, min/max and conversions are one
slot each; integer index arithmetic and predicates one slot per operation
(:attr:`Mix.ints`). Reads are priced by the caller
(where the tensor lives), through ``on_read``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from polyfuse.graph import expr as ex
from polyfuse.graph.dtypes import info as dtype_info
from polyfuse.graph.dtypes import is_float
from polyfuse.poly.costs.desc import Mix

#: per special function: (MUFU, FP32 instructions, other slots) of its libdevice expansion
SPECIAL = {
    "exp": (1, 2, 1),
    "log": (1, 3, 2),
    "sqrt": (1, 2, 2),
    "rsqrt": (1, 0, 1),
    "tanh": (1, 0, 1),
    "erf": (0, 12, 6),
    "log1p": (1, 6, 3),
    "expm1": (1, 6, 3),
    "sigmoid": (2, 3, 2),
    "round": (0, 0, 1),
    "floor": (0, 0, 1),
    "ceil": (0, 0, 1),
    "sin": (0, 20, 10),  # range reduction, then a polynomial (large arguments take longer)
    "cos": (0, 20, 10),
    "tan": (1, 24, 12),
    "asin": (1, 14, 6),
    "acos": (1, 15, 6),
    "atan": (1, 14, 6),
    "sinh": (1, 8, 4),
    "cosh": (1, 6, 3),
    "asinh": (2, 10, 4),
    "acosh": (2, 10, 4),
    "atanh": (1, 10, 4),
    "exp2": (1, 1, 1),
    "log2": (1, 2, 2),
    "log10": (1, 3, 2),
    "pow": (2, 4, 4),
    "atan2": (1, 16, 8),
    "div": (1, 3, 2),
}
#: integer slots to address one global or shared element
ADDRESS = 2


@dataclass
class ExprOps:
    """Operation counts of tensor expressions (accumulate several with one instance)."""

    muls: float = 0.0
    adds: float = 0.0
    other: float = 0.0  # FP compares, selects, min/max, conversions
    mufu: float = 0.0
    fp: float = 0.0  # FP32 work of special functions
    ints: float = 0.0
    lds: float = 0.0  # bytes
    ldg: float = 0.0  # bytes
    loads: float = 0.0  # load instructions

    def special(self, name: str) -> None:
        mufu, fp, other = SPECIAL[name]
        self.mufu += mufu
        self.fp += fp
        self.other += other

    def mix(self) -> Mix:
        ffma = min(self.muls, self.adds)
        fmul, fadd = self.muls - ffma, self.adds - ffma
        slots = ffma + fmul + fadd + self.fp + self.other + self.mufu + self.ints + self.loads
        return Mix(slots=slots, ints=self.ints, ffma=ffma + self.fp, fmul=fmul, fadd=fadd,
                   mufu=self.mufu, lds=self.lds, ldg=self.ldg)  # fmt: skip


class _OpCounter(ex.ExprVisitor[None]):
    """Adds the operations of one evaluation of an expression to ``c``."""

    def __init__(self, c: ExprOps, on_read: Callable[[ex.Read, ExprOps], None]) -> None:
        self.c, self.on_read = c, on_read

    def visit_default(self, e: ex.Expr) -> None:
        for ch in e.children():
            self.visit(ch)

    def visit_Read(self, e: ex.Read) -> None:  # its address: on_read's (unrolled: constants)
        self.on_read(e, self.c)

    def visit_Binary(self, e: ex.Binary) -> None:
        self.visit_default(e)
        c = self.c
        if not is_float(e.dtype):  # 16-bit floats compute in float32 registers too
            c.ints += 1
        elif e.op == "mul":
            c.muls += 1
        elif e.op in ("add", "sub"):
            c.adds += 1
        elif e.op in ("pow", "atan2"):
            c.special(e.op)
        elif e.op in ("div", "floordiv", "mod"):
            c.special("div")
        else:
            c.other += 1

    def visit_Unary(self, e: ex.Unary) -> None:
        self.visit_default(e)
        if e.op in SPECIAL:
            self.c.special(e.op)
        elif e.op not in ("neg", "abs"):  # negation and |x| fold into operand modifiers
            self.c.other += 1

    def visit_Compare(self, e: ex.Compare) -> None:
        self.visit_default(e)
        if not (is_float(e.a.dtype) or is_float(e.b.dtype)):
            self.c.ints += 1  # an index comparison (a predicate)
        else:
            self.c.other += 1

    def visit_Logical(self, e: ex.Logical) -> None:
        self.visit_default(e)
        self.c.ints += 1

    def visit_Select(self, e: ex.Select) -> None:
        self.visit_default(e)
        self.c.other += 1

    def visit_Cast(self, e: ex.Cast) -> None:
        self.visit_default(e)
        self.c.other += 1

    def visit_IterVar(self, e: ex.IterVar) -> None:
        self.c.ints += 1

    def visit_DataIndex(self, e: ex.DataIndex) -> None:
        self.visit_default(e)
        self.c.ints += 1


def count_ops(e: ex.Expr, c: ExprOps, on_read: Callable[[ex.Read, ExprOps], None]) -> None:
    """Add the operations of one evaluation of ``e`` to ``c`` (reads through ``on_read``)."""
    _OpCounter(c, on_read).visit(e)


def global_read(r: ex.Read, c: ExprOps) -> None:
    """``on_read`` for a tensor in global memory: one load of its element size (4 bytes for
    float32, 2 for the 16-bit floats) and its address."""
    c.ldg += dtype_info(r.tensor.dtype).itemsize
    c.loads += 1
    c.ints += ADDRESS


def register_read(r: ex.Read, c: ExprOps) -> None:
    """``on_read`` for a value already in a register (computed in the kernel)."""
