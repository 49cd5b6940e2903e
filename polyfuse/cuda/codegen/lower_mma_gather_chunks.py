"""16-byte ``cp.async`` fills of a gathered shared tile (an implicit GEMM's channels-last input).

A gathered operand stored k-innermost whose every run of 8 consecutive ``k`` (from a multiple
of 8) is one aligned run of its innermost dim (:func:`polyfuse.poly.tensorize_gather.chunked_k`:
a channels-last conv input under the reduction order ``(kh, kw, c)``: 8 channels at one
``(kh, kw)``) is copied by 16-byte chunks like a plain tile
(:func:`polyfuse.cuda.codegen.lower_mma_pipeline.chunk_fill`'s chunk-to-lane order, so the
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

#: a :class:`polyfuse.cuda.codegen.lower_mma_pipeline.TileFill` (that module dispatches here:
#: not imported, not even for typing, so the import graph stays acyclic)
TileFill = Any


def gather_chunk_fill(
    f: TileFill, k0: str, stage: str, pad: str = "    ", k_inside: bool = False
) -> list[str]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` (C text) of the
    k-innermost gathered tile ``f`` (see the module doc); ``k_inside``: the whole k-tile lies
    inside the reduction (no k test). Each subscript is split into its row part (the chunk's
    tile row: the same in every k-tile) and the rest (batch, reduction digits, constant: the
    same for every chunk of a thread where its chunk column is fixed), so a chunk's padding
    test is an add and a compare per guarded subscript and its offset one add."""
    assert f.op.chunked and f.op.k_inner
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    rows, rest, guarded = split_subscripts(f, digits)
    arr = f.op.shape
    strides = [math.prod(arr[i + 1 :]) for i in range(len(arr))]
    kc = [] if k_inside else [f"(pf_k <= {f.k_hi})"]
    conds = [f"(pf_r <= {f.row_hi})", *kc]
    conds += [f"(unsigned)({_sum([rows[i], f'pf_e{i}'])}) < {arr[i]}u" for i in guarded]
    k_part = [
        f"const int pf_k = {k0} + {f.chunk} * pf_q;",
        f"const int {', '.join(f'{d} = {v}' for d, v in zip(digits, f.k_vals, strict=True))};",
        *[f"const int pf_e{i} = {rest[i]};" for i in guarded],
        f"const int pf_kp = {_weighted(rest, strides)};  // the offset but the row's part",
    ]
    fixed_q = (f.nthreads // 8) % per_row == 0  # every chunk of a thread in one column
    dst = f"{f.buf}[{stage} * {f.elements} + {f.layout.offset_text('pf_t', f'{f.chunk} * pf_q')}]"
    head, inner = [], []
    if fixed_q:
        head = [f"{pad}{{", f"{pad}  const int pf_q = pf_tid / 8 % {per_row};",
                *[f"{pad}  {ln}" for ln in k_part]]  # fmt: skip
        pad2 = pad + "  "
    else:
        pad2 = pad
        inner = [f"{pad2}  const int pf_q = pf_c / 8 % {per_row};",
                 *[f"{pad2}  {ln}" for ln in k_part]]  # fmt: skip
    body = [
        f"{pad2}#pragma unroll",
        f"{pad2}for (int pf_u = 0; pf_u < {chunks // f.nthreads}; ++pf_u) {{",
        f"{pad2}  const int pf_c = pf_tid + pf_u * {f.nthreads};",
        f"{pad2}  const int pf_t = pf_c % 8 + pf_c / {8 * per_row} * 8;",
    ]
    tail = [
        f"{pad2}  const int pf_r = {f.row0} + pf_t;",
        f"{pad2}  const bool pf_in = {' & '.join(conds)};",
        f"{pad2}  const unsigned pf_off = pf_in ? "
        f"(unsigned)({_sum([_weighted(rows, strides), 'pf_kp'])}) : 0u;",
        f"{pad2}  pf_cp_async16(&{dst}, {f.src} + pf_off, pf_in ? 16 : 0);",
        f"{pad2}}}",
    ]
    return [*head, *body, *inner, *tail, *([f"{pad}}}"] if fixed_q else [])]


def _sum(terms: list[str]) -> str:
    return " + ".join(t for t in terms if t != "0") or "0"


def _weighted(parts: list[str], strides: list[int]) -> str:
    """``sum(stride * part)`` (C text)."""
    return _sum([p if s == 1 else f"{s} * ({p})" for p, s in zip(parts, strides, strict=True)
                 if p != "0"])  # fmt: skip


def split_subscripts(f: TileFill, digits: list[str]) -> tuple[list[str], list[str], list[int]]:
    """Per array dim of ``f``'s operand, the subscript's row part (the terms of the dims the
    tile row gives: ``pf_r``, or a fold's division and remainder) and the rest (batch dims,
    the reduction ``digits``, the constant), as C text; and the dims a ``guarded`` operand
    tests (those :meth:`TileFill.inside_conds` tests: moving with the row or the reduction
    and not proven inside)."""
    nd = len(f.batch)
    row_vals = dict(f.row_vals or ((f.op.outer_dim, "pf_r"),))
    vals = [*f.batch, *digits]
    rows, rest = [], []
    for c, k in f.op.index:
        row = [f"{a} * {row_vals[d]}" if a != 1 else row_vals[d]
               for d, a in enumerate(c[:nd]) if a and d in row_vals]  # fmt: skip
        oth = [f"{a} * {v}" if a != 1 else v
               for d, (a, v) in enumerate(zip(c, vals, strict=True))
               if a and d not in row_vals]  # fmt: skip
        rows.append(_sum(row))
        rest.append(_sum([*oth, *([str(k)] if k else [])]))
    g = replace(f, k_vals=tuple(digits))
    tested = set(g.inside_conds())
    subs = g.subscripts()
    guarded = [i for i, x in enumerate(subs) if f"(unsigned)({x}) < {f.op.shape[i]}u" in tested]
    return rows, rest, guarded
