"""The variables a kernel declares itself, checked against the namer's generated space.

Loop, block, thread and lane variables come from isl's AST (``c0``…), the mapping (``b0``,
``t0``, ``l0``, ``r0``) and the GEMM tiling (``kt0``, ``ii0``, copy grids ``p0r``…). They never
take a tensor's C name because :mod:`polyfuse.cuda.codegen.namer` keeps tensors out of their
patterns;
:func:`check_declared` holds that for every kernel printed, so a pass that names a new kind of
variable fails here until its pattern is registered with the namer.
"""

from __future__ import annotations

from polyfuse.cuda.codegen.kernel_ast import (
    ROW_BLOCK,
    KDef,
    KernelIR,
    KFor,
    KGuardedCopy,
    KLet,
    KNode,
    KRegisters,
    KRowBlocks,
    KSection,
    KVector,
    KVisitor,
)
from polyfuse.cuda.codegen.namer import is_generated


class _Declared(KVisitor[None]):
    """Collects the variables of the loops, definitions, lets, register arrays, vector groups
    and sections (their launch coordinates, copy grids and row-block loops) of an IR body."""

    def __init__(self) -> None:
        self.names: set[str] = set()

    def walk(self, nodes: list[KNode] | tuple[KNode, ...]) -> set[str]:
        for n in nodes:
            self.visit(n)
        return self.names

    def visit_default(self, n: KNode) -> None:
        for child in ("body", "then", "orelse"):
            self.walk(getattr(n, child, ()))

    def visit_KFor(self, n: KFor) -> None:
        self.names.add(n.var)
        self.walk(n.body)

    def visit_KDef(self, n: KDef) -> None:
        self.names.add(n.var)
        self.walk(n.body)

    def visit_KLet(self, n: KLet) -> None:
        self.names.add(n.name)

    def visit_KRegisters(self, n: KRegisters) -> None:
        self.names.add(n.name)

    def visit_KGuardedCopy(self, n: KGuardedCopy) -> None:
        self.names.add(n.temp)

    def visit_KVector(self, n: KVector) -> None:
        self.names.add(n.var)
        self.walk(n.body)

    def visit_KSection(self, n: KSection) -> None:
        self.names |= {v for v, _ in n.grid_dims + n.thread_dims}
        self.names |= {name for g in n.thread_grids for name, _ in g.coords}
        self.walk(n.body)

    def visit_KRowBlocks(self, n: KRowBlocks) -> None:
        self.names |= {f"pf_g{i}" for i in range(len(n.gemm_grid))}
        self.names |= {"pf_j", "pf_r", ROW_BLOCK}
        self.walk(n.body)


def declared_variables(ir: KernelIR) -> set[str]:
    """Every variable ``ir`` declares: loops, definitions, vector lanes, the decomposition of
    ``blockIdx``/``threadIdx``, reduction lanes and copy thread grids."""
    names = _Declared().walk(ir.body)
    names |= {v for v, _ in ir.grid_dims + ir.thread_dims} | set(ir.lane_params)
    return names | {name for g in ir.thread_grids for name, _ in g.coords}


def check_declared(ir: KernelIR) -> None:
    """Raise (an internal error) when ``ir`` declares a variable outside the generated space."""
    stray = sorted(v for v in declared_variables(ir) if not is_generated(v))
    assert not stray, f"kernel {ir.name}: variables {stray} are outside the generated names"
