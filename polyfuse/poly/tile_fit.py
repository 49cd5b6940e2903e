"""Fitting a ranked GEMM tiling to the extents: the column tile folded over two data dims.

The ranked tilings (:func:`polyfuse.poly.tiling.rank_gemm_tiles`) tile the matrix plane (rows
x columns) in powers of two and every other data dim by 1. A conv's columns are an image row:
56 output pixels run in tiles of 64, and 12.5 % of the multiply-adds fall on padding. The same
column tile of ``BN = T x R`` points (``T`` threads of ``R`` registers each) may instead cover
``BH x BW`` points of two data dims — the columns and the dim just outside them (the image
rows) — with ``T = TH x TW`` threads and ``R = RH x RW`` registers: the block, its threads,
its accumulators and the shared words per multiply-add stay what the cost model ranked, and the
tile may divide both extents (8 x 8 of a 56 x 56 image: no padding). The operand that is reused
along the columns must be reused along the folded dim too (a conv's weights are), so that its
per-thread fragment does not grow; runs of 4 columns (vector stores) stay runs of 4.

:func:`fit_tiling` returns the folded tiling with the least padding over the two dims, or the
ranked one when no fold pads less.
"""

from __future__ import annotations

import math
from dataclasses import replace

from polyfuse.base.decision import DecisionKind, noted
from polyfuse.poly.gemm_shape import GemmShape, GemmTiling
from polyfuse.poly.vectorize import VECTOR_WIDTH


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _waste(extents: list[int], tiles: list[int]) -> float:
    """The share of whole tiles over ``extents`` that lies past them."""
    run = math.prod(-(-e // t) * t for e, t in zip(extents, tiles, strict=True))
    return 1 - math.prod(extents) / run


def fit_tiling(shape: GemmShape, tiling: GemmTiling) -> GemmTiling:
    """``tiling`` with its column tile folded over the columns and the data dim outside them
    when that pads less (see the module docstring); else ``tiling`` itself."""
    nd = len(shape.data)
    ext = [hi - lo + 1 for lo, hi in shape.data]
    n, h = nd - 1, nd - 2
    if h < 0 or ext[n] % tiling.block[n] == 0 or tiling.block[h] != 1 or ext[h] == 1:
        return tiling
    # every operand reused along the columns must be reused along the folded dim too
    if any(n in r and h not in r for r in shape.reuse):
        return tiling
    threads, regs = tiling.threads[n], tiling.regs[n]
    runs = regs % VECTOR_WIDTH == 0  # the columns in vector runs: keep runs of 4
    best: tuple[float, int, int, int, int, int] | None = None
    for tw in _divisors(threads):
        for rw in _divisors(regs):
            if runs and rw % VECTOR_WIDTH:
                continue
            th, rh = threads // tw, regs // rw
            bw, bh = tw * rw, th * rh
            waste = _waste([ext[h], ext[n]], [bh, bw])
            key = (waste, -bw, bh, th, tw, rw)
            if best is None or key < best:
                best = key
    assert best is not None
    waste, nbw, bh, th, tw, rw = best
    before = _waste([ext[h], ext[n]], [1, tiling.block[n]])
    if waste >= before:
        return tiling
    block, thr = list(tiling.block), list(tiling.threads)
    block[h], thr[h], block[n], thr[n] = bh, th, -nbw, tw
    note = noted(
        DecisionKind.GEMM_TILE,
        f"column tile of {tiling.block[n]} folded into {bh}x{-nbw} over data dims {h}x{n} "
        f"(extents {ext[h]}x{ext[n]}; {threads} threads x {regs} registers as "
        f"{th}x{tw} x {regs // rw}x{rw}): padding {before:.1%} -> {waste:.1%} of the "
        "multiply-adds, threads, accumulators and shared words per multiply-add unchanged",
        shape.update.prim,
    )
    return replace(tiling, block=block, threads=thr, reasons=[*tiling.reasons, note])
