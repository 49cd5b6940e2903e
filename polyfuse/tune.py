"""``polyfuse tune``: time the cost model's best GEMM tilings on a GPU and keep the winner.

For every GEMM-like micrograph of a model (identical layers once), the top ``K`` tilings of
:func:`polyfuse.poly.tiling.rank_gemm_tiles` — ordered by the cost model's *modelled* time
(:mod:`polyfuse.poly.costs`, each candidate described by its tile sizes) — are built into
kernels. With a GPU (the project's
runtime, :mod:`polyfuse.cuda.runtime`) each candidate is launched on zero-filled buffers:
``warmup`` launches, then ``reps`` launches timed one by one with events; its time is the
median. The fastest is stored in the compile cache under the micrograph's structure and the
arch (:func:`polyfuse.cache.tune_key`), and later compiles through that cache use it, saying so
in the plan ("tuned on <device>: X us vs modelled best Y us"). Without a GPU nothing is stored:
one line says so, the candidates are listed in the model's order with their modelled times and
what bounds each, and the modelled choice is kept.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import polyfuse
from polyfuse.base.decision import Refusal
from polyfuse.cache import CompileCache, tune_key
from polyfuse.cli_common import add_arch, add_common, non_negative_int, positive_int, write_json
from polyfuse.cuda.codegen.astgen import generate_gemm_ast
from polyfuse.cuda.codegen.lower import lower_gemm_kernel
from polyfuse.cuda.codegen.printer import prelude_for
from polyfuse.driver import CODEGEN_REVISION, SUPPORTED_ARCHS
from polyfuse.errors import DeviceError, PolyfuseError
from polyfuse.poly.device import device_for_arch
from polyfuse.poly.kernel_map import gemm_kernel_fitting
from polyfuse.poly.policy import FLOAT_BYTES, gemm_tile_budget
from polyfuse.poly.promote import gemm_placements, pipeline_stages
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles
from polyfuse.runner import load_source

DEFAULT_TOP = 4
DEFAULT_WARMUP = 3
DEFAULT_REPS = 20


class TuneError(PolyfuseError):
    """``polyfuse tune`` cannot run: unknown model, bad option."""


@dataclass
class Candidate:
    """One tiling of a micrograph: modelled and (with a GPU) measured time."""

    tile: tuple[int, int, int, int, int]  # (BM, BN, TM, TN, TK)
    modelled_us: float
    why: str = ""  # the cost model's account of the candidate (bound, occupancy, waves)
    source: str = ""  # CUDA of the candidate kernel (PRELUDE included)
    function: str = ""
    kernel: object = None
    measured_us: float | None = None


@dataclass
class Tuned:
    """The candidates of one GEMM-like micrograph and the winner."""

    micrograph: str
    key: str
    candidates: list[Candidate] = field(default_factory=list)
    winner: int = 0  # index into candidates (0: the modelled best)
    device: str = ""


def load_spec(spec: str, size: str = "full"):
    """``(inputs, outputs, constants, name)`` of a model argument (:mod:`polyfuse.models`: a
    built-in example, a zoo model at ``size``, an ``.onnx`` or ``.py`` file, module:function)."""
    from polyfuse.models import load_model

    try:
        m = load_model(spec, size)
    except PolyfuseError as e:
        raise TuneError(f"tune: {e}") from e
    return list(m.inputs), list(m.outputs), m.constants or None, m.name


def candidates(fn, arch: str, top: int) -> list[Tuned]:
    """The top ``top`` tilings of every GEMM-like micrograph of compiled graph ``fn``, each
    built into a kernel named ``pf_tune_<micrograph>_c<i>``."""
    graph = fn.plan.graph
    device = device_for_arch(arch)
    out: list[Tuned] = []
    seen: set[str] = set()
    for sm in fn.plan.scheduled:
        shape = detect_gemm(sm)
        if isinstance(shape, Refusal):
            continue
        prims = list(sm.model.micrograph.prims)
        key = tune_key(graph, prims, arch, CODEGEN_REVISION)
        if key in seen:  # identical layers are tuned once
            continue
        seen.add(key)
        tuned = Tuned(sm.model.micrograph.name, key)
        stages = pipeline_stages(arch)
        for tiling in rank_gemm_tiles(shape, device, limit=top, stages=stages):
            gk = gemm_kernel_fitting(sm, shape, tiling, device)
            if isinstance(gk, Refusal):
                continue
            if FLOAT_BYTES * sum(p.floats for p in gk.promotions) * gk.stages > gemm_tile_budget(
                device
            ):
                continue
            name = f"pf_tune_{prims[0]}_c{len(tuned.candidates)}"
            _, body = generate_gemm_ast(gk)
            kernel = lower_gemm_kernel(name, gk, body, gemm_placements(gk), graph.idents)
            assert tiling.choice is not None
            tuned.candidates.append(
                Candidate(
                    tiling.choice,
                    tiling.modelled_us,
                    _modelled_note(tiling.reasons),
                    prelude_for(kernel.source) + "\n" + kernel.source,
                    name,
                    kernel,
                )
            )
        if tuned.candidates:
            out.append(tuned)
    return out


def _modelled_note(reasons: list[str]) -> str:
    """The cost model's line of a tiling's reasons: what bounds it, its occupancy, waves."""
    line = next((r for r in reasons if ": modelled " in r and " us (" in r), "")
    return line.split(" us (", 1)[1].rsplit(") on ", 1)[0] if line else ""


def time_candidate(device, fn, c: Candidate, warmup: int, reps: int) -> float:
    """Median time in microseconds of ``reps`` launches of candidate ``c`` on ``device``."""
    drv = device.driver
    module = load_source(device, c.source)
    func = module.function(c.function)
    k = c.kernel
    ptrs = []
    try:
        for p in k.params:
            n = int(np.prod(_shape(fn, p.tensor or p.name))) * 4
            ptr = device.alloc(n)
            drv.memcpy_htod(ptr, np.zeros(n // 4, np.float32), 0)
            ptrs.append(ptr)
        params = drv.pack(func, [("ptr", ptr) for ptr in ptrs])
        stream = drv.stream_create()
        start, end = drv.event_create(timing=True), drv.event_create(timing=True)
        for _ in range(warmup):
            drv.launch(func, k.grid, k.block, k.dynamic_shared_bytes, stream, params)
        times = []
        for _ in range(reps):
            drv.event_record(start, stream)
            drv.launch(func, k.grid, k.block, k.dynamic_shared_bytes, stream, params)
            drv.event_record(end, stream)
            drv.event_synchronize(end)
            times.append(drv.event_elapsed_ms(start, end) * 1e3)
        drv.stream_synchronize(stream)
        drv.event_destroy(start)
        drv.event_destroy(end)
        drv.stream_destroy(stream)
        return statistics.median(times)
    finally:
        for ptr in ptrs:
            device.free(ptr)


def _shape(fn, name: str) -> tuple[int, ...]:
    for sm in fn.plan.scheduled:
        role = sm.model.tensors.get(name)
        if role is not None:
            return tuple(role.shape)
    raise TuneError(f"tune: tensor '{name}' not found in the plan")


def tune(
    spec: str,
    arch: str = "sm_80",
    *,
    top: int = DEFAULT_TOP,
    cache: CompileCache | None = None,
    runtime: str | None = None,
    warmup: int = DEFAULT_WARMUP,
    reps: int = DEFAULT_REPS,
    say: Callable[[str], None] = print,
    size: str = "full",
) -> list[Tuned]:
    """Tune every GEMM-like micrograph of ``spec`` (see the module doc); returns what was
    found and, with a GPU, measured and stored in ``cache`` (default: the persistent one)."""
    if arch not in SUPPORTED_ARCHS:
        raise TuneError(f"tune: unknown arch '{arch}'; use one of {', '.join(SUPPORTED_ARCHS)}")
    if top < 1 or reps < 1 or warmup < 0:
        raise TuneError("tune: --top and --reps must be at least 1, --warmup at least 0")
    inputs, outputs, constants, name = load_spec(spec, size)
    fn = polyfuse.compile(inputs, outputs, arch, constants=constants, check_cuda=False, name=name)
    found = candidates(fn, arch, top)
    if not found:
        say(f"tune {name}: no GEMM-like micrograph to tune")
        return found
    device = _open_gpu(runtime, say)
    cache = cache if cache is not None else CompileCache.default()
    for t in found:
        best = t.candidates[0].modelled_us
        if device is not None:
            t.device = device.name
            for c in t.candidates:
                c.measured_us = time_candidate(device, fn, c, warmup, reps)
            t.winner = min(range(len(t.candidates)), key=lambda i: t.candidates[i].measured_us)
            w = t.candidates[t.winner]
            cache.put(
                t.key,
                {
                    "tile": list(w.tile),
                    "device": device.name,
                    "measured_us": w.measured_us,
                    "modelled_us": w.modelled_us,
                    "modelled_best_us": best,
                    "candidates": [
                        [list(c.tile), c.modelled_us, c.measured_us] for c in t.candidates
                    ],
                },
            )
        say(_format(t, arch))
    return found


def _open_gpu(runtime: str | None, say: Callable[[str], None]):
    from polyfuse.cuda.runtime.device import open_device

    try:
        return open_device(0, runtime)
    except DeviceError as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        say(f"tune: no GPU present ({msg}); keeping the cost model's choice (nothing stored)")
        return None


def _format(t: Tuned, arch: str) -> str:
    head = f"{t.micrograph} ({arch})"
    if t.device:
        head += f": tuned on {t.device}, winner candidate {t.winner + 1} stored"
    else:
        head += ": modelled choice kept (candidate 1)"
    lines = [head]
    for i, c in enumerate(t.candidates):
        bm, bn, tm, tn, tk = c.tile
        measured = f"  measured {c.measured_us:9.2f} us" if c.measured_us is not None else ""
        mark = "*" if i == t.winner else " "
        why = f" [{c.why}]" if c.why and not t.device else ""
        lines.append(
            f" {mark} {i + 1}. block {bm}x{bn}, micro-tile {tm}x{tn}, k-tile {tk}: "
            f"modelled {c.modelled_us:10.3f} us{measured}{why}"
        )
    if not t.device:
        lines.append("   (modelled by the cost model, polyfuse.poly.costs: no GPU measured these)")
    return "\n".join(lines)


# --------------------------------------------------------------------------- command line


def add_tune_parser(sub) -> None:
    """Register ``polyfuse tune`` on the ``polyfuse`` subparsers."""
    t = sub.add_parser(
        "tune",
        help="time the best GEMM tilings on a GPU and store the winner in the compile cache",
        description="For every GEMM-like micrograph of MODEL, build the cost model's top "
        "tilings, time them on the GPU (warm-up, median) and store the fastest in the "
        "compile cache (keyed by the micrograph's structure and the arch); later compiles "
        "through that cache use it. Without a GPU: prints the modelled candidates and keeps "
        "the modelled choice (exit 0).",
    )
    t.add_argument(
        "model",
        metavar="MODEL",
        help="a built-in example, a zoo model, an .onnx or .py file, or module:function",
    )
    add_arch(t)
    t.add_argument(
        "--top",
        type=positive_int,
        default=DEFAULT_TOP,
        help=f"candidates per micrograph (default: {DEFAULT_TOP})",
    )
    t.add_argument(
        "--warmup",
        type=non_negative_int,
        default=DEFAULT_WARMUP,
        help=f"untimed launches (default: {DEFAULT_WARMUP})",
    )
    t.add_argument(
        "--reps",
        type=positive_int,
        default=DEFAULT_REPS,
        help=f"timed launches, median taken (default: {DEFAULT_REPS})",
    )
    t.add_argument(
        "--runtime",
        choices=("cuda-bindings", "pycuda"),
        help="CUDA runtime (default: whichever is installed)",
    )
    add_common(t, size=True, json="every micrograph's candidates and winner")
    t.set_defaults(func=run_tune)


def run_tune(args) -> int:
    found = tune(
        args.model,
        args.arch,
        top=args.top,
        runtime=args.runtime,
        warmup=args.warmup,
        reps=args.reps,
        size=args.size,
    )
    write_json(args, {"arch": args.arch, "micrographs": [_tuned_json(t) for t in found]})
    return 0


def _tuned_json(t: Tuned) -> dict:
    """One micrograph's candidates and winner as JSON values."""
    cands = [
        {"tile": list(c.tile), "modelled_us": c.modelled_us, "measured_us": c.measured_us}
        for c in t.candidates
    ]
    return {"micrograph": t.micrograph, "winner": t.winner, "device": t.device, "candidates": cands}
