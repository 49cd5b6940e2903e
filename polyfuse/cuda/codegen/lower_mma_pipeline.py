"""The k-tile loop of a tensorized GEMM kernel, as kernel-IR nodes: shared-tile fills (the
nodes of :mod:`polyfuse.cuda.codegen.lower_mma_fills`) and their pipelining.

Each k-tile's two 16-bit shared tiles are filled by 16-byte ``cp.async`` chunks or by scalar
guarded copies (:mod:`polyfuse.cuda.codegen.lower_mma_fills`: the chunk-to-lane order, the
zero-fill, the gathered operands' runs). Where the other operand's tile takes chunks, the
scalar copies go into the same S stages (:func:`~polyfuse.cuda.codegen.lower_mma_fills.fill`);
else single-stage, the k-tiles wholly inside the reduction without the k guard.

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

from collections.abc import Sequence
from dataclasses import replace

from polyfuse.cuda.codegen.kernel_arith import Operand, add, cmp, mod, mul, select
from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KBarrier,
    KCommit,
    KExpr,
    KFor,
    KIf,
    KInt,
    KLet,
    KNode,
    KRef,
    KScope,
    KVar,
    KWait,
    Scope,
)
from polyfuse.cuda.codegen.lower_dtypes import C_TYPES
from polyfuse.cuda.codegen.lower_mma_fills import TileFill, fill, scalar_fill

#: the note of the k-tile loop's commit
ONE_GROUP = "one group per k-tile (empty past the last)"


def wait_pending(stages: int) -> int:
    """Commit groups that may still fly when iteration ``kt`` of an S-stage loop reads k-tile
    ``kt``: S-1 prologue groups plus ``kt`` earlier iterations' are committed, k-tile ``kt``'s
    is group ``kt``, so all but the S-2 newest must have landed."""
    return stages - 2


#: per shared tile, the pointers its fragment loads read and the lane's offset of each (a
#: tf32 operand stored k-outside reads a second one, 4 k further)
Bases = tuple[tuple[tuple[str, str], ...], ...]


def stage_pointers(
    fills: Sequence[TileFill], bases: Bases, stage: Operand = "pf_rs"
) -> list[tuple[str, KExpr]]:
    """Each pointer the fragments are loaded through and its value: stage ``stage`` of its
    tile plus the lane's offset."""
    return [
        (b, add(KVar(f.buf), mul(stage, f.elements), KVar(off)))
        for f, pairs in zip(fills, bases, strict=True)
        for b, off in pairs
    ]


def pointer_type(f: TileFill) -> str:
    return f"const {C_TYPES[f.dtype]}*"


def pointer_lets(fills: Sequence[TileFill], bases: Bases, stage: Operand = "pf_rs") -> list[KLet]:
    """The declarations of :func:`stage_pointers`, each typed by its tile's dtype (uint8 A
    beside int8 B)."""
    types = [pointer_type(f) for f, pairs in zip(fills, bases, strict=True) for _ in pairs]
    pointers = stage_pointers(fills, bases, stage)
    return [KLet(b, v, t, const=False) for (b, v), t in zip(pointers, types, strict=True)]


def advance(counter: str, stages: int) -> KAssign:
    """``counter`` to the next of ``stages`` stages (wrapping to 0)."""
    c = KVar(counter)
    return KAssign(KRef(counter), select(cmp("==", c, stages - 1), 0, add(c, 1)))


def stage(counter: str, ahead: int, stages: int, unrolled: bool) -> Operand:
    """The stage of k-tile ``pf_kt + ahead`` in a steady-state iteration: in a loop unrolled
    by its S stages, ``(pf_kt + ahead) mod S`` (constants once NVRTC unrolls it: no counters,
    no stage offsets computed at run time); in a rolled loop, the wrapping ``counter``
    (``pf_rs`` read, ``pf_ws`` filled; there cheaper than a modulo by 3, which measured 9-16
    more SASS instructions per k-tile)."""
    return mod(add("pf_kt", ahead), stages) if unrolled else counter


def advances(stages: int, unrolled: bool) -> list[KNode]:
    """The counters to the next stage at the end of a rolled iteration (an unrolled one
    computes its stages from ``pf_kt``: :func:`stage`)."""
    return [] if unrolled else [advance("pf_rs", stages), advance("pf_ws", stages)]


def steady_loop(
    lo: int, hi: int, body: list[KNode], stages: int, ahead: int, unrolled: bool, tail: bool
) -> list[KNode]:
    """The pipelined loop's steady state over k-tiles ``lo..hi-1``; ``unrolled``: by its
    ``stages`` (``#pragma unroll S``: see :func:`stage`), then the counters are set where the
    rolled ``tail`` that follows takes over (``pf_rs``: ``hi mod S``; ``pf_ws``: ``ahead``
    further)."""
    loop = k_tile(lo, hi, body)
    if not unrolled or not loop:
        return loop
    resume = [KAssign(KRef("pf_rs"), KInt(hi % stages)),
              KAssign(KRef("pf_ws"), KInt((hi + ahead) % stages))] if tail else []  # fmt: skip
    return [replace(loop[0], unroll=True, unroll_by=stages), *resume]


def k_tile(lo: int, hi: int, body: list[KNode], tail: bool = False) -> list[KNode]:
    """The loop over k-tiles ``lo..hi-1``; ``tail``: a few k-tiles kept rolled (unrolled
    beside the steady state they raised the register pressure into a spill on sm_90)."""
    if lo >= hi:
        return []
    return [KFor("pf_kt", KInt(lo), cmp("<", "pf_kt", hi), 1, tuple(body), rolled=tail)]


