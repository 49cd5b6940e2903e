"""``--prepare``: compile the GPU benchmark's cases here (islpy, NVRTC) and save each as a
polyfuse artifact (``fn.save``: CUDA source, cubin for ``--arch``, launches, buffers, plan
summary, versions, checksums) with the extra facts the benchmark needs in its metadata — FLOPs,
compulsory and distinct bytes, each kernel's kind, the inputs drawn positive, the compile time.
The GPU machine reads them back with :func:`load_cases` (``polyfuse.load``: the runtime alone,
no islpy)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_cases import CONFIGURED, SUITE, _compute_args, _example, _flops

ROOT = Path(__file__).resolve().parents[1]
#: The graph whose per-call host overhead --overhead measures: the attention example.
OVERHEAD_CASE = "overhead_attention4"
#: ``metadata["benchmark"]`` of the artifacts --prepare writes (other artifacts are ignored).
BENCHMARK = "polyfuse-gpu"


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
class PreparedCase:
    """One prepared case: its artifact (a :class:`polyfuse.artifact.LoadedGraph`) and the
    benchmark's metadata saved in it."""

    graph: Any
    path: Path

    @property
    def meta(self) -> dict[str, Any]:
        return self.graph.metadata

    @property
    def name(self) -> str:
        return self.meta["case"]

    @property
    def arch(self) -> str:
        return self.meta["arch"]

    @property
    def input_names(self) -> list[str]:
        return [t.name for t in self.graph.inputs]

    @property
    def input_shapes(self) -> list[tuple[int, ...]]:
        return [t.shape for t in self.graph.inputs]

    @property
    def inputs(self) -> list[str]:
        """Buffer names of the inputs, call order (the keys of a DeviceProgram call)."""
        return self.graph.input_buffers

    @property
    def outputs(self) -> list[str]:
        return self.graph.output_buffers

    @property
    def output_shapes(self) -> list[tuple[int, ...]]:
        return [t.shape for t in self.graph.outputs]

    @property
    def positive_inputs(self) -> list[str]:
        return self.meta["positive_inputs"]

    @property
    def compulsory_bytes(self) -> int:
        return self.meta["compulsory_bytes"]

    @property
    def flops(self) -> float:
        return self.meta["flops"]

    @property
    def input_dtypes(self) -> list[str]:
        return [str(t.dtype) for t in self.graph.inputs]

    @property
    def output_dtypes(self) -> list[str]:
        return [str(t.dtype) for t in self.graph.outputs]

    @property
    def math(self) -> str:
        """What bounds the case's FLOPs: ``fp32`` (CUDA cores), ``bf16`` or ``tf32``."""
        return self.meta.get("math", "fp32")

    @property
    def peers(self) -> list[str] | None:
        """The peers this case is timed beside (None: every peer asked for)."""
        return self.meta.get("peers")

    @property
    def kernels(self) -> list[KernelInfo]:
        """Per kernel: launch shape, shared memory, the cubin's ptxas registers and spills."""
        binary = self.graph.binaries.get(self.arch)
        out = []
        for k in self.graph.kernels:
            r = binary.resources.get(k.function or k.name) if binary else None
            spill = (r.spill_stores + r.spill_loads) if r else None
            out.append(
                KernelInfo(
                    k.name,
                    list(k.grid),
                    list(k.block),
                    k.shared_bytes,
                    r.registers if r else None,
                    spill,
                    self.meta["kernel_kinds"][k.name],
                )  # fmt: skip
            )
        return out


@dataclass
class Prepared:
    """Every prepared case of a directory, in preparation order, and the overhead graph."""

    directory: Path
    cases: list[PreparedCase]
    overhead: PreparedCase | None

    @property
    def arch(self) -> str:
        return self.cases[0].arch if self.cases else "?"

    @property
    def commit(self) -> str:
        return self.cases[0].meta.get("commit", "?") if self.cases else "?"


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


