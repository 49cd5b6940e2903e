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
    band,
    bor,
    cmp,
    div,
    e,
    in_range,
    mod,
    mul,
    select,
    shl,
    sub,
)
from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KChunkCopy,
    KExpr,
    KFor,
    KInt,
    KLet,
    KNode,
    KRef,
    KRegisters,
    KScope,
    KVar,
)
from polyfuse.cuda.codegen.kernel_walk import variables
from polyfuse.cuda.codegen.lower_mma_chunk_dst import chunk_destination, fixed_column

#: a :class:`polyfuse.cuda.codegen.lower_mma_fills.TileFill` (that module dispatches here:
#: not imported, not even for typing, so the import graph stays acyclic)
TileFill = Any


#: the most reduction-digit combinations a chunk's padding mask holds (one bit each)
MASK_BITS = 31


def gather_chunk_fill(
    f: TileFill, k0: Operand, stage: Operand, k_inside: bool = False
) -> tuple[KNode, ...]:
    """``cp.async`` copies of the k-tile at ``k0`` into stage ``stage`` of the k-innermost
    gathered tile ``f`` (see the module doc); ``k_inside``: the whole k-tile lies inside the
    reduction (no k test). Each subscript is split into its row part (the chunk's tile row:
    the same in every k-tile) and the rest (batch, reduction digits, constant: the same for
    every chunk of a thread where its chunk column is fixed). Where :func:`gather_setup`
    precomputed each chunk's row offset and padding mask, a chunk costs a mask test, an add
    and the copy; else its padding test is an add and a compare per guarded subscript."""
    assert f.op.chunked and f.op.k_inner
    per_row = f.inner // f.chunk
    chunks = f.outer * per_row
    assert f.outer % 8 == 0 and chunks % f.nthreads == 0, (f.outer, chunks, f.nthreads)
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    rows, rest, guarded = split_subscripts(f, digits)
    arr = f.op.shape
    strides = [math.prod(arr[i + 1 :]) for i in range(len(arr))]
    kc = [] if k_inside else [cmp("<=", "pf_k", f.k_hi)]
    masked = mask_digits(f) is not None
    k_part: list[KNode] = [
        KLet("pf_k", add(k0, mul(f.chunk, "pf_q"))),
        *[KLet(d, v) for d, v in zip(digits, _digit_values(f, k0), strict=True)],
        *([] if masked else [KLet(f"pf_e{i}", rest[i]) for i in guarded]),
        KLet("pf_kp", _weighted(rest, strides)),  # the offset but the row's part
    ]
    fixed_q = fixed_column(f)
    q = KLet("pf_q", mod(div("pf_tid" if fixed_q else "pf_c", 8), per_row))
    inside = KVar("pf_in")
    if masked:
        return (_masked_fill(f, stage, [q, *k_part], kc, _advance(f, k0)),)
    first, dst = chunk_destination(f, stage)
    conds = [f.row_guard(), *kc]
    conds += [in_range(add(rows[i], f"pf_e{i}"), arr[i]) for i in guarded]
    body: list[KNode] = [
        *_chunk_row(f),
        *([] if fixed_q else [q, *k_part]),
        KLet("pf_r", add(f.row0, "pf_t")),
        KLet("pf_in", all_of(*conds, op="&"), "bool"),
        # unsigned: the address is the array's plus a zero-extended offset, as before
        KLet("pf_off", select(inside, add(_weighted(rows, strides), "pf_kp"), 0), "unsigned"),
        KChunkCopy(dst, KRef(f.src, (KVar("pf_off"),)), select(inside, 16, 0)),
    ]
    loop = _chunks(f, body)
    if fixed_q:
        return (KScope("the thread's chunk column and its k, once per k-tile",
                       (q, *k_part, *first, loop)),)  # fmt: skip
    return (loop,)


def _chunk_row(f: TileFill) -> list[KNode]:
    """Chunk ``pf_u``'s index ``pf_c`` among the tile's and its tile row ``pf_t`` (the
    chunk-to-lane order of :mod:`polyfuse.cuda.codegen.lower_mma_fills`)."""
    per_row = f.inner // f.chunk
    return [KLet("pf_c", add("pf_tid", mul("pf_u", f.nthreads))),
            KLet("pf_t", add(mod("pf_c", 8), mul(div("pf_c", 8 * per_row), 8)))]  # fmt: skip


