"""Lowering of a tensorized GEMM kernel (:class:`polyfuse.poly.tensorize.TensorCoreKernel`) to a
:class:`~polyfuse.cuda.codegen.kernel_ast.KernelIR` printed by the one printer
(:func:`polyfuse.cuda.codegen.printer.kernel_of`).

The kernel each block runs, for its block tile of the result (and its batch coordinates)::

    acc[tiles_m][tiles_n][4] = 0                    // mma C fragments, float32 (int32: bytes)
    for each k-tile:                                // BLOCK_K deep, S-stage pipelined
        fill the shared tiles of A and B            // 16-bit, zero outside the arrays
        (cp.async, S stages, or scalar copies: :mod:`polyfuse.cuda.codegen.lower_mma_pipeline`)
        for each k-step of 16:
            ldmatrix.x4[.trans] A fragments; ldmatrix.x4[.trans] B fragments of 2 mma tiles
            mma.sync.m16n8k16 on every (A, B) fragment pair
    for each accumulator element (fragment row, col): if inside the result, the epilogue
        (:mod:`polyfuse.cuda.codegen.lower_mma_epilogue`: two adjacent columns stored as
        one access where that is proven)

With S >= 2 stages the fragments are double-buffered across the k-steps where the register
model allows (``fragment_buffers``: :mod:`polyfuse.poly.tensorize_fragments`): the loop above,
rotated so each k-step's ``ldmatrix`` runs a k-step ahead of the mma, by
:mod:`polyfuse.cuda.codegen.lower_mma_fragments` (which builds both forms from one
:class:`~polyfuse.cuda.codegen.lower_mma_fragments.KStep`, made by
:mod:`polyfuse.cuda.codegen.lower_mma_steps`).

Accumulator element ``e`` of lane ``l`` is (``l/4 + 8(e/2)``, ``2(l%4) + e%2``). Parameters
and registers come from the buffer and dtype passes; the shared tiles are allocations of the
IR (static, or slices of the dynamic pool past 48 KB).
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.cuda.codegen.kernel_arith import add, band, div, mod, mul, shr
from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KAssign,
    KBarrier,
    Kernel,
    KExpr,
    KInt,
    KLet,
    KNode,
    KRef,
    KRegisters,
    KVar,
    MemSpace,
    Scope,
)
from polyfuse.cuda.codegen.lower import (
    Lowered,
    buffer_placements,
    instantiate_kernel,
    kernel_ir,
    kernel_namer,
)
from polyfuse.cuda.codegen.lower_buffers import alloc_buffers
from polyfuse.cuda.codegen.lower_dtypes import assign_dtypes, storage_dtypes
from polyfuse.cuda.codegen.lower_mma_epilogue import epilogue, unrolled_loop
from polyfuse.cuda.codegen.lower_mma_fills import TileFill, fill_setup, k_values
from polyfuse.cuda.codegen.lower_mma_fragments import double_buffered_loop, single_buffered
from polyfuse.cuda.codegen.lower_mma_pipeline import k_tile_loop
from polyfuse.cuda.codegen.lower_mma_steps import k_step
from polyfuse.cuda.codegen.printer import ir_facts, kernel_of
from polyfuse.cuda.codegen.tensor_core import MMA_BF16, MMA_F16, MMA_INT8, MMA_TF32, Intrinsic
from polyfuse.poly.placement import Placement
from polyfuse.poly.policy import STATIC_SMEM_LIMIT
from polyfuse.poly.tensorize import ITEMSIZE, TensorCoreKernel
from polyfuse.poly.tensorize_gather import k_extent

#: the barrier before an epilogue that stores to shared memory
READ_NOTE = "every warp has read the operand tiles (the result tile may overlay them)"
#: a tile whose modelled registers leave ptxas this much room is bounded
#: ``__launch_bounds__(threads, 1)``: without a block count ptxas split a live range across
#: the k-tile loop of a tf32 64x64 tile at 96 registers (a 4-byte spill, NVRTC 13.0 sm_80);
#: with it, 106 and none. Larger tiles keep the bare thread bound they were measured with
#: (ResNet-50's 255-register convs spilled 24 bytes under the block count)
ROOMY_REGISTERS = 160
#: the intrinsic per operand dtype (float32: tf32, where the user allowed it)
INTRINSIC = {"bfloat16": MMA_BF16, "float16": MMA_F16, "float32": MMA_TF32}


def intrinsic(tk: TensorCoreKernel) -> Intrinsic:
    """The mma instruction of ``tk``: by its operand dtype, per (A, B) pair for bytes."""
    return MMA_INT8.get((tk.dtype, tk.b_dtype)) or INTRINSIC[tk.dtype]


def lower_mma_kernel(
    name: str,
    tk: TensorCoreKernel,
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Kernel:
    """The CUDA kernel of a tensorized GEMM (see the module doc), printed through
    ``canonical`` names when given (:func:`polyfuse.cuda.codegen.lower.instantiate_kernel`)."""
    low = lower_mma_ir(name, tk, placements, idents, canonical)
    return instantiate_kernel(kernel_of(low.ir, low.facts, low.notes), canonical, name)


def lower_mma_ir(
    name: str,
    tk: TensorCoreKernel,
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Lowered:
    """A tensorized GEMM kernel through the passes (see :func:`lower_mma_kernel`), not printed.

    The operands' shared placements are their tiles (the fills'); any other shared placement
    (a whole-row result tile, :mod:`polyfuse.stitch.mma_rows`) is an array the epilogue stores
    to, after a barrier: the joined kernel overlays it on the operand tiles
    (:mod:`polyfuse.cuda.codegen.lower_gemm_rows`)."""
    model = tk.scheduled.model
    shape, t, a, b = tk.shape, tk.tiling, tk.a, tk.b
    assert shape is not None and t is not None and a is not None and b is not None
    operands = {a.tensor, b.tensor}
    as_global = {
        k: Placement(k, "global", p.reason) if p.space == "shared" and k in operands else p
        for k, p in placements.items()
    }
    printed, namer = kernel_namer(name, canonical)
    ir = kernel_ir(printed, tk, [], namer)
    ir = alloc_buffers(ir, buffer_placements(tk, as_global), list(model.tensors))
    ir = assign_dtypes(ir, storage_dtypes(model))
    mma = intrinsic(tk)
    nthreads = 32 * t.warps
    (lm, hm), (ln, hn) = shape.data[tk.m_dim], shape.data[tk.n_dim]
    fold, width = tk.fold, hn - ln + 1
    if fold is not None:  # columns: the folded dim and n, row-major, both from 0
        ln, hn = 0, (shape.data[fold][1] + 1) * width - 1
    lk, hk = k_extent(shape)
    kv = k_values(tuple(shape.red), "pf_k")
    red = tuple(shape.red) if len(shape.red) > 1 else ()
    # per data dim its subscript: the batch dims are the grid's first dims, m and n 0 (the
    # fills and the epilogue put their rows and columns there)
    batch: list[KExpr] = []
    nb = 0
    for i, (lo, _) in enumerate(shape.data):
        if i in (tk.m_dim, tk.n_dim, fold):
            batch.append(KInt(0))
            continue
        batch.append(add(f"pf_g{nb}", lo))
        nb += 1
    # one array read as both operands (attention's Q and K slices of one projection): B's
    # tile is the array's further access
    sa = namer.shared(a.tensor)
    sb = namer.shared(b.tensor if b.tensor != a.tensor else f"{b.tensor}__1")
    la, lb = tk.a_layout, tk.b_layout
    assert la is not None and lb is not None
    ea, eb = la.elements, lb.elements
    tm, tn = t.tiles_m, t.tiles_n
    gm, gn = f"pf_g{nb}", f"pf_g{nb + 1}"
    stages = tk.stages if tk.vector_fill else 1
    lanes, step = k_step(tk, mma)
    itemsize = ITEMSIZE[tk.dtype]
    shared_bytes = stages * (ea + eb) * itemsize
    dynamic = shared_bytes > STATIC_SMEM_LIMIT
    # past the static 48 KB: slices of the launch's dynamic pool (the runtime raises the
    # limit; the pool's offsets count 4-byte words)
    tiles = (
        KAlloc(sa, MemSpace.SHARED, tk.dtype, (stages * ea,), 0 if dynamic else None, align=16),
        KAlloc(sb, MemSpace.SHARED, tk.b_dtype, (stages * eb,),
               stages * ea * itemsize // 4 if dynamic else None, align=16),
    )  # fmt: skip
    regs = tuple(x for x in ir.allocs if x.space is MemSpace.REGISTER)
    stored = tuple(x for x in ir.allocs if x.space is MemSpace.SHARED)  # a result tile
    tid, warp = KVar("pf_tid"), KVar("pf_warp")
    zero: list[KNode] = [KAssign(KRef("pf_acc", (KVar("pf_i"), KVar("pf_j"), KVar("pf_x"))),
                                 KInt(0))]  # fmt: skip
    body: list[KNode] = [
        KLet("pf_lane", band(tid, 31)),
        KLet("pf_warp", shr(tid, 5)),
        KLet("pf_wm", mul(div(warp, t.warps_n), t.block_m // t.warps_m)),
        KLet("pf_wn", mul(mod(warp, t.warps_n), t.block_n // t.warps_n)),
        KLet("pf_m0", add(lm, mul(gm, t.block_m))),
        KLet("pf_n0", add(ln, mul(gn, t.block_n))),
        *lanes,
        KRegisters("pf_acc", mma.c_type, (tm, tn, 4), "local"),
        unrolled_loop("pf_i", tm, [unrolled_loop("pf_j", tn, [unrolled_loop("pf_x", 4, zero)])]),
    ]
    fills = (
        TileFill(a, la, sa, namer.tensor(a.tensor), t.block_m, t.block_k, KVar("pf_m0"), hm,
                 hk, tuple(batch), nthreads, tk.dtype, kv, red,
                 rows_exact=(hm - lm + 1) % t.block_m == 0),
        TileFill(b, lb, sb, namer.tensor(b.tensor), t.block_n, t.block_k, KVar("pf_n0"), hn,
                 hk, tuple(batch), nthreads, tk.b_dtype, kv, red,
                 () if fold is None else ((fold, div("pf_r", width)),
                                          (tk.n_dim, mod("pf_r", width))),
                 rows_exact=(hn - ln + 1) % t.block_n == 0),
    )  # fmt: skip
    k_tiles = -(-(hk - lk + 1) // t.block_k)
    bases = step.pointers
    if tk.vector_fill:  # what the fills compute once (a gather's masks)
        body += [n for f in fills for n in fill_setup(f)]
    if tk.fragment_buffers == 2:  # ALCOP's second level: lower_mma_fragments
        body += double_buffered_loop(fills, bases, step, stages, lk, k_tiles, tk.stage_unroll)
    else:
        body += k_tile_loop(fills, bases, single_buffered(step), stages, tk.vector_fill, lk,
                            k_tiles, tk.stage_unroll)  # fmt: skip
    if stored:
        body.append(KBarrier(Scope.BLOCK, READ_NOTE))
    nest, note = epilogue(tk, batch, as_global, idents, namer, hm, hn)
    body.append(nest)
    ir = ir.with_(
        body=tuple(body),
        allocs=(*tiles, *stored, *regs),
        dynamic_smem_bytes=shared_bytes if dynamic else 0,
        min_blocks=1 if t.registers <= ROOMY_REGISTERS else 0,
    )
    # the facts from the IR: the static tiles (or the dynamic pool), the barrier, mma and
    # cp.async nodes (none with scalar fills), its work estimate (the cost model's mix) and
    # the tile model's registers (occupancy, until ptxas says)
    return Lowered(ir, ir_facts(ir, model.statements, as_global, idents, t.registers), (note,))

