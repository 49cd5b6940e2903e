"""The tiled, promoted GEMM kernel: the GEMM passes as transformations of one isl schedule
tree (PPCG style; :mod:`polyfuse.poly.gemm_tree`).

:func:`build_gemm_kernel` runs the passes in order, each in the module of its concern:

1. tiling (:mod:`polyfuse.poly.gemm_tile_schedule`): isl's band as block, thread, register
   and k-tile coordinates, vector stores where isl proves them; the tree's k-tile band
   (marked), phases and in-tile bands (:func:`polyfuse.poly.gemm_tree.tile_tree`);
2. promotion (:mod:`polyfuse.poly.gemm_promotion`): k-invariant operands into registers, the
   others into shared tiles with their copy statements, added to the tree;
3. pipelining (:mod:`polyfuse.poly.gemm_pipeline`): the stages of the shared tiles, the copies
   shifted S-1 k-tiles early (a band shift), async groups;
4. register fragments of the promoted operands (:mod:`polyfuse.poly.fragments`), read off
   the update's tiled row;
5. barriers (:mod:`polyfuse.poly.gemm_barriers`) around each k-tile's update, grafted as an
   extension node.

isl then generates the whole kernel's loop AST from the tree (init, k-tile loop with copies,
barriers and the unrolled micro-tile, epilogue). The record it fills is
:class:`polyfuse.poly.gemm_kernel.GemmKernel`; the names below are re-exported from the pass
modules for the code generator.
"""

from __future__ import annotations

import math

import islpy as isl

from polyfuse.base.decision import DecisionKind, DecisionNote, Refusal, note_records, noted
from polyfuse.base.decision_data import NO_DATA, FragmentData, GemmLoopData
from polyfuse.poly.fragments import Fragment, register_fragments
from polyfuse.poly.gemm_barriers import SYNC_AFTER, SYNC_BEFORE, barrier_tree
from polyfuse.poly.gemm_kernel import GemmKernel, Promotion, gemm_placements
from polyfuse.poly.gemm_pipeline import (
    COMMIT,
    CP_ASYNC_ARCHS,
    PIPELINE_STAGES,
    WAIT,
    copy_shift,
    pipeline_note,
    pipeline_stages,
    pipeline_tree,
    pipelined_loop,
)
from polyfuse.poly.gemm_promotion import (
    copy_tree,
    hoist_invariant,
    invariant_operands,
    promote_operands,
)
from polyfuse.poly.gemm_shape import GemmShape, GemmTiling, access_function, operand_keys
from polyfuse.poly.gemm_tile_schedule import (
    VECTOR_VAR,
    TileFrame,
    padded_reduction_reads,
    tile_frame,
)
from polyfuse.poly.gemm_tree import flat_map, tile_tree
from polyfuse.poly.schedule import ScheduledMicrograph

__all__ = [
    "COMMIT",
    "CP_ASYNC_ARCHS",
    "PIPELINE_STAGES",
    "SYNC_AFTER",
    "SYNC_BEFORE",
    "VECTOR_VAR",
    "WAIT",
    "GemmKernel",
    "Promotion",
    "access_function",
    "build_gemm_kernel",
    "gemm_placements",
    "invariant_operands",
    "padded_reduction_reads",
    "pipeline_stages",
]


