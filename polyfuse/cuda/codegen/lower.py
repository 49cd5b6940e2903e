"""Lowering of one mapped kernel: kernel AST → :class:`KernelIR` through the passes → CUDA.

The passes, in order: buffers from placements (:mod:`polyfuse.cuda.codegen.lower_buffers`), the lane
combine (:mod:`polyfuse.cuda.codegen.lower_combines`), barriers between stitched parts
(:mod:`polyfuse.cuda.codegen.lower_barriers`), element types
(:mod:`polyfuse.cuda.codegen.lower_dtypes`),
loads and stores on scoped buffers (:mod:`polyfuse.cuda.codegen.lower_accesses`), native 16-bit
pair arithmetic where it is bit-identical (:mod:`polyfuse.cuda.codegen.lower_half2`).
GEMM kernels (:func:`lower_gemm_kernel`): buffers, shared tiles and their copies
(:mod:`polyfuse.cuda.codegen.lower_promotions`) pipelined over S stages where the schedule asks
(:mod:`polyfuse.cuda.codegen.lower_pipeline`: buffer expansion, producer and consumer stage indices,
commit/wait with the exact count), barrier statements, the register micro-tile
(:mod:`polyfuse.cuda.codegen.lower_register_tile`), register fragments of the operands
(:mod:`polyfuse.cuda.codegen.lower_fragments`), vector stores of the epilogue
(:mod:`polyfuse.cuda.codegen.lower_vector_stores`), element types, loads and stores.
This module only translates the poly stage's objects into the passes' plain inputs (isl
bounds become kernel-AST expressions here); :func:`polyfuse.cuda.codegen.printer.emit_kernel` then
writes the final IR as text. Given the structural key's canonical names (``canonical``), a
kernel is printed with them (:mod:`polyfuse.cuda.codegen.namer`) and then instantiated under its
real
names, so the compile cache stores exactly the text every structurally equal kernel gets.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import DecisionNote
from polyfuse.base.errors import UnsupportedOpError
from polyfuse.cuda.codegen.astgen import convert_expr, expr_from
from polyfuse.cuda.codegen.kernel_ast import Kernel, KernelIR, KNode, KParam, MemSpace
from polyfuse.cuda.codegen.kernel_function import instantiate_function, print_function
from polyfuse.cuda.codegen.lower_accesses import lower_accesses
from polyfuse.cuda.codegen.lower_addresses import strength_reduce
from polyfuse.cuda.codegen.lower_barriers import (
    barrier_scope,
    insert_barriers,
    lower_sync_statements,
)
from polyfuse.cuda.codegen.lower_buffers import BufferPlacement, alloc_buffers
from polyfuse.cuda.codegen.lower_combines import lower_combines
from polyfuse.cuda.codegen.lower_dtypes import assign_dtypes, storage_dtypes
from polyfuse.cuda.codegen.lower_fragments import OperandFragment, lower_fragments
from polyfuse.cuda.codegen.lower_half2 import lower_half2
from polyfuse.cuda.codegen.lower_loops import peel_loop, unroll_loops
from polyfuse.cuda.codegen.lower_pipeline import Pipeline
from polyfuse.cuda.codegen.lower_promotions import PromotedTile, lower_promotions
from polyfuse.cuda.codegen.lower_register_tile import lower_register_tile
from polyfuse.cuda.codegen.lower_vector_stores import lower_vector_stores
from polyfuse.cuda.codegen.lower_vectorize import VectorPlan, vectorize
from polyfuse.cuda.codegen.namer import CANONICAL_KERNEL, Namer, c_name, fill, slots
from polyfuse.cuda.codegen.printer import ir_facts, kernel_of
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.placement import Placement
from polyfuse.poly.policy import SCALAR_DTYPES, gemm_tile_registers, smem_itemsize
from polyfuse.poly.promote import (
    COMMIT,
    SYNC_AFTER,
    SYNC_BEFORE,
    VECTOR_VAR,
    WAIT,
    GemmKernel,
)
from polyfuse.poly.stage import aligned_rows
from polyfuse.poly.vectorize import VECTOR_WIDTH
from polyfuse.stitch.facts import KernelFacts

INT_LIMIT = 2**31 - 1


def kernel_ir(
    name: str, mm: MappedKernel, body: list[KNode], namer: Namer | None = None
) -> KernelIR:
    """The IR of a mapped kernel before lowering: launch shape, loops, statements; ``namer``
    names what the passes declare (default: every tensor under its C name)."""
    model = mm.scheduled.model
    for role in model.tensors.values():
        n = 1
        for d in role.shape:
            n *= d
        if n > INT_LIMIT:
            raise UnsupportedOpError(
                f"tensor '{role.ident}' has {n} elements; 64-bit indexing is not supported yet"
            )
    return KernelIR(
        name,
        tuple(zip(mm.block_params, mm.grid_dims, strict=True)),
        tuple(mm.thread_order),
        tuple(body),
        tuple(p.name for p in mm.parts),
        lane_params=tuple(mm.lane_params),
        laneless=frozenset(mm.laneless),
        reduction=mm.strategy is not None,
        namer=namer or Namer(),
    )


def kernel_namer(name: str, canonical: Mapping[str, str] | None) -> tuple[str, Namer]:
    """The name to print a kernel under and its namer: canonical ones when given."""
    if canonical is None:
        return name, Namer()
    return CANONICAL_KERNEL, Namer(slots(canonical))


def instantiate_kernel(kernel: Kernel, canonical: Mapping[str, str] | None, name: str) -> Kernel:
    """``kernel`` printed with ``canonical`` names (graph identifier → ``pfT<i>``) under its
    real names: kernel ``name``, each tensor its :func:`polyfuse.cuda.codegen.namer.c_name`; the
    canonical function stays in ``kernel.canonical``. Without ``canonical``, ``kernel`` itself."""
    if canonical is None:
        return kernel
    assert kernel.printed is not None
    real = {c: c_name(t) for t, c in canonical.items()}
    params = [KParam(Namer().tensor(p.tensor), p.ctype, p.tensor) for p in kernel.params]
    printed = instantiate_function(kernel.printed, [(p.ctype, p.name) for p in params], real)
    return replace(
        kernel,
        name=name,
        params=params,
        source=print_function(printed, name),
        printed=printed,
        canonical=kernel.printed,
        notes=[_filled(n, real) for n in kernel.notes],
    )


def _filled(note: str, real: Mapping[str, str]) -> str:
    """A canonical kernel's note under the real names (a decision keeps its record)."""
    if not isinstance(note, DecisionNote):
        return fill(note, real)
    r = note.record
    subject = tuple(fill(x, real) for x in r.subject)
    return DecisionNote(replace(r, reason=fill(r.reason, real), subject=subject))


