"""Tile the outer permutable band and map it onto CUDA blocks and threads (PPCG style).

Policy. The coincident prefix of the outermost band is the parallelism isl found; we split it
off, tile it, and bind tile loops to block coordinates ``b_i`` and point loops to thread
coordinates ``t_i``. The binding is done the way PPCG does it: ``b_i`` and ``t_i`` become isl
parameters, the domain is filtered to ``tile_i = b_i + offset_i`` and ``point_i = t_i``, and
both bands are removed, so AST generation emits straight-line code in ``b``/``t`` with exactly
the guards partial tiles need. Non-coincident members (reductions) stay serial loops inside a
thread. The kernel linearises ``(b_0..b_n)`` over ``blockIdx.x`` and ``(t_0..t_n)`` over
``threadIdx.x`` with the innermost member fastest, so neighbouring threads touch neighbouring
elements of the innermost dimension (coalesced).

Tile sizes (:func:`choose_tile_sizes`) give the innermost members as many threads as their
extent allows, up to :attr:`MappingConfig.max_threads` per block; outer members get what is
left. Thresholds live in :class:`MappingConfig`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote, noted
from polyfuse.poly.coarsen import Coarsening, choose_coarsening, strip_mine, whole_warps
from polyfuse.poly.cost import ReductionStrategy
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.islutil import parallel_depth, top_band
from polyfuse.poly.schedule import ScheduledMicrograph
from polyfuse.poly.tiling import FORCED_TILE_REASON


@dataclass(frozen=True)
class MappingConfig:
    """Launch-shape knobs (one declared place)."""

    max_threads: int = 256
    min_threads: int = 32
    # GEMM-like micrographs: force (block rows, block cols, micro-tile rows, cols, k-tile)
    # instead of the cost model's choice (poly/tiling.py); None = the model decides.
    gemm_tile: tuple[int, int, int, int, int] | None = None
    # why ``gemm_tile`` is given (the tiling's first note): data, never matched as text
    gemm_tile_reason: str = FORCED_TILE_REASON
    # GEMM shared-tile stages over the k-tile loop (1..4, 2+ with cp.async only); None = the
    # stage model decides (poly/costs/stages.py). A count over the budget is refused, noted.
    gemm_stages: int | None = None
    # tensorized GEMMs: register fragment buffers over the k-steps (2: double-buffered, 1:
    # not); None = decided by the register budget (poly/tensorize_fragments.py)
    mma_fragment_buffers: int | None = None
    # tensorized, pipelined GEMMs: the steady k-tile loop unrolled by its stages (True) or
    # rolled with stage counters (False); None = decided by the register budget (ibid.)
    mma_stage_unroll: bool | None = None
    gemm: bool = True  # False: GEMM-like micrographs keep the one-element-per-thread mapping
    #: float32 GEMMs on tf32 tensor cores (mma.sync.m16n8k8: 10 mantissa bits per operand,
    #: float32 accumulators); off by default like torch's allow_tf32 (poly/tensorize.py)
    allow_tf32: bool = False
    #: tensorized GEMMs: force the k-tile (a multiple of the intrinsic's k: 32 or 64 for
    #: 16-bit operands, 16 or 32 for tf32) instead of the tile model's; None = the model's
    mma_block_k: int | None = None
    #: tensorized GEMMs: force the block tile and warp grid (block M, block N, warps along M,
    #: warps along N; whole 16x8 mma tiles per warp, checked by
    #: ``poly/tensorize_tiling.check_forced_tiling``) instead of the tile model's choice, e.g.
    #: to time tilings on a GPU; None = the model's (a row-stitched GEMM keeps its row tile)
    mma_tile: tuple[int, int, int, int] | None = None
    #: False: no GEMM takes the row reduction after it (rule 9, polyfuse.stitch.gemm_rows)
    gemm_rows: bool = True
    # plain kernels: elements per thread (poly/coarsen.py); None = the cost model decides,
    # 1 = one element per thread, 4/8 = forced (float4 only where isl proves it)
    elements_per_thread: int | None = None
    #: float32 contractions: sum the reduction in this many parts across blocks (split-K,
    #: poly/split_k.py) where it divides the reduction axis; 1 = never; None = the cost model
    #: decides where one stage leaves SMs idle
    split_k: int | None = None


@dataclass(frozen=True)
class MappedKernel:
    """A kernel's micrographs after tiling and block/thread mapping: the one record every
    mapping returns (plain :func:`map_to_gpu`, reduction
    :func:`polyfuse.poly.compose.map_reduction_kernel`, GEMM
    :class:`polyfuse.poly.promote.GemmKernel`), so later stages read the same fields whatever
    the kernel's kind.

    ``parts`` are the scheduled micrographs the kernel runs (one for a plain kernel);
    ``thread_order`` names the coordinates ``threadIdx.x`` decomposes into, slowest first;
    ``strategy`` is the parallel reduction layout (None: no lanes), whose ``lane_params``
    stride the reduced space, ``laneless`` statements run once per kept point and the
    reductions in ``combined`` hold per-lane partials to combine.
    """

    scheduled: ScheduledMicrograph  # the kernel's own model and schedule (all parts united)
    schedule: isl.Schedule  # parametric in block_params + thread_params; mapped bands removed
    context: isl.Set  # ranges of the parameters
    block_params: list[str]
    thread_params: list[str]
    grid_dims: list[int]  # blocks per mapped member
    tile_sizes: list[int]  # threads per mapped member
    extents: list[tuple[int, int]]  # [min, max] of each mapped band member
    notes: list[str] = field(default_factory=list)
    parts: list[ScheduledMicrograph] = field(default_factory=list)  # empty: [scheduled]
    strategy: ReductionStrategy | None = None
    lane_params: list[str] = field(default_factory=list)
    laneless: set[str] = field(default_factory=set)
    combined: set[str] = field(default_factory=set)  # reductions whose lanes hold partials
    thread_order: list[tuple[str, int]] = field(default_factory=list)  # empty: thread params
    coarsening: Coarsening | None = None  # elements per thread (poly/coarsen.py)
    # the mapping's launch-layout record: a reduction layout (poly/cost.py) or GEMM tiles
    # (poly/tiling.py); elements per thread are ``coarsening``'s
    layout: Decided | None = None
    # how the kernel's code is emitted beside its layout (a GEMM's unrolled loops, peeled
    # pipeline and launch bounds: poly/gemm_loops.py), each with its reason
    codegen: tuple[Decided, ...] = ()

    def __post_init__(self) -> None:
        # defaults derived from the other fields, set once at construction (frozen after)
        object.__setattr__(self, "parts", list(self.parts) or [self.scheduled])
        if not self.thread_order:
            order = list(zip(self.thread_params, self.tile_sizes, strict=True))
            object.__setattr__(self, "thread_order", order)

    @property
    def grid(self) -> int:
        n = 1
        for g in self.grid_dims:
            n *= g
        return n

    @property
    def block(self) -> int:
        n = 1
        for t in self.tile_sizes:
            n *= t
        return n

    @property
    def domain(self) -> isl.UnionSet:
        return self.schedule.get_domain()

    @property
    def lanes(self) -> int:
        """Threads cooperating on one result (1: no parallel reduction)."""
        return self.strategy.lanes if self.strategy is not None else 1

    @property
    def kept_tile(self) -> int:
        return self.strategy.kept_tile if self.strategy is not None else 1

    @property
    def combine_form(self) -> str:
        """The canonical form the lanes combine by ("" without lanes)."""
        return self.strategy.form.kind if self.strategy is not None else ""

    def __str__(self) -> str:
        if self.strategy is not None:
            return (
                f"ReductionKernel {'+'.join(p.name for p in self.parts)}: {self.strategy}\n"
                f"  schedule: {self.schedule.get_root()}"
            )
        lines = [
            f"MappedMicrograph {self.scheduled.name}: grid {self.grid} {self.grid_dims}, "
            f"block {self.block} {self.tile_sizes}",
            f"  schedule: {self.schedule.get_root()}",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


#: The record's former name (``polyfuse.poly.promote.GemmKernel`` still extends it by it).
MappedMicrograph = MappedKernel


def choose_tile_sizes(extents: list[int], cfg: MappingConfig) -> list[int]:
    """Threads per mapped member, innermost first, within ``cfg.max_threads`` per block."""
    sizes = [1] * len(extents)
    budget = cfg.max_threads
    for i in reversed(range(len(extents))):
        if budget <= 1:
            break
        e = extents[i]
        if e <= budget:
            sizes[i] = e
            budget //= e
        else:
            # Split the member evenly across blocks: the smallest tile count whose tile fits.
            tiles = -(-e // budget)
            sizes[i] = -(-e // tiles)
            budget = 1
    return sizes


def schedule_ranges(
    mupa: isl.MultiUnionPwAff, domain: isl.UnionSet, n: int
) -> list[tuple[int, int]]:
    """[min, max] of the first ``n`` members of a partial schedule over ``domain``."""
    um = isl.UnionMap.from_multi_union_pw_aff(mupa).intersect_domain(domain)
    rng = isl.Set.from_union_set(um.range())
    return [(rng.dim_min_val(i).to_python(), rng.dim_max_val(i).to_python()) for i in range(n)]


def band_ranges(node: isl.ScheduleNode, domain: isl.UnionSet, n: int) -> list[tuple[int, int]]:
    """[min, max] of the first ``n`` members of band ``node`` over ``domain``."""
    return schedule_ranges(node.band_get_partial_schedule(), domain, n)


def tile_band(
    node: isl.ScheduleNode, sizes: list[int], ranges: list[tuple[int, int]]
) -> tuple[isl.ScheduleNode, isl.MultiUnionPwAff, isl.MultiUnionPwAff, list[int], list[int]]:
    """Tile a band: (tile node, tile and point partial schedules, tile offsets, tile counts)."""
    mv = isl.MultiVal.zero(node.band_get_space())
    for i, s in enumerate(sizes):
        mv = mv.set_val(i, isl.Val.int_from_si(node.get_ctx(), s))
    node = node.band_tile(mv)
    tile_part = node.band_get_partial_schedule()
    point_part = node.child(0).band_get_partial_schedule()
    offsets = [lo // s for (lo, _), s in zip(ranges, sizes, strict=True)]
    counts = [hi // s - lo // s + 1 for (lo, hi), s in zip(ranges, sizes, strict=True)]
    return node, tile_part, point_part, offsets, counts


def bind_band(part: isl.MultiUnionPwAff, values: list[str], params: str) -> isl.UnionSet:
    """Statement instances whose band values equal ``values`` (isl expressions of params)."""
    vs = [f"v{i}" for i in range(len(values))]
    cons = " and ".join(f"{v} = {e}" for v, e in zip(vs, values, strict=True))
    target = isl.Set(f"[{params}] -> {{ [{', '.join(vs)}] : {cons} }}", context=part.get_ctx())
    um = isl.UnionMap.from_multi_union_pw_aff(part)
    return um.intersect_range(isl.UnionSet.from_set(target)).domain()


def map_to_gpu(
    sm: ScheduledMicrograph, cfg: MappingConfig | None = None, device: DeviceSpec | None = None
) -> MappedKernel:
    """Tile the coincident prefix of the outer band and bind it to blocks and threads.

    With a ``device``, a plain kernel may first get several elements per thread
    (:mod:`polyfuse.poly.coarsen`): the band that is mapped is then the strip-mined one."""
    cfg = cfg or MappingConfig()
    ctx = sm.model.ctx
    sched = sm.schedule
    domain = sched.get_domain()
    node = top_band(sched)
    nc = parallel_depth(sched)
    if nc == 0:
        why = "no coincident outer band member: the micrograph runs in one thread"
        note = noted(DecisionKind.TILE_MISMATCH, why, sm.name, made=False)
        return MappedKernel(
            sm, sched, isl.Set("{ : }", context=ctx), [], [], [], [], [], notes=[note]
        )
    if nc < node.band_n_member():
        node = node.band_split(nc)
    coarsening = None
    if device is not None and cfg.elements_per_thread != 1:  # hook: poly/coarsen.py
        coarsening = choose_coarsening(sm, node, device, cfg.elements_per_thread)
        if coarsening.factor > 1:
            node = strip_mine(node, coarsening.factor)
    ranges = band_ranges(node, domain, nc)
    extents = [hi - lo + 1 for lo, hi in ranges]
    sizes = choose_tile_sizes(extents, cfg)
    if coarsening is not None and coarsening.factor > 1:
        sizes = whole_warps(sizes, cfg.max_threads)
    node, tile_part, point_part, offsets, grid_dims = tile_band(node, sizes, ranges)
    bs = [f"b{i}" for i in range(nc)]
    ts = [f"t{i}" for i in range(nc)]
    params = ", ".join(bs + ts)
    on_block = bind_band(
        tile_part, [f"{b} + {o}" for b, o in zip(bs, offsets, strict=True)], params
    )
    on_thread = bind_band(point_part, ts, params)
    node = node.delete().delete()
    mapped = node.get_schedule().intersect_domain(on_block.intersect(on_thread))
    cons = [f"0 <= {b} < {g}" for b, g in zip(bs, grid_dims, strict=True)]
    cons += [f"0 <= {t} < {s}" for t, s in zip(ts, sizes, strict=True)]
    context = isl.Set(f"[{params}] -> {{ : {' and '.join(cons)} }}", context=ctx)
    notes: list[str] = [DecisionNote(coarsening.record)] if coarsening is not None else []
    return MappedKernel(
        sm, mapped, context, bs, ts, grid_dims, sizes, ranges, notes, coarsening=coarsening
    )
