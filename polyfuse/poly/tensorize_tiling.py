"""The block and warp tiling of a tensorized kernel (:mod:`polyfuse.poly.tensorize`).

A block tile of ``block_m x block_n`` is split over a grid of warps, each warp a grid of 16x8
mma tiles, k-steps of the intrinsic's k over k-tiles of :data:`BLOCK_K`. Per k-tile every
thread copies its share of both shared tiles, ``(block_m + block_n) x block_k / threads``
elements, and every warp issues ``tiles_m x tiles_n`` mma per k-step, so a larger warp tile
feeds more HMMA per copied element: what decides the hot loop's HMMA share where the fills are
scalar (an implicit GEMM's im2col gather, ~4 instructions per element) rather than 16-byte
``cp.async`` chunks (~6 per 8 elements).

:func:`choose_mma_tiling` prices every candidate of :data:`TILINGS` whose registers fit with
the one cost model, on a description of the kernel it would become
(:mod:`polyfuse.poly.costs.mma`: its waves and rounds of resident blocks, epilogue, L2
traffic), among those whose blocks fill the SMs (the model prices a block's mma at the
pipe's rate however few warps hold it; where none fills them, those of the most blocks; the
smaller :data:`SMALL_TILINGS` join where the others leave SMs idle, :data:`FILL_SHARE`), and
of the candidates within :data:`MODEL_MARGIN` of the model's best takes the one with the fewest
modelled non-HMMA instructions per useful HMMA of a k-tile (:func:`hot_figure`: the fills by
:func:`polyfuse.poly.tensorize_order.price_k_orders`, the ``ldmatrix`` of the fragments, a
fixed loop overhead, over the share of the block tile inside the GEMM — a 128-row tile of a
64-row GEMM computes half zeros): the model's tensor rate is one loop's, the same for every
tiling. The figures are in its note.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from polyfuse.base.decision import DecisionKind, noted
from polyfuse.base.decision_data import TensorCoreData
from polyfuse.base.errors import ExpressionError
from polyfuse.poly.costs import KernelDesc, Mix, model_kernel
from polyfuse.poly.costs.mma import mma_tile_desc
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_loops import MAX_REGISTERS
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.policy import GEMM_REG_OVERHEAD
from polyfuse.poly.tensorize_order import cheapest, pipelined, price_k_orders
from polyfuse.poly.tiling import epilogue_mix, operand_elements

#: the intrinsic's tile (m16n8k16) and the k-tile a shared buffer holds (two k-steps)
MMA_M, MMA_N, MMA_K = 16, 8, 16
BLOCK_K = 32
#: float32 GEMMs on ``mma.sync.m16n8k8`` tf32 where the user opts in (``allow_tf32``, off by
#: default like torch): k-steps of 8 over k-tiles of 16 (64-byte rows, as many bytes as the
#: 16-bit k-tile); tf32 keeps float32's exponent and 10 of its 23 mantissa bits
TF32_MMA_K, TF32_BLOCK_K = 8, 16
#: the intrinsic's k per operand itemsize (bytes: ``m16n8k32``), and a k-tile's bytes per row
#: (64: two k-steps of every intrinsic)
MMA_K_OF = {1: 32, 2: MMA_K, 4: TF32_MMA_K}
KTILE_BYTES = 64
#: candidate (block M, block N, warps along M, warps along N), the fallback (where none fills
#: the SMs) last: warp tiles of 64x64 (4x8 mma tiles), 64x32 and 32x64, 32x32; blocks of 4
#: or 8 warps (fewer leave a block's fill latency to too few warps). Their smallest block
#: sizes decide a match's orientation and column folding (:mod:`polyfuse.poly.tensorize`)
TILINGS = (
    (128, 256, 2, 4),
    (256, 128, 4, 2),
    (256, 64, 4, 1),
    (64, 256, 1, 4),
    (128, 128, 2, 4),
    (64, 256, 2, 4),
    (256, 64, 4, 2),
    (128, 64, 2, 2),
    (64, 128, 2, 2),
    (64, 64, 2, 2),
)
#: for GEMMs too small to fill the SMs with :data:`TILINGS`: four warps of 32x16, 16x32 and
#: 16x16 (MobileNetV2's 1x1 convs on 7x7 maps: 21 blocks of 64x64, 65 of 32x32)
SMALL_TILINGS = (
    (64, 32, 2, 2),
    (32, 64, 2, 2),
    (32, 32, 2, 2),
)
#: :data:`SMALL_TILINGS` are priced only where every candidate of :data:`TILINGS` leaves more
#: than this share of the SMs without a block: 64x64 in 21 blocks (of 132 SMs) gives way to
#: 32x32 in 65, but 64x64 in 128 blocks stays (64x32 in 224, shared-memory-bound, is modelled
#: slower)
FILL_SHARE = 0.9
#: candidates modelled within this share of the cost model's best are told apart by their
#: hot-loop figure (:func:`hot_figure`): the model's tensor rate is one loop's, measured
#: (the same for every tiling), and its band is 0.67-1.5 of measured times
MODEL_MARGIN = 0.05
#: SASS instructions of a k-tile outside its fills and ldmatrix (loop counter, barriers,
#: shared addresses): 169 others of the 128x128 3x3 conv's k-tile (sm_80) less its modelled
#: 128 fill instructions and 12 ldmatrix
KTILE_OVERHEAD = 29.0
#: the register file one block may take (sm_80, sm_90)
BLOCK_REGISTERS = 65536


@dataclass(frozen=True)
class MmaTiling:
    """Block tile, warp grid and k-tile of a tensorized kernel."""

    block_m: int
    block_n: int
    warps_m: int
    warps_n: int
    block_k: int = BLOCK_K
    mma_k: int = MMA_K  # the intrinsic's k (8: tf32)

    @property
    def warps(self) -> int:
        return self.warps_m * self.warps_n

    @property
    def tiles_m(self) -> int:  # 16-row mma tiles per warp
        return self.block_m // self.warps_m // MMA_M

    @property
    def tiles_n(self) -> int:  # 8-column mma tiles per warp
        return self.block_n // self.warps_n // MMA_N

    @property
    def b_step(self) -> int:
        """B's mma tiles per ``ldmatrix``: two (x4) where a warp has pairs of them, else one."""
        return 2 if self.tiles_n % 2 == 0 else 1

    @property
    def registers(self) -> int:
        """Modelled registers per thread: accumulators, one k-step's fragments, the rest."""
        return (
            4 * self.tiles_m * self.tiles_n
            + 4 * self.tiles_m
            + 2 * self.tiles_n
            + (GEMM_REG_OVERHEAD)
        )


