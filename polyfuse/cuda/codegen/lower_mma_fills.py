"""The shared-tile fills of a tensorized GEMM kernel, as kernel-IR nodes.

Each k-tile's two 16-bit shared tiles (A and B, in the layouts of :mod:`polyfuse.poly.swizzle`:
XOR-swizzled 32-byte rows, or padded rows where the swizzle does not apply; every shared
address goes through :func:`polyfuse.cuda.codegen.kernel_arith.layout_offset`) are filled one
of two ways (:class:`polyfuse.poly.tensorize.TensorCoreKernel` ``vector_fill``):

- **16-byte chunks** (:func:`chunk_fill`, :class:`KChunkCopy`): where the tensorization
  decision proved every chunk's first element 16-byte aligned, each thread issues ``cp.async``
  copies of 8 consecutive elements along the array's innermost dim. Chunk ``c`` of the tile goes
  to tile row ``c % 8 + 8 * (c / (8 * chunks_per_row))``, chunk column
  ``(c / 8) % chunks_per_row``: the 8 lanes of a quarter-warp (one shared-memory phase of
  16-byte accesses) write 8 consecutive rows of one chunk column, which the swizzle (or the row
  padding) puts on 8 distinct groups of 4 banks (conflict-free), while a warp still reads whole
  64- or 128-byte runs of global memory. Past an array's edge the copy's zero-fill argument
  counts the bytes outside (a chunk wholly outside reads nothing and is all zero); a gathered
  operand by chunks: :mod:`polyfuse.cuda.codegen.lower_mma_gather_chunks`;
- **scalar** (:func:`scalar_fill`, :class:`KGuardedCopy`): 2-byte guarded copies (unaligned
  arrays; an implicit GEMM's gathered operand). A thread keeps one position along the tile's
  innermost dim for the whole loop (its subscript part is loop-invariant); a gathered tile
  stored in k rows walks a run of consecutive k per thread (:func:`digit_fill`: the reduction
  dims' values once per k-tile, then carried, or -- where the runs never wrap the innermost
  reduction dim -- only it steps, the other guards one predicate per run).

The k-tile loop that issues them: :mod:`polyfuse.cuda.codegen.lower_mma_pipeline`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from polyfuse.cuda.codegen.kernel_arith import (
    Operand,
    add,
    all_of,
    cmp,
    div,
    e,
    in_range,
    layout_offset,
    mod,
    mul,
    select,
    sub,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KChunkCopy,
    KExpr,
    KFor,
    KGuardedCopy,
    KInt,
    KLet,
    KNode,
    KRef,
    KScope,
    KVar,
)
from polyfuse.cuda.codegen.lower_mma_chunk_dst import chunk_destination
from polyfuse.cuda.codegen.lower_mma_gather_chunks import gather_chunk_fill, gather_setup
from polyfuse.poly.swizzle import SharedLayout
from polyfuse.poly.tensorize import ITEMSIZE, MmaOperand

TID = KVar("pf_tid")


def k_values(red: tuple[tuple[int, int], ...], k: Operand) -> tuple[KExpr, ...]:
    """Each reduction dim's value (bounds ``red``) at the flattened ``k``: ``k`` itself for one
    dim, else ``lo + (k / inner) % extent`` (the innermost dims' extents' product ``inner``)."""
    if len(red) <= 1:
        return (e(k),)
    ext = [hi - lo + 1 for lo, hi in red]
    out = []
    for i, (lo, _) in enumerate(red):
        v = div(k, math.prod(ext[i + 1 :]))
        out.append(add(lo, mod(v, ext[i]) if i else v))
    return tuple(out)


@dataclass(frozen=True)
class TileFill:
    """One operand's shared tile: the buffer, the global array and the tile's extent (``rows``
    of m or n by ``block_k``), its first row, the last valid row and k, the batch subscripts
    (one per data dim: 0 at m and n), the threads and the operand dtype."""

    op: MmaOperand
    layout: SharedLayout
    buf: str
    src: str
    rows: int
    block_k: int
    row0: KExpr
    row_hi: int
    k_hi: int
    batch: tuple[KExpr, ...]
    nthreads: int
    dtype: str
    #: each reduction dim's value at ``pf_k``: ``pf_k`` itself for one reduction dim, else the
    #: flattened k split back (an implicit GEMM's gather: :func:`k_values`)
    k_vals: tuple[KExpr, ...] = (KVar("pf_k"),)
    #: the reduction dims' bounds ``(lo, hi)`` (an implicit GEMM's; a gathered k-row fill
    #: walks their values incrementally: :func:`digit_fill`)
    red: tuple[tuple[int, int], ...] = ()
    #: each data dim the tile's row ``pf_r`` gives, with its value: the operand's row dim
    #: ``pf_r`` where empty; a folded dim and ``n`` (``pf_r / width``, ``pf_r % width``)
    row_vals: tuple[tuple[int, KExpr], ...] = field(default=())
    #: the grid's tiles cover the rows exactly (their count a multiple of ``rows``): no tile
    #: row lies past ``row_hi`` and the fills test none (a guard per chunk held live across
    #: the loop cost 40 registers and a spill on ResNet-50's stage-2 projection, sm_80)
    rows_exact: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "row0", e(self.row0))
        object.__setattr__(self, "batch", tuple(map(e, self.batch)))
        object.__setattr__(self, "k_vals", tuple(map(e, self.k_vals)))
        object.__setattr__(self, "row_vals", tuple((d, e(v)) for d, v in self.row_vals))

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

    def row_guard(self) -> KExpr:
        """Whether the row ``pf_r`` lies inside the array (constant true: :attr:`rows_exact`)."""
        return KInt(1) if self.rows_exact else cmp("<=", "pf_r", self.row_hi)

    def rows_of(self) -> tuple[tuple[int, KExpr], ...]:
        """The data dims the tile's row gives, with their values."""
        return self.row_vals or ((self.op.outer_dim, KVar("pf_r")),)

    def subscripts(self) -> list[KExpr]:
        """The array subscripts of the element at (``pf_r``, ``pf_k``) of the update."""
        vals = [*self.batch, *self.k_vals]  # every data dim's subscript (0: m, n), then k
        for d, v in self.rows_of():
            vals[d] = v
        return [
            add(*[mul(c, v) for c, v in zip(coeffs, vals, strict=True) if c], const)
            for coeffs, const in self.op.index
        ]

    def offset(self) -> KExpr:
        """The offset of the array element at (``pf_r``, ``pf_k``) of the update:
        ``data part + pf_k + constant`` for an operand linear in k (no division of k)."""
        if self.op.linear is None:
            subs, dims, stride, terms = self.subscripts(), self.op.shape, 1, []
            for d in reversed(range(len(dims))):
                terms.append(mul(subs[d], stride))
                stride *= dims[d]
            return add(*reversed(terms))
        coeffs, sk, const = self.op.linear
        vals = [*self.batch, KVar("pf_k")]
        for d, v in self.rows_of():
            vals[d] = v
        pairs = zip((*coeffs, sk), vals, strict=True)
        return add(*[mul(c, v) for c, v in pairs if c], const)

    def inside_conds(self) -> list[KExpr]:
        """The guard terms of a ``guarded`` operand's read (none for others): every subscript
        that moves with the reduction inside the array (zero on a conv's padding)."""
        return [cond for cond, _ in self.inside_terms()]

    def inside_terms(self) -> list[tuple[KExpr, frozenset[int]]]:
        """The terms of :meth:`inside_conds`, each with the values it reads: positions in the
        subscripts' values (the data dims, then the reduction dims' ``k_vals``)."""
        if not self.op.guarded:
            return []
        nd = len(self.batch)
        rows = {d for d, _ in self.rows_of()}
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
            out.append((in_range(x, n), frozenset(i for i, a in enumerate(c) if a)))
        return out

    def dst(self, stage: Operand | None, r: Operand, c: Operand, aligned: bool) -> KRef:
        """The shared element at tile row ``r``, column ``c`` of stage ``stage`` (None: a
        single-buffered tile)."""
        off = layout_offset(self.layout, r, c, aligned)
        return KRef(self.buf, (off if stage is None else add(mul(stage, self.elements), off),))


