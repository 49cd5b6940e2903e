"""The compiler driver: te graph → micrographs → isl schedules → kernels → CompiledGraph.

Stages, each producing a printable object kept on the :class:`Plan`:

1. ``build_graph``: primitives and their op kinds (graph/);
2. ``partition``: Algorithm 1 over the rule table (graph/);
3. ``build_model`` + ``compute_schedule``: isl model and schedule per micrograph under the
   operation budget (poly/); a :class:`Feedback` sends separations back to step 2;
4. ``stitch_memory``: Layer 2 — reduction micrographs stitched with their consumers into one
   kernel (Algorithm 2) (stitch/);
5. ``plan_kernel`` per kernel (stitch/): ``map_kernel`` (poly/, one interface for plain,
   reduction and GEMM kernels: tiling, block/thread mapping), ``place_kernel`` (registers,
   shared or global memory) and recompute instead of spilling — decided before lowering; a
   placement over its isl budget is a :class:`Feedback` too (steps 2-5 run again);
5b. ``stitch_parallel``: Layer 3 — independent kernels share one launch (Algorithm 3);
6. isl AST generation and the CUDA printer (cuda/).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import islpy as isl
import numpy as np

from polyfuse.base.decision import Decided
from polyfuse.cache import (
    KERNEL_FIELDS,
    SCHEDULE_FIELDS,
    TUNE_FIELDS,
    CompileCache,
    kernel_entry,
    kernel_from_entry,
    rename,
    tune_key,
)
from polyfuse.compiled import CompiledGraph, kernel_order, plan_buffers
from polyfuse.cuda.codegen.astgen import generate_ast
from polyfuse.cuda.codegen.dedup import FunctionTable
from polyfuse.cuda.codegen.gemm_lowering import lower_gemm
from polyfuse.cuda.codegen.kernel_ast import Kernel
from polyfuse.cuda.codegen.layer3 import stitch_parallel
from polyfuse.cuda.codegen.lower import lower_kernel, vector_plan
from polyfuse.cuda.codegen.lower_dtypes import check_codegen_dtypes
from polyfuse.cuda.codegen.printer import prelude_for
from polyfuse.cuda.toolchain.compiler import SUPPORTED_ARCHS
from polyfuse.errors import ExpressionError, ScheduleError
from polyfuse.gemm_rows import generate_gemm_rows, tensorized_price
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Tensor
from polyfuse.graph.graph import Graph, build_graph
from polyfuse.graph.partition import PARTITION_RULES, Partition, partition
from polyfuse.graph.passes import check_passes, run_passes
from polyfuse.graph.structure import structural_key
from polyfuse.plan import Plan
from polyfuse.poly.cost import ReductionConfig
from polyfuse.poly.device import DeviceSpec, device_for_arch
from polyfuse.poly.footprint import block_read_bytes, global_footprint
from polyfuse.poly.mapping import MappedKernel, MappingConfig
from polyfuse.poly.model import build_model
from polyfuse.poly.schedule import (
    DEFAULT_BUDGET,
    Feedback,
    ScheduledMicrograph,
    compute_schedule,
    configure,
)
from polyfuse.poly.split import split_long_reductions
from polyfuse.poly.split_k import check_split_k, split_contractions
from polyfuse.poly.tensorize_tiling import check_forced_tiling
from polyfuse.poly.tiling import epilogue_split
from polyfuse.reference import evaluate
from polyfuse.stitch.epilogue import EpilogueChoice, epilogue_choices
from polyfuse.stitch.gemm_rows import GemmRowsGroup
from polyfuse.stitch.memory import KernelGroup, StitchDecision, stitch_memory
from polyfuse.stitch.parallel import PackDecision
from polyfuse.stitch.plan import KernelPlan, plan_kernel
from polyfuse.stitch.row_stitch import stitch_gemm_rows
from polyfuse.version import CODEGEN_REVISION, __version__

MAX_FEEDBACK_ROUNDS = 64


def _check_constants(
    constants: dict[Tensor, np.ndarray], inputs: list[Tensor]
) -> dict[Tensor, np.ndarray]:
    out = {}
    ids = {t.uid for t in inputs}
    for t, a in constants.items():
        if not isinstance(t, Tensor) or not t.is_placeholder:
            raise ExpressionError(f"compile: constant {t!r} must be a te.placeholder")
        if t.uid in ids:
            raise ExpressionError(f"compile: '{t.name}' is both an input and a constant")
        a = np.asarray(a)
        if a.shape != t.shape:
            raise ExpressionError(
                f"compile: constant '{t.name}' has shape {a.shape}, the placeholder {t.shape}"
            )
        out[t] = np.asarray(a, dtype=dtypes.numpy_dtype(t.dtype), order="C")  # 0-d stays 0-d
    return out


def _partition_schedule(
    graph: Graph,
    preferences: dict[frozenset[str], str],
    separations: set[frozenset[str]],
    memo: dict[tuple[str, ...], ScheduledMicrograph],
    ctx: isl.Context,
    budget: int,
    cache: CompileCache,
    salt: str,
    name: str,
) -> tuple[Partition, list[ScheduledMicrograph], list[Feedback]]:
    """Steps 2-3: partition and schedule every micrograph, re-partitioning with isl's
    separations (added to ``separations``) until every micrograph schedules (``memo`` keeps
    schedules by primitives)."""
    events: list[Feedback] = []
    for _ in range(MAX_FEEDBACK_ROUNDS):
        part = partition(graph, PARTITION_RULES, separations, preferences)
        scheduled: list[ScheduledMicrograph] = []
        round_events: list[Feedback] = []
        for mg in part.micrographs:  # every micrograph that fails splits in the same round
            key = tuple(mg.prims)
            try:
                if key not in memo:
                    memo[key] = _schedule(graph, mg, ctx, budget, cache, salt)
            except Feedback as fb:
                round_events.append(fb)
                continue
            sm = memo[key]  # ids are renumbered per partition: a copy names this round's
            scheduled.append(replace(sm, model=replace(sm.model, micrograph=mg)))
        if not round_events:
            return part, scheduled, events
        events.extend(round_events)
        for fb in round_events:
            _separate(separations, fb)
    raise _not_converged(name, budget)


def _not_converged(name: str, budget: int) -> ScheduleError:
    return ScheduleError(f"compile '{name}': feedback did not converge; raise budget= ({budget})")


def _separate(separations: set[frozenset[str]], fb: Feedback) -> None:
    """Keep the groups of a feedback event apart in every later partition."""
    for i, g in enumerate(fb.groups):
        for h in fb.groups[i + 1 :]:
            separations.update(frozenset((a, b)) for a in g for b in h)


def _fuse(
    graph: Graph,
    separations: set[frozenset[str]],
    schedule_args: tuple,
    device: DeviceSpec,
    cfg: MappingConfig,
    stitch: bool,
    cache: CompileCache,
    salt: str,
    times: dict[str, float],
) -> tuple[Partition, list[ScheduledMicrograph], list[Feedback], list[KernelGroup], list]:
    """Steps 2-4: partition and schedule (:func:`_partition_schedule`), stitch, and one more
    partition round when Layer 2 moves elementwise ops into a GEMM's epilogue. Returns the
    partition, its schedules, the feedback events, the kernel groups and the stitch
    decisions; ``times`` gains the stages' seconds."""
    t0 = time.perf_counter()
    part, scheduled, events = _partition_schedule(graph, {}, separations, *schedule_args)
    times["partition+schedule"] += time.perf_counter() - t0
    t0 = time.perf_counter()
    groups, stitches = _stitch(graph, part, scheduled, device, cfg, stitch, cache, salt)
    # Layer 2 feedback: elementwise ops before a reduction that save more bytes in the epilogue
    # of the GEMM before them move there (stitch/epilogue.py); one more partition round
    choices = epilogue_choices(graph, part, groups) if stitch else []
    if choices:
        t1 = time.perf_counter()
        prefer = {pair: c.reason for c in choices for pair in c.pairs}
        again = _partition_schedule(graph, prefer, separations, *schedule_args)
        times["partition+schedule"] += time.perf_counter() - t1
        t0 += time.perf_counter() - t1
        if all(_moved(again[0], c) for c in choices):  # else: kept as first partitioned
            part, scheduled, round_events = again
            events = events + round_events
            groups, stitches = _stitch(graph, part, scheduled, device, cfg, stitch, cache, salt)
    times["stitch"] += time.perf_counter() - t0
    return part, scheduled, events, groups, stitches


