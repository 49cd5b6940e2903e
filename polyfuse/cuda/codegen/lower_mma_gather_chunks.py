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

from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from polyfuse.cuda.codegen.lower_mma_pipeline import TileFill


def gather_chunk_fill(
    f: TileFill, k0: str, stage: str, pad: str = "    ", k_inside: bool = False
) -> list[str]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` (C text) of the
    k-innermost gathered tile ``f`` (see the module doc); ``k_inside``: the whole k-tile lies
    inside the reduction (no k test)."""
    assert f.op.chunked and f.op.k_inner
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    # the k-part: each reduction dim's value at the chunk's first k (divisions of k)
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    g = replace(f, k_vals=tuple(digits))
    kc = [] if k_inside else [f"(pf_k <= {f.k_hi})"]
    conds = " & ".join([f"(pf_r <= {f.row_hi})", *kc, *g.inside_conds()])
    k_part = [
        f"const int pf_k = {k0} + {f.chunk} * pf_q;",
        f"const int {', '.join(f'{d} = {v}' for d, v in zip(digits, f.k_vals, strict=True))};",
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
    body = [
        f"{pad2}#pragma unroll",
        f"{pad2}for (int pf_u = 0; pf_u < {chunks // f.nthreads}; ++pf_u) {{",
        f"{pad2}  const int pf_c = pf_tid + pf_u * {f.nthreads};",
        f"{pad2}  const int pf_t = pf_c % 8 + pf_c / {8 * per_row} * 8;",
    ]
    if not fixed_q:
        inner = [f"{pad2}  const int pf_q = pf_c / 8 % {per_row};",
                 *[f"{pad2}  {ln}" for ln in k_part]]  # fmt: skip
    tail = [
        f"{pad2}  const int pf_r = {f.row0} + pf_t;",
        f"{pad2}  const bool pf_in = {conds};",
        f"{pad2}  const int pf_off = {g.offset()};",
        f"{pad2}  pf_cp_async16(&{dst}, &{f.src}[pf_in ? pf_off : 0], pf_in ? 16 : 0);",
        f"{pad2}}}",
    ]
    return [*head, *body, *inner, *tail, *([f"{pad}}}"] if fixed_q else [])]
