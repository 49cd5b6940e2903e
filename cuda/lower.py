"""Lowering of one mapped kernel: kernel AST → :class:`KernelIR` through the passes → CUDA.

The passes, in order: buffers from placements (:mod:`polyfuse.cuda.lower_buffers`), the lane
combine (:mod:`polyfuse.cuda.lower_combines`), barriers between stitched parts
(:mod:`polyfuse.cuda.lower_barriers`), element types (:mod:`polyfuse.cuda.lower_dtypes`).
This module only translates the poly stage's objects into the passes' plain inputs (isl
bounds become kernel-AST expressions here); :func:`polyfuse.cuda.printer.emit_kernel` then
writes the final IR as text.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.cuda.astgen import convert_expr
from polyfuse.cuda.kernel_ast import Kernel, KernelIR, KNode, MemSpace
from polyfuse.cuda.lower_barriers import barrier_scope, insert_barriers
from polyfuse.cuda.lower_buffers import BufferPlacement, alloc_buffers
from polyfuse.cuda.lower_combines import lower_combines
from polyfuse.cuda.lower_dtypes import assign_dtypes
from polyfuse.cuda.printer import emit_kernel
from polyfuse.errors import UnsupportedOpError
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.placement import Placement

INT_LIMIT = 2**31 - 1


def kernel_ir(name: str, mm: MappedKernel, body: list[KNode]) -> KernelIR:
    """The IR of a mapped kernel before lowering: launch shape, loops, statements."""
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
    )


def buffer_placements(mm: MappedKernel, placements: dict[str, Placement]) -> list[BufferPlacement]:
    """The placements as the buffer pass reads them (box bounds as kernel-AST expressions)."""
    model = mm.scheduled.model
    written = {m.get_tuple_name(isl.dim_type.out) for m in maps_of(model.writes)}
    build = (
        isl.AstBuild.from_context(mm.context) if any(p.box for p in placements.values()) else None
    )
    out = []
    for ident, p in placements.items():
        role = model.tensors.get(ident)
        box = tuple((convert_expr(build.expr_from_pw_aff(lo)), size) for lo, size in p.box)
        read_only = role is not None and role.role == "input" and ident not in written
        out.append(
            BufferPlacement(
                ident, MemSpace(p.space), p.register_copy, box, p.smem_offset, read_only
            )
        )
    return out


def lower_kernel(
    name: str,
    mm: MappedKernel,
    body: list[KNode],
    placements: dict[str, Placement],
    idents: dict[int, str],
) -> Kernel:
    """Lower one mapped kernel's AST through the passes and print it."""
    ir = kernel_ir(name, mm, body)
    ir = alloc_buffers(ir, buffer_placements(mm, placements), list(mm.scheduled.model.tensors))
    # both passes leave a kernel without lanes (no reduction layout) as it is
    ir = lower_combines(ir, mm.combine_form, mm.lanes, mm.kept_tile, frozenset(mm.combined))
    ir = insert_barriers(ir, barrier_scope(mm.combine_form, mm.lanes))
    ir = assign_dtypes(ir)
    return emit_kernel(ir, mm.scheduled.model.statements, placements, idents)
