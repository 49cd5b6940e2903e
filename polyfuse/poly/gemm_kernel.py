"""The tiled GEMM kernel as a record: what the GEMM passes build and the later stages read.

:class:`GemmKernel` is a :class:`polyfuse.poly.mapping.MappedKernel` with the GEMM path's
fields: the shape isl found (:class:`polyfuse.poly.gemm_shape.GemmShape`), the tiling, the
schedule tree the passes transformed (:mod:`polyfuse.poly.gemm_tree`;
:mod:`polyfuse.poly.gemm_tile_schedule`, :mod:`polyfuse.poly.gemm_promotion`,
:mod:`polyfuse.poly.gemm_pipeline`, :mod:`polyfuse.poly.gemm_barriers`) and its statements'
flattened schedule, its operands' shared tiles (:class:`Promotion`) and
register fragments, and how its loops are emitted. :func:`gemm_placements` says where each of
its tensors lives. The builder that composes the passes is
:func:`polyfuse.poly.promote.build_gemm_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import islpy as isl

from polyfuse.graph.expr import Read
from polyfuse.poly.fragments import Fragment
from polyfuse.poly.gemm_loops import GemmLoops
from polyfuse.poly.gemm_shape import GemmShape, GemmTiling
from polyfuse.poly.gemm_tree import flat_map
from polyfuse.poly.mapping import MappedMicrograph
from polyfuse.poly.placement import Placement


@dataclass
class Promotion:
    """One operand access in shared memory: box lower bounds (C text over b, kt), sizes, copy
    layout. ``tensor`` keys the tile (the array's name, or ``<array>__<n>`` for a further
    access of the same array: :func:`polyfuse.poly.gemm_shape.access_groups`); ``source``
    is the global array it copies from."""

    tensor: str
    copy_stmt: str
    lo: list[isl.PwAff]  # the box's lower bounds, in the block params b* and k-tiles kt*
    size: list[int]
    stride: list[int]  # of the shared buffer (last dim padded by ``pad``)
    shape: tuple[int, ...]  # of the global tensor
    bounds_check: list[bool]  # per dim: may the footprint leave the array?
    thread_grid: tuple[int, ...]  # threads along each footprint dim (product: the block's)
    grid: tuple[tuple[str, int], ...]  # the copying threads' coordinates (name, extent)
    reason: str
    pad: int = 0  # words added to the buffer's rows (bank conflicts)
    width: int = 1  # elements per copy instance (4: 128-bit vector copies, proven by isl)
    #: the tile's view of the array: per tile dim, its coefficient on each array dim (empty:
    #: the array's own dims; :mod:`polyfuse.poly.tile_box`)
    merge: tuple[tuple[int, ...], ...] = ()
    source: str = ""  # the global array ("": ``tensor``)
    #: the update's read nodes this tile serves when the array has several accesses (empty:
    #: every read of the array)
    reads: tuple[Read, ...] = ()
    #: the tile box's decision notes (dims merged, box widened: :mod:`polyfuse.poly.tile_box`),
    #: whose words the reason quotes; their records reach the promotion's plan note
    box_notes: tuple[str, ...] = ()

    @property
    def array(self) -> str:
        """The global array the tile copies from."""
        return self.source or self.tensor

    @property
    def floats(self) -> int:
        return self.size[0] * self.stride[0] if self.size else 1


@dataclass(frozen=True)
class GemmKernel(MappedMicrograph):
    """A GEMM-like micrograph tiled for blocks, threads, registers and shared memory."""

    shape: GemmShape | None = None
    tiling: GemmTiling | None = None
    #: the kernel's schedule tree, barriers grafted: what isl generates the AST from
    schedule_tree: isl.Schedule | None = None
    #: the tree before the barriers were grafted (its statements only; see schedule_map)
    statement_tree: isl.Schedule | None = None
    #: the flattened schedule's dims (``ph``: the phase, a sequence in the tree)
    iterators: list[str] = field(default_factory=list)
    promotions: list[Promotion] = field(default_factory=list)
    reg_iters: list[str] = field(default_factory=list)  # loop vars indexing the micro-tile
    guards: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # epilogue bounds
    tile_context: isl.Set | None = None  # ranges of b* and kt* (for the boxes' lower bounds)
    reg_shape: list[int] = field(default_factory=list)  # the accumulator array's shape
    stages: int = 1  # shared-tile stages (2: double-buffered, cp.async)
    pipelined: str = ""  # the k-tile loop the stages alternate over
    #: epilogue statements whose global stores are whole vectors (loop ``VECTOR_VAR``)
    vector_stores: dict[str, str] = field(default_factory=dict)  # statement -> tensor
    #: promoted operands whose per-kk fragment each thread keeps in registers
    fragments: list[Fragment] = field(default_factory=list)
    #: how the loops are emitted (unroll, peel, launch bounds; :mod:`polyfuse.poly.gemm_loops`)
    loops: GemmLoops = field(default_factory=GemmLoops)
    #: promoted operands whose selects-to-zero the update drops, with isl's reason
    #: (:mod:`polyfuse.poly.select_free`)
    select_free: dict[str, str] = field(default_factory=dict)

    @cached_property
    def schedule_map(self) -> isl.UnionMap:
        """The statements' flattened schedule ``[kt..., phase, sub, x...]``
        (:func:`polyfuse.poly.gemm_tree.flat_map` of the tree before the barriers: the
        grafted copies' rows included)."""
        assert self.statement_tree is not None
        return flat_map(self.statement_tree)


def gemm_placements(gk: GemmKernel) -> dict[str, Placement]:
    """Where each tensor of a GEMM kernel lives, with the reason."""
    model = gk.scheduled.model
    shape, tiling = gk.shape, gk.tiling
    assert shape is not None and tiling is not None
    promoted = {p.tensor: p for p in gk.promotions}
    hoisted = {f.tensor: f for f in gk.fragments if f.hoisted}
    acc = f"{shape.update.prim}_acc"
    out: dict[str, Placement] = {}
    read_inside = {m.get_tuple_name(isl.dim_type.out) for s in shape.epilogue for _, m in s.reads}
    for name, role in model.tensors.items():
        if name in promoted:
            out[name] = Placement(name, "shared", promoted[name].reason)
        elif name in hoisted:
            out[name] = Placement(name, "global", f"k-invariant operand: {hoisted[name].reason}")
        elif role.role == "input":
            out[name] = Placement(name, "global", "micrograph input (epilogue operand)")
        elif name == acc:
            tile = "x".join(str(r) for r in tiling.regs if r > 1) or "1"
            out[name] = Placement(
                name,
                "register",
                f"register micro-tile {tile} per thread ({tiling.accumulators} accumulators)",
            )
        elif role.role == "output":
            out[name] = Placement(
                name,
                "global",
                "micrograph output",
                register_copy=name in read_inside,
            )
        else:
            out[name] = Placement(
                name, "register", "one element per micro-tile iteration (epilogue)"
            )
    return out


def as_gemm_kernel(mm: MappedMicrograph) -> GemmKernel | None:
    """``mm`` as a tiled GEMM kernel, or None when another mapping made it: the one class
    test of the GEMM path (the driver and the placement ask this instead of testing classes;
    :func:`polyfuse.cuda.codegen.gemm_lowering.lower_gemm`, :func:`kernel_placements`)."""
    return mm if isinstance(mm, GemmKernel) else None


def kernel_placements(mm: MappedMicrograph) -> dict[str, Placement] | None:
    """Where each tensor of ``mm`` lives when it is a tiled GEMM kernel (its promoted operands
    are its shared tiles, :func:`gemm_placements`); None for every other mapped kernel."""
    gk = as_gemm_kernel(mm)
    return gemm_placements(gk) if gk is not None else None
