"""The k-step of a tensorized GEMM kernel as kernel-IR nodes: each lane's ``ldmatrix`` offsets
(or tf32 32-bit loads) into the shared tiles, the fragment loads of one ``pf_ks`` and the
``mma.sync`` of every fragment pair (a :class:`~polyfuse.cuda.codegen.lower_mma_fragments.KStep`,
single- or double-buffered by :mod:`polyfuse.cuda.codegen.lower_mma_fragments`).

Fragments and addresses follow :mod:`polyfuse.cuda.codegen.tensor_core`'s layouts (PTX ISA):
lane ``l`` gives ``ldmatrix`` the address of row ``l % 8`` of matrix ``l / 8``. The shared
tiles keep their global arrays' innermost dim innermost (it decides ``.trans``), in the layout
of :mod:`polyfuse.poly.swizzle`: the lane's ``ldmatrix`` offset goes through the layout once
(:func:`lane_offset`), mma tiles and k-steps add immediates (:func:`step_offset`).
"""

from __future__ import annotations

from collections.abc import Callable

from polyfuse.cuda.codegen.kernel_arith import (
    add,
    band,
    cmp,
    div,
    layout_offset,
    mod,
    mul,
    shr,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KExpr,
    KFor,
    KFragmentLoad,
    KInt,
    KLdmatrix,
    KLet,
    KMma,
    KNode,
    KRef,
    KRegisters,
    KVar,
)
from polyfuse.cuda.codegen.lower_mma_fragments import KStep
from polyfuse.cuda.codegen.tensor_core import Intrinsic
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import MMA_M, MMA_N, MmaOperand, TensorCoreKernel

LANE = KVar("pf_lane")
KS = KVar("pf_ks")


def lane_offset(lay: SharedLayout, op: MmaOperand, first: str, role: str) -> KExpr:
    """The part of the shared element lane ``pf_lane`` gives ``ldmatrix`` that depends on the
    lane only (its warp's first row or column is ``first``), through the tile's layout;
    :func:`step_offset` adds the mma tile's and the k-step's constant part, so the loads take
    immediate offsets. ``role``: "A" (x4: one 16x16 A tile), "B" (x2: one 8-column B tile),
    "B2" (x4: two B tiles). An 8x8 matrix of 16-bit elements is one of 8 rows by 4 tf32: the
    k-innermost cases load tf32 fragments the same way, by 16-byte chunks of ``lay.chunk``."""
    ch = lay.chunk
    if role == "A":  # matrices (rows 0-7, k 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15)
        if not op.k_inner:  # stored k rows: row k, column m
            r = add(band(LANE, 7), mul(shr(LANE, 4), 8))
            c = add(first, mul(band(shr(LANE, 3), 1), 8))
        else:
            r, c = add(first, band(LANE, 15)), mul(shr(LANE, 4), ch)
        return layout_offset(lay, r, c)
    # B: matrices (n 0-7, k 0-7), (n 0-7, k 8-15), with B2 then (n 8-15, k 0-7), (8-15, 8-15)
    pair = mul(shr(LANE, 4), 8) if role == "B2" else KInt(0)
    if not op.k_inner:
        r, c = add(band(LANE, 7), mul(band(shr(LANE, 3), 1), 8)), add(first, pair)
    else:
        r, c = add(first, band(LANE, 7), pair), mul(band(shr(LANE, 3), 1), ch)
    return layout_offset(lay, r, c)


def step_offset(lay: SharedLayout, op: MmaOperand, tile: KExpr, size: int, k: int) -> KExpr:
    """The constant part of an ``ldmatrix`` address: mma tile ``tile`` (of ``size`` rows or
    columns) of the warp, k-step ``pf_ks`` of ``k`` (whole rows or whole swizzled rows of the
    layout)."""
    if op.k_inner:
        row, col = lay.step_coefficients(size, k)
        return add(mul(row, tile), mul(col, div(KS, k)))
    row, col = lay.step_coefficients(k, size)
    return add(mul(row, div(KS, k)), mul(col, tile))


def tf32_lane(lay: SharedLayout, first: str) -> tuple[KExpr, KExpr]:
    """A tf32 operand stored k-outside (k rows; ``ldmatrix`` has no ``.trans`` of 32-bit
    elements): lane ``l`` reads element (k ``l % 4``, column ``first + l / 4``) and the one 4 k
    further, by plain 32-bit loads; their offsets through the layout (they differ in the XOR
    bit, so the second is a lane offset of its own)."""
    col = add(first, shr(LANE, 2))
    lo = layout_offset(lay, band(LANE, 3), col, False)
    hi = layout_offset(lay, add(band(LANE, 3), 4), col, False)
    return lo, hi


