"""The GEMM path's entry into code generation: whether a mapped kernel is a tiled GEMM, and
its lowering.

A tiled GEMM kernel (:class:`polyfuse.poly.gemm_kernel.GemmKernel`) has its own AST
generation from the flattened schedule map
(:func:`polyfuse.cuda.codegen.astgen.generate_gemm_ast`) and lowering
(:func:`polyfuse.cuda.codegen.lower.lower_gemm_kernel`: shared tiles and copies, barriers,
register micro-tile, fragments); a tensorized GEMM
(:class:`polyfuse.poly.tensorize.TensorCoreKernel`) is lowered onto mma.sync by
:mod:`polyfuse.cuda.codegen.lower_mma`. The driver asks :func:`lower_gemm` for every mapped
kernel and never tests the kernel's class itself: the question "is this a GEMM kernel" is
answered here and in :func:`polyfuse.poly.gemm_kernel.as_gemm_kernel` only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import islpy as isl

from polyfuse.cuda.codegen.astgen import generate_gemm_ast
from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.lower import lower_gemm_kernel
from polyfuse.cuda.codegen.lower_mma import lower_mma_kernel
from polyfuse.poly.gemm_kernel import as_gemm_kernel
from polyfuse.poly.mapping import MappedKernel
from polyfuse.poly.placement import Placement
from polyfuse.poly.tensorize import TensorCoreKernel


@dataclass(frozen=True)
class GemmLowered:
    """A lowered GEMM kernel: isl's AST, the printed kernel, the mapping's notes, and the
    placements its global footprint is counted under (promoted operands are read from global
    memory once per tile)."""

    ast: isl.AstNode | None  # None: a tensorized kernel (its loops are written, not isl's)
    kernel: Kernel
    notes: list[str]
    footprint_placements: dict[str, Placement]


def shared_as_global(placements: Mapping[str, Placement]) -> dict[str, Placement]:
    """``placements`` with every shared tensor counted as global (its tile is a copy of a
    global array: the footprint counts the array's reads)."""
    return {
        k: Placement(k, "global", p.reason) if p.space == "shared" else p
        for k, p in placements.items()
    }


def lower_gemm(
    name: str,
    mm: MappedKernel,
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> GemmLowered | None:
    """The GEMM lowering of kernel ``name`` when ``mm`` is a tiled GEMM kernel (its own AST
    generator and lowering passes, promoted tiles) or a tensorized one (mma.sync on shared
    tiles, :func:`polyfuse.cuda.codegen.lower_mma.lower_mma_kernel`); None for every other
    mapped kernel."""
    if isinstance(mm, TensorCoreKernel):
        kernel = lower_mma_kernel(name, mm, placements, idents, canonical)
        return GemmLowered(None, kernel, list(mm.notes), shared_as_global(placements))
    gk = as_gemm_kernel(mm)
    if gk is None:
        return None
    ast, body = generate_gemm_ast(gk)
    kernel = lower_gemm_kernel(name, gk, body, placements, idents, canonical)
    return GemmLowered(ast, kernel, list(gk.notes), shared_as_global(placements))