def _kernels(
    graph: Graph,
    groups: list[KernelGroup],
    device: DeviceSpec,
    cfg: MappingConfig,
    cache: CompileCache,
    salt: str,
    arch: str,
) -> tuple[list[Kernel], list[KernelPlan], list[MappedKernel | None], dict]:
    """Step 5: map, place and generate every kernel group (from the cache by structural key
    where it has them), in launch order; returns the kernels, their plans, their mapped
    kernels (None: from the cache) and the isl ASTs generated."""
    kernels: list[Kernel] = []
    plans: list[KernelPlan] = []
    mapped: list[MappedKernel | None] = []
    asts = {}
    for i, g in enumerate(groups):
        prims = [p for sm in g.parts for p in sm.model.micrograph.prims]
        tuned = _tuned(cache, graph, g, prims, arch)
        ksalt = f"{salt}|kernel" + (f"|tuned {tuned['tile']}" if tuned else "")
        key = structural_key(graph, prims, ksalt)
        kname = f"k{i}_{prims[0]}"
        entry = cache.get(key.digest, KERNEL_FIELDS)
        if entry is None and isinstance(g, GemmRowsGroup):
            kernel, kp, mm, ast = generate_gemm_rows(graph, g, kname, device, cfg, key.canonical())
            entry = kernel_entry(kernel, kp, key)
            cache.put(key.digest, entry)
            asts[kname] = ast
        elif entry is None:
            kernel, kp, mm, ast = _generate(graph, g, kname, device, cfg, tuned, key.canonical())
            entry = kernel_entry(kernel, kp, key)
            cache.put(key.digest, entry)
            asts[kname] = ast
        else:
            kernel, kp = kernel_from_entry(entry, key, kname, g.names)
            mm = None
        kernels.append(kernel)
        plans.append(kp)
        mapped.append(mm)
    order = kernel_order(kernels)  # launches follow the buffers' dependences
    return (
        [kernels[i] for i in order],
        [plans[i] for i in order],
        [mapped[i] for i in order],
        asts,
    )


