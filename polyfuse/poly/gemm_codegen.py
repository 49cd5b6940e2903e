"""The code-generation decisions of a tiled GEMM kernel, made once its tiles and promotions
are known: how its loops are emitted (:mod:`polyfuse.poly.gemm_loops`) and which selects its
update drops (:mod:`polyfuse.poly.select_free`). Each is a typed record in the plan
(:attr:`polyfuse.poly.mapping.MappedKernel.codegen`) and a note beside the tiling's."""

from __future__ import annotations

import math
from dataclasses import replace

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote
from polyfuse.base.decision_data import GemmLoopData
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_kernel import GemmKernel
from polyfuse.poly.gemm_loops import CopyLoops, plan_gemm_loops
from polyfuse.poly.gemm_shape import access_function
from polyfuse.poly.select_free import select_free_operands

#: The share of a GEMM's multiply-adds on padding (whole tiles past the extents) above which
#: the plan says why the tiles do not fit the extents (issue 20 item 2).
PADDING_LIMIT = 0.05


def padding_record(
    extents: list[tuple[int, int]],
    padded: list[tuple[int, int]],
    data: list[tuple[int, int]],
    block: list[int],
) -> Decided:
    """The share of the multiply-adds the whole tiles spend on padding (``padded`` against the
    update's ``extents``, data dims then reduction dims), and, above :data:`PADDING_LIMIT`,
    why: the data dims whose block tile does not divide the extent."""
    useful = math.prod(hi - lo + 1 for lo, hi in extents)
    run = math.prod(hi - lo + 1 for lo, hi in padded)
    waste = 1 - useful / run
    over = [
        f"data dim {d} (extent {hi - lo + 1}) in block tiles of {b}"
        for d, ((lo, hi), b) in enumerate(zip(data, block, strict=True))
        if (hi - lo + 1) % b
    ]
    reason = f"{waste:.1%} of the multiply-adds fall on padding (whole tiles past the extents)"
    if waste > PADDING_LIMIT and over:
        reason += (
            f": {'; '.join(over)}; the ranked tiles are powers of two (16..128) along the "
            "matrix plane with 64/128/256 threads, and no fold of the column tile over two "
            "data dims (poly/tile_fit.py) divides the extents"
        )
    explained = waste <= PADDING_LIMIT or bool(over)
    data = GemmLoopData("padding", waste=round(waste, 4), explained=explained)
    return Decided((DecisionKind.GEMM_LOOP,), reason, data)


def with_codegen(gk: GemmKernel, device: DeviceSpec) -> GemmKernel:
    """``gk`` with its code-generation decisions on ``device``."""
    assert gk.tiling is not None and gk.tiling.choice is not None and gk.shape is not None
    shape, tiling = gk.shape, gk.tiling
    first = len(shape.red) + 2  # schedule dims: k-tiles, phase, position, then loops
    copies = []
    for p in gk.promotions:
        rank = len(p.size)
        steps = [p.thread_grid[d] * (p.width if d == rank - 1 else 1) for d in range(rank)]
        copies.append(
            CopyLoops(
                p.copy_stmt,
                p.tensor,
                tuple(gk.iterators[first : first + rank]),
                tuple(-(-n // s) for n, s in zip(p.size, steps, strict=True)),
            )
        )
    ktiles = [-(-(hi - lo + 1) // k) for (lo, hi), k in zip(shape.red, tiling.tk, strict=True)]
    loops = plan_gemm_loops(
        shape.update.name,
        tiling.tk,
        tiling.choice,
        tiling.nthreads,
        sum(p.floats for p in gk.promotions),
        gk.stages,
        gk.pipelined,
        copies,
        [f"kt{j}" for j, n in enumerate(ktiles) if n > 1],
        device,
        math.prod(gk.grid_dims),
    )
    # the iteration box the kernel runs: whole block tiles and whole k-tiles
    padded = [
        (lo, lo + -(-(hi - lo + 1) // b) * b - 1)
        for (lo, hi), b in zip(shape.data, tiling.block, strict=True)
    ]
    padded += [
        (lo, lo + n * k - 1) for (lo, _), n, k in zip(shape.red, ktiles, tiling.tk, strict=True)
    ]
    access = {n: access_function(m) for n, m in shape.operands}
    tensors = gk.scheduled.model.tensors
    # an array read through several accesses keeps its selects (one per tile to prove)
    zero_filled = {
        p.tensor: tuple(tensors[p.tensor].shape) for p in gk.promotions if not p.reads
    }
    free = select_free_operands(shape, padded, zero_filled, access)
    decisions = list(loops.decisions) + [
        Decided((DecisionKind.GEMM_LOOP,), why, GemmLoopData("select free", tensor=t))
        for t, why in free.items()
    ]
    decisions.append(padding_record(shape.data + shape.red, padded, shape.data, tiling.block))
    return replace(
        gk,
        loops=loops,
        select_free=free,
        codegen=tuple(decisions),
        notes=[*gk.notes, *(DecisionNote(d) for d in decisions)],
    )
