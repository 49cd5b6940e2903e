"""How a block's threads copy a promoted footprint into shared memory, for any rank.

A shared tile's copy statement ``C_x[kt..., e...]`` has one instance per element of the
footprint box (per vector when isl proved 128-bit copies: the instance is the vector's first
element). The instances are partitioned over the block's ``n`` threads by a *thread grid*:
extents ``g_0 x ... x g_{r-1}`` over the box's dimensions with product ``n``, laid out
row-major over ``threadIdx.x`` (the innermost dimension fastest). The thread at grid point
``p`` copies the elements

    e_d = lo_d + w_d * p_d + w_d * g_d * q_d    (every q_d >= 0 inside the box)

where ``w_d`` is the vector width on the innermost dimension and 1 elsewhere. For each
element exactly one ``p`` solves these (``p_d = ((e_d - lo_d) / w_d) mod g_d``) and distinct
threads have distinct ``p``, so every element is copied exactly once, by one thread — for a
1-D factor (``s[k]``), a 2-D operand tile, or a 3-D/4-D conv input or weight box alike. A
dimension with ``g_d = 1`` gets no coordinate: every thread loops over it whole, in steps of
``w_d`` (an innermost dimension of one vector per row still copies whole vectors).

Threads go to the innermost dimension first (neighbouring threads read neighbouring
addresses: coalesced), up to the next power of two of its extent in vectors, then to the
next dimension outwards, and so on; the outermost dimension of extent > 1 takes all threads
left (those past its extent copy nothing: isl guards them). Each extent divides the threads
left, so the product is exactly ``n``. A footprint of one element (or of rank 0) is copied by
thread 0 alone.

That grid leaves threads idle when an extent is not a power of two (a conv input row of 18
vectors takes 32 threads, 14 of them idle, and the outer dims loop the more). The copies per
thread are ``prod_d ceil(extent_d / g_d)``: when another grid of the same kind (extents
dividing the threads left, product ``n``) needs fewer, the grid with the fewest copies per
thread is taken, the most threads on the innermost dimensions among equals.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class CopyLayout:
    """The thread grid of one copy statement and the isl constraints that apply it."""

    per_dim: tuple[int, ...]  # threads along each footprint dimension (1: a loop per thread)
    coords: tuple[tuple[str, int], ...]  # the grid's coordinates (name, extent), outermost first
    constraints: tuple[str, ...]  # isl constraints over the copy's e* and the coordinates
    prefix: str = ""  # of the coordinates' names (:func:`coord_name`)

    @property
    def label(self) -> str:
        """The grid in words, per footprint dimension (``128x2``)."""
        return "x".join(map(str, self.per_dim)) or str(self.coords[0][1])

    def counters(self, lo: list[str], width: int, es: list[str], qs: list[str]) -> list[str]:
        """isl constraints ``e_d = lo_d + w_d p_d + w_d g_d q_d``: the element each thread
        copies at step ``q`` of its copy loops (``qs``, from 0: constant trip counts)."""
        rank = len(self.per_dim)
        out = []
        for d, g in enumerate(self.per_dim):
            w = width if d == rank - 1 else 1
            p = f" + {w} * {coord_name(self.prefix, d, rank)}" if g > 1 else ""
            out.append(f"{es[d]} = {lo[d]}{p} + {w * g} * {qs[d]}")
        return out


def _pow2_ceil(n: int) -> int:
    return 1 << (max(1, n) - 1).bit_length()


def _pow2_dividing(n: int) -> int:
    """The largest power of two that divides ``n``."""
    return n & -n


def coord_name(prefix: str, dim: int, rank: int) -> str:
    """The thread coordinate along footprint dimension ``dim``: ``<prefix>c`` (innermost),
    ``<prefix>r`` (the next one out), ``<prefix>d<dim>`` further out."""
    if dim == rank - 1:
        return f"{prefix}c"
    if dim == rank - 2:
        return f"{prefix}r"
    return f"{prefix}d{dim}"


def copies_per_thread(size: list[int], width: int, per_dim: list[int]) -> int:
    """The copy instances of the busiest thread of grid ``per_dim``."""
    rank = len(size)
    along = [size[d] // width if d == rank - 1 else size[d] for d in range(rank)]
    return math.prod(-(-a // g) for a, g in zip(along, per_dim, strict=True))


def thread_extents(size: list[int], width: int, nthreads: int) -> list[int]:
    """Threads per footprint dimension (product ``nthreads``; see the module docstring)."""
    first = _innermost_first(size, width, nthreads)
    best = min(
        _grids(size, width, nthreads),
        key=lambda g: (copies_per_thread(size, width, g), [-x for x in reversed(g)]),
        default=first,
    )
    if copies_per_thread(size, width, best) < copies_per_thread(size, width, first):
        return best
    return first


def _grids(size: list[int], width: int, nthreads: int):
    """Every grid whose extents divide the threads left (innermost first), the outermost
    dimension of extent > 1 taking the rest; an extent beyond its dimension's is no use."""
    rank = len(size)
    used = [d for d in range(rank) if size[d] > 1]
    if len(used) < 2:
        return

    def rec(k: int, left: int, grid: list[int]):
        if k == 0:
            out = list(grid)
            out[used[0]] = left
            yield out
            return
        d = used[k]
        along = size[d] // width if d == rank - 1 else size[d]
        for g in range(1, min(left, along) + 1):
            if left % g == 0:
                grid[d] = g
                yield from rec(k - 1, left // g, grid)
        grid[d] = 1

    yield from rec(len(used) - 1, nthreads, [1] * rank)


def _innermost_first(size: list[int], width: int, nthreads: int) -> list[int]:
    """The innermost-first grid (see the module docstring)."""
    rank = len(size)
    per_dim = [1] * rank
    used = [d for d in range(rank) if size[d] > 1] or ([rank - 1] if rank else [])
    left = nthreads
    for d in reversed(used[1:]):  # innermost first; the outermost used dim takes the rest
        along = size[d] // width if d == rank - 1 else size[d]
        per_dim[d] = min(_pow2_ceil(along), _pow2_dividing(left))
        left //= per_dim[d]
    if used:
        per_dim[used[0]] = left
    return per_dim


def copy_layout(
    size: list[int], lo: list[str], width: int, nthreads: int, prefix: str, es: list[str]
) -> CopyLayout:
    """The thread grid that copies the box ``lo``/``size`` (isl texts of the lower bounds) in
    instances of ``width`` elements along its innermost dimension, over ``nthreads`` threads;
    ``es``: the copy statement's element variables; ``prefix``: of the coordinate names."""
    rank = len(size)
    if rank == 0:  # one element, no dimension to spread: thread 0 copies it
        name = f"{prefix}c"
        return CopyLayout((), ((name, nthreads),), (f"{name} = 0",), prefix)
    per_dim = thread_extents(size, width, nthreads)
    assert math.prod(per_dim) == nthreads
    coords, cons = [], []
    for d, g in enumerate(per_dim):
        w = width if d == rank - 1 else 1
        name = coord_name(prefix, d, rank)
        if g == 1:  # looped whole by every thread, in steps of one instance (vector)
            if w > 1:
                cons.append(f"exists (q_{name}: {es[d]} = {lo[d]} + {w} * q_{name})")
            continue
        step = f"{w} * {name}" if w > 1 else name
        cons.append(f"exists (q_{name}: {es[d]} = {lo[d]} + {step} + {w * g} * q_{name})")
        coords.append((name, g))
    return CopyLayout(tuple(per_dim), tuple(coords), tuple(cons), prefix)
