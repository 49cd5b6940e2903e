"""The shared destinations of a thread's 16-byte ``cp.async`` chunks in a k-tile fill.

Chunk ``c = tid + u * threads`` of a tile goes to tile row ``c % 8 + 8 * (c / (8 * per_row))``
and chunk column ``(c / 8) % per_row`` (:mod:`polyfuse.cuda.codegen.lower_mma_fills`). Where a
thread's chunks all lie in one chunk column, consecutive chunks are ``threads / per_row`` tile
rows apart; where the shared layout (swizzled or padded) puts every such pair the same number
of elements apart, on every thread (checked by evaluating the layout), a chunk's destination is
one pointer per k-tile plus ``u`` times that step: a constant the compiler folds into the
copy's shared address instead of recomputing the swizzle per chunk (CUTLASS's iterators
advance the same way).
"""

from __future__ import annotations

from typing import Any

from polyfuse.cuda.codegen.kernel_arith import Operand, add, div, mod, mul
from polyfuse.cuda.codegen.kernel_ast import KLet, KNode, KRef, KVar
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES

#: a :class:`polyfuse.cuda.codegen.lower_mma_fills.TileFill` (not imported: that module
#: imports this one)
TileFill = Any


def fixed_column(f: TileFill) -> bool:
    """Every chunk of a thread lies in one chunk column of ``f``'s tile."""
    return (f.nthreads // 8) % (f.inner // f.chunk) == 0


def chunk_step(f: TileFill) -> int | None:
    """The layout distance between a thread's consecutive chunks where it is the same for
    every thread and chunk, else None (see the module doc; None too for one chunk per
    thread)."""
    per_row = f.inner // f.chunk
    n = f.outer * per_row // f.nthreads
    if n < 2 or not fixed_column(f):
        return None
    apart = f.nthreads // per_row  # tile rows between a thread's consecutive chunks
    step = f.layout.offset(apart, 0) - f.layout.offset(0, 0)
    for tid in range(f.nthreads):
        t0, col = tid % 8 + tid // (8 * per_row) * 8, f.chunk * ((tid // 8) % per_row)
        first = f.layout.offset(t0, col)
        if any(f.layout.offset(t0 + u * apart, col) - first != u * step for u in range(n)):
            return None
    return step


def chunk_destination(f: TileFill, stage: Operand) -> tuple[list[KNode], KRef]:
    """The statements a k-tile's fill runs first and the shared element chunk ``pf_u`` of
    the thread is copied to, in stage ``stage``: through one pointer and the constant step
    where :func:`chunk_step` finds one, else through the chunk's row ``pf_t`` and column
    ``pf_q`` (which the fill computes per chunk)."""
    step = chunk_step(f)
    if step is None:
        return [], f.dst(stage, "pf_t", mul(f.chunk, "pf_q"), True)
    per_row = f.inner // f.chunk
    t0 = add(mod("pf_tid", 8), mul(div("pf_tid", 8 * per_row), 8))
    col = mul(f.chunk, mod(div("pf_tid", 8), per_row))
    base = f.dst(stage, "pf_t0", col, True)
    first: list[KNode] = [
        KLet("pf_t0", t0),
        KLet("pf_dst", add(KVar(base.name), base.index[0]), f"{C_TYPES[f.dtype]}*", const=False),
    ]
    return first, KRef("pf_dst", (mul("pf_u", step),))
