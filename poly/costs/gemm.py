"""Description of a GEMM-like kernel from its tile sizes, before the kernel exists.

:func:`polyfuse.poly.tiling.rank_gemm_tiles` prices every candidate tiling through the cost
model; the candidate kernel is not generated yet, so its instruction mix is estimated from the
tile sizes, following the loop the GEMM path emits (:mod:`polyfuse.poly.promote`,
:mod:`polyfuse.cuda.lower_register_tile`; checked against the SASS instrument's counts of the
4096³ matmul on sm_90, 128x128 block, 8x8 micro-tile, k-tile 8: 730 slots per k-tile, of which
512 FFMA, 64 LDS.32 + 16 LDS.128, 2 LDGSTS.128, 2 BAR; this estimate gives 728):

per k-tile and thread, with ``s = TK x (reduction points whole inside a k-tile)`` steps of the
``kk`` loop:

- ``TM x TN`` FFMA per step;
- the operand fragments from shared memory: A's ``TM`` rows one 32-bit load each (they are a
  column of the A tile), B's ``TN`` columns as 128-bit loads when ``TN`` is a multiple of 4;
  their shared-memory wavefronts per warp follow the thread layout: broadcasts, bank
  conflicts between A rows, B's contiguous vectors (:func:`fragment_wavefronts`);
- :data:`KK_OVERHEAD` integer and branch slots per step (the ``kk`` loop is not unrolled);
- the tile fills: ``(BM + BN) x s`` floats over the block's threads, as 128-bit ``cp.async``
  copies (:data:`COPY_SLOTS` slots each) when the tiles are double-buffered, else as loads
  into registers and stores to shared memory (one slot more), each k-tile then waiting for
  its own loads (``sync_phases``);
- :data:`KTILE_OVERHEAD` slots (two barriers, the async-copy wait, the next tile's addresses);

then the epilogue per output: its tensor expression (:mod:`polyfuse.poly.costs.ops`) and a
store. Registers: :func:`polyfuse.poly.policy.gemm_tile_registers`; shared memory: the tiles
times the pipeline stages. The block reads its A rows and B columns once over the whole
reduction (``block_read_bytes``), from L2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from polyfuse.poly.costs.desc import KernelDesc, Mix
from polyfuse.poly.policy import gemm_tile_registers

#: integer and branch slots of one step of the (not unrolled) kk loop: 9 + 1 (issue 20)
KK_OVERHEAD = 10
#: slots of one k-tile besides its steps and copies: 2 BAR, 1 wait, addresses, branches
KTILE_OVERHEAD = 46
#: slots of one 128-bit cp.async copy (the copy and its address)
COPY_SLOTS = 5
#: slots before the k-tile loop (indices, accumulator initialisation: one per accumulator)
PROLOGUE = 40


@dataclass(frozen=True)
class GemmProblem:
    """What a GEMM-like micrograph computes: ``batch`` independent ``m x n`` outputs, each a
    sum over ``k`` (the tiled reduction dim) times ``k_whole`` (reduction points kept whole
    inside a k-tile: conv's window), the distinct bytes it reads and writes, and the epilogue's
    estimate per output element."""

    m: int
    n: int
    k: int
    k_whole: int
    batch: int
    bytes_read: int
    bytes_written: int
    epilogue: Mix  # per output element (without its store)


def _pad(row: int) -> int:
    """The row stride of a shared tile: padded by one vector when a multiple of the 32 banks
    (:mod:`polyfuse.poly.promote`)."""
    return row + (4 if row % 32 == 0 else 0)


def fragment_wavefronts(rows: int, cols: int, steps: int, b_vector: bool) -> tuple[int, int]:
    """Shared-memory wavefronts one warp's fragment load takes, for A and for B, with the
    block's ``rows`` x ``cols`` threads (columns fastest, so a warp spans ``32 / cols`` rows).

    A (the A tile is ``[BM][k]``, rows ``stride`` words apart): each lane loads one word of its
    row; lanes of one row share it (a broadcast), and rows whose words fall in the same bank
    are served one after another: ``ceil(rows per warp / distinct banks)`` wavefronts.
    B: the lanes read one row of the B tile, ``cols`` distinct vectors (or words) side by
    side: one wavefront per 128 bytes."""
    warp_rows = max(1, 32 // cols)
    stride = _pad(steps)
    banks = 32 // math.gcd(stride, 32)
    waves_a = -(-min(warp_rows, rows) // banks)
    lanes = min(32, cols)
    waves_b = -(-lanes * (16 if b_vector else 4) // 128)
    return waves_a, waves_b


def gemm_tile_desc(
    p: GemmProblem,
    tile: tuple[int, int, int, int, int],
    stages: int,
    name: str = "gemm",
) -> KernelDesc:
    """The cost model's description of ``p`` tiled by ``tile`` = (BM, BN, TM, TN, TK)."""
    bm, bn, tm, tn, tk = tile
    threads = (bm // tm) * (bn // tn)
    kt = min(tk, p.k)
    ktiles = -(-p.k // kt)
    steps = kt * p.k_whole
    blocks = -(-p.m // bm) * -(-p.n // bn) * p.batch
    b_vector = tn % 4 == 0
    frag_loads = tm + (tn // 4 if b_vector else tn)
    fill = (bm + bn) * steps  # floats per k-tile
    copies = math.ceil(fill / 4 / threads)
    waves_a, waves_b = fragment_wavefronts(bm // tm, bn // tn, steps, b_vector)
    fill_bytes = fill * 4 / threads
    async_fill = stages > 1  # cp.async; one stage: loads to registers, then stores to shared
    per_ktile = Mix(
        slots=steps * (tm * tn + frag_loads + KK_OVERHEAD)
        + copies * (COPY_SLOTS + (0 if async_fill else 1))
        + KTILE_OVERHEAD,
        ffma=steps * tm * tn,
        # shared-pipe traffic in lane-bytes: 4 B per lane per 128-B wavefront
        lds=steps * (tm * waves_a + (tn // 4 if b_vector else tn) * waves_b) * 4,
        ldgsts=fill_bytes if async_fill else 0.0,
        ldg=0.0 if async_fill else fill_bytes,
        sts=0.0 if async_fill else fill_bytes,
        bar=2,
    )
    outputs = tm * tn
    epilogue = p.epilogue.scaled(outputs) + Mix(slots=outputs * 1.25 + 8, stg=outputs * 4)
    mix = per_ktile.scaled(ktiles) + epilogue + Mix(slots=PROLOGUE + outputs)
    smem = 4 * stages * (bm * _pad(steps) + steps * _pad(bn))
    return KernelDesc(
        name=name,
        source="GEMM tile estimate",
        blocks=blocks,
        threads=threads,
        registers=gemm_tile_registers(tm, tn),
        shared_bytes=smem,
        mix=mix,
        bytes_read=p.bytes_read,
        bytes_written=p.bytes_written,
        vector_bytes=p.bytes_read + p.bytes_written,
        inflight_bytes=fill_bytes,
        block_read_bytes=fill * ktiles * 4,
        barriers=True,
        sync_phases=0.0 if async_fill else float(ktiles),
    )