def _stitch(
    graph: Graph,
    part: Partition,
    scheduled: list[ScheduledMicrograph],
    device: DeviceSpec,
    cfg: MappingConfig,
    stitch: bool,
    cache: CompileCache,
    salt: str,
) -> tuple[list[KernelGroup], list[StitchDecision]]:
    """Step 4: Layer 2 memory stitching, then a GEMM's whole-row tile taking its row reduction."""
    groups, stitches = stitch_memory(
        graph, part, scheduled, device, enabled=stitch, cache=cache, salt=salt
    )
    if stitch:
        price = tensorized_price(graph, device)
        groups, row_stitches = stitch_gemm_rows(graph, groups, device, cfg, cache, salt, price)
        stitches = stitches + row_stitches
    return groups, stitches


def _moved(part: Partition, choice: EpilogueChoice) -> bool:
    """Whether ``part`` put the choice's elementwise part in its GEMM's micrograph."""
    return len({part.owner[p] for p in (*choice.moved, choice.gemm)}) == 1


def compile(  # noqa: A001
    inputs: Sequence[Tensor],
    outputs: Sequence[Tensor],
    arch: str = "sm_80",
    *,
    budget: int = DEFAULT_BUDGET,
    mapping: MappingConfig | None = None,
    check_cuda: bool | str = "auto",
    stitch: bool = True,
    pack: bool = True,
    constants: dict[Tensor, np.ndarray] | None = None,
    cache: CompileCache | None = None,
    name: str = "graph",
    passes: bool | Sequence[str] = True,
) -> CompiledGraph:
    """Compile the graph from ``inputs`` to ``outputs`` into CUDA kernels.

    ``budget`` bounds every isl scheduler call (operations); ``mapping`` sets launch-shape
    knobs; ``stitch`` enables Layer 2 memory stitching and two-stage long reductions;
    ``pack`` enables Layer 3 parallel stitching (independent kernels share one launch);
    ``check_cuda`` compiles the CUDA with NVRTC/nvcc for ``arch`` to fill in registers and
    shared memory per kernel ("auto": when a compiler is installed). ``constants`` binds
    placeholders to fixed arrays (weights): they are not call arguments. ``cache`` (a
    :class:`polyfuse.cache.CompileCache`, e.g. ``CompileCache.default()``) keeps schedules,
    stitch decisions and kernels by structural key across compiles; without one, identical
    layers are still scheduled and generated once per compile. ``fn.cache_stats`` has the hits.
    ``passes`` selects the graph passes run before partitioning (graph/passes/: CSE, constant
    and batch-norm folding, simplification, dead code): True all, False none, or a list of
    names; ``print(fn.plan)`` lists what they did.
    """
    if arch not in SUPPORTED_ARCHS:
        raise ExpressionError(
            f"compile: unknown arch '{arch}'; use one of {', '.join(SUPPORTED_ARCHS)}"
        )
    check_forced_tiling(mapping.mma_tile if mapping else None)
    check_split_k(mapping.split_k if mapping else None)
    inputs, outputs = list(inputs), list(outputs)
    consts = _check_constants(constants or {}, inputs)
    selected = check_passes(passes)
    check_codegen_dtypes([*inputs, *consts], outputs)
    times: dict[str, float] = {}
    t0 = time.perf_counter()
    ctx = configure(isl.Context())  # options every stage relies on, cached schedules or not
    graph = build_graph(inputs + list(consts), outputs, ctx, constants=consts)
    t1 = time.perf_counter()
    graph = run_passes(graph, selected, evaluate=_evaluate, arch=arch)
    times["passes"] = time.perf_counter() - t1
    device = device_for_arch(arch)
    cache = cache if cache is not None else CompileCache()
    hits0, misses0 = cache.hits, cache.misses
    cfg = mapping or MappingConfig()
    salt = f"polyfuse {__version__}|codegen {CODEGEN_REVISION}|{arch}"
    salt += f"|budget {budget}|{cfg}|stitch {stitch}"
    splits: list[Decided] = []  # reductions split across blocks or not (poly/split.py)
    graph_notes = split_long_reductions(graph, device, ReductionConfig(), splits) if stitch else []
    if stitch:  # float32 contractions summed in parts (split-K), decisions cached
        graph_notes += split_contractions(graph, device, mapping, splits, cache, salt)
    times["graph"] = time.perf_counter() - t0 - times["passes"]

    memo: dict[tuple[str, ...], ScheduledMicrograph] = {}
    separations: set[frozenset[str]] = set()
    schedule_args = (memo, ctx, budget, cache, salt, name)
    events: list[Feedback] = []
    times.update({"partition+schedule": 0.0, "stitch": 0.0, "map+place+codegen": 0.0})
    for _ in range(MAX_FEEDBACK_ROUNDS):
        try:
            fused = _fuse(
                graph, separations, schedule_args, device, cfg, stitch, cache, salt, times
            )
            part, scheduled, round_events, groups, stitches = fused
            events += round_events
            t0 = time.perf_counter()
            built = _kernels(graph, groups, device, cfg, cache, salt, arch)
            times["map+place+codegen"] += time.perf_counter() - t0
            break
        except Feedback as fb:  # placement over budget: split the micrograph, compile again
            events.append(fb)
            _separate(separations, fb)
    else:
        raise _not_converged(name, budget)
    kernels, plans, mapped, asts = built
    t0 = time.perf_counter()
    packs: list[PackDecision] = []
    if pack:  # Layer 3: independent kernels share one launch
        kernels, plans, mapped, packs = stitch_parallel(kernels, plans, mapped, device)
    functions = FunctionTable()  # identical kernels (and identical packs) share one function
    kernels = [functions.add(k) for k in kernels]
    body = functions.source()
    source = prelude_for(body) + "\n" + body
    times["pack"] = time.perf_counter() - t0

    buffers, launches = plan_buffers(graph, kernels)
    plan = Plan(
        name,
        graph,
        part,
        events,
        scheduled,
        mapped,
        plans,
        kernels,
        asts,
        times,
        stitches,
        graph_notes,
        packs,
        splits,
        f"{device}; figures: {device.figures}",
    )
    fn = CompiledGraph(
        name,
        arch,
        inputs,
        outputs,
        kernels,
        source,
        launches,
        buffers,
        plan,
        graph.idents,
        {graph.idents[u]: a for u, a in graph.constants.items()},
    )
    fn.cache_stats = {"hits": cache.hits - hits0, "misses": cache.misses - misses0}
    if check_cuda:
        fn.check_cuda(arch, required=check_cuda is True)
    return fn


