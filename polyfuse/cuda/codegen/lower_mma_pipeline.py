"""The k-tile loop of a tensorized GEMM kernel: shared-tile fills and their pipelining.

Each k-tile's two 16-bit shared tiles (A and B, in the layouts of
:mod:`polyfuse.poly.swizzle`: XOR-swizzled 32-byte rows, or padded rows where the swizzle does
not apply; every shared address goes through :meth:`SharedLayout.offset_text`) are filled one
of two ways (:class:`polyfuse.poly.tensorize.TensorCoreKernel` ``vector_fill``):

- **16-byte chunks** (:func:`chunk_fill`): where the tensorization decision proved every chunk's
  first element 16-byte aligned, each thread issues ``cp.async`` copies of 8 consecutive
  elements along the array's innermost dim. Chunk ``c`` of the tile goes to tile row
  ``c % 8 + 8 * (c / (8 * chunks_per_row))``, chunk column ``(c / 8) % chunks_per_row``: the 8
  lanes of a quarter-warp (one shared-memory phase of 16-byte accesses) write 8 consecutive rows
  of one chunk column, which the swizzle (or the row padding) puts on 8 distinct groups of 4 banks
  (conflict-free), while a warp still reads whole 64- or 128-byte runs of global memory. Past an
  array's edge the copy's zero-fill argument counts the bytes outside (a chunk wholly outside
  reads nothing and is all zero);
- **scalar** (:func:`scalar_fill`): 2-byte guarded copies (unaligned arrays; an implicit
  GEMM's gathered operand). A thread keeps one position along the tile's innermost dim for
  the whole loop (its subscript part is loop-invariant); a gathered tile stored in k rows walks
  a run of consecutive k per thread (:func:`digit_fill`: the reduction dims' values once per
  k-tile, then carried, or -- where the runs never wrap the innermost reduction dim -- only it
  steps, the other guards one predicate per run). Where the other operand's tile takes
  chunks, the scalar copies go into the same S stages (:func:`fill`); else single-stage, the
  k-tiles wholly inside the reduction without the k guard.

With chunks the k-tile loop is pipelined over S stages (ALCOP; S from
:func:`polyfuse.poly.costs.stages.choose_stages`): S buffers per tile; a prologue issues the
copies of k-tiles 0..S-2, one commit group each; iteration ``kt`` waits until only the S-2
newest groups may still fly (:func:`wait_pending`; k-tile ``kt``'s group has landed), a
barrier makes every thread's copies visible and retires the reads of k-tile ``kt-1``, then
the copies of k-tile ``kt+S-1`` go into the stage ``kt-1`` used (a commit each iteration, empty
past the last k-tile, so the counts stay exact) and the fragments of k-tile ``kt`` are loaded
and multiplied. With S = 1 the copies of k-tile ``kt`` are issued, committed and waited for
(``wait_prior(0)``) between the two barriers of a single-buffered loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from polyfuse.cuda.codegen.c_text import c_offset
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES, FLOAT_TO_HALF
from polyfuse.cuda.codegen.lower_mma_gather_chunks import gather_chunk_fill
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import ITEMSIZE, MmaOperand


@dataclass(frozen=True)
class TileFill:
    """One operand's shared tile: the buffer, the global array and the tile's extent (``rows``
    of m or n by ``block_k``), its first row (C text), the last valid row and k, the batch
    subscripts (C text, one per data dim: "0" at m and n), the threads and the operand
    dtype."""

    op: MmaOperand
    layout: SharedLayout
    buf: str
    src: str
    rows: int
    block_k: int
    row0: str
    row_hi: int
    k_hi: int
    batch: tuple[str, ...]
    nthreads: int
    dtype: str
    #: each reduction dim's value at ``pf_k`` (C text): ``pf_k`` itself for one reduction dim,
    #: else the flattened k split back (an implicit GEMM's gather)
    k_vals: tuple[str, ...] = ("pf_k",)
    #: the reduction dims' bounds ``(lo, hi)`` (an implicit GEMM's; a gathered k-row fill
    #: walks their values incrementally: :func:`digit_fill`)
    red: tuple[tuple[int, int], ...] = ()
    #: each data dim the tile's row ``pf_r`` gives, with its value (C text): the operand's row
    #: dim ``pf_r`` where empty; a folded dim and ``n`` (``pf_r / width``, ``pf_r % width``)
    row_vals: tuple[tuple[int, str], ...] = ()

    @property
    def inner(self) -> int:
        """Elements along the tile's innermost dim (the array's)."""
        return self.block_k if self.op.k_inner else self.rows

    @property
    def outer(self) -> int:
        return self.rows if self.op.k_inner else self.block_k

    @property
    def itemsize(self) -> int:
        return ITEMSIZE[self.dtype]

    @property
    def chunk(self) -> int:
        """Elements of a 16-byte chunk (one cp.async)."""
        return 16 // self.itemsize

    @property
    def elements(self) -> int:
        """Elements of one stage of the tile."""
        return self.layout.elements

    def subscripts(self) -> list[str]:
        """The array subscripts of the element at (``pf_r``, ``pf_k``) of the update (C)."""
        vals = [*self.batch, *self.k_vals]  # every data dim's subscript ("0": m, n), then k
        for d, v in self.row_vals or ((self.op.outer_dim, "pf_r"),):
            vals[d] = v
        idx = []
        for coeffs, const in self.op.index:
            terms = [f"{c} * {v}" if c != 1 else v for c, v in zip(coeffs, vals, strict=True) if c]
            sub = " + ".join(terms + ([str(const)] if const else [])) or "0"
            idx.append(f"({sub})" if len(terms) + bool(const) > 1 else sub)
        return idx

    def offset(self) -> str:
        """The offset of the array element at (``pf_r``, ``pf_k``) of the update, as C text:
        ``data part + pf_k + constant`` for an operand linear in k (no division of k)."""
        if self.op.linear is None:
            return c_offset(self.subscripts(), self.op.shape)
        coeffs, sk, const = self.op.linear
        vals = [*self.batch, "pf_k"]
        for d, v in self.row_vals or ((self.op.outer_dim, "pf_r"),):
            vals[d] = v
        pairs = zip((*coeffs, sk), vals, strict=True)
        terms = [f"{c} * {v}" if c != 1 else v for c, v in pairs if c]
        return " + ".join([*terms, *([str(const)] if const else [])])

    def inside(self, op: str = "&&") -> str:
        """The guard of a ``guarded`` operand's read (C text, "" for others): every subscript
        that moves with the reduction inside the array (zero on a conv's padding), joined by
        ``op`` (``&``: evaluated whole, a predicate rather than a branch per term)."""
        return "".join(f" {op} {c}" for c in self.inside_conds())

    def inside_conds(self) -> list[str]:
        """The terms of :meth:`inside`, one per guarded subscript."""
        return [cond for cond, _ in self.inside_terms()]

    def inside_terms(self) -> list[tuple[str, frozenset[int]]]:
        """The terms of :meth:`inside`, each with the values it reads: positions in the
        subscripts' values (the data dims, then the reduction dims' ``k_vals``)."""
        if not self.op.guarded:
            return []
        nd = len(self.batch)
        rows = {d for d, _ in self.row_vals or ((self.op.outer_dim, ""),)}
        out = []
        for x, n, (c, k) in zip(self.subscripts(), self.op.shape, self.op.index, strict=True):
            if not (any(c[nd:]) or any(c[d] for d in rows)):
                continue
            if self.red and not any(c[:nd]):  # reduction dims only: inside over their box?
                box = list(zip(c[nd:], self.red, strict=True))
                lo = k + sum(min(a * r0, a * r1) for a, (r0, r1) in box)
                hi = k + sum(max(a * r0, a * r1) for a, (r0, r1) in box)
                if 0 <= lo and hi < n:
                    continue
            out.append((f"(unsigned)({x}) < {n}u", frozenset(i for i, a in enumerate(c) if a)))
        return out


def scalar_fill(
    f: TileFill, k0: str, stage: str = "", pad: str = "    ", k_inside: bool = False
) -> list[str]:
    """The loop that copies the k-tile at ``k0`` into ``f``'s shared tile (stage ``stage``, C
    text; "" for a single-buffered tile), every thread a strided share of the elements, the
    array's innermost dim fastest; zeros outside the array. Where the threads divide the tile's
    rows, a thread keeps one position along the innermost dim (``pf_i``) for the whole tile:
    its part of the subscripts (a gather's column, the fold's divisions) is loop-invariant,
    computed once before the k-tile loop, and only the other coordinate moves."""
    inner, outer = f.inner, f.outer
    n = inner * outer
    if f.op.gather and not f.op.k_inner and len(f.red) > 1 and f.nthreads % inner == 0:
        if n % f.nthreads == 0:
            return digit_fill(f, k0, stage, pad, k_inside)
    base = f"{stage} * {f.elements} + " if stage else ""
    zero = f"{FLOAT_TO_HALF[f.dtype]}(0.0f)" if f.dtype in FLOAT_TO_HALF else "0.0f"
    if f.nthreads % inner == 0 and n % f.nthreads == 0:
        w, step = f.layout.row, f.nthreads // inner
        o, i = f"pf_tid / {inner}", f"pf_tid % {inner}"
        if f.layout.blocked and f.nthreads % (2 * inner) == 0 and inner % w == 0:
            # a blocked layout's rows are w elements (32 bytes): a warp's 16 lanes of one
            # 16-bit row, the other 16 the next row of the same block (other banks; a
            # whole-width row across two blocks hit the same banks twice)
            nb = inner // w
            o = f"pf_tid / {w} % 2 + pf_tid / {2 * w * nb} * 2"
            i = f"pf_tid / {2 * w} % {nb} * {w} + pf_tid % {w}"
        head = [
            f"{pad}for (int pf_u = 0; pf_u < {n // f.nthreads}; ++pf_u) {{",
            f"{pad}  const int pf_o = {o} + pf_u * {step}, pf_i = {i};",
        ]
        io, ii = "pf_o", "pf_i"
    else:
        head = [f"{pad}for (int pf_e = pf_tid; pf_e < {n}; pf_e += {f.nthreads}) {{"]
        io, ii = f"pf_e / {inner}", f"pf_e % {inner}"
    if f.op.k_inner:
        row, k = f"{f.row0} + {io}", f"{k0} + {ii}"
    else:
        row, k = f"{f.row0} + {ii}", f"{k0} + {io}"
    # a gather's subscripts (divisions, guards) kept rolled where k moves along the loop:
    # unrolled they spilled on sm_90; a k-innermost tile with one k per thread (``pf_i``) has
    # its divisions once per k-tile, unrolled (the rows step by immediates)
    fixed_k = f.op.k_inner and ii == "pf_i"
    unroll = [f"{pad}#pragma unroll 1"] if f.op.gather and not fixed_k else []
    if fixed_k:
        unroll = [f"{pad}#pragma unroll"]
    kc = "" if k_inside else f" && pf_k <= {f.k_hi}"
    guard = f"pf_r <= {f.row_hi}{kc}{f.inside()}"
    load = [f"{pad}  if ({guard}) pf_v = {f.src}[{f.offset()}];"]
    if f.op.gather:  # the guard evaluated whole (one predicate, no branch per term) and the
        # offset outside it (unconditional: its k part shared by the unrolled elements)
        kc = "" if k_inside else f" & (pf_k <= {f.k_hi})"
        guard = f"(pf_r <= {f.row_hi}){kc}{f.inside('&')}"
        load = [f"{pad}  const int pf_off = {f.offset()};",
                f"{pad}  if ({guard}) pf_v = {f.src}[pf_off];"]  # fmt: skip
    return [
        *unroll,
        *head,
        f"{pad}  const int pf_r = {row}, pf_k = {k};",
        f"{pad}  {C_TYPES[f.dtype]} pf_v = {zero};",
        *load,
        f"{pad}  {f.buf}[{base}{f.layout.offset_text(io, ii, False)}] = pf_v;",
        f"{pad}}}",
    ]


def digit_fill(
    f: TileFill, k0: str, stage: str = "", pad: str = "    ", k_inside: bool = False
) -> list[str]:
    """:func:`scalar_fill` of a gathered tile stored in k rows (an implicit GEMM's input):
    each thread copies one column (``pf_i``, fixed for the whole loop) of a run of ``U``
    consecutive k rows. The reduction dims' values at the run's first k are computed once per
    k-tile (the divisions of k), then carried along the run digit by digit (the innermost dim
    +1, wrapping into the next), so no element divides k; a warp's lanes still write one row
    of consecutive columns (the same banks as the strided order)."""
    inner, u = f.inner, f.inner * f.outer // f.nthreads
    base = f"{stage} * {f.elements} + " if stage else ""
    zero = f"{FLOAT_TO_HALF[f.dtype]}(0.0f)" if f.dtype in FLOAT_TO_HALF else "0.0f"
    digits = [f"pf_d{j}" for j in range(len(f.red))]
    ext = [hi - lo + 1 for lo, hi in f.red]
    first = []
    for j, (lo, _) in enumerate(f.red):
        inner_ext = math.prod(ext[j + 1 :])
        v = f"pf_kb / {inner_ext}" if inner_ext > 1 else "pf_kb"
        v = f"({v}) % {ext[j]}" if j else f"({v})"
        first.append(f"{digits[j]} = {lo} + {v}" if lo else f"{digits[j]} = {v}")
    g = replace(f, k_vals=tuple(digits))
    # each guard term with whether a run moves it: ``pf_k`` and the innermost digit (value
    # position ``last``) step along the run; the rows, batch and outer digits do not
    last = len(f.batch) + len(digits) - 1
    terms = [(f"(pf_r <= {f.row_hi})", False)]
    terms += [] if k_inside else [(f"(pf_k <= {f.k_hi})", True)]
    terms += [(c, last in reads) for c, reads in g.inside_terms()]
    conds = [c for c, _ in terms]
    fixed: list[str] = []  # terms the run does not move, one predicate before it
    if ext[-1] % u == 0 and f.block_k % u == 0:  # runs start on multiples of u: never wrap
        carry = [f"++{digits[-1]};"]
        fixed = [c for c, moves in terms if not moves]
        conds = [c for c, moves in terms if moves] + (["pf_run"] if fixed else [])
    else:  # branch-free: the innermost +1, each wrap carried outward by selects
        carry = []
        for j in range(len(f.red) - 1, 0, -1):
            lo, hi = f.red[j]
            inc = "1" if j == len(f.red) - 1 else f"pf_c{j + 1}"
            carry.append(f"const int pf_c{j} = {digits[j]} + {inc} > {hi}; "
                         f"{digits[j]} = pf_c{j} ? {lo} : {digits[j]} + {inc};")  # fmt: skip
        carry.append(f"{digits[0]} += pf_c1;")
    head = []
    if fixed:
        head = [f"{pad}  const int pf_r = {f.row0} + pf_tid % {inner};",
                f"{pad}  const bool pf_run = {' & '.join(fixed)};"]  # fmt: skip
    return [
        f"{pad}{{",
        f"{pad}  const int pf_kb = {k0} + pf_tid / {inner} * {u};",
        f"{pad}  int {', '.join(first)};",
        *head,
        f"{pad}#pragma unroll",
        f"{pad}  for (int pf_u = 0; pf_u < {u}; ++pf_u) {{",
        f"{pad}    const int pf_o = pf_tid / {inner} * {u} + pf_u, pf_i = pf_tid % {inner};",
        f"{pad}    const int pf_k = pf_kb + pf_u;",
        *([] if fixed else [f"{pad}    const int pf_r = {f.row0} + pf_i;"]),
        f"{pad}    {C_TYPES[f.dtype]} pf_v = {zero};",
        f"{pad}    const int pf_off = {g.offset()};",
        f"{pad}    if ({' & '.join(conds)}) pf_v = {f.src}[pf_off];",
        f"{pad}    {f.buf}[{base}{f.layout.offset_text('pf_o', 'pf_i', False)}] = pf_v;",
        *[f"{pad}    {c}" for c in carry],
        f"{pad}  }}",
        f"{pad}}}",
    ]


def fill(f: TileFill, k0: str, stage: str, pad: str = "    ", k_inside: bool = False) -> list[str]:
    """The copies of the k-tile at ``k0`` into stage ``stage`` of ``f``'s tile in a pipelined
    loop: 16-byte ``cp.async`` chunks (:func:`chunk_fill`), or scalar copies for a gathered
    operand with no contiguous run (:func:`scalar_fill`: they land before the barrier that
    ends the iteration, so the stage is ready as early as the chunks)."""
    if f.op.scalar:
        return scalar_fill(f, k0, stage, pad, k_inside)
    if f.op.chunked:  # a gather by 16-byte chunks (a channels-last conv input)
        return gather_chunk_fill(f, k0, stage, pad, k_inside)
    return chunk_fill(f, k0, stage, pad, k_inside)


def chunk_fill(
    f: TileFill, k0: str, stage: str, pad: str = "    ", k_inside: bool = False
) -> list[str]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` (C text) of ``f``'s
    tile, 16 bytes each (see the module doc for the chunk-to-lane order and the zero-fill);
    ``k_inside``: the whole k-tile lies inside the reduction (only rows are guarded, which
    does not change along the loop)."""
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    row, col = "pf_t", f"{f.chunk} * pf_q"
    if f.op.k_inner:  # tile row: m or n; chunks run along k
        r, k = f"{f.row0} + {row}", f"{k0} + {col}"
        count = f"pf_r <= {f.row_hi} ? {f.k_hi} + 1 - pf_k : 0"
        if k_inside:
            count = f"pf_r <= {f.row_hi} ? {f.chunk} : 0"
    else:  # tile row: k; chunks run along m or n
        r, k = f"{f.row0} + {col}", f"{k0} + {row}"
        count = f"pf_k <= {f.k_hi} ? {f.row_hi} + 1 - pf_r : 0"
        if k_inside:
            count = f"{f.row_hi} + 1 - pf_r"
    dst = f"{f.buf}[{stage} * {f.elements} + {f.layout.offset_text('pf_t', f'{f.chunk} * pf_q')}]"
    return [
        f"{pad}#pragma unroll",
        f"{pad}for (int pf_u = 0; pf_u < {chunks // f.nthreads}; ++pf_u) {{",
        f"{pad}  const int pf_c = pf_tid + pf_u * {f.nthreads};",
        f"{pad}  const int pf_t = pf_c % 8 + pf_c / {8 * per_row} * 8, "
        f"pf_q = pf_c / 8 % {per_row};",
        f"{pad}  const int pf_r = {r}, pf_k = {k};",
        f"{pad}  int pf_n = {count};",
        f"{pad}  pf_n = pf_n < 0 ? 0 : pf_n > {f.chunk} ? {f.chunk} : pf_n;  // elements inside",
        f"{pad}  pf_cp_async16(&{dst}, &{f.src}[pf_n > 0 ? {f.offset()} : 0], "
        f"{f.itemsize} * pf_n);",
        f"{pad}}}",
    ]


def wait_pending(stages: int) -> int:
    """Commit groups that may still fly when iteration ``kt`` of an S-stage loop reads k-tile
    ``kt``: S-1 prologue groups plus ``kt`` earlier iterations' are committed, k-tile ``kt``'s
    is group ``kt``, so all but the S-2 newest must have landed."""
    return stages - 2


def k_tile_loop(
    fills: tuple[TileFill, TileFill],
    bases: tuple[tuple[str, str], tuple[str, str]],
    compute: list[str],
    stages: int,
    vector: bool,
    k_lo: int,
    k_tiles: int,
) -> list[str]:
    """The k-tile loop (see the module doc): ``compute`` (lines at loop-body depth) loads the
    fragments of the k-tile from the shared tiles through ``bases`` (per tile: the pointer it
    reads, declared here per stage, and the lane's offset added to it) and multiplies them.
    With 16-byte fills the loop is split where the k-tiles it fills stop lying wholly inside
    the reduction: the steady state fills without a k guard, the tail with one."""
    bk = fills[0].block_k
    point = [
        f"    const {C_TYPES[f.dtype]}* {b} = {f.buf} + pf_rs * {f.elements} + {off};"
        for f, (b, off) in zip(fills, bases, strict=True)
    ]
    full = min(k_tiles, (fills[0].k_hi - k_lo + 1) // bk)  # k-tiles wholly inside

    def loop(lo: int, hi: int, body: list[str], tail: bool = False) -> list[str]:
        """k-tiles ``lo..hi-1``; ``tail``: a few k-tiles kept rolled (unrolled beside the
        steady state they raised the register pressure into a spill on sm_90)."""
        if lo >= hi:
            return []
        head = ["#pragma unroll 1"] if tail else []
        return [*head, f"  for (int pf_kt = {lo}; pf_kt < {hi}; ++pf_kt) {{", *body, "  }"]

    if not vector:

        def scalar(inside: bool) -> list[str]:
            return [
                f"    const int pf_k0 = {k_lo} + pf_kt * {bk};",
                *point,
                "    __syncthreads();  // the previous k-tile's fragments are loaded",
                *[ln for f in fills for ln in scalar_fill(f, "pf_k0", k_inside=inside)],
                "    __syncthreads();  // the shared tiles are filled",
                *compute,
            ]

        return ["  const int pf_rs = 0;", *loop(0, full, scalar(True)),
                *loop(full, k_tiles, scalar(False), True)]  # fmt: skip
    if stages == 1:

        def single(inside: bool) -> list[str]:
            return [
                f"    const int pf_k0 = {k_lo} + pf_kt * {bk};",
                *point,
                "    __syncthreads();  // the previous k-tile's fragments are loaded",
                *[ln for f in fills for ln in fill(f, "pf_k0", "0", k_inside=inside)],
                "    __pipeline_commit();",
                "    __pipeline_wait_prior(0);",
                "    __syncthreads();  // the shared tiles are filled",
                *compute,
            ]

        return ["  const int pf_rs = 0;", *loop(0, full, single(True)),
                *loop(full, k_tiles, single(False), True)]  # fmt: skip
    ahead = stages - 1

    def steady(inside: bool) -> list[str]:
        fill_ = [ln for f in fills for ln in fill(f, "pf_kf", "pf_ws", "      ", inside)]
        return [
            f"    const int pf_k0 = {k_lo} + pf_kt * {bk};",
            f"    __pipeline_wait_prior({wait_pending(stages)});  // k-tile pf_kt has landed",
            "    __syncthreads();  // ... for every thread; k-tile pf_kt - 1 is read",
            "    {" if inside else f"    if (pf_kt + {ahead} < {k_tiles}) {{",
            f"      const int pf_kf = pf_k0 + {ahead * bk};",
            *fill_,
            "    }",
            "    __pipeline_commit();  // one group per k-tile (empty past the last)",
            *point,
            *compute,
            f"    pf_rs = pf_rs == {stages - 1} ? 0 : pf_rs + 1;",
            f"    pf_ws = pf_ws == {stages - 1} ? 0 : pf_ws + 1;",
        ]

    main = max(0, full - ahead)  # iterations whose fill lies wholly inside
    return [
        *prologue(fills, ahead, k_tiles, k_lo, bk),
        *loop(0, main, steady(True)),
        *loop(main, k_tiles, steady(False), True),
    ]


def prologue(fills: Sequence[TileFill], ahead: int, k_tiles: int, k_lo: int, bk: int) -> list[str]:
    """The pipelined loop's prologue: k-tiles 0..S-2 filled into their stages, one commit
    group each (empty past the last k-tile), and the read and fill stage counters."""
    return [
        "#pragma unroll",
        f"  for (int pf_s = 0; pf_s < {ahead}; ++pf_s) {{  // prologue: k-tiles 0..S-2",
        f"    if (pf_s < {k_tiles}) {{",
        f"      const int pf_k0 = {k_lo} + pf_s * {bk};",
        *[line for f in fills for line in fill(f, "pf_k0", "pf_s", "      ")],
        "    }",
        "    __pipeline_commit();",
        "  }",
        f"  int pf_rs = 0, pf_ws = {ahead};  // the stages read and filled",
    ]
