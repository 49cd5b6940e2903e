"""Layer 2 for GEMMs: a GEMM whose block tile covers whole rows takes the row reduction after it.

A y-reduce kernel (softmax of attention scores, a residual add + layer norm) that reads a
GEMM's output row by row can run in the GEMM's kernel when one GEMM block computes whole rows
(block tile BM x N): the GEMM's epilogue stores its tile to shared memory instead of global
memory, a barrier follows, and the reduction kernel's own code (its stitched parts, lanes and
combines; :mod:`polyfuse.poly.compose`) runs in the same block, a warp per row, ``threads /
32`` rows at a time, for each of the ``BM / (threads / 32)`` reduction blocks the GEMM block's
rows make, reading that shared tile. The intermediate never reaches global memory and one
launch is saved. A warp per row keeps the reduction's combine convergent under a partial row
tile's guard (rows not a multiple of the tile: the guard keeps or drops whole warps).

Policy (PPCG style: legality by isl, speed by the one cost model):

1. **candidates** — a group of one GEMM-like micrograph (:func:`detect_gemm`) whose output is
   read by exactly one y-reduce group and is no graph output; the reduction group reads no
   tensor produced downstream of the GEMM (no cycle);
2. **tiles** — every whole-row tiling (BN the power of two covering the row, BM in
   :data:`ROW_TILES`, register micro-tile TM x TN, a multiple of 32 threads whose warps divide
   BM, registers within the budget) is priced by the cost model; the cheapest whose shared
   memory fits static shared memory is taken (the GEMM's operand tiles overlaid, by liveness,
   with the row tile and the reduction's own arrays and combine scratch); none fitting is a
   refusal with the bytes;
3. **legality** — isl checks that the map from reduction blocks to the GEMM blocks that run
   them (:func:`block_correspondence`) covers the reduction's grid, and that every element a
   reduction block reads is one its GEMM block stored; the reduction's view of the shared tile
   is the GEMM block's tile (its lower bounds pulled back through that map);
4. **cost** — stitched when the whole-row tile's modelled time is below the best tile's plus
   what the intermediate costs in DRAM traffic (written and read back) plus one launch
   (:mod:`polyfuse.stitch.row_cost`: the argument, and the record whose figures — both tiles'
   times, blocks, waves and bounds, the bytes and launch saved, the gain — are the decision's
   data).

Every stitch made or refused is a :class:`StitchDecision` (rule ``GEMM_ROWS_RULE``), made by
:func:`polyfuse.stitch.row_stitch.stitch_gemm_rows`; 16-bit GEMMs take the tensorized variant
of steps 2-4 (:mod:`polyfuse.stitch.mma_rows`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, refused
from polyfuse.base.decision_data import NO_DATA, DecisionData
from polyfuse.graph.graph import Graph
from polyfuse.poly.cost import ReductionStrategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.islutil import drop_params, maps_of
from polyfuse.poly.kernel_map import gemm_kernel_fitting
from polyfuse.poly.mapping import MappedKernel, MappingConfig
from polyfuse.poly.placement import Placement, set_box
from polyfuse.poly.policy import (
    COMBINE_SCRATCH_FLOATS_PER_THREAD,
    FLOAT_BYTES,
    GEMM_REG_BUDGET,
    STATIC_SMEM_LIMIT,
    gemm_tile_registers,
)
from polyfuse.poly.promote import (
    GemmKernel,
    gemm_placements,
    padded_reduction_reads,
    pipeline_stages,
)
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tiling import GemmShape, GemmTiling, detect_gemm, rank_gemm_tiles
from polyfuse.stitch.memory import KernelGroup
from polyfuse.stitch.recompute import recompute_spills
from polyfuse.stitch.row_cost import TilePrice, row_stitch_cost

#: the rule number the plan prints for a GEMM + row-reduction stitch
GEMM_ROWS_RULE = 9
#: rows per block tried for a whole-row GEMM tile (the reduction's kept tile)
ROW_TILES = (4, 8, 16, 32)
#: register micro-tiles tried (TM x TN) and the k-tiles
MICRO_TILES = tuple((tm, tn) for tm in (1, 2, 4, 8) for tn in (4, 8))
ROW_KTILES = (8, 16, 32)
#: threads per block tried
ROW_THREADS = (64, 128, 256)
#: lanes per row of the reduction (a warp per row)
WARP = 32
#: what the cached decisions' data holds (:mod:`polyfuse.stitch.row_cost`); bumped when it changes
ROW_COST_REVISION = 5
#: the widest row a whole-row tile is tried for (wider rows are refused with this reason)
MAX_ROW = 4096


@dataclass
class GemmRowsGroup(KernelGroup):
    """A GEMM micrograph (``parts[0]``) and the y-reduce group after it, as one kernel."""

    tensor: str = ""  # the GEMM output the reduction reads (kept in shared memory)
    tile: tuple[int, int, int, int, int] | None = None  # (BM, BN, TM, TN, TK)
    figures: DecisionData = NO_DATA  # the cost model's figures of the decision (RowStitchData)
    #: the GEMM runs on tensor cores; ``tile`` is then (BM, BN, warps M, warps N, k-tile)
    #: (:mod:`polyfuse.stitch.mma_rows`)
    tensor_cores: bool = False

    @property
    def gemm(self) -> ScheduledMicrograph:
        return self.parts[0]

    @property
    def rows(self) -> list[ScheduledMicrograph]:
        return self.parts[1:]


@dataclass
class RowsPlan:
    """Both halves of a stitched GEMM + row-reduction kernel, mapped and placed."""

    gemm: GemmKernel
    gemm_placements: dict[str, Placement]
    rows: MappedKernel
    rows_placements: dict[str, Placement]
    rows_decisions: list
    shared_bytes: int
    #: reduction blocks per GEMM block (each ``threads / 32`` rows of the GEMM's BM)
    repeat: int = 1


def _row_shape(shape: GemmShape) -> tuple[int, int, int]:
    """(rows dim, rows extent, row width N) of the GEMM's data dims (last dim: the row)."""
    ext = [hi - lo + 1 for lo, hi in shape.data]
    m_dim = next((d for d in reversed(range(len(ext) - 1)) if ext[d] > 1), max(0, len(ext) - 2))
    return m_dim, ext[m_dim], ext[-1]


