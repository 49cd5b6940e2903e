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
    """``op`` is one of + - * neg fdiv pdiv mod min max == != < <= > >= && || ?:"""

    op: str
    args: tuple[KExpr, ...]

    def __str__(self) -> str:
        a = [str(x) for x in self.args]
        if self.op == "neg":
            return f"(-{a[0]})"
        if self.op == "?:":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if self.op in ("min", "max", "fdiv"):
            return f"{self.op}({', '.join(a)})"
        return "(" + f" {self.op} ".join(a) + ")"


def substitute(e: KExpr, var: str, value: KExpr) -> KExpr:
    """``e`` with variable ``var`` replaced by ``value``."""
    if isinstance(e, KVar):
        return value if e.name == var else e
    if isinstance(e, KOp):
        return KOp(e.op, tuple(substitute(a, var, value) for a in e.args))
    return e