def _matmul(m: int, k: int, n: int, dtype: str = "float32") -> tuple[list, list, None]:
    """A plain ``a @ w`` (the tensor-core cases' cuBLAS comparison)."""
    from polyfuse import ops, te

    a = te.placeholder((m, k), dtype, name="a")
    w = te.placeholder((k, n), dtype, name="w")
    return [a, w], [ops.matmul(a, w, name="matmul")], None


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
    example = _example(name)[0]
    build = _matmul if example == "matmul" else getattr(examples, example)
    dtype = {"dtype": CONFIGURED[name].dtype} if name in CONFIGURED else {}
    inputs, outputs, _ = build(**args, **dtype)
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
    order: int = 0,
    passes: bool = True,
    mapping: Any = None,
) -> PreparedCase:
    """Compile one graph for ``arch`` and save it as ``DIR/<name>.pfa`` (cubin for ``arch``);
    ``passes``: run the graph passes (``polyfuse.compile(passes=)``); ``mapping``: a
    ``MappingConfig`` (default: the compiler's)."""
    import polyfuse

    config = dict(config or {})
    extra: dict[str, Any] = {}
    if name in CONFIGURED and mapping is None:
        from polyfuse.poly.mapping import MappingConfig

        tc = CONFIGURED[name]
        mapping = MappingConfig(**tc.mapping)
        extra = {"math": tc.math, "peers": list(tc.peers), "mapping": dict(tc.mapping)}
    t0 = time.perf_counter()
    fn = polyfuse.compile(inputs, outputs, arch=arch, passes=passes, mapping=mapping)
    seconds = time.perf_counter() - t0
    meta = {
        "benchmark": BENCHMARK,
        "case": name,
        "order": order,
        "arch": arch,
        "positive_inputs": list(positive),
        "kernel_kinds": {k.name: kernel_kind(fn, k) for k in fn.kernels},
        "compulsory_bytes": fn.compulsory_bytes(),
        "distinct_bytes": fn.global_bytes(),  # isl footprints of all kernels
        "flops": _flops(name, config),
        "compile_seconds": seconds,
        "scale": scale,
        "config": config,
        "commit": _commit(),
        **extra,
    }
    path = fn.save(directory / f"{name}.pfa", archs=[arch], metadata=meta)
    return PreparedCase(polyfuse.load(path), path)


def prepare(
    directory: Path, cases: Sequence[str], arch: str, scale: int = 1, overhead: bool = True
) -> Prepared:
    """Compile ``cases`` (and the 4-kernel overhead graph) for ``arch`` into ``directory``,
    one artifact each; return them as :func:`load_cases` reads them."""
    from polyfuse import examples

    directory.mkdir(parents=True, exist_ok=True)
    arts = []
    for i, name in enumerate(cases):
        inputs, outputs, positive, config = _build_case(name, scale)
        art = compile_case(directory, name, inputs, outputs, arch, positive, config, scale, i)
        arts.append(art)
        kernels = art.kernels
        spills = sum(k.spill_bytes or 0 for k in kernels)
        print(
            f"prepared {name:22s} {len(kernels)} kernels  {art.meta['compile_seconds']:6.2f} s  "
            f"regs {[k.registers for k in kernels]}  spills {spills} B",
            flush=True,
        )
    over = None
    if overhead:
        inputs, outputs, _ = examples.attention()
        # without the graph passes (whose layout fold takes its transpose into the GEMM) and
        # the GEMM + row stitch (which joins the scores GEMM and its softmax): the same
        # 4-kernel graph every GPU day has timed
        from polyfuse.poly.mapping import MappingConfig

        over = compile_case(
            directory,
            OVERHEAD_CASE,
            inputs,
            outputs,
            arch,
            order=len(cases),
            passes=False,
            mapping=MappingConfig(gemm_rows=False),
        )
    return Prepared(directory, arts, over)


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


def import_polyfuse() -> Any:
    """``polyfuse``, installed (on the GPU machine: the carried wheel, :mod:`gpu_day`).
    Importing it imports no compiler (no islpy): ``polyfuse.load`` and the runtime need only
    numpy and a driver."""
    try:
        import polyfuse
    except ModuleNotFoundError:
        raise SystemExit(
            "polyfuse is not installed here: pip install the carried wheel "
            "(DIR/wheels/polyfuse-*.whl, --prepare-all) or `pip install -e .` in the checkout"
        ) from None
    return polyfuse


def load_cases(directory: Path) -> Prepared:
    """The cases ``--prepare`` saved in ``directory`` (``polyfuse.load``, no islpy needed);
    a damaged or other-version artifact stops with polyfuse's one-line reason."""
    polyfuse = import_polyfuse()
    from polyfuse.errors import ArtifactError

    found = []
    for path in sorted(directory.glob("*.pfa")):
        try:
            graph = polyfuse.load(path)
        except ArtifactError as e:
            raise SystemExit(f"{e}") from None
        if graph.metadata.get("benchmark") == BENCHMARK:
            found.append(PreparedCase(graph, path))
    if not found:
        raise SystemExit(f"{directory}: no prepared cases (*.pfa): run --prepare {directory}")
    found.sort(key=lambda c: c.meta["order"])
    cases = [c for c in found if c.name != OVERHEAD_CASE]
    over = next((c for c in found if c.name == OVERHEAD_CASE), None)
    return Prepared(directory, cases, over)