def check_forced_tiling(tile: tuple[int, int, int, int] | None) -> None:
    """Refuse a user-forced tiling (``MappingConfig.mma_tile``: block M, block N, warps along
    M and N) whose warps do not split the block tile into whole 16x8 mma tiles, whose block
    has more than 1024 threads, or whose modelled registers exceed 255 per thread or the
    block's register file (it would spill)."""
    if tile is None:
        return
    why = ""
    if len(tile) != 4 or not all(isinstance(v, int) and v > 0 for v in tile):
        why = "four positive integers"
    else:
        bm, bn, wm, wn = tile
        t = MmaTiling(bm, bn, wm, wn)
        if bm % (MMA_M * wm) or bn % (MMA_N * wn):
            why = f"a block tile split into whole {MMA_M}x{MMA_N} mma tiles per warp"
        elif t.warps > 32:
            why = "at most 32 warps (1024 threads) per block"
        elif t.registers > MAX_REGISTERS:
            why = f"at most {MAX_REGISTERS} registers per thread (modelled {t.registers})"
        elif t.registers * 32 * t.warps > BLOCK_REGISTERS:
            why = (
                f"at most {BLOCK_REGISTERS} registers per block (modelled {t.registers} x "
                f"{32 * t.warps} threads)"
            )
    if why:
        raise ExpressionError(
            f"MappingConfig: mma_tile={tuple(tile)} is not a tensor-core tiling: it needs "
            f"{why}; e.g. one of the model's candidates {', '.join(map(str, TILINGS[:3]))}, "
            "or None for the model's choice"
        )


def extent(shape: GemmShape, d: int) -> int:
    """The extent of ``shape``'s data dim ``d``."""
    lo, hi = shape.data[d]
    return hi - lo + 1


def fill_slots(
    t: MmaTiling, shape: GemmShape, ops: tuple | None, aligned: Callable[[object], bool]
) -> tuple[float, bool]:
    """Modelled fill instructions per thread of one k-tile of ``t`` in the reduction order
    the fills will take (:func:`polyfuse.poly.tensorize_order.cheapest`), and whether that
    order keeps the loop pipelined; plain 16-byte chunks where ``ops`` is None."""
    threads = 32 * t.warps
    if ops is None:
        return (t.block_m + t.block_n) * t.block_k / threads / 8 * 6.0, True
    priced = price_k_orders(shape, *ops, (t.block_m, t.block_n), t.block_k, threads, aligned)
    cost, _, _, a, b = cheapest(priced)
    return cost, pipelined(a, b, aligned)


