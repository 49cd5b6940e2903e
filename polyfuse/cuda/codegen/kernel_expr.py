"""The kernel IR's integer expressions (indices, bounds, guards): constants, variables and
operators, as isl's AST expressions convert into them (:mod:`polyfuse.cuda.codegen.astgen`).
:mod:`polyfuse.cuda.codegen.kernel_ast` re-exports them beside the statement nodes."""

from __future__ import annotations

from dataclasses import dataclass


class KExpr:
    """An integer (index/control) expression."""


@dataclass(frozen=True)
class KInt(KExpr):
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True)
class KVar(KExpr):
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True)
class KOp(KExpr):
    """``op`` is one of + - * neg fdiv pdiv mod min max == != < <= > >= && || ?: (isl's), or
    C's own integer operators on values the lowering knows are non-negative: ``/`` ``%`` ``&``
    ``|`` ``^`` ``>>`` ``<<``; ``ult`` (``(unsigned)(a) < b``: ``a`` in ``[0, b)`` by one
    compare) and ``addr`` (``&a``, the address of a :class:`KRef`)."""

    op: str
    args: tuple[KExpr, ...]

    def __str__(self) -> str:
        a = [str(x) for x in self.args]
        if self.op == "neg":
            return f"(-{a[0]})"
        if self.op == "?:":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if self.op == "ult":
            return f"((unsigned)({a[0]}) < {a[1]}u)"
        if self.op == "addr":
            return f"&{a[0]}"
        if self.op in ("min", "max", "fdiv"):
            return f"{self.op}({', '.join(a)})"
        return "(" + f" {self.op} ".join(a) + ")"


@dataclass(frozen=True)
class KRef(KExpr):
    """``name[i0][i1]...``: an element of an array the kernel declares (a shared tile by its
    flat offset, a register or fragment array by its subscripts), or a scalar variable or
    pointer without ``index``. Tensor-core loops address their buffers through these
    (:mod:`polyfuse.cuda.codegen.lower_mma`); a statement's tensor accesses are
    :class:`polyfuse.cuda.codegen.kernel_access.KLoad` instead."""

    name: str
    index: tuple[KExpr, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.index, tuple):
            object.__setattr__(self, "index", tuple(self.index))

    def __str__(self) -> str:
        return self.name + "".join(f"[{i}]" for i in self.index)
