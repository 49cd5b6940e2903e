"""The fragment loop of a tensorized GEMM kernel: one k-tile's k-steps, single- or
double-buffered in registers (ALCOP's shared -> register level; the decision:
:mod:`polyfuse.poly.tensorize_fragments`).

A k-step (:class:`KStep`) is the kernel-IR nodes :mod:`polyfuse.cuda.codegen.lower_mma` builds
for one ``pf_ks``: ``ldmatrix`` (or tf32 32-bit) loads of the A and B fragments (``pf_fa``,
``pf_fb``) from the k-tile's stage (pointers ``pf_sa``, ``pf_sb``), then the ``mma.sync`` of
every fragment pair. Single-buffered (:func:`single_buffered`), each k-step declares its
fragments, loads them and multiplies them, inside the k-tile loop of
:func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop`, whose barrier at the top of each
k-tile keeps every load of k-tile ``kt`` behind it.

Double-buffered (:func:`double_buffered_loop`, S >= 2 cp.async stages), the fragments get a
leading buffer dimension of 2, k-step ``kk`` multiplies buffer ``kk % 2`` after issuing the
loads of ``kk + 1`` into the other, and the k-tile loop is rotated so the wait and barrier sit
at the end of each k-tile::

    fill k-tiles 0..S-2 (one commit group each); wait_group(S-2); barrier
    load k-step 0 of k-tile 0 into buffer 0                         // prologue
    for each k-tile kt:
        fill k-tile kt+S-1 into the stage k-tile kt-1 used; commit
        for each k-step kk but the last:
            load k-step kk+1 into buffer (kk+1) % 2; mma on buffer kk % 2
        wait_group(S-2); barrier         // k-tile kt+1 has landed; k-tile kt is read
        load k-step 0 of k-tile kt+1 into buffer 0                  // across the boundary
        mma on the last k-step's buffer

Every read of k-tile ``kt`` (its last k-step's loads included) comes before the barrier that
ends iteration ``kt``, and the fill that overwrites its stage (iteration ``kt + 1``) after it;
k-tile ``kt + 1``'s group is group ``kt + 1`` of ``kt + S`` committed, so the wait count is
S-2 as in the rotated-out form. The loads of the next k-tile's first k-step run under the
last k-step's mma. The k-steps per k-tile are even, so k-step 0 is always buffer 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

from polyfuse.cuda.codegen import lower_mma_pipeline
from polyfuse.cuda.codegen.kernel_arith import add, band, cmp, div, mul
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
    KRegisters,
    KVar,
    KWait,
    Scope,
)
from polyfuse.cuda.codegen.kernel_walk import KExprMapper
from polyfuse.cuda.codegen.lower_mma_fills import TileFill
from polyfuse.cuda.codegen.lower_mma_pipeline import (
    Bases,
    advances,
    ahead_fills,
    pointer_lets,
    prologue,
    stage,
    stage_pointers,
    steady_loop,
    tail,
)


@dataclass(frozen=True)
class KStep:
    """One k-step of a k-tile as kernel-IR nodes, the k-step's first k ``pf_ks``: the
    fragment register arrays, their loads from the stage pointers ``pf_sa`` / ``pf_sb``, the
    mma on them; the k-tile's depth and the intrinsic's k."""

    fragments: tuple[KRegisters, ...]
    loads: tuple[KNode, ...]
    mma: tuple[KNode, ...]
    block_k: int
    mma_k: int
    #: per shared tile (A, B) the pointers its loads read, each with the lane's offset into
    #: the tile (:func:`polyfuse.cuda.codegen.lower_mma_pipeline.stage_pointers`)
    pointers: Bases = ((("pf_sa", "pf_la"),), (("pf_sb", "pf_lb"),))

    @property
    def steps(self) -> int:
        return self.block_k // self.mma_k


def map_exprs(n: KNode, fn: Callable[[KExpr], KExpr]) -> KNode:
    """``n`` with every expression (its fields and its children's, at any depth) through
    ``fn``; ``fn`` sees a whole expression and rewrites inside it itself."""
    changes = {}
    for f in fields(n):  # type: ignore[arg-type]
        v = getattr(n, f.name)
        if isinstance(v, KExpr):
            changes[f.name] = fn(v)
        elif isinstance(v, tuple) and v and all(isinstance(x, KNode) for x in v):
            changes[f.name] = tuple(map_exprs(x, fn) for x in v)
    return replace(n, **changes)  # type: ignore[type-var]


def buffered(step: KStep, nodes: Sequence[KNode], buf: KExpr, ks: KExpr) -> list[KNode]:
    """``nodes`` of ``step`` on fragment buffer ``buf`` at k-step ``ks`` (for ``pf_ks``): each
    fragment reference gets ``buf`` as its leading index (``buf`` may read the loop's own
    ``pf_ks``: it is not substituted)."""
    names = {r.name for r in step.fragments}

    class Sub(KExprMapper):
        def visit_KVar(self, x: KVar) -> KExpr:
            return ks if x.name == "pf_ks" else x

        def visit_KRef(self, x: KRef) -> KExpr:
            index = tuple(map(self.visit, x.index))
            return KRef(x.name, (buf, *index) if x.name in names else index)

    sub = Sub().visit

    return [map_exprs(n, sub) for n in nodes]


def single_buffered(step: KStep) -> tuple[KNode, ...]:
    """The k-steps of one k-tile, each declaring, loading and multiplying its fragments (the
    compute of :func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop`)."""
    body = (*step.fragments, *step.loads, *step.mma)
    return (
        KFor("pf_ks", KInt(0), cmp("<", "pf_ks", step.block_k), step.mma_k, body, unroll=True),
    )


def mma_buffers(step: KStep) -> tuple[KExpr, KExpr]:
    """The buffer k-step ``pf_ks`` of the k-step loop multiplies, and the last k-step's (its
    loads went in before the boundary)."""
    return band(div("pf_ks", step.mma_k), 1), KInt((step.steps - 1) % 2)


def double_buffered_loop(
    fills: tuple[TileFill, TileFill],
    bases: Bases,
    step: KStep,
    stages: int,
    k_lo: int,
    k_tiles: int,
    unrolled: bool = False,
) -> list[KNode]:
    """The k-tile loop of an S-stage (S >= 2) cp.async pipeline with double-buffered
    fragments (the module doc); ``fills``, ``bases``, ``k_lo``, ``k_tiles`` and ``unrolled``
    as for :func:`polyfuse.cuda.codegen.lower_mma_pipeline.k_tile_loop` (its steady state
    fills without a k guard, its rolled tail with one)."""
    assert stages >= 2 and step.steps % 2 == 0, (stages, step.steps)
    bk, mk = step.block_k, step.mma_k
    ahead = stages - 1
    wait = lower_mma_pipeline.wait_pending(stages)
    now, last = mma_buffers(step)
    full = min(k_tiles, (fills[0].k_hi - k_lo + 1) // bk)  # k-tiles wholly inside
    zero = KInt(0)
    first = buffered(step, step.loads, zero, zero)  # k-step 0 into buffer 0

    def body(inside: bool, filled: bool = True) -> list[KNode]:
        """One k-tile; ``inside``: its fill lies inside the reduction, and a next k-tile
        exists (the steady state); ``filled``: it fills a k-tile (not in the drain)."""
        ahead_loads = buffered(step, step.loads, band(add(div("pf_ks", mk), 1), 1),
                               add("pf_ks", mk))  # fmt: skip
        steps = (*ahead_loads, *buffered(step, step.mma, now, KVar("pf_ks")))
        at = unrolled and inside
        # the next k-tile's stage, read from here on
        pointers = stage_pointers(fills, bases, stage("pf_rs", 1, stages, at))
        return [
            KLet("pf_k0", add(k_lo, mul("pf_kt", bk))),
            *([ahead_fills(fills, ahead, bk, k_tiles, inside, stage("pf_ws", ahead, stages, at))]
              if filled else []),
            KCommit(lower_mma_pipeline.ONE_GROUP),
            # all k-steps but the last
            KFor("pf_ks", zero, cmp("<", "pf_ks", bk - mk), mk, steps, unroll=True),
            KWait(wait, "k-tile pf_kt + 1 has landed"),
            KBarrier(Scope.BLOCK, "... for every thread; k-tile pf_kt is read"),
            *advances(stages, at),
            *[KAssign(KRef(b), v) for b, v in pointers],
            *(first if inside else [KIf(cmp("<", add("pf_kt", 1), k_tiles), tuple(first))]),
            *buffered(step, step.mma, last, KInt(bk - mk)),
        ]

    main = max(0, full - ahead)  # iterations whose fill lies wholly inside
    return [
        *prologue(fills, ahead, k_tiles, k_lo, bk),
        KWait(wait, "k-tile 0 has landed"),
        KBarrier(Scope.BLOCK, "... for every thread"),
        *[replace(r, shape=(2, *r.shape), note="two fragment buffers" if not i else "")
          for i, r in enumerate(step.fragments)],
        *pointer_lets(fills, bases),
        *first,
        *steady_loop(0, main, body(True), stages, ahead, unrolled, main < k_tiles),
        *tail(main, k_tiles, ahead, body(False), body(False, False)),
    ]


__all__ = ["KStep", "buffered", "double_buffered_loop", "map_exprs", "mma_buffers",
           "single_buffered"]