def ahead_fills(
    fills: Sequence[TileFill], ahead: int, bk: int, k_tiles: int, inside: bool,
    into: Operand = "pf_ws",
) -> KNode:  # fmt: skip
    """The fills of k-tile ``pf_kt + ahead`` into stage ``into``; ``inside``: it lies inside
    the reduction (no k guard, and it exists)."""
    body = [KLet("pf_kf", add("pf_k0", ahead * bk)),
            *[n for f in fills for n in fill(f, "pf_kf", into, inside)]]  # fmt: skip
    if inside:
        return KScope(f"fill k-tile pf_kt + {ahead}", tuple(body))
    return KIf(cmp("<", add("pf_kt", ahead), k_tiles), tuple(body))


def k_tile_loop(
    fills: tuple[TileFill, TileFill],
    bases: Bases,
    compute: Sequence[KNode],
    stages: int,
    vector: bool,
    k_lo: int,
    k_tiles: int,
    unrolled: bool = False,
) -> list[KNode]:
    """The k-tile loop (see the module doc): ``compute`` loads the fragments of the k-tile from
    the shared tiles through ``bases`` (per tile: the pointer it reads, declared here per
    stage, and the lane's offset added to it) and multiplies them. With 16-byte fills the loop
    is split where the k-tiles it fills stop lying wholly inside the reduction: the steady
    state fills without a k guard (``unrolled``: by its stages, :func:`steady_loop`), the tail
    with one."""
    bk = fills[0].block_k
    point = pointer_lets(fills, bases)
    full = min(k_tiles, (fills[0].k_hi - k_lo + 1) // bk)  # k-tiles wholly inside
    k0 = KLet("pf_k0", add(k_lo, mul("pf_kt", bk)))
    loaded = KBarrier(Scope.BLOCK, "the previous k-tile's fragments are loaded")
    filled = KBarrier(Scope.BLOCK, "the shared tiles are filled")
    if not vector:

        def scalar(inside: bool) -> list[KNode]:
            return [k0, *point, loaded,
                    *[n for f in fills for n in scalar_fill(f, "pf_k0", k_inside=inside)],
                    filled, *compute]  # fmt: skip

        return [KLet("pf_rs", KInt(0)), *k_tile(0, full, scalar(True)),
                *k_tile(full, k_tiles, scalar(False), True)]  # fmt: skip
    if stages == 1:

        def single(inside: bool) -> list[KNode]:
            return [k0, *point, loaded,
                    *[n for f in fills for n in fill(f, "pf_k0", 0, k_inside=inside)],
                    KCommit(), KWait(0), filled, *compute]  # fmt: skip

        return [KLet("pf_rs", KInt(0)), *k_tile(0, full, single(True)),
                *k_tile(full, k_tiles, single(False), True)]  # fmt: skip
    ahead = stages - 1

    def steady(inside: bool, filled: bool = True) -> list[KNode]:
        at = unrolled and inside
        fill_ = ahead_fills(fills, ahead, bk, k_tiles, inside, stage("pf_ws", ahead, stages, at))
        return [
            k0,
            KWait(wait_pending(stages), "k-tile pf_kt has landed"),
            KBarrier(Scope.BLOCK, "... for every thread; k-tile pf_kt - 1 is read"),
            *([fill_] if filled else []),
            KCommit(ONE_GROUP),
            *pointer_lets(fills, bases, stage("pf_rs", 0, stages, at)),
            *compute,
            *advances(stages, at),
        ]

    main = max(0, full - ahead)  # iterations whose fill lies wholly inside
    return [
        *prologue(fills, ahead, k_tiles, k_lo, bk),
        *steady_loop(0, main, steady(True), stages, ahead, unrolled, main < k_tiles),
        *tail(main, k_tiles, ahead, steady(False), steady(False, False)),
    ]


def tail(
    main: int, k_tiles: int, ahead: int, filling: list[KNode], draining: list[KNode]
) -> list[KNode]:
    """The rolled k-tiles ``main..k_tiles-1`` after the steady state: ``filling`` (the fill of
    k-tile ``pf_kt + ahead`` guarded by k: a partial last k-tile) while that k-tile exists,
    then ``draining``, the last ``ahead`` k-tiles, with no fill at all (each commits its
    empty group, so the wait counts stay exact). A fill left guarded by ``pf_kt + ahead <
    k_tiles`` in the drain is dead, but NVRTC kept its address arithmetic in the loop (a
    3-k-tile MobileNetV2 projection on sm_90: 6.4 other instructions per HMMA)."""
    drain = max(main, k_tiles - ahead)
    return [*k_tile(main, drain, filling, True), *k_tile(drain, k_tiles, draining, True)]


def prologue(
    fills: Sequence[TileFill], ahead: int, k_tiles: int, k_lo: int, bk: int
) -> list[KNode]:
    """The pipelined loop's prologue: k-tiles 0..S-2 filled into their stages, one commit
    group each (empty past the last k-tile), and the read and fill stage counters."""
    fill_ = [KLet("pf_k0", add(k_lo, mul("pf_s", bk))),
             *[n for f in fills for n in fill(f, "pf_k0", "pf_s")]]  # fmt: skip
    body = (KIf(cmp("<", "pf_s", k_tiles), tuple(fill_)), KCommit())
    return [
        KFor("pf_s", KInt(0), cmp("<", "pf_s", ahead), 1, body, unroll=True),
        KLet("pf_rs", KInt(0), const=False),  # the stage read ...
        KLet("pf_ws", KInt(ahead), const=False),  # ... and the stage filled
    ]