def build_gemm_kernel(
    sm: ScheduledMicrograph, shape: GemmShape, tiling: GemmTiling, stages: int = 1
) -> GemmKernel | Refusal:
    """The tiled, promoted kernel: schedule map, context, promotions; or why not (a
    :class:`Refusal` about the operand that cannot be promoted).

    ``stages`` S > 1 keeps S shared buffers per tile when exactly one k-tile loop has more
    than one iteration (:mod:`polyfuse.poly.gemm_pipeline`).
    """
    model = sm.model
    frame = tile_frame(shape, model, tiling)
    nr = len(shape.red)
    kts, regs = frame.kts, frame.regs

    # Promotion: k-invariant operands in registers, the others in shared tiles.
    hoisted, not_hoisted = hoist_invariant(frame, shape, model, tiling)
    got = promote_operands(
        frame, shape, model, tiling.nthreads, {f.tensor for f in hoisted}, not_hoisted
    )
    if isinstance(got, Refusal):
        return got
    promotions, copy_doms = got

    # The flattened schedule: fixed width, the copies' loops in the same tail dims.
    tail_n = max([nr + len(regs) + 1] + [c.rank for c in copy_doms])
    tail_names = frame.kks + regs + ["pos"] + [f"x{i}" for i in range(tail_n - nr - len(regs) - 1)]
    iterators = kts + ["ph", "sub"] + tail_names
    params = frame.bnames + frame.tnames + [c for pr in promotions for c, _ in pr.grid]
    P = ", ".join(params)
    stages, loop = pipelined_loop(frame.ktiles, stages, len(copy_doms))
    rows = frame.statement_schedule(shape, tail_n, P)
    red = frame.reduction_band(shape, tiling.tk, P)
    tree = tile_tree(rows, red, tiling.tk, shape.update.name)
    early = [0] * nr
    if loop is not None:  # decided before the copies are grafted: it shifts their extension
        tree = pipeline_tree(
            tree, len(copy_doms), shape.init.name, kts, frame.ktiles, loop, stages, tail_n
        )
        early = copy_shift(nr, stages, loop)
    tree = copy_tree(tree, copy_doms, kts, tail_n, early)
    cons = [f"0 <= {b} < {g}" for b, g in frame.bused]
    cons += [f"0 <= {t} < {n}" for t, n in frame.tused]
    cons += [f"0 <= {c} < {g}" for pr in promotions for c, g in pr.grid]
    context = isl.Set(f"[{P}] -> {{ : {' and '.join(cons)} }}", context=model.ctx)
    statements = tree  # before the barriers: its flattening is the statements' schedule

    notes = _notes(frame, shape, tiling, promotions, hoisted, not_hoisted, stages, loop)
    promoted = {p.tensor for p in promotions}
    fragments, fragment_notes = register_fragments(
        shape.update,
        rows,  # the update's row (no later pass moves it)
        iterators,
        regs,
        frame.reg_shape,
        [
            (key, access_function(m))
            for key, (_, m) in zip(operand_keys(shape), shape.operands, strict=True)
            if key in promoted
        ],
        tiling.accumulators,
        sum(f.floats for f in hoisted),
    )
    notes += fragment_notes
    tree = barrier_tree(tree, shape.update.name, kts, frame.ktiles)
    return GemmKernel(
        sm,
        isl.Schedule.from_domain(flat_map(statements).domain().coalesce()),
        context,
        frame.bnames,
        frame.tnames,
        [g for _, g in frame.bused],
        [n for _, n in frame.tused],
        shape.data,
        notes=notes,
        shape=shape,
        tiling=tiling,
        schedule_tree=tree,
        statement_tree=statements,
        iterators=iterators,
        promotions=promotions,
        reg_iters=regs,
        guards=frame.epilogue_guards(shape, tiling.block),
        tile_context=frame.ranges,
        reg_shape=frame.reg_shape,
        vector_stores=frame.vector_stores,
        stages=stages,
        pipelined=kts[loop] if loop is not None else "",
        fragments=hoisted + fragments,
        layout=tiling.decision(math.prod(g for _, g in frame.bused), stages),
    )


def _promotion_note(p: Promotion) -> DecisionNote:
    """The plan's note on promoted tile ``p``: a GEMM-tile record; when its tile box was
    reshaped (the reason quotes the tile box's notes) its data is the last reshaping's
    :class:`TileBoxData` (the box as copied), so that record is kept."""
    box = note_records(p.box_notes)
    data = box[-1].data if box else NO_DATA
    return noted(DecisionKind.GEMM_TILE, f"{p.tensor}: shared ({p.reason})", p.tensor, data=data)


def _notes(
    frame: TileFrame,
    shape: GemmShape,
    tiling: GemmTiling,
    promotions: list[Promotion],
    hoisted: list[Fragment],
    not_hoisted: dict[str, str],
    stages: int,
    loop: int | None,
) -> list[str]:
    """The plan's notes on the kernel: the tiling's reasons, then each pass's choice (each a
    decision record: :class:`~polyfuse.base.decision.DecisionNote`)."""
    loop_kind = DecisionKind.GEMM_LOOP
    notes = list(tiling.reasons)
    notes += [_promotion_note(p) for p in promotions]
    notes += [
        noted(
            DecisionKind.REGISTER_FRAGMENT,
            f"{f.tensor}: {f.reason}",
            f.tensor,
            data=FragmentData(f.tensor, f.floats, f.reads),
        )
        for f in hoisted
    ]
    notes += [
        noted(
            DecisionKind.REGISTER_FRAGMENT,
            f"{t}: not held in registers ({why}); a shared tile instead",
            t,
            made=False,
        )
        for t, why in not_hoisted.items()
        if any(p.tensor == t for p in promotions)
    ]
    store = GemmLoopData("store", tensor=shape.update.prim)
    notes.append(noted(loop_kind, frame.store_why, shape.update.prim, data=store))
    if loop is not None:
        stage_bytes = 4 * sum(p.floats for p in promotions)
        notes.append(
            noted(
                DecisionKind.PIPELINE_STAGES,
                pipeline_note(stages, frame.kts[loop], stage_bytes),
                shape.update.prim,
            )
        )
    notes.append(
        noted(
            loop_kind,
            f"epilogue on the register tile before the single store: "
            f"{', '.join(s.prim for s in shape.epilogue)}",
            *(s.prim for s in shape.epilogue),
            data=GemmLoopData("epilogue"),
        )
    )
    return notes
