"""Pipeline stages of a tiled GEMM's shared tiles (ALCOP's multi-stage loads, cp.async).

With S > 1 stages the kernel keeps S shared buffers per tile when exactly one k-tile loop has
more than one iteration (:func:`pipelined_loop`): the copies of k-tile kt+S-1 are issued
asynchronously during k-tile kt, so the schedule runs each copy S-1 k-tiles early
(:func:`copy_shift`) and the first S-1 k-tiles' copies run in S-1 iterations before k-tile 0
(the prologue the loop pass peels). The copies issued in one k-tile form one async group
(statement ``Cp_commit``); before the update of k-tile kt, ``Cp_wait`` waits for all groups
but the S-1 newest (:func:`async_group_schedule`).

On the kernel's schedule tree (:func:`pipeline_tree`) the pass runs before the copies are
grafted: an ``isl_schedule_node_band_shift`` of the k-tile band (the init S-1 earlier along
every k-tile loop: before the first copies) and the async-group statements added in phase 0;
the copies' extension then maps k-tile kt to the copies of kt+S-1 (:func:`copy_shift`).
"""

from __future__ import annotations

import islpy as isl

from polyfuse.poly.gemm_tile_schedule import ints, tail
from polyfuse.poly.gemm_tree import add_statements, shift_k_tiles

COMMIT = "Cp_commit"  # pipelined: the copies issued for one k-tile form one async group
WAIT = "Cp_wait"  # pipelined: all groups but the S-1 newest (k-tiles kt+1..kt+S-1) have landed
#: shared-tile stages when pipelined, unless the stage model (:mod:`polyfuse.poly.costs.stages`)
#: chooses: k-tile kt+1 is copied (cp.async) while kt is used
PIPELINE_STAGES = 2
CP_ASYNC_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")  # cp.async exists from sm_80 on


def pipeline_stages(arch: str) -> int:
    """Shared-tile stages on ``arch``: double buffering where cp.async exists."""
    return PIPELINE_STAGES if arch in CP_ASYNC_ARCHS else 1


def pipelined_loop(ktiles: list[int], stages: int, copies: int) -> tuple[int, int | None]:
    """The stages the kernel gets and the k-tile loop (its index) they alternate over: 1 and
    None when there is nothing to overlap (no copies) or the k-tiles run over several loops
    (or none of more than one k-tile)."""
    multi = [j for j, n in enumerate(ktiles) if n > 1]
    if stages > 1 and (len(multi) != 1 or not copies):
        stages = 1
    return stages, (multi[0] if stages > 1 else None)


def copy_shift(nr: int, stages: int, loop: int) -> list[int]:
    """The copies' k-tile shift: S-1 k-tiles early along ``loop`` (the copies of k-tile
    kt+S-1 run during kt)."""
    return [-(stages - 1) if j == loop else 0 for j in range(nr)]


def pipeline_shifts(init: str, nr: int, stages: int) -> dict[str, list[int]]:
    """The k-tile band's shift per domain statement: the init S-1 earlier along every k-tile
    loop (at -S: before the first copies, which run at k-tiles 1-S..-1; the copies are
    grafted with :func:`copy_shift` applied to their extension)."""
    return {init: [-(stages - 1)] * nr}


def pipeline_tree(
    tree: isl.Schedule,
    copies: int,
    init: str,
    kts: list[str],
    ktiles: list[int],
    loop: int,
    stages: int,
    n: int,
) -> isl.Schedule:
    """The pipelining pass on the schedule tree, before the copies are grafted: the k-tile
    band shifted (:func:`pipeline_shifts`), then the async groups of the ``copies`` copies
    added in phase 0 (:func:`async_group_schedule`; ``n`` tail dims). The commits run in every
    k-tile from 1-S on, so the prologue's k-tiles run something and isl builds the copies
    grafted there (an extension's instances exist only where its subtree runs)."""
    tree = shift_k_tiles(tree, pipeline_shifts(init, len(kts), stages))
    empty = isl.UnionMap("{ }", context=tree.get_ctx())
    groups = async_group_schedule(empty, kts, ktiles, loop, stages, copies, n)
    return add_statements(tree, groups)


def async_group_schedule(
    umap: isl.UnionMap,
    kts: list[str],
    ktiles: list[int],
    loop: int,
    stages: int,
    copies: int,
    n: int,
) -> isl.UnionMap:
    """``umap`` with one async group commit per k-tile after its ``copies`` copies (the last
    S-1 empty; from k-tile 1-S on along ``loop``), then the wait for k-tile kt's group."""
    ctx = umap.get_ctx()
    groups = ((copies, COMMIT, 1 - stages), (copies + 1, WAIT, 0))
    for sub, sname, first in groups:
        kdom = " and ".join(
            f"{first if i == loop else 0} <= {k} < {m}"
            for i, (k, m) in enumerate(zip(kts, ktiles, strict=True))
        )
        umap = umap.union(
            isl.UnionMap(
                f"{{ {sname}[{ints(kts)}] -> [{ints(kts)}, 0, {sub}, {tail([], n)}] : {kdom} }}",
                context=ctx,
            )
        )
    return umap


def pipeline_note(stages: int, loop: str, stage_bytes: int) -> str:
    """The plan's note on a pipelined kernel's shared tiles."""
    ahead = "kt+1" if stages == 2 else f"kt+1..kt+{stages - 1}"
    return (
        f"shared tiles in {stages} stages over k-tile loop {loop}: k-tiles {ahead} "
        f"are copied with cp.async while kt is used "
        f"({stages} x {stage_bytes} B)"
    )
