"""Lowering of a tensorized GEMM kernel (:class:`polyfuse.poly.tensorize.TensorCoreKernel`).

The kernel each block runs, for its block tile of the result (and its batch coordinates)::

    acc[tiles_m][tiles_n][4] = 0                    // mma C fragments, float32
    for each k-tile:                                // BLOCK_K deep, S-stage pipelined
        fill the shared tiles of A and B            // 16-bit, zero outside the arrays
        (cp.async, S stages, or scalar copies: :mod:`polyfuse.cuda.codegen.lower_mma_pipeline`)
        for each k-step of 16:
            ldmatrix.x4[.trans] A fragments; ldmatrix.x4[.trans] B fragments of 2 mma tiles
            mma.sync.m16n8k16 on every (A, B) fragment pair
    for each accumulator element (fragment row, col): if inside the result, the epilogue

With S >= 2 stages the fragments are double-buffered across the k-steps where the register
model allows (``fragment_buffers``: :mod:`polyfuse.poly.tensorize_fragments`): the loop above,
rotated so each k-step's ``ldmatrix`` runs a k-step ahead of the mma, by
:mod:`polyfuse.cuda.codegen.lower_mma_fragments` (which writes both forms from one
:class:`~polyfuse.cuda.codegen.lower_mma_fragments.KStep`).

Fragments and addresses follow :mod:`polyfuse.cuda.codegen.tensor_core`'s layouts (PTX ISA): lane
``l``
gives ``ldmatrix`` the address of row ``l % 8`` of matrix ``l / 8``; accumulator element ``e``
of lane ``l`` is (``l/4 + 8(e/2)``, ``2(l%4) + e%2``). The shared tiles keep their global
arrays' innermost dim innermost (the fill is coalesced; it decides ``.trans``), in the layout of
:mod:`polyfuse.poly.swizzle` (XOR-swizzled 32-byte rows, padding as the fallback): the lane's
``ldmatrix`` offset goes through the layout once, mma tiles and k-steps add immediates. The
epilogue statements (final store, bias, activation, ...) are printed from the te expressions by
the GEMM printer's :class:`polyfuse.cuda.codegen.body_printer.BodyPrinter`, with the accumulator
element
in the reduction's register. Parameters and registers come from the buffer and dtype passes; the
body is written here as text (a :class:`KFunction`), like the GEMM + row kernels of
:mod:`polyfuse.cuda.codegen.lower_gemm_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping

from polyfuse.cuda.codegen.body_printer import BodyPrinter
from polyfuse.cuda.codegen.kernel_ast import KBarrier, Kernel, KMma, KRef, MemSpace, Scope
from polyfuse.cuda.codegen.kernel_function import KFunction, print_function
from polyfuse.cuda.codegen.lower import (
    buffer_placements,
    instantiate_kernel,
    kernel_ir,
    kernel_namer,
)
from polyfuse.cuda.codegen.lower_buffers import alloc_buffers
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES, assign_dtypes, storage_dtypes
from polyfuse.cuda.codegen.lower_mma_fragments import KStep, double_buffered_loop, single_buffered
from polyfuse.cuda.codegen.lower_mma_pipeline import TileFill, k_tile_loop
from polyfuse.cuda.codegen.printer import DYNAMIC_POOL
from polyfuse.cuda.codegen.tensor_core import MMA_BF16, MMA_F16, MMA_TF32
from polyfuse.poly.placement import Placement
from polyfuse.poly.policy import STATIC_SMEM_LIMIT
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import ITEMSIZE, MMA_M, MMA_N, MmaOperand, TensorCoreKernel
from polyfuse.poly.tensorize_gather import k_extent, k_parts
from polyfuse.stitch.facts import KernelFacts, SharedArray

#: the intrinsic per operand dtype (float32: tf32, where the user allowed it)
INTRINSIC = {"bfloat16": MMA_BF16, "float16": MMA_F16, "float32": MMA_TF32}


def _lane_offset(lay: SharedLayout, op: MmaOperand, first: str, role: str) -> str:
    """The part of the shared element lane ``pf_lane`` gives ``ldmatrix`` that depends on the
    lane only (its warp's first row or column is ``first``), through the tile's layout;
    :func:`_step_offset` adds the mma tile's and the k-step's constant part, so the loads take
    immediate offsets. ``role``: "A" (x4: one 16x16 A tile), "B" (x2: one 8-column B tile),
    "B2" (x4: two B tiles). An 8x8 matrix of 16-bit elements is one of 8 rows by 4 tf32: the
    k-innermost cases load tf32 fragments the same way, by 16-byte chunks of ``lay.chunk``."""
    ch = lay.chunk
    if role == "A":  # matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
        if not op.k_inner:  # stored k rows: row k, column m
            r, c = "(pf_lane & 7) + (pf_lane >> 4) * 8", f"{first} + ((pf_lane >> 3) & 1) * 8"
        else:
            r, c = f"{first} + (pf_lane & 15)", f"(pf_lane >> 4) * {ch}"
        return lay.offset_text(r, c)
    # B: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), with B2 then (n 8-15, k 0-7), (8-15, 8-15)
    pair = "(pf_lane >> 4) * 8" if role == "B2" else "0"
    if not op.k_inner:
        r, c = "(pf_lane & 7) + ((pf_lane >> 3) & 1) * 8", f"{first} + {pair}"
    else:
        r, c = f"{first} + (pf_lane & 7) + {pair}", f"((pf_lane >> 3) & 1) * {ch}"
    return lay.offset_text(r, c)


def _step_offset(lay: SharedLayout, op: MmaOperand, tile: str, size: int, k: int) -> str:
    """The constant part of an ``ldmatrix`` address: mma tile ``tile`` (of ``size`` rows or
    columns) of the warp, k-step ``pf_ks`` of ``k`` (whole rows or whole swizzled rows of the
    layout)."""
    if op.k_inner:
        row, col = lay.step_coefficients(size, k)
        return f"{row} * {tile} + {col} * (pf_ks / {k})"
    row, col = lay.step_coefficients(k, size)
    return f"{row} * (pf_ks / {k}) + {col} * {tile}"


def _tf32_lane(lay: SharedLayout, first: str) -> tuple[str, str]:
    """A tf32 operand stored k-outside (k rows; ``ldmatrix`` has no ``.trans`` of 32-bit
    elements): lane ``l`` reads element (k ``l % 4``, column ``first + l / 4``) and the one 4 k
    further, by plain 32-bit loads; their offsets through the layout (the second as the
    difference: the XOR bit differs)."""
    col = f"{first} + (pf_lane >> 2)"
    lo = lay.offset_text("(pf_lane & 3)", col, False)
    hi = lay.offset_text("(pf_lane & 3) + 4", col, False)
    return lo, f"({hi}) - ({lo})"


def _tf32_loads(lay: SharedLayout, frag: str, buf: str, delta: str, regs: list[tuple[int, int]],
                cols: str, k: int) -> list[str]:  # fmt: skip
    """Plain loads of a k-outside tf32 fragment: register ``r`` of ``regs`` (``frag`` with
    ``{r}``) from 8-column group ``cols`` + its ``h`` (A's second 8 rows of m), 4 k further
    when its ``v``."""
    rc, cc = lay.step_coefficients(k, 8)
    return [
        f"        {frag.format(r=r)} = __float_as_uint({buf}[{delta + ' + ' if v else ''}"
        f"{rc} * (pf_ks / {k}) + {cc} * ({cols} + {h})]);"
        for r, (h, v) in enumerate(regs)
    ]


def _loader(op: MmaOperand, x: int) -> str:
    return f"pf_ldmatrix_x{x}" + ("_trans" if op.trans else "")


def lower_mma_kernel(
    name: str,
    tk: TensorCoreKernel,
    placements: dict[str, Placement],
    idents: dict[int, str],
    canonical: Mapping[str, str] | None = None,
) -> Kernel:
    """The CUDA kernel of a tensorized GEMM (see the module doc), printed through
    ``canonical`` names when given (:func:`polyfuse.cuda.codegen.lower.instantiate_kernel`)."""
    model = tk.scheduled.model
    shape, t, a, b = tk.shape, tk.tiling, tk.a, tk.b
    assert shape is not None and t is not None and a is not None and b is not None
    as_global = {
        k: Placement(k, "global", p.reason) if p.space == "shared" else p
        for k, p in placements.items()
    }
    printed, namer = kernel_namer(name, canonical)
    ir = kernel_ir(printed, tk, [], namer)
    ir = alloc_buffers(ir, buffer_placements(tk, as_global), list(model.tensors))
    ir = assign_dtypes(ir, storage_dtypes(model))
    mma = INTRINSIC[tk.dtype]
    mk = t.mma_k
    ctype = C_TYPES[tk.dtype]
    nthreads = 32 * t.warps
    (lm, hm), (ln, hn) = shape.data[tk.m_dim], shape.data[tk.n_dim]
    fold, width = tk.fold, hn - ln + 1
    if fold is not None:  # columns: the folded dim and n, row-major, both from 0
        ln, hn = 0, (shape.data[fold][1] + 1) * width - 1
    lk, hk = k_extent(shape)
    kv = tuple(k_parts(shape, "pf_k"))
    red = tuple(shape.red) if len(shape.red) > 1 else ()
    # per data dim its subscript: the batch dims are the grid's first dims, m and n "0" (the
    # fills and the epilogue put their rows and columns there)
    batch, nb = [], 0
    for i, (lo, _) in enumerate(shape.data):
        if i in (tk.m_dim, tk.n_dim, fold):
            batch.append("0")
            continue
        batch.append(f"(pf_g{nb} + {lo})" if lo else f"pf_g{nb}")
        nb += 1
    sa, sb = namer.shared(a.tensor), namer.shared(b.tensor)
    la, lb = tk.a_layout, tk.b_layout
    assert la is not None and lb is not None
    ea, eb = la.elements, lb.elements
    tm, tn = t.tiles_m, t.tiles_n
    gm, gn = f"pf_g{nb}", f"pf_g{nb + 1}"
    stages = tk.stages if tk.vector_fill else 1
    # B fragments of two mma tiles per ldmatrix.x4 where the warp has pairs of them
    b_step = t.b_step
    b_role = "B2" if b_step == 2 else "B"
    tf32 = tk.dtype == "float32"
    lane_lines, loads = [], ["#pragma unroll"]
    if tf32 and a.trans:
        lo, delta = _tf32_lane(la, "pf_wm")
        lane_lines += [f"  const int pf_la = {lo};", f"  const int pf_da = {delta};"]
        regs = [(0, 0), (1, 0), (0, 1), (1, 1)]  # a0..a3: (m g, k t) (g+8, t) (g, t+4) (g+8, t+4)
        body = _tf32_loads(la, "pf_fa[pf_i][{r}]", "pf_sa", "pf_da", regs, "2 * pf_i", mk)
        loads += [f"      for (int pf_i = 0; pf_i < {tm}; ++pf_i) {{", *body, "      }"]
    else:
        lane_lines.append(f"  const int pf_la = {_lane_offset(la, a, 'pf_wm', 'A')};")
        loads.append(
            f"      for (int pf_i = 0; pf_i < {tm}; ++pf_i) {_loader(a, 4)}(pf_fa[pf_i], "
            f"&pf_sa[{_step_offset(la, a, 'pf_i', MMA_M, mk)}]);"
        )
    loads.append("#pragma unroll")
    if tf32 and b.trans:
        lo, delta = _tf32_lane(lb, "pf_wn")
        lane_lines += [f"  const int pf_lb = {lo};", f"  const int pf_db = {delta};"]
        frag = f"pf_fb[pf_j / {b_step}][2 * (pf_j % {b_step}) + {{r}}]"
        body = _tf32_loads(lb, frag, "pf_sb", "pf_db", [(0, 0), (0, 1)], "pf_j", mk)
        loads += [f"      for (int pf_j = 0; pf_j < {tn}; ++pf_j) {{", *body, "      }"]
    else:
        lane_lines.append(f"  const int pf_lb = {_lane_offset(lb, b, 'pf_wn', b_role)};")
        loads.append(
            f"      for (int pf_j = 0; pf_j < {tn}; pf_j += {b_step}) {_loader(b, 2 * b_step)}("
            f"pf_fb[pf_j / {b_step}], &pf_sb[{_step_offset(lb, b, 'pf_j', MMA_N, mk)}]);"
        )
    itemsize = ITEMSIZE[tk.dtype]
    shared_bytes = stages * (ea + eb) * itemsize
    dynamic = shared_bytes > STATIC_SMEM_LIMIT
    if dynamic:  # past the static 48 KB: the launch's dynamic pool (the runtime raises the limit)
        tiles = [
            f"  extern __shared__ __align__(16) {ctype} {DYNAMIC_POOL}[];",
            f"  {ctype}* const {sa} = {DYNAMIC_POOL};",
            f"  {ctype}* const {sb} = {DYNAMIC_POOL} + {stages * ea};",
        ]
    else:
        tiles = [
            f"  __shared__ __align__(16) {ctype} {sa}[{stages * ea}];",
            f"  __shared__ __align__(16) {ctype} {sb}[{stages * eb}];",
        ]
    lines = [
        *tiles,
        *[f"  float {x.name};" for x in ir.allocs if x.space is MemSpace.REGISTER],
        "  const int pf_lane = pf_tid & 31, pf_warp = pf_tid >> 5;",
        f"  const int pf_wm = (pf_warp / {t.warps_n}) * {t.block_m // t.warps_m}, "
        f"pf_wn = (pf_warp % {t.warps_n}) * {t.block_n // t.warps_n};",
        f"  const int pf_m0 = {lm} + {gm} * {t.block_m}, pf_n0 = {ln} + {gn} * {t.block_n};",
        *lane_lines,
        f"  float pf_acc[{tm}][{tn}][4];",
        f"#pragma unroll\n  for (int pf_i = 0; pf_i < {tm}; ++pf_i)",
        f"#pragma unroll\n    for (int pf_j = 0; pf_j < {tn}; ++pf_j)",
        "#pragma unroll\n      for (int pf_x = 0; pf_x < 4; ++pf_x)",
        "        pf_acc[pf_i][pf_j][pf_x] = 0.0f;",
    ]
    step = KStep(
        (("pf_fa", f"[{tm}][4]"), ("pf_fb", f"[{tn // b_step}][{2 * b_step}]")),
        tuple(loads),
        (
            "#pragma unroll",
            f"      for (int pf_i = 0; pf_i < {tm}; ++pf_i)",
            "#pragma unroll",
            f"        for (int pf_j = 0; pf_j < {tn}; ++pf_j) "
            f"{mma.name}(pf_acc[pf_i][pf_j], pf_fa[pf_i], "
            f"&pf_fb[pf_j / {b_step}][2 * (pf_j % {b_step})], pf_acc[pf_i][pf_j]);",
        ),
        t.block_k,
        mk,
    )
    fills = (
        TileFill(a, la, sa, namer.tensor(a.tensor), t.block_m, t.block_k, "pf_m0", hm, hk,
                 tuple(batch), nthreads, tk.dtype, kv, red),
        TileFill(b, lb, sb, namer.tensor(b.tensor), t.block_n, t.block_k, "pf_n0", hn, hk,
                 tuple(batch), nthreads, tk.dtype, kv, red,
                 () if fold is None else ((fold, f"(pf_r / {width})"),
                                          (tk.n_dim, f"(pf_r % {width})"))),
    )  # fmt: skip
    k_tiles = -(-(hk - lk + 1) // t.block_k)
    bases = (("pf_sa", "pf_la"), ("pf_sb", "pf_lb"))
    if tk.fragment_buffers == 2:  # ALCOP's second level: lower_mma_fragments
        lines += double_buffered_loop(fills, bases, step, stages, lk, k_tiles)
    else:
        lines += k_tile_loop(
            fills, bases, single_buffered(step), stages, tk.vector_fill, lk, k_tiles
        )
    # the epilogue, per accumulator element at its fragment (row, col)
    bp = BodyPrinter(as_global, idents, namer=namer)
    args = list(batch)
    args[tk.m_dim], args[tk.n_dim] = "pf_row", "pf_col"
    if fold is not None:
        args[fold], args[tk.n_dim] = f"(pf_col / {width})", f"(pf_col % {width})"
    if tk.split:  # the micrograph's dim d is og * group + row in the group
        d, og = tk.split
        args[d : d + 2] = [f"({args[d]} * {og} + {args[d + 1]})"]
    acc = namer.register(f"{shape.update.prim}_acc")
    body = [bp.statement(s, args, s.prim) for s in shape.epilogue]
    lines += [
        "#pragma unroll",
        f"  for (int pf_i = 0; pf_i < {tm}; ++pf_i)",
        "#pragma unroll",
        f"    for (int pf_j = 0; pf_j < {tn}; ++pf_j)",
        "#pragma unroll",
        "      for (int pf_x = 0; pf_x < 4; ++pf_x) {",
        f"        const int pf_row = pf_m0 + pf_wm + {MMA_M} * pf_i + (pf_lane >> 2)"
        " + 8 * (pf_x >> 1);",
        f"        const int pf_col = pf_n0 + pf_wn + {MMA_N} * pf_j + 2 * (pf_lane & 3)"
        " + (pf_x & 1);",
        f"        if (pf_row <= {hm} && pf_col <= {hn}) {{",
        f"          {acc} = pf_acc[pf_i][pf_j][pf_x];",
        *[f"          {line}" for line in body],
        "        }",
        "      }",
    ]
    fn = KFunction(
        tuple((p.ctype, p.name) for p in ir.params),
        nthreads,
        0,
        ir.grid_dims,
        ir.thread_dims,
        "".join(f"{line}\n" for line in lines),
    )
    arrays = (SharedArray(stages * ea * itemsize, 16), SharedArray(stages * eb * itemsize, 16))
    facts = KernelFacts(
        shared_arrays=() if dynamic else arrays,
        dynamic_shared_bytes=shared_bytes if dynamic else 0,
        barriers=True,
        mma=True,
        async_copies=tk.vector_fill,  # the tiles are filled by cp.async chunks
    )
    kernel = Kernel(
        printed,
        list(ir.params),
        [
            KBarrier(Scope.BLOCK),
            KMma(mma.name, (MMA_M, MMA_N, mk), KRef("pf_acc"), KRef("pf_fa"), KRef("pf_fb")),
        ],
        (ir.blocks, 1, 1),
        (nthreads, 1, 1),
        list(ir.micrographs),
        facts=facts,
        source=print_function(fn, printed),
        printed=fn,
    )
    return instantiate_kernel(kernel, canonical, name)