def hot_figure(
    t: MmaTiling, shape: GemmShape, ops: tuple | None, rows: int, cols: int,
    aligned: Callable[[object], bool], fill: float | None = None,
) -> float:  # fmt: skip
    """Modelled non-HMMA instructions per useful HMMA of one k-tile of ``t`` (the module
    doc); ``ops``: the (A, B) operands (plain chunked tiles where None), ``rows`` x ``cols``
    the GEMM's result, ``fill``: :func:`fill_slots` where already known."""
    if fill is None:
        fill = fill_slots(t, shape, ops, aligned)[0]
    steps = t.block_k // t.mma_k
    ldsm = (t.tiles_m + t.tiles_n // t.b_step) * steps
    hmma = t.tiles_m * t.tiles_n * steps
    useful = rows / (-(-rows // t.block_m) * t.block_m) * cols / (-(-cols // t.block_n) * t.block_n)
    return (fill + ldsm + KTILE_OVERHEAD) / (hmma * useful)


@dataclass(frozen=True)
class MmaProblem:
    """What a tensorized GEMM computes, for the cost model: the epilogue's mix per output,
    the distinct bytes it reads and writes, the reduction's length."""

    epilogue: Mix
    bytes_read: int
    bytes_written: int
    k: int


@dataclass(frozen=True)
class Priced:
    """A candidate tiling with its modelled time, its hot-loop figure (:func:`hot_figure`),
    its place in :data:`TILINGS` and its blocks."""

    us: float
    figure: float
    index: int
    tiling: MmaTiling
    blocks: int


def mma_problem(shape: GemmShape, itemsize: int) -> MmaProblem:
    """``shape``'s epilogue (:func:`polyfuse.poly.tiling.epilogue_mix`) and bytes at
    ``itemsize`` bytes per operand element (16-bit results of 16-bit operands; float32 ones
    of tf32's and bytes')."""
    out = itemsize if itemsize == 2 else 4
    data = math.prod(hi - lo + 1 for lo, hi in shape.data)
    red = math.prod(hi - lo + 1 for lo, hi in shape.red)
    reads = operand_elements(shape) * itemsize
    return MmaProblem(epilogue_mix(shape), reads, data * out, red)


def tile_desc(
    t: MmaTiling, problem: MmaProblem, blocks: int, fill: float, itemsize: int,
    piped: bool = True,
) -> KernelDesc:  # fmt: skip
    """The cost model's description of ``problem`` tiled by ``t`` in ``blocks`` blocks, each
    thread's fills ``fill`` instructions per k-tile, pipelined or (``piped`` False) waited
    for in every k-tile (:mod:`polyfuse.poly.costs.mma`)."""
    steps = t.block_k // t.mma_k
    return mma_tile_desc(
        name="mma tile",
        blocks=blocks,
        warps=t.warps,
        registers=t.registers,
        tile_elems=(t.block_m, t.block_n, t.block_k),
        mma_per_ktile=t.tiles_m * t.tiles_n * steps,
        ldsm_per_ktile=(t.tiles_m + t.tiles_n // t.b_step) * steps,
        fill_slots=fill,
        overhead_slots=KTILE_OVERHEAD,
        ktiles=-(-problem.k // t.block_k),
        itemsize=itemsize,
        out_itemsize=2 if itemsize == 2 else 4,
        epilogue=problem.epilogue,
        bytes_read=problem.bytes_read,
        bytes_written=problem.bytes_written,
        k=problem.k,
        pipelined=piped,
    )


def _label(t: MmaTiling) -> str:
    return f"{t.block_m}x{t.block_n} ({t.warps} warps)"


def choose_mma_tiling(
    shape: GemmShape,
    device: DeviceSpec,
    itemsize: int = 2,
    mn: tuple[int, int] | None = None,
    fold: int | None = None,
    ops: tuple | None = None,
    aligned: Callable[[object], bool] = lambda op: True,
    block_k: int | None = None,
    forced: tuple[int, int, int, int] | None = None,
    forced_reason: str = "",
) -> tuple[MmaTiling, str]:
    """The candidate of :data:`TILINGS` and :data:`SMALL_TILINGS` the cost model and the
    hot-loop figure choose (the module doc), with the reason; ``itemsize``: the operands'
    bytes (2: m16n8k16, 4: tf32's m16n8k8, 1: bytes' m16n8k32); ``mn``: the m and n data
    dims (the last two by default), ``fold``: a data dim folded into the columns, ``ops``:
    the (A, B) operands, ``aligned``: whether a linear operand's chunks start aligned,
    ``block_k``: a forced k-tile (a multiple of the intrinsic's k; the model's otherwise);
    ``forced``: the one candidate (block M, block N, warps along M and N) priced, for
    ``forced_reason`` (a whole-row tile, :mod:`polyfuse.stitch.mma_rows`; the user's
    ``MappingConfig.mma_tile``)."""
    mma_k, bk = MMA_K_OF[itemsize], KTILE_BYTES // itemsize
    if block_k is not None and (block_k <= 0 or block_k % mma_k or block_k > 4 * mma_k):
        raise ValueError(f"mma_block_k={block_k}: a tensorized k-tile is 1 to 4 k-steps of {mma_k}")
    m, n = mn or (len(shape.data) - 2, len(shape.data) - 1)
    rows = extent(shape, m)
    cols = extent(shape, n) * (1 if fold is None else extent(shape, fold))
    batch = 1
    for i in range(len(shape.data)):
        if i not in (m, n, fold):
            batch *= extent(shape, i)
    problem = mma_problem(shape, itemsize)
    priced, refused = [], []
    candidates = TILINGS if forced is None else (forced,)

    def price(i: int, bm: int, bn: int, wm: int, wn: int) -> None:
        t = MmaTiling(bm, bn, wm, wn, bk, mma_k)
        if block_k is not None:
            t = replace(t, block_k=block_k)
        blocks = batch * -(-rows // bm) * -(-cols // bn)
        if t.registers > device.max_regs_per_thread and forced is None:
            refused.append(f"{_label(t)}: {t.registers} registers")
            return
        fill, piped = fill_slots(t, shape, ops, aligned)
        desc = tile_desc(t, problem, blocks, fill, itemsize, piped)
        us = model_kernel(desc, device).us
        figure = hot_figure(t, shape, ops, rows, cols, aligned, fill)
        priced.append(Priced(us, figure, i, t, blocks))

    for i, c in enumerate(candidates):
        price(i, *c)
    spread = max((min(p.blocks, device.sms) for p in priced), default=0)
    if forced is None and spread < FILL_SHARE * device.sms:  # SMs idle: the small tilings too
        for i, c in enumerate(SMALL_TILINGS, len(candidates)):
            price(i, *c)
    # the model prices a block's mma at the pipe's rate however few warps the SM holds, so
    # tiles that leave SMs idle are taken only where none fills them: then the most blocks
    most = max(p.blocks for p in priced)
    fills = [p for p in priced if p.blocks >= device.sms] or [
        p for p in priced if p.blocks == most
    ]
    best = min(p.us for p in fills)
    near = [p for p in fills if p.us <= best * (1 + MODEL_MARGIN)]
    chosen = min(near, key=lambda p: (p.figure, p.index))
    t, blocks = chosen.tiling, chosen.blocks
    others = ", ".join(
        f"{_label(p.tiling)}: {p.us:.1f} us, {p.figure:.2f}"
        for p in sorted(fills, key=lambda p: (p.us, p.figure, p.index))
        if p is not chosen
    )
    few = [f"{_label(p.tiling)}: {p.blocks} blocks" for p in priced if p not in fills]
    data = TensorCoreData(
        "tile",
        {1: "m16n8k32", 2: "m16n8k16", 4: "m16n8k8.tf32"}[itemsize],
        [t.block_m, t.block_n, t.block_k],
        [t.warps_m, t.warps_n],
    )
    return t, noted(
        (DecisionKind.COST_MODEL, DecisionKind.GEMM_TILE),
        f"block tile {t.block_m}x{t.block_n}x{t.block_k} of {t.warps} warps, each "
        f"{t.tiles_m}x{t.tiles_n} mma tiles of 16x8 ({blocks} blocks on {device.sms} SMs; "
        f"modelled {chosen.us:.1f} us, {chosen.figure:.2f} other instructions per useful HMMA"
        + (
            f"; the fewest others within {MODEL_MARGIN:.0%} of the cost model's best, "
            f"{best:.1f} us"
            if forced is None
            else ""
        )
        + (f"; vs {others}" if others else "")
        + (f"; too few blocks: {', '.join(few)}" if few else "")
        + (f"; too many registers: {', '.join(refused)}" if refused else "")
        + (f"; forced: {forced_reason}" if forced is not None else "")
        + ")",
        shape.update.prim,
        data=data,
    )
