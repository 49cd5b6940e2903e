"""How a GEMM kernel's loops are emitted: unrolled reduction steps, a peeled pipeline, launch
bounds. Each is a typed decision with its reason (:class:`GemmLoops`), made here and carried
out by isl's AST generation (:func:`polyfuse.cuda.codegen.astgen.generate_gemm_ast`) and the
lowering
passes (:mod:`polyfuse.cuda.codegen.lower_loops`); the printer only writes what they decided.

Policy (issue 20: the hot loop of a cuBLAS-class SGEMM is 85-90 % FFMA; what is not FFMA is
what these decisions remove):

1. **Unrolled reduction steps.** Inside one k-tile the update runs ``TK`` steps of the
   reduction (the ``kk`` loops), each a fully unrolled micro-tile of ``TM x TN``
   multiply-adds fed by register fragments. Left as a loop, every step pays a counter, a
   compare and a branch, and its shared-memory addresses are computed from the counter. The
   ``kk`` loops are unrolled whole, innermost first, while one unrolled body stays within
   :data:`UNROLL_FMA_LIMIT` multiply-adds per thread (a k-tile of 8 steps of an 8x8 tile: 512;
   a 3x3 window: 9 steps): the offsets become constants, consecutive steps' fragment loads of
   one row merge into 128-bit shared loads, and the steps' loads can be scheduled early.
   Longer bodies would thrash the instruction cache: the next loop outwards is unrolled by the
   largest factor of its trip count within the limit (a conv's channel loop by 2 around its
   unrolled 3x3 window: two channels' nine weights of a row merge into 64-bit loads), and the
   loops outside it stay loops.
2. **Peeled pipeline.** A double-buffered k-tile loop runs from -1 (the first tile's copies)
   to ``KT - 1`` (the last tile's compute), so every iteration tests both ends. Its first and
   last iterations are split off (:func:`polyfuse.cuda.codegen.lower_loops.peel_loop`): the steady
   state has neither test.
3. **Unrolled copy loops.** Each thread copies a shared tile in loops of constant trip count
   (:meth:`polyfuse.poly.copy_layout.CopyLayout.counters`); up to :data:`COPY_UNROLL_LIMIT`
   copies per tile they are unrolled.
4. **Strength-reduced addresses.** The copies' global addresses in a k-tile loop are pointers
   advanced by a constant per k-tile (:mod:`polyfuse.cuda.codegen.lower_addresses`), not recomputed
   from the block and thread coordinates every iteration.
5. **Launch bounds.** ``__launch_bounds__(threads, blocks)`` with the blocks per SM the tile
   model planned for (:func:`polyfuse.poly.policy.blocks_per_sm` of the estimated registers
   and the shared tiles): ptxas then keeps each thread within the registers that let those
   blocks be resident, instead of taking a few more and halving the occupancy. Synchronous
   copies hold their vectors in registers on the way to shared memory: the estimate counts
   :data:`SYNC_COPY_REGISTERS` more for them. The cap leaves
   :data:`REGISTER_MARGIN` registers above the estimate (a bound at the estimate itself made
   ptxas spill); where no count of two or more blocks does but the estimate itself fits two or
   more, the bound is at the estimate: without one, ptxas takes a few registers more or fewer
   than the two blocks' cap (124-130 for the 256-thread 8x8 tiles, NVRTC 13.0), so the
   occupancy would halve or not by chance; where not even the estimate fits two blocks, no
   bound is set.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.base.decision_data import GemmLoopData
from polyfuse.poly.device import DeviceSpec, occupancy
from polyfuse.poly.policy import FLOAT_BYTES, gemm_tile_registers

#: Multiply-adds per thread one unrolled reduction body may hold (instruction-cache bound: an
#: 8x8 micro-tile over a k-tile of up to 32 steps, or over two channels of a 3x3 window, fits;
#: a conv's eight channels unrolled whole (4608) made ptxas spill).
UNROLL_FMA_LIMIT = 2048
#: Copies per thread of one shared tile per k-tile whose loops are unrolled at most.
COPY_UNROLL_LIMIT = 32
#: Registers a thread needs beside the tile model's estimate under a launch bound when its
#: copies are synchronous (global -> registers -> shared: the vectors in flight; ptxas spilled
#: a 4096 matmul's 8x8 tile at the 128 registers of two 256-thread blocks without them: 8 B
#: on sm_80 with NVRTC 13.0). Without a bound they reuse the fragments' registers
#: (:func:`unbounded_registers`).
SYNC_COPY_REGISTERS = 16
#: Registers the launch bounds leave a thread above the micro-tile's estimate. The SASS of 145
#: GEMM kernels (6 cases x 2 archs x ~12 tilings, NVRTC 13.0): ptxas spilled 8-40 B in 3 of
#: 11 bounds at the estimate (4x4 tiles, 64 registers) and in 6 of 22 bounds 8 above it (8x8
#: tiles at 128, their unrolled bodies holding the next steps' fragments), in 1 of 4 at 24.
REGISTER_MARGIN = 16
#: Registers ptxas allocates per thread in steps of (sm_70..sm_90).
REGISTER_STEP = 8
#: Registers one thread may use at most (sm_70..sm_90).
MAX_REGISTERS = 255


@dataclass(frozen=True)
class GemmLoops:
    """The loop decisions of one GEMM kernel (what :func:`plan_gemm_loops` decided)."""

    #: loops unrolled: (loop variable, the statement it runs, its most iterations, the
    #: unroll factor: 0 whole); isl names loops by schedule position, so the update's ``kk0``
    #: and a copy's first loop share a name
    unroll: tuple[tuple[str, str, int, int], ...] = ()
    #: the pipelined k-tile loop whose first and last iterations run apart ("": none)
    peel: str = ""
    #: k-tile loops whose copies read global memory through pointers they advance
    streams: tuple[str, ...] = ()
    #: ``__launch_bounds__`` minimum resident blocks per SM (0: only the block size)
    min_blocks: int = 0
    #: registers per thread the launch bounds leave ptxas (0: no bound)
    register_cap: int = 0
    decisions: tuple[Decided, ...] = ()


def _record(what: str, reason: str, **data) -> Decided:
    """A loop-emission decision: its reason and typed data (``what`` and its figures)."""
    return Decided((DecisionKind.GEMM_LOOP,), reason, GemmLoopData(what, **data))


def unrolled_steps(
    tk: list[int], accumulators: int, limit: int = UNROLL_FMA_LIMIT
) -> tuple[list[int], list[int]]:
    """The reduction dims whose ``kk`` loop is unrolled (innermost first while the unrolled
    body holds at most ``limit`` multiply-adds) and those left as loops; dims with one step
    per k-tile have no loop and are in neither."""
    unrolled, kept = [], []
    body = accumulators
    for j in reversed(range(len(tk))):
        if tk[j] <= 1:
            continue
        if not kept and body * tk[j] <= limit:
            body *= tk[j]
            unrolled.append(j)
        else:
            kept.append(j)
    return unrolled[::-1], kept[::-1]


def kept_unroll_factor(trips: int, inner: int, limit: int = UNROLL_FMA_LIMIT) -> int:
    """The unroll factor of the innermost ``kk`` loop kept as a loop (``trips`` steps around a
    body of ``inner`` multiply-adds): the largest proper divisor of ``trips`` whose unrolled
    body holds at most ``limit`` multiply-adds (1: not unrolled)."""
    return max(f for f in range(1, trips) if trips % f == 0 and f * inner <= limit)


def launch_bound(
    threads: int, registers: int, shared_bytes: int, device: DeviceSpec,
    grid: int | None = None,
) -> tuple[int, int]:  # fmt: skip
    """``(blocks, cap)`` of ``__launch_bounds__(threads, blocks)`` for a block of ``threads``
    threads estimated at ``registers`` each with ``shared_bytes`` of shared memory: the most
    blocks per SM whose registers per thread (the cap) leave :data:`REGISTER_MARGIN` above the
    estimate, else the most whose cap is at least the estimate, but no more than a launch of
    ``grid`` blocks gives an SM (``ceil(grid / SMs)``: residency past that buys nothing and
    the cap only forces spills, e.g. DeepFM's 104-block GEMMs bounded to 8 blocks/SM spilled
    104 bytes at 128 registers); (0, 0) when that is one block (no bound to keep)."""
    most = -(-grid // device.sms) if grid else None
    for need in (registers + REGISTER_MARGIN, registers):
        blocks = occupancy(device, threads, need, shared_bytes).blocks_per_sm
        if most is not None:
            blocks = min(blocks, most)
        cap = register_cap(threads, blocks, device) if blocks else 0
        if blocks > 1 and cap >= need:
            return blocks, cap
    return 0, 0


def tile_registers(tm: int, tn: int, sync_copies: bool) -> int:
    """Registers per thread a GEMM micro-tile ``tm x tn`` is estimated at under a launch
    bound: :data:`SYNC_COPY_REGISTERS` more with synchronous tile copies (``sync_copies``)."""
    return gemm_tile_registers(tm, tn) + (SYNC_COPY_REGISTERS if sync_copies else 0)


def unbounded_registers(tm: int, tn: int, sync_copies: bool) -> int:
    """Registers per thread ptxas takes for a micro-tile ``tm x tn`` without a launch bound:
    what the code keeps live at once, in its allocation steps. Uncapped, ptxas loads and
    stores a synchronous copy's vectors at the top of the k-tile, where they reuse the
    ``tm + tn`` fragment registers (live at another time): the copies add only what they need
    beyond those. (SASS of the 256-thread 8x8 tiles without a bound, NVRTC 13.0, sm_80 and
    sm_90, matmul 4096 and FFN up, k-tiles 8, 16, 32: 124-130 registers, estimate 120.)"""
    extra = max(0, SYNC_COPY_REGISTERS - tm - tn) if sync_copies else 0
    need = gemm_tile_registers(tm, tn) + extra
    return min(MAX_REGISTERS, -(-need // REGISTER_STEP) * REGISTER_STEP)


def register_cap(threads: int, blocks: int, device: DeviceSpec) -> int:
    """Registers per thread that let ``blocks`` blocks of ``threads`` threads share an SM: the
    register file is split between the SM's partitions (one per scheduler) and each warp
    lives in one, so the fullest partition holds ``ceil(warps / partitions)`` of them — what
    ptxas caps ``__launch_bounds__(threads, blocks)`` at (NVRTC 13.0, sm_80 and sm_90: 64
    threads x 5 blocks, 10 warps, are capped at 168 registers, not 65536 / 320 = 204;
    ``tests/test_gemm_loops.py``)."""
    warps = -(-threads // 32) * blocks
    parts = device.schedulers_per_sm
    cap = device.regs_per_sm // parts // (-(-warps // parts) * 32)
    return min(MAX_REGISTERS, cap // REGISTER_STEP * REGISTER_STEP)


@dataclass(frozen=True)
class CopyLoops:
    """One shared tile's copy statement: each thread's copy loops, one per footprint dim
    (trip count ``trips[d]``; isl names them ``loops[d]``)."""

    stmt: str
    tensor: str
    loops: tuple[str, ...]
    trips: tuple[int, ...]


def unrolled_copies(c: CopyLoops, limit: int = COPY_UNROLL_LIMIT) -> list[int]:
    """The dims of ``c`` whose copy loop is unrolled: innermost first while the copies of
    the unrolled loops number at most ``limit`` (loops of one trip are not loops)."""
    out, n = [], 1
    for d in reversed(range(len(c.trips))):
        if c.trips[d] <= 1:
            continue
        if n * c.trips[d] > limit:
            break
        n *= c.trips[d]
        out.append(d)
    return out[::-1]


def plan_gemm_loops(
    update: str,
    tk: list[int],
    tile: tuple[int, int, int, int, int],
    threads: int,
    shared_floats: int,
    stages: int,
    pipelined: str,
    copies: list[CopyLoops],
    ktiles: list[str],
    device: DeviceSpec,
    grid: int | None = None,
) -> GemmLoops:
    """The loop decisions for a GEMM kernel whose update statement ``update`` runs k-tile
    steps ``tk`` per reduction dim, tile ``(BM, BN, TM, TN, TK)``, ``threads`` per block,
    ``shared_floats`` per stage of its shared tiles (filled by ``copies``), ``stages`` of
    them over the k-tile loop ``pipelined``, on ``device``; ``ktiles``: the k-tile loops of
    more than one k-tile; ``grid``: the launch's blocks (bounds the blocks per SM asked)."""
    _, _, tm, tn, _ = tile
    acc = tm * tn
    decisions: list[Decided] = []
    unrolled, kept = unrolled_steps(tk, acc)
    names = [f"kk{j}" for j in unrolled]
    unroll = [(f"kk{j}", update, tk[j], 0) for j in unrolled]
    if unrolled:
        steps = math.prod(tk[j] for j in unrolled)
        decisions.append(
            _record(
                "unroll",
                f"reduction steps {', '.join(names)} unrolled ({steps} steps x {acc} "
                f"multiply-adds = {steps * acc} per thread, limit {UNROLL_FMA_LIMIT}): constant "
                "shared-memory offsets, consecutive steps' fragment loads merge into vector "
                "loads, no counter or branch per step",
                loops=names,
                steps=steps,
                fma=steps * acc,
            )
        )
    inner = acc * math.prod(tk[j] for j in unrolled)
    if kept:  # the innermost loop kept: unrolled by a factor of its trip count
        j = kept[-1]
        f = kept_unroll_factor(tk[j], inner)
        if f > 1:
            unroll.append((f"kk{j}", update, tk[j], f))
            decisions.append(
                _record(
                    "unroll by",
                    f"reduction loop kk{j} ({tk[j]} steps) unrolled by {f}: {f * inner} "
                    f"multiply-adds per unrolled body (limit {UNROLL_FMA_LIMIT}); consecutive "
                    "steps' fragment loads merge into vector loads, a counter and branch per "
                    f"{f} steps",
                    loops=[f"kk{j}"],
                    factor=f,
                    fma=f * inner,
                )
            )
    for j in kept:
        body = acc * tk[j] * math.prod(tk[i] for i in unrolled if i > j)
        decisions.append(
            _record(
                "keep loop",
                f"reduction loop kk{j} ({tk[j]} steps) stays a loop: unrolled it would hold "
                f"{body} multiply-adds per thread (limit {UNROLL_FMA_LIMIT}, instruction cache)",
                loops=[f"kk{j}"],
                fma=body,
            )
        )
    for c in copies:
        dims = unrolled_copies(c)
        if not dims:
            continue
        n = math.prod(c.trips[d] for d in dims)
        unroll += [(c.loops[d], c.stmt, c.trips[d], 0) for d in dims]
        decisions.append(
            _record(
                "unroll copies",
                f"copy loops of {c.tensor}'s shared tile unrolled ({n} copies per thread per "
                f"k-tile, limit {COPY_UNROLL_LIMIT}): constant trip counts, the copies issue "
                "back to back without a counter or branch each",
                tensor=c.tensor,
                copies=n,
            )
        )
    peel = pipelined if stages > 1 else ""
    if peel:
        decisions.append(
            _record(
                "peel",
                f"pipelined k-tile loop {peel} ({stages} stages) split into a prologue of "
                f"{stages - 1} iteration(s) (the first k-tiles' copies in flight), a steady "
                f"state, and an epilogue of the last k-tile(s) (their compute, empty commits)",
                loop=peel,
            )
        )
    streams = tuple(ktiles) if copies else ()
    if streams:
        decisions.append(
            _record(
                "strength reduction",
                f"global addresses of the copies in k-tile loop {', '.join(streams)} are "
                "pointers advanced by a constant per k-tile, not recomputed from the block and "
                "thread coordinates every iteration",
                loops=list(streams),
            )
        )
    regs = tile_registers(tm, tn, stages == 1 and bool(copies))
    smem = FLOAT_BYTES * shared_floats * stages
    min_blocks, cap = launch_bound(threads, regs, smem, device, grid)
    blocks = min_blocks
    if min_blocks:
        decisions.append(
            _record(
                "launch bounds",
                f"__launch_bounds__({threads}, {blocks}): the tile model plans {blocks} "
                f"blocks/SM on {device.name} ({regs} registers estimated, {smem} B shared); "
                f"ptxas keeps each thread within {cap} registers so that they stay resident",
                threads=threads,
                min_blocks=blocks,
                register_cap=cap,
            )
        )
    return GemmLoops(tuple(unroll), peel, streams, min_blocks, cap, tuple(decisions))