def _evaluate(t: Tensor, feeds) -> np.ndarray:
    """A constant primitive's value for the graph passes, by ``polyfuse.reference``."""
    return evaluate([t], feeds)[0]


def _schedule(graph, mg, ctx, budget: int, cache: CompileCache, salt: str) -> ScheduledMicrograph:
    """The micrograph's schedule, from the cache (by structural key) or from isl."""
    key = structural_key(graph, mg.prims, f"{salt}|schedule")
    model = build_model(graph, mg, ctx)
    entry = cache.get(key.digest, SCHEDULE_FIELDS)
    back = {c: a for a, c in key.canonical().items()}
    if entry is not None:
        if "feedback" in entry:
            groups = [[back[p] for p in grp] for grp in entry["feedback"]]
            label = f"{mg.name} [{', '.join(mg.prims)}]"
            raise Feedback(label, entry["reason"], groups, entry.get("limit"))
        sm = ScheduledMicrograph(model, rename(entry["schedule"], back), notes=entry["notes"])
        return _gemm_epilogue_kept(sm, mg)
    canon = key.canonical()
    try:
        sm = compute_schedule(model, budget)
    except Feedback as fb:
        groups = [[canon[p] for p in grp] for grp in fb.groups]
        # remembered, the bound that stopped isl too: a group isl could not schedule in time
        # is split again without running isl again (in this compile and, on disk, later ones)
        cache.put(key.digest, {"feedback": groups, "reason": fb.reason, "limit": fb.limit})
        raise
    cache.put(key.digest, {"schedule": rename(str(sm.schedule), canon), "notes": list(sm.notes)})
    return _gemm_epilogue_kept(sm, mg)


