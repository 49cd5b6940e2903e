"""C text of the kernel IR's integer expressions: indices, guards, row-major offsets (the
printer's and the body printers' shared vocabulary; :mod:`polyfuse.cuda.codegen.printer` re-exports
them)."""

from __future__ import annotations

from polyfuse.cuda.codegen.kernel_ast import KExpr, KInt, KOp, KRef, KVar, KVisitor


class _CIndex(KVisitor[str]):
    """C text of an integer expression of the kernel IR."""

    def visit_KInt(self, e: KInt) -> str:
        return str(e.value) if e.value >= 0 else f"({e.value})"

    def visit_KVar(self, e: KVar) -> str:
        return e.name

    def visit_KRef(self, e: KRef) -> str:
        return e.name + "".join(f"[{self.visit(i)}]" for i in e.index)

    def visit_KOp(self, e: KOp) -> str:
        a = [self.visit(x) for x in e.args]
        if e.op == "neg":
            return f"(-{a[0]})"
        if e.op == "?:":
            return f"({a[0]} ? {a[1]} : {a[2]})"
        if e.op == "ult":
            return f"((unsigned)({a[0]}) < {a[1]}u)"
        if e.op == "addr":
            return f"&{a[0]}"
        if e.op in ("min", "max"):
            return f"{e.op}({a[0]}, {a[1]})"
        if e.op == "fdiv":
            return f"pf_fdiv({a[0]}, {a[1]})"
        return "(" + f" {e.op} ".join(a) + ")"


_C_INDEX = _CIndex()


def c_index(e: KExpr) -> str:
    """Integer expression from the kernel AST."""
    return _C_INDEX.visit(e)


def c_cond(e: KExpr) -> str:
    """A guard: a conjunction of comparisons written flat (``a >= 0 && a < n``)."""
    if isinstance(e, KOp) and e.op == "&&":
        return " && ".join(c_cond(a) for a in e.args)
    if isinstance(e, KOp) and e.op in ("<", "<=", ">", ">=", "==", "!="):
        return f"{c_index(e.args[0])} {e.op} {c_index(e.args[1])}"
    return c_index(e)


def c_linear(name: str, idx: list[str], dims: list[int] | tuple[int, ...]) -> str:
    """``name[i0 * s0 + ... + in]``: a row-major element of an array of shape ``dims``."""
    return f"{name}[{c_offset(idx, dims)}]"


def c_offset(idx: list[str], dims: list[int] | tuple[int, ...]) -> str:
    """``i0 * s0 + ... + in``: the row-major offset of an element of an array ``dims``."""
    if not dims:
        return "0"
    terms, stride = [], 1
    for d in reversed(range(len(dims))):
        i = idx[d]
        terms.append(i if stride == 1 else f"{i} * {stride}")
        stride *= dims[d]
    return " + ".join(reversed(terms))
