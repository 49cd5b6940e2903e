"""Layer 2 for tensorized GEMMs: a 16-bit GEMM on tensor cores whose block tile covers whole
rows takes the row reduction after it (rule 9, as :mod:`polyfuse.stitch.gemm_rows`).

Attention's scores product in bfloat16 or float16 (``Q·Kᵀ`` then a scale and softmax over the
keys) runs on ``mma.sync`` (:mod:`polyfuse.poly.tensorize`), so the float32 tiles of
:mod:`polyfuse.stitch.gemm_rows` decline it ("the operands are not float32"); a float32 one
does too where the user allowed tf32 (``MappingConfig.allow_tf32``: the stitch keeps the
kernel on the tensor cores it would run on alone). Here the
tensorized kernel takes a block tile of :data:`~polyfuse.poly.tensorize_tiling.TILINGS` whose
columns cover the row (the narrowest such width), its epilogue stores the accumulators to a
shared row tile instead of global memory (after a barrier: the tile overlays the operand tiles,
:func:`polyfuse.cuda.codegen.lower_mma.lower_mma_ir`), and the reduction's own code runs in the
same block a warp per row, exactly as for the float32 GEMMs (the same isl checks:
:func:`~polyfuse.stitch.gemm_rows.shared_row_tile`).

Policy: the candidates are the whole-row tilings whose shared pool fits static shared memory
(the operand stages overlaid with the row tile and the reduction's arrays); each is priced by
the one cost model on its lowered kernel (the kernel IR estimate), as is the tensorized
kernel's own best tile, and the cheapest is stitched when the model says the DRAM round trip
of the intermediate and the launch it saves outweigh what the whole-row tile costs
(:mod:`polyfuse.stitch.row_cost`). Refusals (a folded or split GEMM, a row wider than the
widest tile, the shared pool, the cost) are the decision's reason.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, refused
from polyfuse.graph.dtypes import info as dtype_info
from polyfuse.graph.graph import Graph
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.policy import smem_itemsize
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tensorize import TensorCoreKernel, map_tensor_core, tensor_core_placements
from polyfuse.poly.tensorize_fragments import with_fragment_buffers, with_stage_unroll
from polyfuse.poly.tensorize_tiling import TILINGS
from polyfuse.stitch.gemm_rows import (
    RowsPlan,
    epilogue_tile,
    map_rows,
    reduction_bytes,
    row_tile_placements,
    shared_pool,
    shared_row_tile,
    too_wide,
)
from polyfuse.stitch.memory import KernelGroup
from polyfuse.stitch.row_cost import TilePrice, row_stitch_cost

#: how a refusal for want of a tensorized mapping starts (the caller then tries CUDA cores)
NO_TENSOR_CORES = "no tensor cores: "
#: why the tensorized GEMM takes its tile (the tile note's "forced: ...")
FORCED = "whole-row tile for the row reduction after it (stitch/mma_rows.py)"

Tiling = tuple[int, int, int, int]  # (block M, block N, warps along M, warps along N)
#: the cost model's price of a tensorized kernel launched alone: measured on its lowered
#: kernel, so the driver, which sees code generation, passes it in
#: (:func:`polyfuse.gemm_rows.tensorized_price`)
Pricer = Callable[[TensorCoreKernel], TilePrice]

#: whole-row tiles beside :data:`TILINGS`: 32 rows of 256 columns on 4 warps (each warp 32x64,
#: as the 64x128 tile's), whose row tile of floats fits static shared memory where 64 rows
#: of 256 do not (ViT-B/16's 197 keys)
ROW_ONLY = ((32, 256, 1, 4),)


def row_tilings(n: int) -> list[Tiling]:
    """The whole-row tilings tried for rows of ``n`` elements: the candidates of
    :data:`TILINGS` and :data:`ROW_ONLY` of the narrowest block width that covers the row
    (wider ones compute more padding), fewer rows first."""
    widths = [t[1] for t in TILINGS if t[1] >= n]
    if not widths:
        return []
    return sorted(
        (t for t in TILINGS + ROW_ONLY if t[1] == min(widths)), key=lambda t: (t[0], t[2:])
    )


@dataclass
class MmaRows:
    """One priced whole-row tensorized kernel: its tiling, mapping and modelled price."""

    tiling: Tiling
    kernel: TensorCoreKernel
    price: TilePrice


def _tensorize(
    sm: ScheduledMicrograph, device: DeviceSpec, cfg: MappingConfig, tiling: Tiling | None
) -> TensorCoreKernel | Refusal:
    """``sm`` on tensor cores as the mapping would put it (tf32 first where the user allowed
    it, as :func:`polyfuse.poly.kernel_map.map_kernel`), on ``tiling`` where given."""
    reason = FORCED if tiling else ""
    tk: TensorCoreKernel | Refusal | None = None
    if cfg.allow_tf32:
        tk = map_tensor_core(sm, device, cfg.gemm_stages, True, cfg.mma_block_k, tiling, reason)
    if not isinstance(tk, TensorCoreKernel):
        tk = map_tensor_core(sm, device, cfg.gemm_stages, False, cfg.mma_block_k, tiling, reason)
    if isinstance(tk, Refusal):
        return tk
    tk = with_fragment_buffers(tk, device, cfg.mma_fragment_buffers)
    return with_stage_unroll(tk, device, cfg.mma_stage_unroll)


def mma_tile_footprint(tk: TensorCoreKernel, tensor: str) -> tuple[isl.Set, list] | Refusal:
    """The elements of ``tensor`` one block of ``tk`` stores (parametric in its block
    coordinates ``pf_g<i>``: the batch dims one point each, then the block tile's rows and
    columns, as :mod:`polyfuse.cuda.codegen.lower_mma` lays out the grid) and the box that
    holds them; or why not (TILE_MISMATCH)."""
    shape, t = tk.shape, tk.tiling
    assert shape is not None and t is not None

    def bounds(ds: list[str]) -> list[str]:
        cons, nb = [], 0
        for i, (lo, _) in enumerate(shape.data):
            if i not in (tk.m_dim, tk.n_dim):
                cons.append(f"{ds[i]} = {lo} + pf_g{nb}")
                nb += 1
        for i, g, size in ((tk.m_dim, nb, t.block_m), (tk.n_dim, nb + 1, t.block_n)):
            lo = shape.data[i][0]
            cons.append(f"{lo} + {size} * pf_g{g} <= {ds[i]} < {lo} + {size} * pf_g{g} + {size}")
        return cons

    return epilogue_tile(tk, shape, tensor, bounds)


def store_wavefronts(stride: int) -> int:
    """Shared-memory wavefronts of one warp's epilogue store to a row tile of 4-byte elements
    whose rows are ``stride`` elements apart: accumulator element ``x`` of lane ``l`` lies at
    row ``l / 4``, column ``2 (l % 4) + x``, so a warp writes 8 rows x 4 columns per store; the
    busiest of the 32 banks takes that many wavefronts."""
    banks: dict[int, int] = {}
    for lane in range(32):
        b = (stride * (lane // 4) + 2 * (lane % 4)) % 32
        banks[b] = banks.get(b, 0) + 1
    return max(banks.values())


def pair_store_wavefronts(stride: int) -> int:
    """Shared-memory wavefronts of one warp's epilogue store of column pairs (one ``float2``
    per lane: :mod:`polyfuse.cuda.codegen.lower_mma_epilogue`) to a row tile whose rows are
    ``stride`` floats apart: lane ``l`` writes words ``stride * (l / 4) + 2 (l % 4)`` and the
    next; 8-byte accesses are served a half-warp (4 rows) per phase, each phase taking as many
    wavefronts as its busiest bank has words (2 at the least, one per phase)."""
    total = 0
    for phase in (range(16), range(16, 32)):
        banks: dict[int, int] = {}
        for lane in phase:
            for w in (0, 1):
                b = (stride * (lane // 4) + 2 * (lane % 4) + w) % 32
                banks[b] = banks.get(b, 0) + 1
        total += max(banks.values())
    return total


def row_pad(width: int) -> int:
    """Elements each row of a ``width``-wide row tile is padded by: the fewest (a multiple of
    4, keeping 16-byte rows for the reduction's vector reads) whose stride gives the epilogue's
    stores the fewest wavefronts — pairs of columns as ``float2`` where the rows are even
    (:func:`pair_store_wavefronts`: a 128-wide row, 8 of them; padded by 8, 2, conflict-free),
    else element by element (:func:`store_wavefronts`: padded by 4, 2 per 4-byte store)."""
    if width % 4:
        return 0
    cost = pair_store_wavefronts if width % 2 == 0 else store_wavefronts
    return min(range(0, 32, 4), key=lambda p: (cost(width + p), p))


def _padded(box: list, stride: int) -> list:
    """``box`` with its last (row) dim ``stride`` elements long."""
    return [*box[:-1], (box[-1][0], stride)]


def plan_mma_rows(
    graph: Graph,
    gemm: ScheduledMicrograph,
    rows: list[ScheduledMicrograph],
    tensor: str,
    tiling: Tiling,
    form,
    device: DeviceSpec,
    cfg: MappingConfig,
    memo: dict | None = None,
    tk: TensorCoreKernel | None = None,
) -> RowsPlan | Refusal:
    """Both halves with the tensorized GEMM on the whole-row ``tiling`` (``tk`` where the
    caller has mapped it) and ``tensor`` in shared memory in both, or why not (refusals as
    :func:`polyfuse.stitch.gemm_rows.plan_rows`)."""
    subject = (gemm.name, *(r.name for r in rows), tensor)

    def no(why: str, kind: DecisionKind = DecisionKind.TILE_MISMATCH) -> Refusal:
        return refused(kind, why, *subject)

    if tk is None:
        got = _tensorize(gemm, device, cfg, tiling)
        if isinstance(got, Refusal):
            return no(f"no tensor cores: {got.reason}")
        tk = got
    assert tk.shape is not None and tk.tiling is not None
    if tk.fold is not None or tk.split is not None:
        return no("the tensorized GEMM folds or splits its data dims: its rows are not the row's")
    if tk.n_dim != len(tk.shape.data) - 1:
        return no(f"the tensorized GEMM's columns are data dim {tk.n_dim}, not the row")
    threads = 32 * tk.tiling.warps
    mapped = map_rows(graph, rows, form, tk.tiling.block_m, threads, device, cfg, memo)
    if isinstance(mapped, str):
        return no(mapped)
    rec, repeat = mapped
    rm, rpl = rec.mapped, dict(rec.placements)
    boxes = shared_row_tile(tk, rm, tensor, mma_tile_footprint(tk, tensor), repeat)
    if isinstance(boxes, Refusal):
        return no(boxes.reason, boxes.kind)
    gbox, rbox = boxes
    width = gbox[-1][1]
    stride = width + row_pad(width)
    gbox, rbox = _padded(gbox, stride), _padded(rbox, stride)
    gp, rp = row_tile_placements(tensor, gbox, rbox, rpl)
    itemsize = smem_itemsize(gemm.model.tensors[tensor].dtype)
    gp, rp = replace(gp, itemsize=itemsize), replace(rp, itemsize=itemsize)
    others = reduction_bytes(rpl, tensor, threads)
    operands = tk.stages * tk.shared_bytes()
    total = shared_pool(gp.smem_bytes, operands, others)
    wide = too_wide(tensor, gp.smem_bytes, operands, others)
    if wide is not None:
        return no(wide.reason, wide.kind)
    gpl = tensor_core_placements(tk)
    gpl[tensor], rpl[tensor] = gp, rp
    return RowsPlan(tk, gpl, rm, rpl, rec.decisions, total, repeat)


def try_mma_rows(
    graph: Graph,
    gp: KernelGroup,
    gc: KernelGroup,
    tensor: str,
    device: DeviceSpec,
    cfg: MappingConfig,
    price: Pricer,
) -> tuple[bool, str, dict]:
    """The tensorized GEMM group ``gp`` and the y-reduce group ``gc`` reading ``tensor``:
    (stitched?, reason, data: the tiling and both modelled figures, ``price``'s)."""
    (gemm,) = gp.parts
    best = _tensorize(gemm, device, cfg, None)
    if isinstance(best, Refusal):
        return False, f"{NO_TENSOR_CORES}{best.reason}", {}
    assert best.shape is not None and best.tiling is not None
    lo, hi = best.shape.data[-1]
    n = hi - lo + 1
    tilings = row_tilings(n)
    if not tilings:
        widest = max(t[1] for t in TILINGS)
        return False, f"row of {n} elements wider than the widest tensor-core tile ({widest})", {}
    best_price = price(best)
    role = gemm.model.tensors[tensor]
    size = dtype_info(role.dtype).itemsize * math.prod(role.shape)
    refusals: list[str] = []
    memo: dict = {}
    priced: list[MmaRows] = []
    for tiling in tilings:
        tk = _tensorize(gemm, device, cfg, tiling)
        if isinstance(tk, Refusal):
            refusals.append(f"{tiling[0]}x{tiling[1]}: {tk.reason}")
            continue
        priced.append(MmaRows(tiling, tk, price(tk)))
    for p in sorted(priced, key=lambda p: (p.price.us, p.tiling)):
        cost = row_stitch_cost(tensor, p.price, best_price, size, device)
        data = cost.data().as_dict()
        if not cost.taken:
            if refusals:
                return False, f"{refusals[0]} (dearer tiles: the cost model says no)", {}
            return False, f"the cost model says no: {cost.figures()}", data
        plan = plan_mma_rows(
            graph, gemm, gc.parts, tensor, p.tiling, gc.form, device, cfg, memo, p.kernel
        )
        if isinstance(plan, Refusal):
            refusals.append(plan.reason)
            continue
        data["shared_bytes"] = plan.shared_bytes
        return True, f"GEMM block tile covers whole rows: {cost.figures()}", data
    return False, refusals[0] if refusals else f"no whole-row tensor-core tiling for {n}", {}

