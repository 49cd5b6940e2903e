"""Lowering pass: 128-bit global accesses for the element groups of a coarsened kernel.

:mod:`polyfuse.poly.coarsen` strip-mined the innermost parallel band member and marked the
point loop ``coarsen:<E>``; it also proved, per tensor, that the ``E`` lanes of a group touch
``E`` consecutive elements starting at a multiple of 4. A reduction kernel's runs
(:mod:`polyfuse.poly.lane_vector`: each lane takes 4 consecutive elements of the reduced or
row axis) carry the same mark and proof; inside them the pass works alike — a reduction's
update reads the float4 registers, its accumulator and the combine after the loop unchanged.

This pass turns that loop into a :class:`KVector`: the proven tensors the kernel only reads
are loaded as ``E/4`` ``float4`` per statement reading them (the printer loads identical
addresses once) before the lanes run, the proven tensors it writes (and reads back only from
registers) are stored as ``float4`` after them; every other access stays scalar inside the
lanes.

When the loop's bound is not the constant ``E`` (the band's end cuts a group short), the
vector form runs under the bound evaluated at lane ``E - 1`` (the group is whole) and the
original scalar loop runs otherwise — the scalar tail.

Shared rows (a tensor kept in shared memory, e.g. layer norm's centred row, or the whole-row
tile a GEMM stored for the reduction, :mod:`polyfuse.stitch.gemm_rows`) proven alike
(``VectorPlan.shared``: isl proved the run 16-byte aligned in the buffer and every statement
of a run touching the same element) move as ``float4`` too: a run that only reads the row
loads it before the lanes; a run that writes it keeps the lanes' elements in registers (its
readers in the run read them there) and stores them after. Lane ``l`` then moves bytes
``[16 l, 16 l + 16)`` of the row in one access: a warp's 512 bytes in four conflict-free
phases, where scalar accesses at element ``4 l + j`` hit each bank from four lanes. The pass
declares such a buffer ``__align__(16)``, or keeps it scalar when it sits in the dynamic pool
at an offset that is not a multiple of 4 elements.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KernelIR,
    KExpr,
    KFor,
    KIf,
    KInt,
    KLaneAccess,
    KMark,
    KNode,
    KOp,
    KStmt,
    KVar,
    KVector,
    map_children,
)
from polyfuse.cuda.codegen.namer import Namer

MARK = "coarsen:"


@dataclass(frozen=True)
class VectorPlan:
    """What the pass needs: elements per thread, which tensors get float4 loads and stores,
    and per statement the tensor it writes and those it reads (global accesses only)."""

    factor: int
    loads: frozenset[str]
    stores: frozenset[str]
    writes: Mapping[str, str]  # statement -> tensor written
    reads: Mapping[str, frozenset[str]]  # statement -> tensors read from global memory
    #: shared tensors whose runs are proven aligned, contiguous and uniform (also in ``reads``)
    shared: frozenset[str] = field(default_factory=frozenset)


SHARED_ALIGN = 16  # bytes: a float4 shared access needs its address 16-byte aligned


def substitute(e: KExpr, var: str, value: KExpr) -> KExpr:
    """``e`` with ``var`` replaced by ``value``."""
    if isinstance(e, KVar):
        return value if e.name == var else e
    if isinstance(e, KOp):
        args = tuple(substitute(a, var, value) for a in e.args)
        if e.op == "+" and KInt(0) in args and len(args) == 2:
            return args[0] if args[1] == KInt(0) else args[1]
        return KOp(e.op, args)
    return e


def _full_bound(loop: KFor, width: int) -> KExpr | None:
    """None when the loop runs exactly ``[0, width)``; else the condition that it does."""
    c = loop.cond
    if c == KOp("<=", (KVar(loop.var), KInt(width - 1))) or c == KOp(
        "<", (KVar(loop.var), KInt(width))
    ):
        return None
    return substitute(c, loop.var, KInt(width - 1))


def _vectorize(loop: KFor, width: int, plan: VectorPlan) -> list[KNode]:
    """The vector form of one group loop (with its scalar tail), or the loop as it was."""
    if loop.init != KInt(0) or loop.step != 1 or width % 4:
        return [loop]
    if not all(isinstance(n, KStmt) for n in loop.body):
        return [loop]
    zero = KInt(0)
    in_run = {plan.writes.get(n.stmt) for n in loop.body if isinstance(n, KStmt)}
    loads: list[KLaneAccess] = []  # one per statement reading a proven tensor
    stores: list[KLaneAccess] = []
    local: list[KLaneAccess] = []  # reads of a shared row this run writes: its registers
    for n in loop.body:
        assert isinstance(n, KStmt)
        args = tuple(substitute(a, loop.var, zero) for a in n.args)
        for t in sorted(plan.reads.get(n.stmt, ())):
            if t in plan.shared and t in in_run:
                local.append(KLaneAccess(t, n.stmt, args))
            elif t in plan.loads or t in plan.shared:
                loads.append(KLaneAccess(t, n.stmt, args))
        w = plan.writes.get(n.stmt)
        if w in plan.stores or w in plan.shared:
            stores.append(KLaneAccess(w, n.stmt, args))
    if not loads and not stores:
        return [loop]
    vec = KVector(loop.var, width, list(loop.body), tuple(loads), tuple(stores), tuple(local))
    full = _full_bound(loop, width)
    if full is None:
        return [vec]
    return [KIf(full, [vec], [loop])]


def vectorize(ir: KernelIR, plan: VectorPlan | None) -> KernelIR:
    """A new IR whose ``coarsen:<E>`` group loops use float4 accesses where ``plan`` allows."""
    if plan is None or plan.factor <= 1:
        return ir
    usable = _aligned_buffers(ir.allocs, plan.shared, ir.namer)
    plan = replace(plan, shared=usable)
    if not (plan.loads or plan.stores or plan.shared):
        return ir

    def walk(nodes: list[KNode]) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, KMark) and n.name.startswith(MARK):
                width = int(n.name.removeprefix(MARK))
                body: list[KNode] = []
                for m in n.body:
                    body += _vectorize(m, width, plan) if isinstance(m, KFor) else [m]
                out.append(KMark(n.name, body))
            else:
                out.append(map_children(n, walk))
        return out

    aligned = {ir.namer.shared(t) for t in usable}
    allocs = tuple(
        replace(a, align=max(a.align, SHARED_ALIGN))
        if a.offset is None and a.name in aligned
        else a
        for a in ir.allocs
    )
    return ir.with_(body=tuple(walk(list(ir.body))), allocs=allocs)


def _aligned_buffers(
    allocs: tuple[KAlloc, ...], shared: frozenset[str], namer: Namer | None = None
) -> frozenset[str]:
    """The tensors of ``shared`` whose buffer (named by ``namer``) can start 16-byte aligned:
    a static array (declared aligned) or a slice of the dynamic pool at a multiple of 4
    elements."""
    per = SHARED_ALIGN // 4
    namer = namer or Namer()
    buffers = {a.name: a for a in allocs}
    return frozenset(
        t
        for t in shared
        if (a := buffers.get(namer.shared(t))) is not None
        and (a.offset is None or a.offset % per == 0)
    )