def tf32_loads(lay: SharedLayout, frag: Callable[[int], KRef], bufs: tuple[str, str],
               regs: list[tuple[int, int]], cols: KExpr, k: int) -> list[KNode]:  # fmt: skip
    """Plain loads of a k-outside tf32 fragment: register ``r`` of ``regs`` (``frag(r)``) from
    8-column group ``cols`` + its ``h`` (A's second 8 rows of m), through the second pointer
    of ``bufs`` (4 k further) when its ``v``: every address a pointer plus a constant."""
    rc, cc = lay.step_coefficients(k, 8)
    return [
        KFragmentLoad(frag(r), KRef(bufs[v], (add(mul(rc, div(KS, k)), mul(cc, add(cols, h))),)))
        for r, (h, v) in enumerate(regs)
    ]


def _loop(var: str, trips: int, body: list[KNode], step: int = 1) -> KFor:
    return KFor(var, KInt(0), cmp("<", var, trips), step, tuple(body), unroll=True)


def k_step(tk: TensorCoreKernel, mma: Intrinsic) -> tuple[list[KNode], KStep]:
    """The lane's offsets into the shared tiles (``pf_la``/``pf_lb``, and a k-outside tf32
    operand's second, ``pf_la4``/``pf_lb4``: lets before the loop) and one k-step of the
    k-tile loop (with the pointers its loads read)."""
    t, a, b, la, lb = tk.tiling, tk.a, tk.b, tk.a_layout, tk.b_layout
    assert t is not None and a is not None and b is not None
    assert la is not None and lb is not None
    mk, tm, tn = t.mma_k, t.tiles_m, t.tiles_n
    # B fragments of two mma tiles per ldmatrix.x4 where the warp has pairs of them
    b_step = t.b_step
    b_role = "B2" if b_step == 2 else "B"
    tf32 = tk.dtype == "float32"
    i, j = KVar("pf_i"), KVar("pf_j")
    lanes: list[KNode] = []
    pointers: list[tuple[tuple[str, str], ...]] = [(("pf_sa", "pf_la"),), (("pf_sb", "pf_lb"),)]
    if tf32 and a.trans:
        lo, hi = tf32_lane(la, "pf_wm")
        lanes += [KLet("pf_la", lo), KLet("pf_la4", hi)]
        pointers[0] += (("pf_sa4", "pf_la4"),)
        regs = [(0, 0), (1, 0), (0, 1), (1, 1)]  # a0..a3: (m g, k t) (g+8, t) (g, t+4) (g+8, t+4)
        body = tf32_loads(la, lambda r: KRef("pf_fa", (i, KInt(r))), ("pf_sa", "pf_sa4"), regs,
                          mul(2, i), mk)  # fmt: skip
        loads = [_loop("pf_i", tm, body)]
    else:
        lanes.append(KLet("pf_la", lane_offset(la, a, "pf_wm", "A")))
        src = KRef("pf_sa", (step_offset(la, a, i, MMA_M, mk),))
        loads = [_loop("pf_i", tm, [KLdmatrix(KRef("pf_fa", (i,)), src, 4, a.trans)])]
    fb = div(j, b_step)
    if tf32 and b.trans:
        lo, hi = tf32_lane(lb, "pf_wn")
        lanes += [KLet("pf_lb", lo), KLet("pf_lb4", hi)]
        pointers[1] += (("pf_sb4", "pf_lb4"),)

        def frag(r: int) -> KRef:
            return KRef("pf_fb", (fb, add(mul(2, mod(j, b_step)), r)))

        body = tf32_loads(lb, frag, ("pf_sb", "pf_sb4"), [(0, 0), (0, 1)], j, mk)
        loads.append(_loop("pf_j", tn, body))
    else:
        lanes.append(KLet("pf_lb", lane_offset(lb, b, "pf_wn", b_role)))
        src = KRef("pf_sb", (step_offset(lb, b, j, MMA_N, mk),))
        ld = KLdmatrix(KRef("pf_fb", (fb,)), src, 2 * b_step, b.trans)
        loads.append(_loop("pf_j", tn, [ld], b_step))
    mma_node = KMma(
        mma.name,
        (MMA_M, MMA_N, mk),
        KRef("pf_acc", (i, j)),
        KRef("pf_fa", (i,)),
        KRef("pf_fb", (fb, mul(2, mod(j, b_step)))),
    )
    fragments = (
        KRegisters("pf_fa", "unsigned", (tm, 4), "fragment"),
        KRegisters("pf_fb", "unsigned", (tn // b_step, 2 * b_step), "fragment"),
    )
    step = KStep(
        fragments,
        tuple(loads),
        (_loop("pf_i", tm, [_loop("pf_j", tn, [mma_node])]),),
        t.block_k,
        mk,
        tuple(pointers),
    )
    return lanes, step


__all__ = ["k_step", "lane_offset", "step_offset", "tf32_lane", "tf32_loads"]
