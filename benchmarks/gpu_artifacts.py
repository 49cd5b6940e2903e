"""``--prepare``: compile the GPU benchmark's cases here (islpy, NVRTC) and write their
artifacts — CUDA source, cubin, launches, buffers, ptxas resources, byte/FLOP counts — to
``DIR/manifest.json``, which the GPU machine reads without the compiler."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gpu_cases import COMPUTE, SUITE, _compute_args, _flops

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
#: The graph whose per-call host overhead --overhead measures: the attention example.
OVERHEAD_CASE = "overhead_attention4"
FORMAT = 1


@dataclass
class KernelInfo:
    name: str
    grid: list[int]
    block: list[int]
    shared_bytes: int
    registers: int | None
    spill_bytes: int | None
    kind: str  # "gemm" | "reduction" | "stitched" | "elementwise"


@dataclass
class CaseArtifact:
    """One prepared case (an entry of ``manifest.json``)."""

    name: str
    source: str  # file names inside DIR
    cubin: str
    arch: str
    launches: list[dict]
    buffers: list[dict]
    inputs: list[str]  # buffer names, call order
    input_names: list[str]
    input_shapes: list[list[int]]
    positive_inputs: list[str]  # drawn as |normal| (Adam's second moments)
    outputs: list[str]
    output_names: list[str]
    kernels: list[KernelInfo]
    compulsory_bytes: int
    distinct_bytes: int  # isl footprints of all kernels
    flops: float
    compile_seconds: float
    scale: int = 1
    config: dict = field(default_factory=dict)


def kernel_kind(fn: Any, kernel: Any) -> str:
    """GEMM-like (a contraction: an opaque reduction primitive), a reduction, a stitched
    reduction (several micrographs), or elementwise/layout — from the plan's op kinds."""
    plan, graph = fn.plan, fn.plan.graph
    by_name = {m.name: m for m in plan.micrographs}
    prims = [p for m in kernel.micrographs if m in by_name for p in by_name[m].prims]
    kinds = [graph.prims[p] for p in prims if p in graph.prims]
    if any(p.kind.value == "opaque" and p.is_reduction for p in kinds):
        return "gemm"
    if any(p.is_reduction for p in kinds):
        return "stitched" if len(kernel.micrographs) > 1 else "reduction"
    return "elementwise"


def _build_case(name: str, scale: int):
    """(inputs, outputs, positive input names, config) of a case at ``scale``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import suite

    from polyfuse import examples

    if name in SUITE:
        inputs, outputs, _ = suite.build(name, scale)
        positive = [t.name for t in inputs if name == "adam3" and t.name.startswith("v")]
        return inputs, outputs, positive, {"scale": scale}
    args = _compute_args(name, scale)
    inputs, outputs, _ = getattr(examples, COMPUTE[name][0])(**args)
    return inputs, outputs, [], args


def compile_case(
    directory: Path,
    name: str,
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    arch: str,
    positive: Sequence[str] = (),
    config: dict | None = None,
    scale: int = 1,
) -> CaseArtifact:
    """Compile one graph for ``arch``; write its source and cubin; return its entry."""
    import polyfuse
    from polyfuse.cuda.compiler import compile_cuda

    config = dict(config or {})
    t0 = time.perf_counter()
    fn = polyfuse.compile(inputs, outputs, arch=arch)
    seconds = time.perf_counter() - t0
    binary = compile_cuda(fn.cuda_source, arch, output="cubin")
    (directory / f"{name}.cu").write_text(fn.cuda_source)
    (directory / f"{name}.{arch}.cubin").write_bytes(binary.image)
    idents = fn._idents
    kernels = []
    for k in fn.kernels:
        r = binary.resources.get(k.function or k.name)
        spill = (r.spill_stores + r.spill_loads) if r else None
        kind = kernel_kind(fn, k)
        regs = r.registers if r else None
        kernels.append(
            KernelInfo(k.name, list(k.grid), list(k.block), k.shared_bytes, regs, spill, kind)
        )
    launches = [
        {
            "kernel": lc.kernel,
            "function": lc.function,  # the shared __global__ it runs (kernel dedup)
            "grid": list(lc.grid),
            "block": list(lc.block),
            "shared_bytes": lc.shared_bytes,
            "args": [
                a if isinstance(a, str) else {"value": a.value, "ctype": a.ctype} for a in lc.args
            ],
        }
        for lc in fn.launches
    ]
    return CaseArtifact(
        name=name,
        source=f"{name}.cu",
        cubin=f"{name}.{arch}.cubin",
        arch=arch,
        launches=launches,
        buffers=[asdict(b) for b in fn.buffers],
        inputs=[idents[t.uid] for t in fn.inputs],
        input_names=[t.name for t in fn.inputs],
        input_shapes=[list(t.shape) for t in fn.inputs],
        positive_inputs=list(positive),
        outputs=[idents[t.uid] for t in fn.outputs],
        output_names=[t.name for t in fn.outputs],
        kernels=kernels,
        compulsory_bytes=fn.compulsory_bytes(),
        distinct_bytes=fn.global_bytes(),
        flops=_flops(name, config),
        compile_seconds=seconds,
        scale=scale,
        config=config,
    )


def prepare(
    directory: Path, cases: Sequence[str], arch: str, scale: int = 1, overhead: bool = True
) -> dict:
    """Compile ``cases`` (and the 4-kernel overhead graph) for ``arch`` into ``directory``;
    write and return the manifest."""
    from polyfuse import examples

    directory.mkdir(parents=True, exist_ok=True)
    arts = []
    for name in cases:
        inputs, outputs, positive, config = _build_case(name, scale)
        art = compile_case(directory, name, inputs, outputs, arch, positive, config, scale)
        arts.append(art)
        spills = sum(k.spill_bytes or 0 for k in art.kernels)
        print(
            f"prepared {name:22s} {len(art.kernels)} kernels  {art.compile_seconds:6.2f} s  "
            f"regs {[k.registers for k in art.kernels]}  spills {spills} B",
            flush=True,
        )
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "arch": arch,
        "scale": scale,
        "commit": _commit(),
        "cases": [asdict(a) for a in arts],
    }
    if overhead:
        inputs, outputs, _ = examples.attention()
        art = compile_case(directory, OVERHEAD_CASE, inputs, outputs, arch)
        manifest["overhead"] = asdict(art)
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def _commit() -> str:
    try:
        import subprocess

        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except Exception:
        return "?"


def load_manifest(directory: Path) -> dict:
    manifest = json.loads((directory / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise SystemExit(f"{directory}: manifest format {manifest.get('format')} != {FORMAT}")
    for case in [*manifest["cases"], *([manifest["overhead"]] if "overhead" in manifest else [])]:
        case["kernels"] = [KernelInfo(**k) for k in case["kernels"]]
    return manifest
