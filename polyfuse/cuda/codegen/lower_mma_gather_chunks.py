"""16-byte ``cp.async`` fills of a gathered shared tile (an implicit GEMM's channels-last input).

A gathered operand stored k-innermost whose every run of 8 consecutive ``k`` (from a multiple
of 8) is one aligned run of its innermost dim (:func:`polyfuse.poly.tensorize_gather.chunked_k`:
a channels-last conv input under the reduction order ``(kh, kw, c)``: 8 channels at one
``(kh, kw)``) is copied by 16-byte chunks like a plain tile
(:func:`polyfuse.cuda.codegen.lower_mma_fills.chunk_fill`'s chunk-to-lane order, so the
writes stay conflict-free), each chunk's address through the operand's full subscripts
(the reduction dims split back from the chunk's first ``k``). The chunk is inside the array or
wholly outside (the padding, rows past the GEMM, k past the reduction: the same test for its
8 elements), so its zero-fill count is 16 bytes or 0. Where the threads' chunk columns do
not move between their chunks, the chunk's ``k`` and its split are computed once per k-tile.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from polyfuse.cuda.codegen.kernel_arith import (
    Operand,
    add,
    all_of,
    cmp,
    div,
    e,
    in_range,
    mod,
    mul,
    select,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KChunkCopy,
    KExpr,
    KFor,
    KInt,
    KLet,
    KNode,
    KRef,
    KScope,
    KVar,
)

#: a :class:`polyfuse.cuda.codegen.lower_mma_fills.TileFill` (that module dispatches here:
#: not imported, not even for typing, so the import graph stays acyclic)
TileFill = Any


def gather_chunk_fill(
    f: TileFill, k0: Operand, stage: Operand, k_inside: bool = False
) -> tuple[KNode, ...]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` of the k-innermost
    gathered tile ``f`` (see the module doc); ``k_inside``: the whole k-tile lies inside the
    reduction (no k test). Each subscript is split into its row part (the chunk's tile row:
    the same in every k-tile) and the rest (batch, reduction digits, constant: the same for
    every chunk of a thread where its chunk column is fixed), so a chunk's padding test is an
    add and a compare per guarded subscript and its offset one add."""
    assert f.op.chunked and f.op.k_inner
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    rows, rest, guarded = split_subscripts(f, digits)
    arr = f.op.shape
    strides = [math.prod(arr[i + 1 :]) for i in range(len(arr))]
    kc = [] if k_inside else [cmp("<=", "pf_k", f.k_hi)]
    conds = [cmp("<=", "pf_r", f.row_hi), *kc]
    conds += [in_range(add(rows[i], f"pf_e{i}"), arr[i]) for i in guarded]
    k_part: list[KNode] = [
        KLet("pf_k", add(k0, mul(f.chunk, "pf_q"))),
        *[KLet(d, v) for d, v in zip(digits, f.k_vals, strict=True)],
        *[KLet(f"pf_e{i}", rest[i]) for i in guarded],
        KLet("pf_kp", _weighted(rest, strides)),  # the offset but the row's part
    ]
    fixed_q = (f.nthreads // 8) % per_row == 0  # every chunk of a thread in one column
    q = KLet("pf_q", mod(div("pf_tid" if fixed_q else "pf_c", 8), per_row))
    inside = KVar("pf_in")
    body: list[KNode] = [
        KLet("pf_c", add("pf_tid", mul("pf_u", f.nthreads))),
        KLet("pf_t", add(mod("pf_c", 8), mul(div("pf_c", 8 * per_row), 8))),
        *([] if fixed_q else [q, *k_part]),
        KLet("pf_r", add(f.row0, "pf_t")),
        KLet("pf_in", all_of(*conds, op="&"), "bool"),
        # unsigned: the address is the array's plus a zero-extended offset, as before
        KLet("pf_off", select(inside, add(_weighted(rows, strides), "pf_kp"), 0), "unsigned"),
        KChunkCopy(
            f.dst(stage, "pf_t", mul(f.chunk, "pf_q"), True),
            KRef(f.src, (KVar("pf_off"),)),
            select(inside, 16, 0),
        ),
    ]
    loop = KFor(
        "pf_u", KInt(0), cmp("<", "pf_u", chunks // f.nthreads), 1, tuple(body), unroll=True
    )
    if fixed_q:
        return (KScope("the thread's chunk column and its k, once per k-tile",
                       (q, *k_part, loop)),)  # fmt: skip
    return (loop,)


def _weighted(parts: list[KExpr], strides: list[int]) -> KExpr:
    """``sum(stride * part)``."""
    return add(*[mul(s, p) for p, s in zip(parts, strides, strict=True)])


def split_subscripts(
    f: TileFill, digits: list[str]
) -> tuple[list[KExpr], list[KExpr], list[int]]:
    """Per array dim of ``f``'s operand, the subscript's row part (the terms of the dims the
    tile row gives: ``pf_r``, or a fold's division and remainder) and the rest (batch dims,
    the reduction ``digits``, the constant); and the dims a ``guarded`` operand tests (those
    :meth:`TileFill.inside_conds` tests: moving with the row or the reduction and not proven
    inside)."""
    nd = len(f.batch)
    row_vals = dict(f.rows_of())
    vals = [*f.batch, *map(e, digits)]
    rows, rest = [], []
    for c, k in f.op.index:
        rows.append(add(*[mul(a, row_vals[d]) for d, a in enumerate(c[:nd])
                          if a and d in row_vals]))  # fmt: skip
        oth = [mul(a, v) for d, (a, v) in enumerate(zip(c, vals, strict=True))
               if a and d not in row_vals]  # fmt: skip
        rest.append(add(*oth, k))
    g = replace(f, k_vals=tuple(KVar(d) for d in digits))
    tested = set(g.inside_conds())
    subs = g.subscripts()
    guarded = [i for i, x in enumerate(subs) if in_range(x, f.op.shape[i]) in tested]
    return rows, rest, guarded