def _chunks(f: TileFill, body: list[KNode]) -> KFor:
    """The unrolled loop over a thread's chunks ``pf_u``."""
    n = f.outer * (f.inner // f.chunk) // f.nthreads
    return KFor("pf_u", KInt(0), cmp("<", "pf_u", n), 1, tuple(body), unroll=True)


def _names(f: TileFill) -> tuple[str, str]:
    """The registers of :func:`gather_setup`: per chunk its row offset and padding mask."""
    return f"pf_ro_{f.buf}", f"pf_pm_{f.buf}"


def mask_digits(f: TileFill) -> tuple[tuple[str, int, int], ...] | None:
    """The reduction digits (name, lo, hi) a chunk's padding test reads, where a per-chunk
    mask over their values (CUTLASS's precomputed filter masks) replaces the test: the
    threads' chunk columns are fixed, the reduction is split into digits and their
    combinations fit :data:`MASK_BITS`. None where not."""
    if not (f.op.chunked and f.op.k_inner and f.red and fixed_column(f)):
        return None
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    _, rest, guarded = split_subscripts(f, digits)
    read = set().union(*[variables(rest[i]) for i in guarded])
    used = tuple((d, lo, hi) for d, (lo, hi) in zip(digits, f.red, strict=True) if d in read)
    if math.prod(hi - lo + 1 for _, lo, hi in used) > MASK_BITS:
        return None
    return used


def _mask_bit(used: tuple[tuple[str, int, int], ...]) -> KExpr:
    """The bit of the digits' current values in a padding mask (the first digit outermost)."""
    index, stride = [], 1
    for d, lo, hi in reversed(used):
        index.append(mul(sub(d, lo), stride))
        stride *= hi - lo + 1
    return shl(1, add(*index))


def gather_setup(f: TileFill) -> tuple[KNode, ...]:
    """Before the k-tile loop, per chunk of the thread (:func:`mask_digits`; none where it
    does not apply): its row's part of the offset, and its padding mask, one bit per
    combination of the guarded subscripts' reduction digits, set where the chunk lies
    inside the array there (all clear past the last row). The k-tiles then test one bit."""
    used = mask_digits(f)
    if used is None:
        return ()
    per_row = f.inner // f.chunk
    digits = [f"pf_d{j}" for j in range(len(f.k_vals))]
    rows, rest, guarded = split_subscripts(f, digits)
    arr = f.op.shape
    strides = [math.prod(arr[i + 1 :]) for i in range(len(arr))]
    ro, pm = _names(f)
    mask = KRef(pm, (KVar("pf_u"),))
    nest: KNode = KAssign(mask, KInt(1))  # no padding test: the one bit
    if guarded:
        inside = all_of(*[in_range(add(rows[i], rest[i]), arr[i]) for i in guarded], op="&")
        nest = KAssign(mask, bor(mask, select(inside, _mask_bit(used), 0)))
    for d, lo, hi in reversed(used):
        nest = KFor(d, KInt(lo), cmp("<=", d, hi), 1, (nest,), unroll=True)
    n = f.outer * per_row // f.nthreads
    row = add(f.row0, "pf_t")
    # no padding test: a chunk past the last row takes the last row's offset (it copies
    # nothing from there: its mask is clear), so a k-tile inside the reduction needs no
    # select on the address (:func:`_masked_fill`)
    clamp = not guarded and not f.rows_exact
    body: list[KNode] = [
        *_chunk_row(f),
        KLet("pf_r", select(cmp(">", row, f.row_hi), f.row_hi, row) if clamp else row),
        KAssign(KRef(ro, (KVar("pf_u"),)), _weighted(rows, strides)),
        KAssign(mask, KInt(0)),
        nest,
        *([] if f.rows_exact else
          [KAssign(mask, select(cmp("<=", row, f.row_hi), mask, 0))]),  # fmt: skip
    ]
    first = [KLet(_state(f, j), KInt(lo), const=False)
             for j, (lo, _) in enumerate(f.red[:-1])] if carried(f) else []  # fmt: skip
    return (
        *first,
        KRegisters(ro, "int", (n,), note=f"{f.src}: each chunk's row offset"),
        KRegisters(pm, "unsigned", (n,), note=f"{f.src}: each chunk's padding mask"),
        _chunks(f, body),
    )


def _padded(f: TileFill) -> bool:
    """Whether ``f``'s chunks test subscripts of the array (a conv's padding), beside their
    row: a chunk outside may then address past the array."""
    return bool(split_subscripts(f, [f"pf_d{j}" for j in range(len(f.k_vals))])[2])


def carried(f: TileFill) -> bool:
    """Whether a k-tile's reduction digits are carried from the previous k-tile's instead of
    split from its ``k`` (divisions per k-tile): a masked fill (:func:`mask_digits`) of a
    reduction of several dims whose innermost extent is a multiple of the k-tile. Every
    k-tile then lies at one position of the outer dims (a conv's filter position), a
    thread's chunk ``q`` at ``q * chunk`` along the innermost from the k-tile's start, which
    is ``k0`` modulo the extent (the same for every thread: NVRTC computes it on the uniform
    datapath, or folds it in an unrolled steady state). The outer digits move like an
    odometer, +1 after the extent's last k-tile. The fills of a k-tile loop run once per
    k-tile, in order (prologue, steady state, tail), so the registers advance with them."""
    if len(f.red) < 2 or mask_digits(f) is None:
        return False
    lo, hi = f.red[-1]
    return (hi - lo + 1) % f.block_k == 0


def _state(f: TileFill, j: int) -> str:
    """The register carrying outer reduction digit ``j`` of ``f``'s next k-tile
    (:func:`carried`)."""
    return f"pf_kd{j}_{f.buf}"


def _digit_values(f: TileFill, k0: Operand) -> tuple[KExpr, ...]:
    """Each reduction digit of the thread's chunk in the k-tile at ``k0``: the outer ones
    carried (:func:`carried`), the innermost the k-tile's ``k0`` modulo its extent plus the
    chunk's offset ``pf_q`` along it; or all split from the chunk's ``k``."""
    if not carried(f):
        return f.k_vals
    n = len(f.red)
    lo, hi = f.red[-1]
    return (*[KVar(_state(f, j)) for j in range(n - 1)],
            add(lo, mod(k0, hi - lo + 1), mul(f.chunk, "pf_q")))  # fmt: skip


def _advance(f: TileFill, k0: Operand) -> list[KNode]:
    """The carried digits (:func:`carried`) to the next k-tile: where the k-tile at ``k0`` is
    the innermost extent's last (``k0`` modulo it, the same for every thread), the next
    outer digit ``+ 1``, its wrap carried outward by selects, branch-free."""
    if not carried(f):
        return []
    n = len(f.red)
    lo, hi = f.red[-1]
    ext = hi - lo + 1
    out: list[KNode] = [KLet(f"pf_kc{n - 1}", cmp("==", mod(k0, ext), ext - f.block_k), "bool")]
    for j in range(n - 2, 0, -1):
        lo, hi = f.red[j]
        step = add(_state(f, j), select(f"pf_kc{j + 1}", 1, 0))
        out += [KLet(f"pf_kc{j}", cmp(">", step, hi), "bool"),
                KAssign(KRef(_state(f, j)), select(f"pf_kc{j}", lo, step))]  # fmt: skip
    out.append(KAssign(KRef(_state(f, 0)), select("pf_kc1", 1, 0), "+="))
    return out


def _masked_fill(
    f: TileFill, stage: Operand, k_part: list[KNode], kc: list[KExpr], advance: list[KNode]
) -> KNode:
    """The k-tile's chunks through :func:`gather_setup`'s registers: the k-tile's bit
    (none past the reduction), then per chunk a mask test, the offset and the copy. Where
    a thread's chunks lie a constant step apart in the shared layout (checked on every
    thread), the destination is the first chunk's plus that step."""
    used = mask_digits(f)
    assert used is not None
    ro, pm = _names(f)
    u = KVar("pf_u")
    bit = _mask_bit(used)
    inside = KVar("pf_in")
    first, dst = chunk_destination(f, stage)
    off: KExpr = add(KRef(ro, (u,)), "pf_kp")
    if kc or _padded(f):  # a chunk outside (padding, past the reduction) may address past
        off = select(inside, off, 0)
    body: list[KNode] = [
        *([] if first else _chunk_row(f)),
        KLet("pf_in", cmp("!=", band(KRef(pm, (u,)), "pf_bit"), 0), "bool"),
        # unsigned: the address is the array's plus a zero-extended offset, as before
        KLet("pf_off", off, "unsigned"),
        KChunkCopy(dst, KRef(f.src, (KVar("pf_off"),)), select(inside, 16, 0)),
    ]  # fmt: skip
    return KScope(
        "the thread's chunk column, its k and its mask bit, once per k-tile",
        (*k_part, KLet("pf_bit", select(all_of(*kc), bit, 0) if kc else bit), *first,
         _chunks(f, body), *advance),
    )  # fmt: skip


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