def buffer_placements(mm: MappedKernel, placements: dict[str, Placement]) -> list[BufferPlacement]:
    """The placements as the buffer pass reads them (box bounds as kernel-AST expressions)."""
    model = mm.scheduled.model
    written = {m.get_tuple_name(isl.dim_type.out) for m in maps_of(model.writes)}
    out = []
    for ident, p in placements.items():
        role = model.tensors.get(ident)
        box = tuple((convert_expr(expr_from(mm.context, lo)), size) for lo, size in p.box)
        read_only = role is not None and role.role == "input" and ident not in written
        size = smem_itemsize(role.dtype) if role is not None else 4
        out.append(
            BufferPlacement(
                ident, MemSpace(p.space), p.register_copy, box, p.smem_offset, read_only, size,
                p.stage,
            )  # fmt: skip
        )
    return out


def vector_plan(mm: MappedKernel, placements: dict[str, Placement]) -> VectorPlan | None:
    """The vectorisation pass's input: float4 loads for proven tensors the kernel only reads,
    float4 stores for proven global outputs it reads back (if at all) from a register copy,
    and the shared rows whose runs may move as float4 (proven, aligned, and touched at the
    same element by every statement of a run)."""
    c = mm.coarsening
    if c is None or c.factor <= 1:
        return None
    model = mm.scheduled.model
    stmts = model.statements
    writes = {s.name: s.write.get_tuple_name(isl.dim_type.out) for s in stmts}
    written = set(writes.values())
    proven = {t for t, ok in c.vector.items() if ok and model.tensors[t].dtype not in SCALAR_DTYPES}
    # one plain writer (no accumulator: init, update and final all touch those)
    writers: dict[str, list[str]] = {}
    for s in stmts:
        writers.setdefault(writes[s.name], []).append(s.role)
    # a row the kernel writes once and reads, or only reads (a GEMM's whole-row tile stored
    # by the other half of a joined kernel, :mod:`polyfuse.cuda.codegen.lower_gemm_rows`)
    shared = frozenset(
        t
        for t in proven
        if placements[t].space == "shared"
        and writers.get(t, ["compute"]) == ["compute"]
        and c.uniform.get(t, False)
        and aligned_rows(tuple(model.tensors[t].shape), placements[t].box, mm.context)
    )
    reads: dict[str, frozenset[str]] = {}
    read_any: set[str] = set()
    for s in stmts:
        names = {m.get_tuple_name(isl.dim_type.out) for _, m in s.reads}
        read_any |= names
        reads[s.name] = frozenset(
            t
            for t in names
            if (placements[t].space == "global" and not placements[t].register_copy) or t in shared
        )
    proven = {t for t in proven if placements[t].space == "global"}
    loads = frozenset(t for t in proven if t not in written)
    stores = frozenset(
        t for t in proven & written if t not in read_any or placements[t].register_copy
    )
    return VectorPlan(c.factor, loads, stores, writes, reads, shared)


