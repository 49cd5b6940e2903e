"""The order of an implicit GEMM's flattened reduction (:mod:`polyfuse.poly.tensorize_gather`).

A convolution's ``k`` flattens the reduction dims ``(c, kh, kw)`` row-major; any order of them
is the same GEMM (both operands' fills split ``k`` the same way), but the order decides what
the fills cost per element:

- an operand linear in ``k`` (:func:`polyfuse.poly.tensorize_gather.linear_k`: an OIHW weight
  under ``(c, kh, kw)``) is copied by 16-byte ``cp.async`` chunks, no division of k;
- a gathered operand stored k-innermost keeps one k per thread for a whole k-tile (its
  divisions of k once per k-tile);
- a gathered operand stored in k rows (the input, im2col) walks a run of consecutive k per
  thread (:func:`polyfuse.cuda.codegen.lower_mma_fills.digit_fill`): where the innermost
  reduction dim's extent is a multiple of the run and the runs start on multiples of it, the
  run never carries into the outer dims: the guards on the outer dims and the offset's other
  terms stay fixed along the run (NCHW under ``(kh, kw, c)``: one channel per element);
  otherwise every element carries and tests its digits.

:func:`choose_k_order` prices each order (the identity, and each reduction dim moved
innermost) by these per-element costs, measured on SASS of the ResNet 3x3 conv (sm_80/sm_90,
the instructions of a k-tile loop per copied element) and picks the cheapest, the figures in
its note. Whether an order keeps the k-tile loop pipelined (:func:`pipelined`) the tile model
prices (:mod:`polyfuse.poly.costs.mma`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from polyfuse.base.decision import DecisionKind, noted
from polyfuse.base.decision_data import GemmLoopData
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.tensorize_gather import chunked_k, linear_k

#: SASS instructions per copied element, measured (see the module doc): a 16-byte chunk (8
#: elements, address and zero-fill count), a scalar gather with one k per thread, a k-row
#: gather whose run stays in one value of the outer dims, one that carries per element
#: (per chunk)
COST_CHUNK, COST_FIXED_K, COST_RUN, COST_CARRY = 6.0, 4.0, 4.0, 26.0
#: a gathered 16-byte chunk (:func:`polyfuse.poly.tensorize_gather.chunked_k`) where each
#: chunk's row offset and padding mask are precomputed
#: (:func:`polyfuse.cuda.codegen.lower_mma_gather_chunks.gather_setup`): the mask test, the
#: offset, the cp.async; and once per k-tile the k split into the reduction dims, the mask bit
#: and the offset's k part (the GPU-day 3x3 conv's 64x256 k-tile, sm_80: 100 others, of
#: which 16 ldmatrix, 2 weight chunks and ~30 loop overhead)
COST_GATHER_CHUNK, COST_GATHER_KTILE = 5.0, 16.0


def permute_reduction(
    shape: GemmShape, ops: list, order: tuple[int, ...]
) -> tuple[GemmShape, list]:
    """``shape`` and its operands (:class:`polyfuse.poly.tensorize.MmaOperand`) with the
    reduction dims in ``order`` (flattening outer to inner): the bounds and each subscript's
    reduction coefficients permuted alike, the linear form recomputed."""
    nd = len(shape.data)
    new = replace(shape, red=[shape.red[i] for i in order])
    out = []
    for op in ops:
        index = tuple(((*c[:nd], *(c[nd + i] for i in order)), k) for c, k in op.index)
        lin, chunked = None, False
        if op.linear is not None or (op.gather and not op.guarded):
            lin = linear_k(index, op.shape, new, op.outer_dim, op.k_inner)
        if op.gather and lin is None:
            chunked = chunked_k(index, op.shape, new, op.k_inner, op.chunk)
        out.append(replace(op, index=index, linear=lin, chunked=chunked))
    return new, out


def run_is_flat(shape: GemmShape, rows: int, block_k: int, nthreads: int) -> bool:
    """Whether a k-row gather's per-thread runs (``rows x block_k / nthreads`` consecutive k
    from a multiple of it) stay in one value of the outer reduction dims."""
    lo, hi = shape.red[-1]
    run = rows * block_k // nthreads
    return nthreads % rows == 0 and block_k % run == 0 and (hi - lo + 1) % run == 0


def fill_cost(op, shape: GemmShape, rows: int, block_k: int, nthreads: int, aligned: bool) -> float:
    """Modelled instructions of one k-tile's fill of ``op`` per thread (the module doc's
    per-element costs); ``aligned``: a linear operand's chunks start 16-byte aligned."""
    elems = rows * block_k / nthreads
    if not op.gather or (op.linear is not None and aligned):
        return elems / op.chunk * COST_CHUNK
    if op.chunked:
        return elems / op.chunk * COST_GATHER_CHUNK + COST_GATHER_KTILE
    if op.k_inner:
        return elems * COST_FIXED_K
    flat = run_is_flat(shape, rows, block_k, nthreads)
    return elems * (COST_RUN if flat else COST_CARRY)


