"""Barrier statements of a tiled GEMM's k-tile loop.

Every k-tile runs ``[kt, 0, ...]`` copies (and async groups), ``[kt, 1]`` a barrier (the
copies are done before the micro-tile reads them: ``Sync_load``), ``[kt, 2, ...]`` the update
and ``[kt, 3]`` a barrier (the reads are done before the next k-tile's copies overwrite the
tiles: ``Sync_use``). They are statements of the schedule like any other, so isl's AST
generation places them.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.poly.gemm_tile_schedule import ints, tail

SYNC_BEFORE = "Sync_load"  # barrier statement: copies done before the micro-tile reads them
SYNC_AFTER = "Sync_use"  # barrier statement: reads done before the next k-tile's copies


def barrier_schedule(umap: isl.UnionMap, kts: list[str], ktiles: list[int], n: int) -> isl.UnionMap:
    """``umap`` with both barriers of every k-tile (``ktiles`` per k-tile loop ``kts``; ``n``
    tail dims)."""
    ctx = umap.get_ctx()
    for ph, sname in ((1, SYNC_BEFORE), (3, SYNC_AFTER)):
        kdom = " and ".join(f"0 <= {k} < {m}" for k, m in zip(kts, ktiles, strict=True))
        umap = umap.union(
            isl.UnionMap(
                f"{{ {sname}[{ints(kts)}] -> [{ints(kts)}, {ph}, 0, {tail([], n)}] : {kdom} }}",
                context=ctx,
            )
        )
    return umap