def _pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def row_tiles(n: int) -> list[tuple[int, int, int, int, int]]:
    """The whole-row tilings (BM, BN, TM, TN, TK) tried for rows of ``n`` elements.

    The reduction runs a warp per row (32 lanes: a partial row tile's row guard then keeps or
    drops whole warps, so its combine never runs under a divergent guard): ``threads / 32``
    rows at a time, ``BM / (threads / 32)`` times per GEMM block."""
    bn = max(16, _pow2(n))
    out = []
    for bm in ROW_TILES:
        for tm, tn in MICRO_TILES:
            if bm % tm or bn % tn or gemm_tile_registers(tm, tn) > GEMM_REG_BUDGET:
                continue
            threads = (bm // tm) * (bn // tn)
            if threads not in ROW_THREADS or bm % (threads // WARP):
                continue
            out += [(bm, bn, tm, tn, tk) for tk in ROW_KTILES]
    return out


def gemm_tile_footprint(
    gk: GemmKernel, tensor: str
) -> tuple[isl.Set, list[tuple[isl.PwAff, int]]] | Refusal:
    """The elements of ``tensor`` one block of ``gk`` stores (parametric in its block
    parameters: the block's tile of the epilogue statement that writes ``tensor``, through its
    write access) and the box that holds them: per dim (lower bound, size); or why not (a
    TILE_MISMATCH refusal about ``tensor``)."""
    shape, tiling = gk.shape, gk.tiling
    assert shape is not None and tiling is not None
    bmap = set(gk.block_params)

    def bounds(ds: list[str]) -> list[str]:
        cons = []
        for i, (d, (lo, _), b) in enumerate(zip(ds, shape.data, tiling.block, strict=True)):
            bb = f"b{i}" if f"b{i}" in bmap else "0"  # promote.py names block dim i b<i>
            cons.append(f"{lo} + {b} * {bb} <= {d} < {lo} + {b} * {bb} + {b}")
        return cons

    return epilogue_tile(gk, shape, tensor, bounds)


def epilogue_tile(
    mm: MappedKernel, shape: GemmShape, tensor: str, bounds: Callable[[list[str]], list[str]]
) -> tuple[isl.Set, list[tuple[isl.PwAff, int]]] | Refusal:
    """The elements of ``tensor`` one block of ``mm`` stores: the epilogue statement that
    writes it, on the points of its domain inside ``bounds`` (constraints on the data dims
    ``d0, d1, ...`` and the block parameters), through its write access; and the box that
    holds them. Or why not (a TILE_MISMATCH refusal about ``tensor``)."""
    writers = [s for s in shape.epilogue if s.write.get_tuple_name(isl.dim_type.out) == tensor]
    if len(writers) != 1:
        return refused(
            DecisionKind.TILE_MISMATCH, f"{tensor} is not stored by one epilogue statement", tensor
        )
    (stmt,) = writers
    ds = [f"d{i}" for i in range(len(shape.data))]
    tile = isl.Set(
        f"[{', '.join(mm.block_params)}] -> {{ {stmt.name}[{', '.join(ds)}] : "
        f"{' and '.join(bounds(ds))} }}",
        context=mm.scheduled.model.ctx,
    )
    dom = stmt.domain
    tile = tile.align_params(dom.get_space()).intersect(dom.align_params(tile.get_space()))
    fp = tile.apply(stmt.write.align_params(tile.get_space())).coalesce()
    box = set_box(fp)
    if box is None:
        return refused(
            DecisionKind.TILE_MISMATCH, f"no box bounds the GEMM block's tile of {tensor}", tensor
        )
    return fp, box


def reads_footprint(mm: MappedKernel, tensor: str) -> isl.Set | None:
    """The elements of ``tensor`` one block of ``mm`` reads (parametric in its block, thread
    and lane parameters), or None when it does not read it."""
    model = mm.scheduled.model
    out = None
    for m in maps_of(model.reads.intersect_domain(mm.domain)):
        if m.get_tuple_name(isl.dim_type.out) != tensor:
            continue
        img = m.range().intersect_params(mm.context)
        out = img if out is None else out.union(img)
    return out


def plan_rows(
    graph: Graph,
    gemm: ScheduledMicrograph,
    rows: list[ScheduledMicrograph],
    tensor: str,
    tile: tuple[int, int, int, int, int],
    form,
    device: DeviceSpec,
    cfg: MappingConfig,
    memo: dict | None = None,
) -> RowsPlan | Refusal:
    """Map both halves with the whole-row ``tile`` and place ``tensor`` in shared memory in
    both, or why not (isl's legality and layout checks: TILE_MISMATCH; the shared-memory
    budget: FOOTPRINT; each a refusal about the GEMM, the rows and ``tensor``). ``memo``
    keeps the reduction's mapping per (rows, threads) across the tiles one decision tries."""
    subject = (gemm.name, *(r.name for r in rows), tensor)

    def no(why: str, kind: DecisionKind = DecisionKind.TILE_MISMATCH) -> Refusal:
        return refused(kind, why, *subject)

    shape = detect_gemm(gemm)
    if isinstance(shape, Refusal):
        return no(f"{gemm.name} is not GEMM-like ({shape})")
    (tiling,) = rank_gemm_tiles(
        shape,
        device,
        tile,
        limit=1,
        forced_reason="whole-row tile for the row reduction after it (stitch/gemm_rows.py)",
        stages=pipeline_stages(device.arch),
    )
    unsound = padded_reduction_reads(shape, tiling.tk, gemm.model)
    if unsound is not None:
        return no(unsound.reason)
    bm, threads = tile[0], tiling.nthreads
    mapped = map_rows(graph, rows, form, bm, threads, device, cfg, memo)
    if isinstance(mapped, str):
        return no(mapped)
    rec, repeat = mapped
    rm, rpl = rec.mapped, dict(rec.placements)
    _, _, n = _row_shape(shape)
    row_bytes = FLOAT_BYTES * bm * n
    others = reduction_bytes(rpl, tensor, threads)
    assert tiling.code is not None
    wide = too_wide(tensor, row_bytes, tiling.code.shared_bytes, others)
    if wide is not None:  # the tile model's estimate of the GEMM's tiles, before building it
        return no(wide.reason, wide.kind)
    gk = gemm_kernel_fitting(gemm, shape, tiling, device)
    if isinstance(gk, Refusal):
        return no(gk.reason)
    # the epilogue stores to the shared row tile element by element (no global vectors)
    gk = replace(gk, vector_stores={})
    boxes = shared_row_tile(gk, rm, tensor, gemm_tile_footprint(gk, tensor), repeat)
    if isinstance(boxes, Refusal):
        return no(boxes.reason, boxes.kind)
    gbox, rbox = boxes
    # shared memory: the GEMM's stages, the row tile, the reduction's tiles and scratch
    tile_floats = math.prod(s for _, s in gbox)
    promoted = FLOAT_BYTES * sum(p.floats for p in gk.promotions) * gk.stages
    total = shared_pool(FLOAT_BYTES * tile_floats, promoted, others)
    wide = too_wide(tensor, FLOAT_BYTES * tile_floats, promoted, others)
    if wide is not None:
        return no(wide.reason, wide.kind)
    gpl = gemm_placements(gk)
    gpl[tensor], rpl[tensor] = row_tile_placements(tensor, gbox, rbox, rpl)
    return RowsPlan(gk, gpl, rm, rpl, rec.decisions, total, repeat)


def map_rows(
    graph: Graph,
    rows: list[ScheduledMicrograph],
    form,
    bm: int,
    threads: int,
    device: DeviceSpec,
    cfg: MappingConfig,
    memo: dict | None,
):
    """The reduction half mapped a warp per row on the GEMM block's ``threads`` (its
    recompute decisions with it) and the reduction blocks per GEMM block of ``bm`` rows; or
    why not. ``memo`` keeps the mapping per rows at a time."""
    if threads % WARP or bm % (threads // WARP):
        return f"{threads} threads do not run {bm} rows a warp per row"
    kept = threads // WARP
    if memo is None or kept not in memo:
        strategy = ReductionStrategy(
            form, kept, WARP, f"the GEMM's whole-row tile: a warp per row, {kept} rows at a time"
        )
        rec = recompute_spills(graph, rows, strategy, device, cfg)
        if memo is not None:
            memo[kept] = rec
    else:
        rec = memo[kept]
    rm = rec.mapped
    if rm.strategy is None or rm.strategy.threads != threads:
        got = rm.strategy.threads if rm.strategy is not None else "no"
        return f"the reduction maps to {got} threads, the GEMM tile has {threads}"
    return rec, bm // kept


def shared_row_tile(
    gk: MappedKernel,
    rm: MappedKernel,
    tensor: str,
    stored: tuple[isl.Set, list] | Refusal,
    repeat: int,
) -> tuple[list, list] | Refusal:
    """The boxes of ``tensor`` in shared memory: the GEMM block's (``stored``: the tile it
    stores and its box, :func:`gemm_tile_footprint`, or why not) and the one the reduction
    ``rm`` sees, the same tile parametric in its own block; or why not (isl: each reduction
    block runs in one GEMM block, :func:`block_correspondence`, and reads only elements that
    block stored; both see boxes of one shape). A TILE_MISMATCH refusal."""
    if isinstance(stored, Refusal):
        return stored
    gfp, gbox = stored
    rfp = reads_footprint(rm, tensor)
    if rfp is None:
        return refused(DecisionKind.TILE_MISMATCH, f"the reduction does not read {tensor}", tensor)
    rfp = drop_params(rfp, rm.thread_params + rm.lane_params)
    corr = block_correspondence(gk, rm, repeat)
    if isinstance(corr, Refusal):
        return corr
    reads = _as_map(rfp, rm.block_params)  # { [rb] -> T[e] }
    writes = _as_map(gfp, gk.block_params)  # { [gb] -> T[e] }
    if not reads.is_subset(corr.apply_range(writes)):
        why = f"a reduction block reads elements of {tensor} its GEMM block does not store"
        return refused(DecisionKind.TILE_MISMATCH, why, tensor)
    # the reduction sees the GEMM's tile: its lower bounds, at the GEMM block of its own block
    seen = corr.apply_range(writes)  # { [rb] -> T[e] }: the tile of its GEMM block
    rbox = set_box(_as_set(seen, rm.block_params))
    if rbox is None or [s for _, s in rbox] != [s for _, s in gbox]:
        why = f"the shared tiles of {tensor} differ (GEMM vs reduction)"
        return refused(DecisionKind.TILE_MISMATCH, why, tensor)
    return gbox, rbox


def row_tile_placements(
    tensor: str, gbox: list, rbox: list, rpl: dict[str, Placement]
) -> tuple[Placement, Placement]:
    """``tensor``'s shared placements in the GEMM half (box ``gbox``) and in the reduction
    half (``rbox``, after the reduction's own arrays ``rpl``)."""
    why = f"whole-row tile {'x'.join(str(s) for _, s in gbox)} in shared memory"
    gp = Placement(tensor, "shared", f"{why} (the GEMM stores it)", box=tuple(gbox))
    rp = Placement(
        tensor,
        "shared",
        f"{why} (stored by the GEMM before a barrier)",
        box=tuple(rbox),
        smem_offset=sum(p.smem_floats for t, p in rpl.items() if t != tensor),
    )
    return gp, rp


def row_grid(gemm_grid: list[int] | tuple[int, ...], rows: int) -> tuple[int, ...]:
    """The GEMM's block grid as the reduction's blocks correspond to it: without the trailing
    coordinates of one block past the reduction's ``rows`` coordinates (a tensorized whole-row
    tile's columns, always block 0)."""
    grid = tuple(gemm_grid)
    while len(grid) > rows and grid[-1] == 1:
        grid = grid[:-1]
    return grid


def block_correspondence(gk: GemmKernel, rm: MappedKernel, repeat: int) -> isl.Map | Refusal:
    """``{ [rb] -> [gb] }``: the GEMM block that runs each reduction block. Block coordinates
    correspond in order; the last reduction coordinate (rows) is ``repeat`` times the GEMM's
    (or, when the GEMM has one coordinate fewer, its rows in one block, below ``repeat``).
    The map must be a function onto the GEMM's grid and defined on the whole reduction grid;
    when it cannot be, a TILE_MISMATCH refusal about both kernels."""
    subject = (gk.scheduled.name, rm.scheduled.name)
    gp, gg = gk.block_params, gk.grid_dims
    rp, rg = rm.block_params, rm.grid_dims
    ones = len(gp) - len(row_grid(gg, len(rp)))
    if not rp or len(gp) - ones not in (len(rp), len(rp) - 1):
        return refused(
            DecisionKind.TILE_MISMATCH,
            f"block grids do not correspond ({gg} GEMM, {rg} reduction)",
            *subject,
        )
    rs = [f"r{i}" for i in range(len(rp))]
    gs = [f"g{i}" for i in range(len(gp))]
    kept = gs[: len(gs) - ones]
    cons = [f"0 <= {r} < {n}" for r, n in zip(rs, rg, strict=True)]
    cons += [f"{g} = {r}" for g, r in zip(kept, rs[:-1], strict=False)]
    if len(kept) == len(rp):
        cons.append(f"{repeat} * {kept[-1]} <= {rs[-1]} < {repeat} * {kept[-1]} + {repeat}")
    else:
        cons.append(f"{rs[-1]} < {repeat}")
    cons += [f"{g} = 0" for g in gs[len(kept) :]]
    cons += [f"0 <= {g} < {n}" for g, n in zip(gs, gg, strict=True)]
    corr = isl.Map(
        f"{{ [{', '.join(rs)}] -> [{', '.join(gs)}] : {' and '.join(cons)} }}",
        context=gk.scheduled.model.ctx,
    )
    grid = isl.Set(
        f"{{ [{', '.join(rs)}] : {' and '.join(cons[: len(rs)])} }}",
        context=gk.scheduled.model.ctx,
    )
    if not corr.domain().is_equal(grid):
        why = f"some reduction blocks have no GEMM block ({rg} reduction, {gg} GEMM)"
        return refused(DecisionKind.TILE_MISMATCH, why, *subject)
    return corr


def _as_map(fp: isl.Set, params: list[str]) -> isl.Map:
    """A set parametric in block parameters ``params`` as ``{ [params] -> set }``."""
    m = isl.Map.from_range(fp)
    for p in params:
        pos = m.get_space().find_dim_by_name(isl.dim_type.param, p)
        n = m.dim(isl.dim_type.in_)
        m = m.move_dims(isl.dim_type.in_, n, isl.dim_type.param, pos, 1)
    n = m.dim(isl.dim_type.param)
    return m.project_out(isl.dim_type.param, 0, n).reset_tuple_id(isl.dim_type.in_)


def _as_set(m: isl.Map, params: list[str]) -> isl.Set:
    """``{ [b] -> set }`` back as the set parametric in block parameters ``params``."""
    n = m.dim(isl.dim_type.in_)
    m = m.insert_dims(isl.dim_type.param, 0, n)
    for i, p in enumerate(params):
        m = m.set_dim_name(isl.dim_type.param, i, p)
    for i in range(n):
        m = m.equate(isl.dim_type.param, i, isl.dim_type.in_, i)
    return m.project_out(isl.dim_type.in_, 0, n).range()


def shared_pool(row: int, gemm: int, rows: int) -> int:
    """Bytes of the joined kernel's shared pool: the GEMM's operand tiles (``gemm``) are dead
    when its epilogue stores the row tile (``row``), which the reduction's own arrays and
    scratch (``rows``) follow: the two phases overlay
    (:mod:`polyfuse.cuda.codegen.lower_gemm_rows`)."""
    return max(gemm, row + rows)


def reduction_bytes(rpl: dict[str, Placement], tensor: str, threads: int) -> int:
    """Shared bytes of the reduction half beside the row tile of ``tensor``: its own arrays
    (placements ``rpl``) and the combine scratch of ``threads`` threads."""
    others = FLOAT_BYTES * sum(p.smem_floats for t, p in rpl.items() if t != tensor)
    return others + FLOAT_BYTES * COMBINE_SCRATCH_FLOATS_PER_THREAD * threads


def too_wide(tensor: str, row: int, gemm: int, rows: int) -> Refusal | None:
    """Why the row tile (``row`` bytes), the GEMM's tiles and the reduction's shared memory do
    not fit static shared memory (a FOOTPRINT refusal about ``tensor``), or None."""
    total = shared_pool(row, gemm, rows)
    if total <= STATIC_SMEM_LIMIT:
        return None
    why = (
        f"row too wide for shared memory: the {row} B row tile of {tensor} + {rows} B of the "
        f"reduction (or the GEMM's {gemm} B operand tiles, which the two overlay) = {total} B "
        f"> {STATIC_SMEM_LIMIT} B static shared memory per block"
    )
    return refused(DecisionKind.FOOTPRINT, why, tensor)


def _best_tiling(shape: GemmShape, device: DeviceSpec) -> GemmTiling | None:
    ranked = rank_gemm_tiles(shape, device, limit=1, stages=pipeline_stages(device.arch))
    return ranked[0] if ranked else None


def try_gemm_rows(
    graph: Graph,
    gp: KernelGroup,
    gc: KernelGroup,
    tensor: str,
    device: DeviceSpec,
    cfg: MappingConfig,
) -> tuple[bool, str, dict]:
    """Steps 2-4 for the GEMM group ``gp`` and the y-reduce group ``gc`` reading ``tensor``:
    (stitched?, reason, data: the tile and both modelled figures)."""
    (gemm,) = gp.parts
    shape = detect_gemm(gemm)
    if isinstance(shape, Refusal):
        return False, f"not GEMM-like: {shape}", {}
    _, _, n = _row_shape(shape)
    if n > MAX_ROW:
        return False, f"row of {n} elements wider than {MAX_ROW}", {}
    best = _best_tiling(shape, device)
    if best is None:
        return False, "the GEMM has no ranked tiling", {}
    stages = pipeline_stages(device.arch)
    priced = []
    for tile in row_tiles(n):
        (t,) = rank_gemm_tiles(shape, device, tile, limit=1, stages=stages)
        priced.append((t.modelled_us, tile, t))
    size = FLOAT_BYTES * math.prod(hi - lo + 1 for lo, hi in shape.data)
    best_price = TilePrice.of(best, device)
    refusals: list[str] = []
    memo: dict = {}
    for _, tile, t in sorted(priced, key=lambda p: p[:2]):
        cost = row_stitch_cost(tensor, TilePrice.of(t, device), best_price, size, device)
        data = cost.data().as_dict()  # JSON: the stitch memo keeps it
        if not cost.taken:  # this and every dearer tile lose
            if refusals:
                return False, f"{refusals[0]} (dearer tiles: the cost model says no)", {}
            return False, f"the cost model says no: {cost.figures()}", data
        plan = plan_rows(graph, gemm, gc.parts, tensor, tile, gc.form, device, cfg, memo)
        if isinstance(plan, Refusal):
            refusals.append(plan.reason)
            continue
        data["shared_bytes"] = plan.shared_bytes
        return True, f"GEMM block tile covers whole rows: {cost.figures()}", data
    if refusals:
        return False, refusals[0], {}
    bn = max(16, _pow2(n))
    why = (
        f"no block tile {bn} wide has {min(ROW_THREADS)}-{max(ROW_THREADS)} threads, a warp per "
        f"row of its {ROW_TILES} rows (micro-tiles {MICRO_TILES[0]}..{MICRO_TILES[-1]})"
    )
    return False, f"no whole-row tiling for rows of {n}: {why}", {}
