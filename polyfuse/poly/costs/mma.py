"""Description of a tensorized (``mma.sync``) kernel from its tiling, before the kernel exists.

:func:`polyfuse.poly.tensorize_tiling.choose_mma_tiling` prices every candidate block tile
through the one cost model on a description of the kernel it would become, per thread:

- per k-tile, ``tiles_m x tiles_n`` mma per k-step (the warp's 16x8 tiles), the fragments'
  ``ldmatrix`` (``tiles_m + tiles_n / b_step`` per k-step, 16 bytes a thread each), the fills'
  modelled instructions (:func:`polyfuse.poly.tensorize_order.price_k_orders`, their bytes as
  ``cp.async``) and :data:`~polyfuse.poly.tensorize_tiling.KTILE_OVERHEAD` slots;
- the tail (what runs outside the k-step loop, :attr:`KernelDesc.tail`): the epilogue's
  expression per accumulator (:func:`polyfuse.poly.tiling.epilogue_mix`), one slot to round
  a 16-bit result, a store per pair of columns, the first fills and :data:`PROLOGUE` slots;
- registers: the tile model's (:attr:`MmaTiling.registers`); shared memory: both tiles in
  :data:`STAGES` buffers; each block streams its rows of A and columns of B from L2 (16-byte
  ``cp.async.cg`` fills bypass the L1: no block reuses another's from there);
- where both operands are gathered element by element (no 16-byte chunks: the loop is not
  pipelined), single-stage fills: loads and shared stores, each k-tile waiting for its own
  (``sync_phases``, the model's fill latency).

The tensor pipe's rate is the one the H100's pipelined loop sustained, the same for every
tiling, so what tells candidates apart is their waves and rounds of resident blocks (block
phases), their epilogue and L2 traffic; the loop's own instruction overhead per mma is far
below that rate's issue budget, and :func:`polyfuse.poly.tensorize_tiling.hot_figure` decides
between candidates the model prices alike.
"""

from __future__ import annotations

from polyfuse.poly.costs.desc import KernelDesc, Mix

#: slots before the k-tile loop (indices, shared and global pointers, accumulators' zeros
#: come on top)
PROLOGUE = 60.0
#: shared-tile buffers the description assumes (the stage model picks 2-4 afterwards; two
#: set the least shared memory and so the most resident blocks any pipelined tile has)
STAGES = 2
#: bytes one thread reads per ``ldmatrix.x4`` (512 a warp)
LDSM_BYTES = 16.0


def mma_tile_desc(
    *,
    name: str,
    blocks: int,
    warps: int,
    registers: int,
    tile_elems: tuple[int, int, int],
    mma_per_ktile: float,
    ldsm_per_ktile: float,
    fill_slots: float,
    overhead_slots: float,
    ktiles: int,
    itemsize: int,
    out_itemsize: int,
    epilogue: Mix,
    bytes_read: int,
    bytes_written: int,
    k: int,
    pipelined: bool = True,
) -> KernelDesc:
    """The cost model's description of one candidate (see the module doc): ``tile_elems`` =
    (block M, block N, block k); per k-tile and thread: ``mma_per_ktile`` mma,
    ``ldsm_per_ktile`` ldmatrix, ``fill_slots`` fill instructions, ``overhead_slots`` more;
    ``itemsize``, ``out_itemsize``: the operands' and the result's bytes per element;
    ``epilogue``: the expression's mix per output; ``k``: the reduction's length;
    ``pipelined``: False where both operands are gathered element by element (single-stage
    fills: loads and shared stores, every k-tile waiting for its own)."""
    bm, bn, bk = tile_elems
    threads = 32 * warps
    fill_bytes = (bm + bn) * bk * itemsize / threads
    per_ktile = Mix(
        slots=mma_per_ktile + ldsm_per_ktile + fill_slots + overhead_slots,
        ints=fill_slots + overhead_slots,
        mma=mma_per_ktile,
        lds=LDSM_BYTES * ldsm_per_ktile,
        ldgsts=fill_bytes if pipelined else 0.0,
        ldg=0.0 if pipelined else fill_bytes,
        sts=0.0 if pipelined else fill_bytes,
        bar=1 if pipelined else 2,
    )
    stages = STAGES if pipelined else 1
    outputs = bm * bn / threads
    pairs = outputs / 2
    rounding = outputs if out_itemsize == 2 else 0.0  # one slot to round a 16-bit result
    epi = epilogue.scaled(outputs) + Mix(
        slots=rounding + pairs * 2, ints=pairs, stg=2 * out_itemsize * pairs
    )
    ahead = stages - 1  # the prologue's fills, before any mma
    first = Mix(slots=ahead * fill_slots, ints=ahead * fill_slots, ldgsts=ahead * fill_bytes)
    tail = epi + first + Mix(slots=PROLOGUE + outputs / 2, ints=PROLOGUE / 2)
    mix = per_ktile.scaled(ktiles) + tail
    return KernelDesc(
        name=name,
        source="tensor-core tile estimate",
        blocks=blocks,
        threads=threads,
        registers=registers,
        shared_bytes=stages * (bm + bn) * bk * itemsize,
        mix=mix,
        bytes_read=bytes_read,
        bytes_written=bytes_written,
        vector_bytes=bytes_read,
        inflight_bytes=fill_bytes * max(1, stages - 1),
        block_read_bytes=(bm + bn) * k * itemsize,
        block_bypass_bytes=(bm + bn) * k * itemsize if pipelined else 0,  # cp.async.cg
        barriers=True,
        sync_phases=0.0 if pipelined else float(ktiles),
        tail=tail,
    )