def k_orders(n: int) -> list[tuple[int, ...]]:
    """The orders tried: the identity, then each dim moved innermost."""
    ident = tuple(range(n))
    return [ident] + [(*(i for i in ident if i != j), j) for j in range(n - 1)]


def price_k_orders(
    shape: GemmShape, a, b, rows: tuple[int, int], block_k: int, nthreads: int,
    aligned: Callable[[object], bool],
) -> list[tuple[float, tuple[int, ...], GemmShape, object, object]]:  # fmt: skip
    """Each order of :func:`k_orders` priced: (modelled fill instructions per thread and
    k-tile of ``a`` and ``b``, the order, ``shape``, ``a``, ``b`` in it)."""
    priced = []
    for order in k_orders(len(shape.red)):
        s, (pa, pb) = permute_reduction(shape, [a, b], order)
        cost = sum(
            fill_cost(op, s, r, block_k, nthreads, aligned(op))
            for op, r in ((pa, rows[0]), (pb, rows[1]))
        )
        priced.append((cost, order, s, pa, pb))
    return priced


def pipelined(a, b, aligned: Callable[[object], bool]) -> bool:
    """Whether operands ``a`` and ``b`` (in some reduction order) keep the k-tile loop
    pipelined: one at least filled by 16-byte chunks (both scalar: single-stage fills, every
    k-tile's loads waited for), every chunked one aligned (``aligned``)."""
    chunked = [op for op in (a, b) if not op.scalar]
    return bool(chunked) and all(aligned(op) for op in chunked)


def cheapest(
    priced: list[tuple[float, tuple[int, ...], GemmShape, object, object]],
) -> tuple[float, tuple[int, ...], GemmShape, object, object]:
    """The order of :func:`price_k_orders` with the fewest fill instructions (the first of
    equals)."""
    return min(priced, key=lambda p: p[0])


def choose_k_order(
    shape: GemmShape, a, b, rows: tuple[int, int], block_k: int, nthreads: int,
    aligned: Callable[[object], bool],
) -> tuple[GemmShape, object, object, str]:  # fmt: skip
    """The cheapest order of ``shape``'s reduction dims for the fills of ``a`` and ``b`` (tiles
    of ``rows`` = (block m, block n) by ``block_k``): ``shape``, ``a``, ``b`` in that order
    and the note (a k-order decision record: every order's modelled cost); unchanged with one
    reduction dim."""
    if len(shape.red) < 2:
        return shape, a, b, ""
    priced = price_k_orders(shape, a, b, rows, block_k, nthreads, aligned)
    cost, order, s, pa, pb = cheapest(priced)
    costs = ", ".join(f"{o}: {c:.0f}" for c, o, *_ in priced)
    note = noted(
        DecisionKind.GEMM_LOOP,
        f"tensor cores: reduction flattened in the order {order} of its dims (modelled fill "
        f"instructions per thread and k-tile: {costs})",
        shape.update.prim,
        data=GemmLoopData("k order", loops=[str(d) for d in order]),
    )
    return s, pa, pb, note