def _gemm_epilogue_kept(sm: ScheduledMicrograph, mg) -> ScheduledMicrograph:
    """``sm``, or a :class:`Feedback` splitting off the part of its epilogue that keeps its
    contraction off the GEMM path (:func:`polyfuse.poly.tiling.epilogue_split`)."""
    split = epilogue_split(sm)
    if split is None:
        return sm
    label = f"{mg.name} [{', '.join(mg.prims)}]"
    raise Feedback(
        label,
        f"{split[1][0]} reads the contraction's result at other elements, so the GEMM path "
        "declines the fused micrograph; the contraction and its elementwise epilogue are "
        "tiled apart from the rest",
        split,
    )


def _tuned(cache: CompileCache, graph, g, prims: list[str], arch: str) -> dict | None:
    """The tiling ``polyfuse tune`` stored for this kernel group's micrograph, if any (only
    single micrographs with a reduction can be GEMM-like)."""
    if len(g.parts) != 1 or not any(s.role == "update" for s in g.parts[0].model.statements):
        return None
    return cache.peek(tune_key(graph, prims, arch, CODEGEN_REVISION), TUNE_FIELDS)


def _generate(
    graph,
    g,
    kname: str,
    device,
    cfg: MappingConfig,
    tuned: dict | None = None,
    canonical: dict[str, str] | None = None,
):
    """Plan (stitch stage: mapping, placement, recompute), then generate one kernel group
    (a cache miss). Code generation reads the plan only; the kernel is printed with the
    structural key's ``canonical`` names (what the cache stores) and instantiated.

    ``tuned``: the winner ``polyfuse tune`` measured for this micrograph (a cache entry); it
    replaces the cost model's ranking unless ``MappingConfig.gemm_tile`` forces a tiling.
    """
    if tuned is not None and cfg.gemm_tile is None:
        why = (
            f"tuned on {tuned['device']}: {tuned['measured_us']:.1f} us vs modelled best "
            f"{tuned['modelled_best_us']:.1f} us (polyfuse tune); tile sizes"
        )
        cfg = replace(cfg, gemm_tile=tuple(tuned["tile"]), gemm_tile_reason=why)
    kp = plan_kernel(graph, g, kname, device, cfg)
    kernel, ast = _lower(kp, graph.idents, canonical)
    return kernel, kp, kp.parts[0], ast


def _lower(
    kp: KernelPlan, idents: dict[int, str], canonical: dict[str, str] | None = None
) -> tuple[Kernel, isl.AstNode]:
    """The CUDA kernel of a planned kernel, with its notes and isl global footprint."""
    (mm,) = kp.parts
    pl = kp.placements
    if (gemm := lower_gemm(kp.name, mm, pl, idents, canonical)) is not None:
        # the GEMM path's own AST generator and lowering (promoted tiles, or mma.sync on
        # tensor cores); the footprint counts the promoted operands' global reads
        ast, kernel, notes, pl = gemm.ast, gemm.kernel, gemm.notes, gemm.footprint_placements
    else:
        ast, body = generate_ast(mm)
        kernel = lower_kernel(kp.name, mm, body, pl, idents, canonical)
        notes = mm.notes + [n for p in kp.micrograph_parts for n in p.notes]
        model = mm.scheduled.model
        block = block_read_bytes(model, mm.domain, mm.context, mm.block_params, pl)
        kernel = replace(kernel, block_read_bytes=block)
    fp = global_footprint(mm.scheduled.model, pl)
    kernel = replace(
        kernel,
        notes=[*notes, *kernel.notes],  # the mapping's, then lowering's (native pairs)
        bytes_read=sum(fp.reads.values()),
        bytes_written=sum(fp.writes.values()),
        tensor_bytes={
            t: (fp.reads.get(t, 0), fp.writes.get(t, 0)) for t in sorted({*fp.reads, *fp.writes})
        },
        reread_bytes=sum(p.reread * fp.reads.get(t, 0) for t, p in pl.items()),
    )
    if (vp := vector_plan(mm, pl)) is not None:  # float4 traffic, for the kernel time model
        vector = sum(fp.reads.get(t, 0) for t in vp.loads)
        vector += sum(fp.writes.get(t, 0) for t in vp.stores)
        kernel = replace(kernel, vector_bytes=vector)
    return kernel, ast
