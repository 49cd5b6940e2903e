"""The one mapping entry: a kernel's scheduled micrographs → :class:`MappedKernel` + placements.

Policy, tried in order (PPCG-style: the first mapping that applies wins, and the reason for
passing over the others is kept in the notes):

1. a kernel with a reduction strategy (a reduction micrograph, possibly stitched with its
   consumers) gets the parallel reduction layout of :mod:`polyfuse.poly.compose`; when its one
   micrograph cannot take that layout (isl refuses the composition) the reason is noted and its
   reduction loops stay serial;
2. a GEMM-like micrograph (``MappingConfig.gemm``) is tiled for registers and shared memory
   (:mod:`polyfuse.poly.tiling`, :mod:`polyfuse.poly.promote`) with the best-ranked tiling whose
   promoted tiles fit :func:`polyfuse.poly.policy.gemm_tile_budget` (pipelined on sm_80+ over
   the stages ALCOP's latency model chooses within that budget,
   :mod:`polyfuse.poly.costs.stages`);
3. a GEMM-like micrograph of 16-bit operands (which the float32 tiles decline) is tensorized
   when isl matches its update against ``mma.sync.m16n8k16``
   (:mod:`polyfuse.poly.tensorize`); otherwise the plan notes "no tensor cores: <why>";
4. anything else gets the plain block/thread mapping of :func:`map_to_gpu`.

:func:`place_kernel` then decides every tensor's memory space for whichever mapping came out.
Callers see one record and never ask which path produced it.
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, noted, refusal_note, refused
from polyfuse.base.errors import ScheduleError
from polyfuse.graph.graph import Graph
from polyfuse.poly.compose import CompositionError, map_reduction_kernel
from polyfuse.poly.cost import ReductionStrategy
from polyfuse.poly.costs.stages import StageChoice, StageProblem, choose_stages
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.gemm_codegen import with_codegen
from polyfuse.poly.gemm_kernel import GemmKernel, kernel_placements
from polyfuse.poly.gemm_pipeline import pipeline_stages
from polyfuse.poly.gemm_tile_schedule import padded_reduction_reads
from polyfuse.poly.guard import operation_budget, over_budget
from polyfuse.poly.mapping import MappedKernel, MappingConfig, map_to_gpu
from polyfuse.poly.placement import Placement, place_shared, place_tensors
from polyfuse.poly.policy import (
    ASSUMED_REGISTERS,
    FLOAT_BYTES,
    gemm_tile_budget,
    gemm_tile_registers,
    reduction_tile_budget,
)
from polyfuse.poly.promote import build_gemm_kernel
from polyfuse.poly.schedule import Feedback, ScheduledMicrograph, halves, micrograph_label
from polyfuse.poly.tensorize import TensorCoreKernel, map_tensor_core, tensor_core_placements
from polyfuse.poly.tensorize_fragments import with_fragment_buffers, with_stage_unroll
from polyfuse.poly.tile_fit import fit_tiling
from polyfuse.poly.tiling import GemmShape, GemmTiling, detect_gemm, rank_gemm_tiles

#: kinds of the plan notes on tensor cores and on pipeline stages
TENSOR_CORES, STAGES = DecisionKind.TENSOR_CORES, DecisionKind.PIPELINE_STAGES
#: why a tensorized kernel's tiling is the user's (``MappingConfig.mma_tile``)
FORCED_MMA_TILE = "MappingConfig.mma_tile"


def map_kernel(
    graph: Graph,
    parts: list[ScheduledMicrograph],
    strategy: ReductionStrategy | None,
    device: DeviceSpec,
    cfg: MappingConfig | None = None,
) -> MappedKernel:
    """Map the kernel that runs ``parts`` (in dependence order) onto blocks and threads."""
    cfg = cfg or MappingConfig()
    if strategy is not None:
        try:
            return map_reduction_kernel(graph, parts, strategy, device, cfg.elements_per_thread)
        except CompositionError as e:
            if len(parts) > 1:  # stitching checked this composition: it cannot fail here
                raise
            note = noted(
                DecisionKind.REDUCTION_LAYOUT,
                f"no parallel reduction layout ({e}); reduction loops stay serial",
                parts[0].name,
                made=False,
            )
            parts = [replace(parts[0], notes=[*parts[0].notes, note])]
    (sm,) = parts
    bk, tile = cfg.mma_block_k, cfg.mma_tile
    tc_args = (bk, tile, FORCED_MMA_TILE if tile else "")
    tf32 = map_tensor_core(sm, device, cfg.gemm_stages, True, *tc_args) if cfg.allow_tf32 else None
    if isinstance(tf32, TensorCoreKernel):
        tf32 = with_fragment_buffers(tf32, device, cfg.mma_fragment_buffers)
        return with_stage_unroll(tf32, device, cfg.mma_stage_unroll)
    gemm = map_gemm(sm, device, cfg) if cfg.gemm else None
    if gemm is not None and not isinstance(gemm, Refusal):
        if tf32:
            no = refusal_note(TENSOR_CORES, f"no tf32 tensor cores: {tf32}", tf32)
            gemm.notes.append(no)
        return gemm
    half = gemm is not None and gemm.reason == HALF_OPERANDS
    tensorized = map_tensor_core(sm, device, cfg.gemm_stages, False, *tc_args) if half else None
    if isinstance(tensorized, TensorCoreKernel):
        tensorized = with_fragment_buffers(tensorized, device, cfg.mma_fragment_buffers)
        return with_stage_unroll(tensorized, device, cfg.mma_stage_unroll)
    mapped = map_to_gpu(sm, cfg, device)
    if gemm is not None:  # a contraction the GEMM path declined: the plan says why
        mapped.notes.append(refusal_note(DecisionKind.GEMM_TILE, f"no GEMM tiling: {gemm}", gemm))
    if tensorized:
        no = refusal_note(TENSOR_CORES, f"no tensor cores: {tensorized}", tensorized)
        mapped.notes.append(no)
    return mapped


def stage_notes(choice: StageChoice, subject: str) -> list[str]:
    """The stage model's choice and each candidate as plan notes (``stages: ...``): the
    choice and the chosen candidate made, the others refused."""
    out: list[str] = [noted(STAGES, f"stages: {choice.reason}", subject)]
    for c in choice.candidates:
        made = c.stages == choice.stages and not c.refused
        out.append(noted(STAGES, f"stages: {c.label}", subject, made=made))
    return out


#: detect_gemm's reason for a contraction the float32 tiles decline: tensorization's cases
HALF_OPERANDS = "the operands are not float32"


def map_gemm(
    sm: ScheduledMicrograph, device: DeviceSpec, cfg: MappingConfig
) -> GemmKernel | Refusal | None:
    """The register/shared-tiled mapping of a GEMM-like micrograph; why not (a
    :class:`Refusal` about the micrograph) when it is one but its operands' dtype keeps it off
    the float32 tiles (:data:`HALF_OPERANDS`: tensorization is tried next), a tiling cannot
    be built, or no ranked tiling fits the shared-memory budget (each rejected tiling named);
    None when it is not GEMM-like (the plain mapping, nothing to say)."""
    shape = detect_gemm(sm)
    if isinstance(shape, Refusal):
        return shape if shape.reason == HALF_OPERANDS else None
    budget = gemm_tile_budget(device)
    rejected: list[str] = []  # why each tiling tried first was rejected
    ranked = rank_gemm_tiles(
        shape,
        device,
        cfg.gemm_tile,
        forced_reason=cfg.gemm_tile_reason,
        stages=pipeline_stages(device.arch),
        limit=RANKED_FOR_SOUNDNESS,
    )
    over_budget = False
    for tiling in ranked:
        unsound = padded_reduction_reads(shape, tiling.tk, sm.model)
        if unsound is not None:
            rejected.append(f"rejected {tiling.label}: {unsound}")
            continue
        gk = gemm_kernel_fitting(sm, shape, tiling, device, cfg.gemm_stages)
        if isinstance(gk, Refusal):
            why = "; ".join([*rejected, f"{tiling.label}: {gk}"])
            return refused(gk.kind, why, sm.name)
        smem = FLOAT_BYTES * sum(p.floats for p in gk.promotions) * gk.stages
        if smem <= budget:
            break
        over_budget = True
        rejected.append(
            f"rejected {tiling.label}: its shared tiles take {smem} B > {budget} B per block"
        )
    else:
        kind = DecisionKind.FOOTPRINT if over_budget or not ranked else DecisionKind.GEMM_TILE
        why = "; ".join(rejected) if ranked else f"no tiling fits {budget} B per block"
        return refused(kind, f"no ranked tiling is sound and fits: {why}", sm.name)
    if not rejected:
        return gk
    tile = DecisionKind.GEMM_TILE
    return replace(gk, notes=[*gk.notes, *(noted(tile, r, sm.name, made=False) for r in rejected)])


#: candidates tried in rank order: enough to reach a sound k-tile (one dividing the reduction)
#: when the best ones pad it into an operand's array (:func:`padded_reduction_reads`)
RANKED_FOR_SOUNDNESS = 64


def gemm_kernel_fitting(
    sm: ScheduledMicrograph,
    shape: GemmShape,
    tiling: GemmTiling,
    device: DeviceSpec,
    stages: int | None = None,
) -> GemmKernel | Refusal:
    """The GEMM kernel of ``tiling``, pipelined where cp.async exists over as many stages as
    the stage model (:func:`polyfuse.poly.costs.stages.choose_stages`) chooses within
    :func:`gemm_tile_budget` (``stages``: forced, refused over the budget), else
    single-buffered; or why it cannot be built (a :class:`Refusal`). The plan's notes say
    why."""
    tiling = fit_tiling(shape, tiling)  # the column tile over two dims where it pads less
    gk = build_gemm_kernel(sm, shape, tiling, pipeline_stages(device.arch))
    if isinstance(gk, Refusal):
        return gk
    if gk.stages == 1:
        if stages and stages > 1:  # forced, but nothing to pipeline here
            why = (
                f"no cp.async on {device.arch}"
                if pipeline_stages(device.arch) == 1
                else "no single k-tile loop of several k-tiles with shared tiles"
            )
            why = f"stages: 1, not the forced {stages} ({why})"
            gk = replace(gk, notes=[*gk.notes, noted(STAGES, why, sm.name, made=False)])
        return with_codegen(gk, device)
    choice = choose_stages(stage_problem(gk), device, stages)
    if choice.stages != gk.stages:
        gk = build_gemm_kernel(sm, shape, tiling, choice.stages)
        if isinstance(gk, Refusal):
            return gk
    gk = replace(gk, notes=[*gk.notes, *stage_notes(choice, sm.name)])
    return with_codegen(gk, device)


def stage_problem(gk: GemmKernel) -> StageProblem:
    """The stage model's view of a pipelined GEMM kernel (per block and k-tile)."""
    assert gk.tiling is not None and gk.shape is not None
    model = gk.scheduled.model
    t = gk.tiling
    choice = t.choice
    regs = gemm_tile_registers(choice[2], choice[3]) if choice else ASSUMED_REGISTERS
    (j,) = [i for i, (lo, hi) in enumerate(gk.shape.red) if -(-(hi - lo + 1) // t.tk[i]) > 1]
    lo, hi = gk.shape.red[j]
    operands = dict.fromkeys(n for n, _ in gk.shape.operands)
    return StageProblem(
        fma_per_ktile=math.prod(t.block) * math.prod(t.tk),
        stage_bytes=FLOAT_BYTES * sum(p.floats for p in gk.promotions),
        ktiles=-(-(hi - lo + 1) // t.tk[j]),
        blocks=math.prod(gk.grid_dims),
        threads=t.nthreads,
        registers=regs,
        dram_bytes=sum(
            math.prod(model.tensors[n].shape) * model.tensors[n].itemsize for n in operands
        ),
    )


#: isl operations placing one plain or reduction kernel's tensors may take (registers, shared
#: footprints). The 53 golden graphs pass at 300k (six need more than 60k); a lane layout whose
#: sets isl cannot project cheaply (fuzz seed 790008: an elementwise producer fused into a
#: 3-axis all-reduce over 512 lanes) ran for hours without it.
PLACEMENT_BUDGET = 1_000_000


def place_kernel(
    mm: MappedKernel, device: DeviceSpec, stage: bool | frozenset[str] = False
) -> dict[str, Placement]:
    """Where every tensor of the mapped kernel lives, with the reason.

    Registers or global memory (:func:`place_tensors`); a parallel reduction layout then moves
    scratch tensors into shared memory within :func:`reduction_tile_budget` (Layer 2), first
    staging inputs that several parts read where ``stage`` (True: as :mod:`polyfuse.poly.stage`
    decides; a set: those inputs, decided before); a GEMM kernel's promoted operands are its
    shared tiles.

    Placement runs under :data:`PLACEMENT_BUDGET` isl operations. Past it, a kernel of one
    micrograph of several primitives goes back to the partitioner (:class:`Feedback`: the
    driver splits the micrograph in two and compiles again); any other kernel ends in a
    one-line :class:`ScheduleError`.
    """
    gemm = kernel_placements(mm)
    if gemm is not None:
        return gemm
    if isinstance(mm, TensorCoreKernel):
        return tensor_core_placements(mm)
    try:
        with operation_budget(mm.scheduled.model.ctx, PLACEMENT_BUDGET):
            placements = place_tensors(mm)
            if mm.strategy is None:
                return placements
            wide = any(
                r.role == "accumulator" and r.itemsize == 8
                for r in mm.scheduled.model.tensors.values()
            )
            budget = reduction_tile_budget(device, mm.strategy.threads, 8 if wide else 4)
            return place_shared(mm, placements, budget, device, stage)
    except isl.Error as e:
        if not over_budget(e):
            raise
        why = f"placing its tensors exceeded {PLACEMENT_BUDGET} isl operations"
        if len(mm.parts) == 1 and len(mm.parts[0].model.micrograph.prims) > 1:
            # back to the partitioner, like a schedule over budget: the split's kernels have
            # lane layouts of their own
            model = mm.parts[0].model
            label = micrograph_label(model.micrograph)
            raise Feedback(label, why, halves(model), "operations") from None
        fix = (
            "compile with stitch=False"
            if len(mm.parts) > 1
            else "it cannot be split; please report the graph with its shapes"
        )
        raise ScheduleError(
            f"{mm.scheduled.name}: {why} (a lane layout isl cannot project cheaply); {fix}"
        ) from None
