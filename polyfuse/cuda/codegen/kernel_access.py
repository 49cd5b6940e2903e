"""Loads and stores of the kernel IR: scoped buffers, element accesses and the value
expressions of a statement instance (TVM's ``BufferLoad``/``BufferStore`` on scoped buffers).

:mod:`polyfuse.cuda.codegen.lower_accesses` turns each statement instance (a ``KStmt``) into
:class:`KStore` nodes whose values hold :class:`KLoad` nodes: where each tensor lives (global
array, shared tile, register scalar or array, operand fragment, vector lane), its index and
its conversions are decided there; :mod:`polyfuse.cuda.codegen.body_printer` writes these nodes as C
and decides nothing. ``str(node)`` is the pseudo-code ``print(ir)`` shows.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from polyfuse.cuda.codegen.kernel_expr import KExpr


class BufferScope(StrEnum):
    """The memory a buffer lives in."""

    GLOBAL = "global"  # a kernel parameter
    SHARED = "shared"  # a block's tile (static or a slice of the dynamic pool)
    LOCAL = "local"  # a thread's register scalar or array (accumulators, lanes, staged runs)
    FRAGMENT = "fragment"  # a thread's operand fragment of a register micro-tile


@dataclass(frozen=True)
class KBuffer:
    """A buffer an access names: C ``name``, element ``dtype``, ``scope``, ``shape`` (row-major
    elements; ``()`` a scalar)."""

    name: str
    dtype: str
    scope: BufferScope
    shape: tuple[int, ...] = ()

    def __str__(self) -> str:
        dims = "x".join(map(str, self.shape))
        return f"{self.scope.value}:{self.name}" + (f"<{dims}>" if dims else "")


class KVal:
    """A value expression of a statement instance (its te expression with resolved accesses)."""

    dtype: str = "float32"


@dataclass(frozen=True)
class KIdx(KVal):
    """An integer index expression of the kernel AST (a loop variable, a bound)."""

    expr: KExpr
    dtype: str = "int32"

    def __str__(self) -> str:
        return str(self.expr)


@dataclass(frozen=True)
class KTerm:
    """``(value - lo) * stride`` of a row-major offset (``lo`` None: ``value * stride``);
    ``scaled``: the stride is written even where it is 1 (a pipeline stage's term)."""

    value: KVal
    lo: KVal | None = None
    stride: int = 1
    scaled: bool = False

    def __str__(self) -> str:
        v = f"({self.value} - {self.lo})" if self.lo is not None else str(self.value)
        return v + (f" * {self.stride}" if self.stride != 1 or self.scaled else "")


@dataclass(frozen=True)
class KOffset(KVal):
    """A sum of terms: the linear offset of an element (``0`` without terms)."""

    terms: tuple[KTerm, ...]
    dtype: str = "int32"

    def __str__(self) -> str:
        return " + ".join(map(str, self.terms)) or "0"


@dataclass(frozen=True)
class KLoad(KVal):
    """``buffer[index]`` (one subscript per entry; none: a scalar buffer); ``dtype``: the value's
    type as the expression sees it (the tensor's)."""

    buffer: KBuffer
    index: tuple[KVal, ...]
    dtype: str = "float32"

    def __str__(self) -> str:
        idx = "".join(f"[{i}]" for i in self.index)
        return f"{self.buffer.scope.value}:{self.buffer.name}{idx}"


@dataclass(frozen=True)
class KAddr(KVal):
    """The address of ``buffer``'s first element (a combine's scratch), as a ``ctype``
    pointer when that differs from the buffer's own."""

    buffer: KBuffer
    ctype: str = ""

    def __str__(self) -> str:
        return f"&{self.buffer}" + (f" as {self.ctype}*" if self.ctype else "")


@dataclass(frozen=True)
class KConst(KVal):
    value: float | int | bool
    dtype: str = "float32"

    def __str__(self) -> str:
        return repr(self.value)


@dataclass(frozen=True)
class KUnary(KVal):
    op: str
    a: KVal
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.op}({self.a})"


@dataclass(frozen=True)
class KBinary(KVal):
    """``a op b``; ``operands``: the operands' dtypes; ``data``: an integer dividend reads a
    tensor (floor division and modulo then use the exact typed helpers)."""

    op: str
    a: KVal
    b: KVal
    dtype: str = "float32"
    operands: tuple[str, str] = ("float32", "float32")
    data: bool = False

    def __str__(self) -> str:
        return f"{self.op}({self.a}, {self.b})"


@dataclass(frozen=True)
class KCompare(KVal):
    op: str
    a: KVal
    b: KVal
    dtype: str = "bool"

    def __str__(self) -> str:
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class KLogical(KVal):
    op: str
    a: KVal
    b: KVal
    dtype: str = "bool"

    def __str__(self) -> str:
        return f"({self.a} {self.op} {self.b})"


