"""Per-kernel SASS analysis: hot loop, resources, occupancy, issue-bound time, float4 check.

:func:`analyse` compiles one CUDA translation unit with NVRTC/nvcc for each arch (with
``-lineinfo``, which leaves the SASS unchanged and lets nvdisasm name each instruction's source
line), disassembles the cubin (:mod:`.tools`), parses it (:mod:`.parse`), finds each kernel's
hot loop (:mod:`.loops`) and returns a :class:`SassReport` of :class:`KernelSass` records —
printable, and ``to_dict()`` for JSON.

The issue-bound estimate (:func:`estimate`) is a model, not a measurement: the busiest SM runs
``ceil(blocks / SMs)`` blocks, each of ``warps`` warps executing the kernel's per-thread slots
(its costliest path from entry to exit, every loop at its trip count); the SM issues
``schedulers`` warp instructions per clock, its FP32 lanes retire ``lanes / 32``
FFMA/FMUL/FADD per clock, its shared memory moves 128 bytes per clock. The time is the
largest of the three, at the clock :mod:`polyfuse.poly.device` gives (measured-derived where
the GPU was measured) — the cost model's SM-local bounds
(:func:`polyfuse.poly.costs.model.sm_bounds_us`); the full model, with DRAM, L2, latency and
launch, is :func:`polyfuse.cuda.codegen.kernel_cost.describe_sass` +
:func:`polyfuse.poly.costs.model_kernel`. Every assumption is listed with the figure.

With the kernel IR (a compiled graph's kernels) the float4 check of :mod:`.vector` runs too.
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse.base.errors import PolyfuseError
from polyfuse.cuda.codegen.kernel_ast import Kernel, KNode
from polyfuse.cuda.codegen.kernel_dispatch import KDispatch
from polyfuse.cuda.toolchain.compiler import KernelResources, compile_cuda
from polyfuse.cuda.toolchain.sass.loops import body_mix, find_loops, hot_loop
from polyfuse.cuda.toolchain.sass.mix import InstrMix
from polyfuse.cuda.toolchain.sass.parse import SassFunction, parse_listing
from polyfuse.cuda.toolchain.sass.records import (
    Estimate,
    KernelSass,
    Launch,
    SassReport,
    VectorAccess,
    VectorCheck,
)
from polyfuse.cuda.toolchain.sass.tools import Disassembler, find_disassembler
from polyfuse.cuda.toolchain.sass.vector import VECTOR_RE, vector_check
from polyfuse.poly.costs.model import sm_bounds_us
from polyfuse.poly.device import DeviceSpec, Occupancy, device_for_arch, occupancy

__all__ = [
    "DEFAULT_ARCHS",
    "Estimate",
    "KernelSass",
    "Launch",
    "SassReport",
    "VectorAccess",
    "VectorCheck",
    "analyse",
    "analyse_function",
    "estimate",
    "vector_check",
]

DEFAULT_ARCHS = ("sm_80", "sm_90")
#: Compile options of the instrument: line info only (the SASS is the same as without).
OPTIONS = ("-lineinfo",)


def estimate(
    per_thread: InstrMix, launch: Launch, occ: Occupancy, device: DeviceSpec
) -> Estimate | None:
    """The issue-bound time of a launch whose threads each execute ``per_thread`` (None when
    one block does not fit an SM)."""
    if occ.blocks_per_sm == 0:
        return None
    warps = -(-launch.threads // 32)
    per_sm = -(-launch.blocks // device.sms)
    # the cost model's SM-local bounds (polyfuse.poly.costs), every warp issuing each clock
    sm = sm_bounds_us(per_thread.cost_mix(), launch.blocks, launch.threads, occ, device)
    bounds = {k: sm[k] for k in ("issue", "FP32 pipe", "tensor pipe", "shared memory")}
    bound = max(bounds, key=lambda k: bounds[k])
    waves = launch.blocks / (occ.blocks_per_sm * device.sms)
    assumptions = [
        f"{device.name}: {device.sms} SMs, {device.issue_figures}",
        f"issue: {device.schedulers_per_sm} warp instructions per clock per SM; FP32 pipe: "
        f"{device.fp32_lanes_per_sm // 32} warp FFMA/FMUL/FADD per clock per SM; tensor pipe: "
        f"{device.mma_tflops:g} TFLOP/s of mma.sync on the device; shared "
        f"memory: {device.smem_bytes_per_clock} B per clock per SM, no bank conflicts",
        f"blocks spread evenly: the busiest SM runs ceil({launch.blocks}/{device.sms}) = "
        f"{per_sm} blocks of {warps} warps, {per_thread.total:.0f} slots per thread",
        "each loop iteration along its costliest path (uniform branches: one arm; a "
        "diverged warp runs both); "
        "enough warps resident to issue every clock; no DRAM, latency or launch cost",
    ]
    return Estimate(bounds[bound], bound, bounds, per_sm, waves, assumptions)


def analyse_function(
    fn: SassFunction,
    *,
    kernel: str | None = None,
    resources: KernelResources | None = None,
    launch: Launch | None = None,
    device: DeviceSpec | None = None,
    source: str | None = None,
    body: Sequence[KNode] | None = None,
) -> KernelSass:
    """Analyse one parsed SASS function (the pieces :func:`analyse` gathers per kernel)."""
    device = device or device_for_arch(fn.arch)
    loops = find_loops(fn)
    hot = hot_loop(fn, loops)
    notes: list[str] = []
    per_thread = body_mix(fn, loops, notes)
    occ = None
    est = None
    threads = launch.threads if launch else None
    if threads and resources is not None:
        smem = resources.shared_bytes + (launch.dynamic_smem if launch else 0)
        occ = occupancy(device, threads, max(1, resources.registers), smem)
    if launch is not None and occ is not None:
        est = estimate(per_thread, launch, occ, device)
        if est is not None:
            est.assumptions += notes
        else:
            notes.append("one block does not fit an SM: no estimate")
    elif launch is None:
        notes.append("no launch shape (grid, block): no occupancy or estimate")
    parts = [p for n in body or () if isinstance(n, KDispatch) for p in n.parts]
    if len(parts) > 1:
        notes.append(
            f"Layer 3 pack of {len(parts)} parts: each block runs one; per thread, the "
            "costliest part is counted"
        )
    check = None
    if source is not None and (body is not None or VECTOR_RE.search(source)):
        check = vector_check(fn, source, body or ())
    return KernelSass(
        kernel or fn.name,
        fn.name,
        fn.arch,
        resources,
        launch,
        occ,
        hot,
        loops,
        per_thread,
        est,
        check,
        notes,
        fn,
    )


def analyse(
    source: str,
    archs: Sequence[str] = DEFAULT_ARCHS,
    *,
    kernels: Sequence[Kernel] = (),
    launch: Launch | None = None,
    name: str = "",
    disassembler: Disassembler | None = None,
) -> SassReport:
    """Compile ``source`` for each of ``archs`` and analyse every kernel (see the module doc).

    ``kernels``: the compiled graph's kernel records (launch shape, IR, function name); each
    becomes one :class:`KernelSass` per arch. Without them every ``__global__`` function of
    the cubin is analysed, under ``launch`` when given. Raises
    :class:`~polyfuse.cuda.toolchain.sass.tools.DisassemblerNotFound` without a disassembler."""
    dis = disassembler or find_disassembler()
    out: list[KernelSass] = []
    compilers: dict[str, str] = {}
    for arch in archs:
        binary = compile_cuda(source, arch, options=OPTIONS)
        compilers[arch] = f"{binary.compiler} {binary.compiler_version}"
        functions = parse_listing(dis.disassemble(binary.image), arch)
        device = device_for_arch(arch)
        todo: list[tuple[str, str, Launch | None, Sequence[KNode] | None]] = [
            (
                k.name,
                k.function or k.name,
                # the cubin holds the static arrays: the launch adds the dynamic bytes only
                Launch(tuple(k.grid), tuple(k.block), k.dynamic_shared_bytes),  # type: ignore[arg-type]
                k.body,
            )
            for k in kernels
        ] or [(f, f, launch, None) for f in functions if f in binary.resources]
        for kname, fname, shape, body in todo:
            if fname not in functions:
                raise PolyfuseError(
                    f"sass: kernel '{kname}': function '{fname}' is not in the {arch} cubin"
                )
            out.append(
                analyse_function(
                    functions[fname],
                    kernel=kname,
                    resources=binary.resources.get(fname),
                    launch=shape,
                    device=device,
                    source=source,
                    body=body,
                )
            )
    return SassReport(name, out, str(dis), compilers)
