"""A small kernel AST of our own, between isl's AST and CUDA C text.

isl's AST (for/if/block/user nodes over isl expressions) is converted into these dataclasses so
later passes (parallel reductions, pipelining) can rewrite plain Python objects, and so the
printer never touches isl. ``print(kernel)`` shows the pseudo-code.
"""

from __future__ import annotations

from dataclasses import dataclass, field


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


class KNode:
    """A statement-level node."""


@dataclass
class KFor(KNode):
    var: str
    init: KExpr
    cond: KExpr
    step: int
    body: list[KNode]


@dataclass
class KIf(KNode):
    cond: KExpr
    then: list[KNode]
    orelse: list[KNode] = field(default_factory=list)


@dataclass
class KDef(KNode):
    """``const int var = value;`` (a degenerate loop)."""

    var: str
    value: KExpr
    body: list[KNode]


@dataclass
class KMark(KNode):
    """An isl mark (``part:<micrograph>`` separates the parts of a stitched kernel)."""

    name: str
    body: list[KNode]


@dataclass
class KStmt(KNode):
    """One instance of an isl statement; ``args`` are its domain coordinates."""

    stmt: str
    args: tuple[KExpr, ...]


@dataclass
class KParam:
    name: str
    ctype: str  # "const float*" | "float*" | "int"
    tensor: str | None = None  # buffer name for pointers


@dataclass
class Kernel:
    """One ``__global__`` function with its launch shape."""

    name: str
    params: list[KParam]
    body: list[KNode]
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    micrographs: list[str]
    shared_bytes: int = 0
    source: str = ""
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    static_shared_bytes: int | None = None
    bytes_read: int = 0  # distinct global bytes (isl footprint)
    bytes_written: int = 0
    notes: list[str] = field(default_factory=list)
    #: The ``__global__`` function that runs this kernel (shared by structurally identical
    #: kernels, see :mod:`polyfuse.cuda.dedup`); empty: the function is named ``name``.
    function: str = ""

    def __str__(self) -> str:
        head = (
            f"kernel {self.name} grid={self.grid} block={self.block} "
            f"smem={self.shared_bytes} micrographs={self.micrographs}"
        )
        return head + "\n" + "\n".join(_fmt(self.body, 1))


def _fmt(nodes: list[KNode], depth: int) -> list[str]:
    pad = "  " * depth
    out: list[str] = []
    for n in nodes:
        if isinstance(n, KFor):
            out.append(f"{pad}for {n.var} = {n.init}; {n.cond}; += {n.step}")
            out += _fmt(n.body, depth + 1)
        elif isinstance(n, KIf):
            out.append(f"{pad}if {n.cond}")
            out += _fmt(n.then, depth + 1)
            if n.orelse:
                out.append(f"{pad}else")
                out += _fmt(n.orelse, depth + 1)
        elif isinstance(n, KDef):
            out.append(f"{pad}let {n.var} = {n.value}")
            out += _fmt(n.body, depth + 1)
        elif isinstance(n, KMark):
            out.append(f"{pad}// {n.name}")
            out += _fmt(n.body, depth)
        elif isinstance(n, KStmt):
            out.append(f"{pad}{n.stmt}({', '.join(map(str, n.args))})")
    return out