@dataclass(frozen=True)
class Lowered:
    """A kernel through the lowering passes, not printed yet: its final IR (with the
    canonical names when it has them, :func:`kernel_namer`), its facts and its notes."""

    ir: KernelIR
    facts: KernelFacts
    notes: tuple[str, ...] = ()


def lower_kernel(
    name: str,
    mm: MappedKernel,
    body: list[KNode],
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Kernel:
    """Lower one mapped kernel's AST through the passes and print it (through ``canonical``
    names when given, see :func:`instantiate_kernel`)."""
    low = lower_kernel_ir(name, mm, body, placements, idents, canonical)
    return instantiate_kernel(kernel_of(low.ir, low.facts, low.notes), canonical, name)


def lower_kernel_ir(
    name: str,
    mm: MappedKernel,
    body: list[KNode],
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Lowered:
    """One mapped kernel's AST through the passes (see :func:`lower_kernel`)."""
    printed, namer = kernel_namer(name, canonical)
    ir = kernel_ir(printed, mm, body, namer)
    ir = alloc_buffers(ir, buffer_placements(mm, placements), list(mm.scheduled.model.tensors))
    # both passes leave a kernel without lanes (no reduction layout) as it is
    finals = {
        s.name: s.prim
        for s in mm.scheduled.model.statements
        if s.role == "final" and s.prim in mm.combined
    }
    ir = lower_combines(ir, mm.combine_form, mm.lanes, mm.kept_tile, finals)
    ir = insert_barriers(ir, barrier_scope(mm.combine_form, mm.lanes))
    ir = vectorize(ir, vector_plan(mm, placements))  # coarsened kernels and reduction runs
    ir = assign_dtypes(ir, storage_dtypes(mm.scheduled.model))
    ir = lower_accesses(ir, mm.scheduled.model.statements, placements, idents)
    ir, pairs = lower_half2(ir)  # native 16-bit pairs where bit-identical
    facts = ir_facts(ir, mm.scheduled.model.statements, placements, idents)
    return Lowered(ir, facts, tuple(d.reason for d in pairs))


def promoted_tiles(gk: GemmKernel) -> list[PromotedTile]:
    """The GEMM kernel's promotions as the promotion pass reads them (isl bounds as
    kernel-AST expressions)."""
    assert gk.shape is not None
    readers = frozenset({gk.shape.update.name})
    out = []
    for p in gk.promotions:
        lo = tuple(convert_expr(expr_from(gk.tile_context, x)) for x in p.lo)
        shape = tuple(p.size[:-1]) + (p.size[-1] + p.pad,) if p.size else (1,)
        out.append(
            PromotedTile(
                p.tensor,
                p.copy_stmt,
                lo,
                shape,
                tuple(p.shape),
                tuple(p.bounds_check),
                p.grid,
                readers,
                p.width,
                p.tensor in gk.select_free,
                p.merge,
                p.array,
                p.reads,
            )
        )
    return out


def operand_fragments(gk: GemmKernel) -> list[OperandFragment]:
    """The GEMM kernel's register fragments as the fragment pass reads them (isl elements as
    kernel-AST expressions over the loop variables)."""
    assert gk.shape is not None
    readers = frozenset({gk.shape.update.name})
    out = []
    for f in gk.fragments:
        element = tuple(convert_expr(expr_from(f.context, e)) for e in f.element)
        shape = tuple(gk.scheduled.model.tensors[f.tensor].shape) if f.hoisted else ()
        out.append(
            OperandFragment(
                f.tensor,
                tuple(f.index_vars),
                tuple(f.shape),
                element,
                readers,
                shape,
                tuple(f.inside),
            )
        )
    return out


def lower_gemm_kernel(
    name: str,
    gk: GemmKernel,
    body: list[KNode],
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Kernel:
    """Lower a GEMM kernel's AST through the passes (buffers, shared tiles and copies,
    barriers, register micro-tile, operand fragments, element types) and print it (through
    ``canonical`` names when given, see :func:`instantiate_kernel`)."""
    low = lower_gemm_ir(name, gk, body, placements, idents, canonical)
    return instantiate_kernel(kernel_of(low.ir, low.facts, low.notes), canonical, name)


def lower_gemm_ir(
    name: str,
    gk: GemmKernel,
    body: list[KNode],
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Lowered:
    """A GEMM kernel's AST through the passes (see :func:`lower_gemm_kernel`)."""
    model = gk.scheduled.model
    assert gk.shape is not None and gk.tiling is not None
    # A promoted operand is a global array (a parameter); its shared tile comes from the
    # promotion pass, and reads outside the update go to global memory. Another shared
    # placement (a whole-row output tile, :mod:`polyfuse.stitch.gemm_rows`) stays shared.
    promoted = {p.tensor for p in gk.promotions}
    as_global = {
        k: Placement(k, "global", p.reason) if p.space == "shared" and k in promoted else p
        for k, p in placements.items()
    }
    printed, namer = kernel_namer(name, canonical)
    ir = kernel_ir(printed, gk, body, namer)
    ir = alloc_buffers(ir, buffer_placements(gk, as_global), list(model.tensors))
    ir = unroll_loops(ir, gk.loops.unroll, gk.loops.min_blocks)  # on the isl statements
    pipeline = None
    if gk.stages > 1:
        ktiles = tuple(v for v in gk.iterators if v.startswith("kt"))
        pipeline = Pipeline(gk.stages, gk.pipelined, ktiles, COMMIT, WAIT)
    ir = lower_promotions(ir, promoted_tiles(gk), pipeline)
    ir = ir.with_(
        body=tuple(lower_sync_statements(list(ir.body), frozenset((SYNC_BEFORE, SYNC_AFTER))))
    )
    acc = namer.register(f"{gk.shape.update.prim}_acc")
    bounds = {s: [hi for _, hi in b] for s, b in gk.guards.items()}
    tile_stmts = frozenset(s.name for s in [gk.shape.init, gk.shape.update, *gk.shape.epilogue])
    ir = lower_register_tile(ir, acc, gk.reg_shape, gk.reg_iters, bounds, tile_stmts)
    ir = lower_fragments(ir, operand_fragments(gk), gk.reg_iters)
    ir = peel_loop(ir, gk.loops.peel)
    ir = strength_reduce(ir, gk.loops.streams)
    shapes = {t: tuple(model.tensors[t].shape) for t in gk.vector_stores.values()}
    ir = lower_vector_stores(ir, VECTOR_VAR, VECTOR_WIDTH, gk.vector_stores, shapes)
    ir = assign_dtypes(ir, storage_dtypes(model))
    ir = lower_accesses(ir, model.statements, as_global, idents)
    # the tile model's register estimate (the same figure its ranking used)
    choice = gk.tiling.choice
    regs = gemm_tile_registers(choice[2], choice[3]) if choice is not None else None
    return Lowered(ir, ir_facts(ir, model.statements, as_global, idents, regs))