@dataclass(frozen=True)
class KSelect(KVal):
    """``cond ? a : b``; ``operands``: the branches' dtypes."""

    cond: KVal
    a: KVal
    b: KVal
    dtype: str = "float32"
    operands: tuple[str, str] = ("float32", "float32")

    def __str__(self) -> str:
        return f"({self.cond} ? {self.a} : {self.b})"


@dataclass(frozen=True)
class KCast(KVal):
    """``a`` (of dtype ``src``) converted to ``dtype``."""

    a: KVal
    src: str
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.dtype}({self.a})"


@dataclass(frozen=True)
class KDataIndex(KVal):
    """A tensor value used as an index (a gather)."""

    a: KVal
    dtype: str = "int32"

    def __str__(self) -> str:
        return f"index({self.a})"


@dataclass(frozen=True)
class KCall(KVal):
    """``fn(args)``: a conversion (16-bit widening or rounding) or a lane combine."""

    fn: str
    args: tuple[KVal, ...]
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.fn}({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class KStore:
    """``buffer[index] = value`` where ``guard`` holds (None: always)."""

    buffer: KBuffer
    index: tuple[KVal, ...]
    value: KVal
    guard: KExpr | None = None

    def __str__(self) -> str:
        idx = "".join(f"[{i}]" for i in self.index)
        guard = f" if {self.guard}" if self.guard is not None else ""
        return f"{self.buffer}{idx} = {self.value}{guard}"


@dataclass(frozen=True)
class KLane:
    """One vector access of a ``KVector`` group: ``width`` lanes of ``target`` (the element at
    lane 0, a global or shared buffer) moved as whole words through the lane array ``lanes``;
    ``words``: the names of the loaded words (loads only)."""

    target: KLoad
    lanes: KBuffer
    words: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.lanes.name} <-> {self.target}"


@dataclass(frozen=True)
class KIdentity(KVal):
    """The identity of reduction ``op`` in ``dtype`` (an accumulator's start)."""

    op: str
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"identity.{self.op}"


@dataclass(frozen=True)
class KReduce(KVal):
    """``acc op value``: one step of reduction ``op`` on an accumulator of ``dtype``."""

    op: str
    acc: KVal
    value: KVal
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"{self.op}({self.acc}, {self.value})"


@dataclass(frozen=True)
class KAllReduce(KVal):
    """The total of ``value`` over a parallel reduction's lanes (every lane gets it): ``form``
    "y" (``lanes`` consecutive threads: shuffles, then ``scratch`` across warps) or "x"
    (``lanes`` thread rows of ``kept`` threads, in ``scratch``)."""

    form: str
    lanes: int
    kept: int
    op: str
    value: KVal
    scratch: KAddr
    dtype: str = "float32"

    def __str__(self) -> str:
        return f"allreduce_{self.form}<{self.op}, {self.lanes}>({self.value}, {self.scratch})"


@dataclass(frozen=True)
class KPairLane(KVal):
    """Two adjacent lanes of a vector group's loaded 16-bit lane array ``lanes`` (the name of
    a ``KLane.lanes`` buffer), kept as one ``__half2``/``__nv_bfloat162`` of ``dtype``."""

    lanes: str
    dtype: str = "float16"

    def __str__(self) -> str:
        return f"pair({self.lanes})"


@dataclass(frozen=True)
class KPairConst(KVal):
    """A constant exactly representable in the 16-bit ``dtype``, in both halves of a pair."""

    value: float
    dtype: str = "float16"

    def __str__(self) -> str:
        return f"pair({self.value!r})"


@dataclass(frozen=True)
class KPairSplat(KVal):
    """One 16-bit element ``load`` (the same for every lane of the group: a broadcast) in both
    halves of a pair of ``dtype``."""

    load: KLoad
    dtype: str = "float16"

    def __str__(self) -> str:
        return f"pair({self.load})"


@dataclass(frozen=True)
class KPairOp(KVal):
    """Native 16-bit pair arithmetic (:mod:`polyfuse.cuda.codegen.lower_half2`): ``op`` one of
    add, sub, mul (rounded once each, never contracted into an fma) or neg, on pairs of
    ``dtype``."""

    op: str
    args: tuple[KVal, ...]
    dtype: str = "float16"

    def __str__(self) -> str:
        return f"{self.op}2({', '.join(map(str, self.args))})"


@dataclass(frozen=True)
class KPairStore:
    """A vector group's stored lane array ``lanes`` computed pair by pair as ``value`` (a tree
    of :class:`KPairOp`, :class:`KPairLane`, :class:`KPairSplat`, :class:`KPairConst`) instead
    of lane by lane."""

    lanes: str
    value: KVal

    def __str__(self) -> str:
        return f"{self.lanes} = {self.value}"
