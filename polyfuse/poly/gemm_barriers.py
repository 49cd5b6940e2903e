"""Barrier statements of a tiled GEMM's k-tile loop, grafted into the kernel's schedule tree.

Every k-tile runs its copies (and async groups; phase 0), then a barrier (the copies are done
before the micro-tile reads them: ``Sync_load``), the update (phase 1) and a barrier (the
reads are done before the next k-tile's copies overwrite the tiles: ``Sync_use``). The
barriers are no statements of the domain: :func:`barrier_tree` grafts them before and after
the update as one extension node ``{ [kt...] -> Sync_load[kt...]; [kt...] -> Sync_use[kt...] }``
over the k-tile band's schedule (PPCG grafts its synchronisation the same way), and isl's AST
generation places them.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.poly.gemm_tile_schedule import ints
from polyfuse.poly.gemm_tree import graft_barriers

SYNC_BEFORE = "Sync_load"  # barrier statement: copies done before the micro-tile reads them
SYNC_AFTER = "Sync_use"  # barrier statement: reads done before the next k-tile's copies


def barrier_extension(
    ctx: isl.Context, name: str, kts: list[str], ktiles: list[int]
) -> isl.UnionMap:
    """``{ [kt...] -> name[kt...] }`` over every k-tile (``ktiles`` per k-tile loop)."""
    kdom = " and ".join(f"0 <= {k} < {m}" for k, m in zip(kts, ktiles, strict=True))
    return isl.UnionMap(f"{{ [{ints(kts)}] -> {name}[{ints(kts)}] : {kdom} }}", context=ctx)


def barrier_tree(
    tree: isl.Schedule, update: str, kts: list[str], ktiles: list[int]
) -> isl.Schedule:
    """The barrier pass on the schedule tree: both barriers of every k-tile grafted around
    the ``update``."""
    ctx = tree.get_ctx()
    before = barrier_extension(ctx, SYNC_BEFORE, kts, ktiles)
    after = barrier_extension(ctx, SYNC_AFTER, kts, ktiles)
    space = tree.get_domain().get_space()
    return graft_barriers(tree, update, before.align_params(space), after.align_params(space))