def _let(name: str, value: Operand, ctype: str = "int") -> KLet:
    return KLet(name, e(value), ctype)


def _loop(var: str, trips: int, body: list[KNode], unroll: bool = True, rolled: bool = False):
    return KFor(var, KInt(0), cmp("<", var, trips), 1, tuple(body), unroll, rolled=rolled)


def scalar_fill(
    f: TileFill, k0: Operand, stage: Operand | None = None, k_inside: bool = False
) -> tuple[KNode, ...]:
    """The loop that copies the k-tile at ``k0`` into ``f``'s shared tile (stage ``stage``;
    None for a single-buffered tile), every thread a strided share of the elements, the
    array's innermost dim fastest; zeros outside the array. Where the threads divide the tile's
    rows, a thread keeps one position along the innermost dim (``pf_i``) for the whole tile:
    its part of the subscripts (a gather's column, the fold's divisions) is loop-invariant,
    computed once before the k-tile loop, and only the other coordinate moves."""
    inner, outer = f.inner, f.outer
    n = inner * outer
    if f.op.gather and not f.op.k_inner and len(f.red) > 1 and f.nthreads % inner == 0:
        if n % f.nthreads == 0:
            return digit_fill(f, k0, stage, k_inside)
    strided = f.nthreads % inner == 0 and n % f.nthreads == 0
    blocked = f.layout.blocked and inner % f.layout.row == 0 and outer % 2 == 0
    if strided and blocked and f.nthreads % (2 * inner) and not f.op.gather and not f.op.k_inner:
        # one row per trip (a 128-wide tile on 128 threads) puts a warp on two blocks 1 KB
        # apart (2-way bank conflicts): the element loop in the blocked order below instead
        strided = False
    if strided:
        w, step = f.layout.row, f.nthreads // inner
        o, i = div(TID, inner), mod(TID, inner)
        if f.layout.blocked and f.nthreads % (2 * inner) == 0 and inner % w == 0:
            # a blocked layout's rows are w elements (32 bytes): a warp's 16 lanes of one
            # 16-bit row, the other 16 the next row of the same block (other banks; a
            # whole-width row across two blocks hit the same banks twice)
            nb = inner // w
            o = add(mod(div(TID, w), 2), mul(div(TID, 2 * w * nb), 2))
            i = add(mul(mod(div(TID, 2 * w), nb), w), mod(TID, w))
        head: list[KNode] = [_let("pf_o", add(o, mul("pf_u", step))), _let("pf_i", i)]
        io, ii = KVar("pf_o"), KVar("pf_i")
    elif blocked:
        # the elements in the blocked order above, two rows of one block per 32 lanes (a
        # 96-wide tile on 128 threads, whose rows the threads do not divide)
        w = f.layout.row
        nb = inner // w
        head = []
        io = add(mul(div("pf_e", 2 * w * nb), 2), mod(div("pf_e", w), 2))
        ii = add(mul(mod(div("pf_e", 2 * w), nb), w), mod("pf_e", w))
    else:
        head, io, ii = [], div("pf_e", inner), mod("pf_e", inner)
    if f.op.k_inner:
        row, k = add(f.row0, io), add(k0, ii)
    else:
        row, k = add(f.row0, ii), add(k0, io)
    # a gather's subscripts (divisions, guards) kept rolled where k moves along the loop:
    # unrolled they spilled on sm_90; a k-innermost tile with one k per thread (``pf_i``) has
    # its divisions once per k-tile, unrolled (the rows step by immediates)
    fixed_k = f.op.k_inner and strided
    kc = [] if k_inside else [cmp("<=", "pf_k", f.k_hi)]
    src: KExpr = f.offset()
    lets: list[KNode] = []
    op = "&&"
    if f.op.gather:  # the guard evaluated whole (one predicate, no branch per term) and the
        # offset outside it (unconditional: its k part shared by the unrolled elements)
        op = "&"
        lets, src = [_let("pf_off", src)], KVar("pf_off")
    guard = all_of(f.row_guard(), *kc, *f.inside_conds(), op=op)
    copy = KGuardedCopy(
        f.dst(stage, io, ii, False), KRef(f.src, (src,)), guard, f.dtype, "pf_v"
    )
    body = [*head, _let("pf_r", row), _let("pf_k", k), *lets, copy]
    # a byte tile transposed by its fill (k outside in the array): kept rolled too, its 32
    # or more copies per thread unrolled held a register each and spilled
    rolled = (f.op.gather and not fixed_k) or f.op.transposed_fill
    if strided:
        return (_loop("pf_u", n // f.nthreads, body, fixed_k and not rolled, rolled),)
    return (KFor("pf_e", TID, cmp("<", "pf_e", n), f.nthreads, tuple(body), rolled=rolled),)


def digit_fill(
    f: TileFill, k0: Operand, stage: Operand | None = None, k_inside: bool = False
) -> tuple[KNode, ...]:
    """:func:`scalar_fill` of a gathered tile stored in k rows (an implicit GEMM's input):
    each thread copies one column (``pf_i``, fixed for the whole loop) of a run of ``U``
    consecutive k rows. The reduction dims' values at the run's first k are computed once per
    k-tile (the divisions of k), then carried along the run digit by digit (the innermost dim
    +1, wrapping into the next), so no element divides k; a warp's lanes still write one row
    of consecutive columns (the same banks as the strided order)."""
    inner, u = f.inner, f.inner * f.outer // f.nthreads
    digits = [f"pf_d{j}" for j in range(len(f.red))]
    ext = [hi - lo + 1 for lo, hi in f.red]
    first = [
        KLet(d, v, const=False)
        for d, v in zip(digits, k_values(f.red, "pf_kb"), strict=True)
    ]
    g = replace(f, k_vals=tuple(KVar(d) for d in digits))
    # each guard term with whether a run moves it: ``pf_k`` and the innermost digit (value
    # position ``last``) step along the run; the rows, batch and outer digits do not
    last = len(f.batch) + len(digits) - 1
    terms: list[tuple[KExpr, bool]] = [] if f.rows_exact else [(f.row_guard(), False)]
    terms += [] if k_inside else [(cmp("<=", "pf_k", f.k_hi), True)]
    terms += [(c, last in reads) for c, reads in g.inside_terms()]
    conds = [c for c, _ in terms]
    fixed: list[KExpr] = []  # terms the run does not move, one predicate before it
    carry: list[KNode] = []
    if ext[-1] % u == 0 and f.block_k % u == 0:  # runs start on multiples of u: never wrap
        carry = [KAssign(KRef(digits[-1]), KInt(1), "+=")]
        fixed = [c for c, moves in terms if not moves]
        conds = [c for c, moves in terms if moves] + ([KVar("pf_run")] if fixed else [])
    else:  # branch-free: the innermost +1, each wrap carried outward by selects
        for j in range(len(f.red) - 1, 0, -1):
            lo, hi = f.red[j]
            inc: KExpr = KInt(1) if j == len(f.red) - 1 else KVar(f"pf_c{j + 1}")
            step = add(digits[j], inc)
            carry += [_let(f"pf_c{j}", cmp(">", step, hi)),
                      KAssign(KRef(digits[j]), select(f"pf_c{j}", lo, step))]  # fmt: skip
        carry.append(KAssign(KRef(digits[0]), KVar("pf_c1"), "+="))
    head: list[KNode] = []
    if fixed:
        head = [_let("pf_r", add(f.row0, mod(TID, inner))),
                _let("pf_run", all_of(*fixed, op="&"), "bool")]  # fmt: skip
    copy = KGuardedCopy(
        f.dst(stage, "pf_o", "pf_i", False),
        KRef(f.src, (KVar("pf_off"),)),
        all_of(*conds, op="&"),
        f.dtype,
        "pf_v",
    )
    run = [
        _let("pf_o", add(mul(div(TID, inner), u), "pf_u")),
        _let("pf_i", mod(TID, inner)),
        _let("pf_k", add("pf_kb", "pf_u")),
        *([] if fixed else [_let("pf_r", add(f.row0, "pf_i"))]),
        _let("pf_off", g.offset()),
        copy,
        *carry,
    ]
    body = [_let("pf_kb", add(k0, mul(div(TID, inner), u))), *first, *head,
            _loop("pf_u", u, run)]  # fmt: skip
    return (KScope("a run of k per thread, its reduction digits carried", tuple(body)),)


def fill(
    f: TileFill, k0: Operand, stage: Operand | None, k_inside: bool = False
) -> tuple[KNode, ...]:
    """The copies of the k-tile at ``k0`` into stage ``stage`` of ``f``'s tile in a pipelined
    loop: 16-byte ``cp.async`` chunks (:func:`chunk_fill`), or scalar copies for a gathered
    operand with no contiguous run (:func:`scalar_fill`: they land before the barrier that
    ends the iteration, so the stage is ready as early as the chunks)."""
    if f.op.scalar:
        return scalar_fill(f, k0, stage, k_inside)
    if f.op.chunked:  # a gather by 16-byte chunks (a channels-last conv input)
        return gather_chunk_fill(f, k0, stage, k_inside)
    return chunk_fill(f, k0, stage, k_inside)


def fill_setup(f: TileFill) -> tuple[KNode, ...]:
    """What ``f``'s fills precompute once before the k-tile loop (a gathered chunk fill's
    per-chunk row offsets and padding masks: :func:`gather_setup`); none for the others."""
    return gather_setup(f) if f.op.chunked and not f.op.scalar else ()


def chunk_fill(
    f: TileFill, k0: Operand, stage: Operand, k_inside: bool = False
) -> tuple[KNode, ...]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` of ``f``'s tile, 16
    bytes each (see the module doc for the chunk-to-lane order and the zero-fill);
    ``k_inside``: the whole k-tile lies inside the reduction (only rows are guarded, which
    does not change along the loop)."""
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    col = mul(f.chunk, "pf_q")
    count: KExpr
    # a k-tile inside the reduction whose only guard is the row's: a chunk past the last row
    # reads nothing from a clamped row (the last; for chunks along the row, its last whole
    # chunk: 16-byte aligned), so the address needs no select and stays affine in the k-tile
    # (the row test is loop-invariant, hoisted out of the k-tile loop)
    clamp = k_inside and not f.rows_exact
    if f.op.k_inner:  # tile row: m or n; chunks run along k
        r, k = add(f.row0, "pf_t"), add(k0, col)
        inside = KInt(f.chunk) if k_inside else sub(f.k_hi + 1, "pf_k")
        count = select(cmp("<=", r, f.row_hi) if clamp else f.row_guard(), inside, 0)
        last = f.row_hi
    else:  # tile row: k; chunks run along m or n
        r, k = add(f.row0, col), add(k0, "pf_t")
        count = KInt(f.chunk) if f.rows_exact else sub(f.row_hi + 1, r)
        if not k_inside:
            count = select(cmp("<=", "pf_k", f.k_hi), count, 0)
        last = f.row_hi - f.row_hi % f.chunk
    n = KVar("pf_n")
    first, dst = chunk_destination(f, stage)
    source = f.offset() if clamp else select(cmp(">", n, 0), f.offset(), 0)
    body = [
        _let("pf_c", add(TID, mul("pf_u", f.nthreads))),
        _let("pf_t", add(mod("pf_c", 8), mul(div("pf_c", 8 * per_row), 8))),
        _let("pf_q", mod(div("pf_c", 8), per_row)),
        _let("pf_r", select(cmp(">", r, last), last, r) if clamp else r),
        _let("pf_k", k),
        KLet("pf_n", count, const=False),
        # the elements inside, clamped to the chunk
        KAssign(KRef("pf_n"), select(cmp("<", n, 0), 0, select(cmp(">", n, f.chunk), f.chunk, n))),
        KChunkCopy(dst, KRef(f.src, (source,)), mul(f.itemsize, n)),
    ]  # fmt: skip
    loop = _loop("pf_u", chunks // f.nthreads, body)
    if not first:
        return (loop,)
    return (KScope("the chunks' destination once per k-tile", (*first, loop)),)


__all__ = [
    "TileFill",
    "chunk_fill",
    "digit_fill",
    "fill",
    "fill_setup",
    "k_values",
    "scalar_fill",
]
