"""polyfuse's generated kernels on a real GPU, beside PyTorch eager, torch.compile and JAX.

Compile here, run there: the lent GPU machines have torch, CuPy, JAX and NVIDIA's
cuda-bindings but no islpy (the compiler) and no network. So the benchmark has two halves:

``python benchmarks/gpu.py --prepare DIR [--arch sm_90] [--cases ...] [--scale N]``
    (any machine with polyfuse) compiles every case — the 12 suite subgraphs of
    ``benchmarks/suite.py`` and the compute cases of ``../shared/bench/gpu/README.md`` — and
    writes, per case, the CUDA source, the cubin for ``--arch`` (NVRTC), the launches, the
    buffer specs, ptxas resources and the byte/FLOP counts to ``DIR/manifest.json``. Inputs are
    not stored (full-size inputs are hundreds of MB): they are drawn on the GPU machine from a
    seed. ``DIR`` stays small (a few hundred KB) so it can be carried to the GPU machine.
``python benchmarks/gpu.py --run DIR [--out FILE]``
    (the GPU machine) imports only numpy, cuda-bindings (through polyfuse's runtime,
    :mod:`polyfuse.cuda.runtime`, which needs neither islpy nor the rest of the compiler),
    torch, and JAX/triton when present. It measures the two ceilings (device-to-device copy
    bandwidth, cuBLAS FP32 rate with TF32 off), then per case: draws the inputs, computes the
    float64 reference (the peer's computation in torch float64), runs polyfuse's kernels
    through the runtime on torch tensors (no copies; CUDA graph replay), checks the relative
    L2 error and that a second run is bit-identical, and times polyfuse, torch eager,
    torch.compile (Inductor) and JAX (XLA) on the same float32 inputs. Prints a table and
    writes JSON (default ``benchmarks/results/gpu.json``).
``python benchmarks/gpu.py --overhead DIR``
    (GPU machine) the per-call host overhead of the runtime on a 4-kernel graph (the
    attention example), with and without CUDA graphs, for numpy and torch arguments.
``python benchmarks/gpu.py --models [--size full|tiny] [--out FILE]``
    (GPU machine *with islpy*, e.g. a carried wheel) compiles BERT-base, GPT-2 small,
    ResNet-50 and ViT-B/16 from ``polyfuse.zoo`` for the GPU's arch and runs them beside the
    same definitions in PyTorch (:mod:`polyfuse.torch.zoo`, same weights) eager and under
    torch.compile: relative error against float64, median ms, and where polyfuse's time goes
    by kernel class (GEMM-like / reductions / elementwise+layout / launch gaps).

Timing: ``triton.testing.do_bench`` (median, L2 flushed before each repetition) where triton
exists, else CUDA events around each repetition after a 256 MB L2 flush, median of the
repetitions; JAX by host clock around repeated calls with ``block_until_ready`` (its own
stream; L2 not flushed). TF32 off everywhere. ``floor_ms = max(compulsory bytes / measured
copy bandwidth, FLOPs / measured cuBLAS FP32 rate)``.

Tested without a GPU (tests/test_gpu_benchmark.py): artifacts prepared at a small
``--scale`` run through the runtime on a fake GPU driver (kernels in the CPU emulator) and
match the peers' float64 results, so the peers compute what polyfuse computes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MANIFEST = "manifest.json"
#: The graph whose per-call host overhead --overhead measures: the attention example.
OVERHEAD_CASE = "overhead_attention4"
FORMAT = 1

LN_EPS = BN_EPS = 1e-5
RMS_EPS = 1e-6
ADAM = {"step": 10, "lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8}


# ============================================================================================
# Peers: each case's computation, once, over an array namespace (torch or jax.numpy)
# ============================================================================================


class Ops:
    """The few operations whose spelling differs between torch and jax.numpy."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "torch":
            import torch

            self.m = torch
        else:
            import jax
            import jax.numpy as jnp

            self.m, self.jax = jnp, jax

    def mean(self, x, axis, keepdims=True):
        if self.kind == "torch":
            return self.m.mean(x, dim=axis, keepdim=keepdims)
        return self.m.mean(x, axis=axis, keepdims=keepdims)

    def sum(self, x, axis, keepdims=False):
        if self.kind == "torch":
            return self.m.sum(x, dim=axis, keepdim=keepdims)
        return self.m.sum(x, axis=axis, keepdims=keepdims)

    def max(self, x, axis, keepdims=True):
        if self.kind == "torch":
            return self.m.amax(x, dim=axis, keepdim=keepdims)
        return self.m.max(x, axis=axis, keepdims=keepdims)

    def erf(self, x):
        return self.m.erf(x) if self.kind == "torch" else self.jax.scipy.special.erf(x)

    def sigmoid(self, x):
        return self.m.sigmoid(x) if self.kind == "torch" else self.jax.nn.sigmoid(x)

    def relu(self, x):
        return self.m.relu(x) if self.kind == "torch" else self.m.maximum(x, 0.0)

    def softmax(self, x, axis=-1):
        e = self.m.exp(x - self.max(x, axis))
        return e / self.sum(e, axis, keepdims=True)

    def swap_last(self, x):
        return x.transpose(-1, -2) if self.kind == "torch" else self.m.swapaxes(x, -1, -2)

    def conv2d(self, x, w, padding):
        if self.kind == "torch":
            return self.m.nn.functional.conv2d(x, w, padding=padding)
        return self.jax.lax.conv_general_dilated(
            x, w, (1, 1), [(padding, padding)] * 2, dimension_numbers=("NCHW", "OIHW", "NCHW")
        )


def _ln(o: Ops, x, g, b):
    m = o.mean(x, -1)
    d = x - m
    return d / o.m.sqrt(o.mean(d * d, -1) + LN_EPS) * g + b


def _gelu_erf(o: Ops, u):
    return 0.5 * u * (1.0 + o.erf(u * (1.0 / math.sqrt(2.0))))


def _adam3(o: Ops, *a):
    bc1 = 1.0 - ADAM["b1"] ** ADAM["step"]
    bc2 = 1.0 - ADAM["b2"] ** ADAM["step"]
    out = []
    for j in range(3):
        p, g, m, v = a[4 * j : 4 * j + 4]
        m2 = m * ADAM["b1"] + g * (1.0 - ADAM["b1"])
        v2 = v * ADAM["b2"] + g * g * (1.0 - ADAM["b2"])
        p2 = p - (m2 / bc1) / (o.m.sqrt(v2 / bc2) + ADAM["eps"]) * ADAM["lr"]
        out += [p2, m2, v2]
    return tuple(out)


def _lstm(o: Ops, gates, c):
    hd = c.shape[-1]
    i, f, g, out = (gates[:, j * hd : (j + 1) * hd] for j in range(4))
    c2 = o.sigmoid(f) * c + o.sigmoid(i) * o.m.tanh(g)
    return o.sigmoid(out) * o.m.tanh(c2), c2


def _batchnorm(o: Ops, x, gamma, beta):
    mu = o.mean(x, (0, 2, 3))
    d = x - mu
    var = o.mean(d * d, (0, 2, 3))
    return o.relu(d / o.m.sqrt(var + BN_EPS) * gamma + beta), mu, var


def _attention(o: Ops, q, k, v):
    scale = 1.0 / math.sqrt(q.shape[-1])
    return o.softmax(q @ o.swap_last(k) * scale) @ v


#: case name -> peer function ``(ops, *inputs) -> output or tuple of outputs``.
PEERS: dict[str, Callable[..., Any]] = {
    "layernorm": lambda o, x, g, b: _ln(o, x, g, b),
    "layernorm_lib": lambda o, x, g, b: _ln(o, x, g, b),
    "softmax": lambda o, x: o.softmax(x),
    "log_softmax": lambda o, x: (
        (x - o.max(x, -1)) - o.m.log(o.sum(o.m.exp(x - o.max(x, -1)), -1, keepdims=True))
    ),
    "bias_gelu_tanh": lambda o, x, b: (
        lambda u: 0.5 * u * (1.0 + o.m.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u * u * u)))
    )(x + b),
    "residual_layernorm": lambda o, x, r, g, b: _ln(o, x + r, g, b),
    "attn_softmax": lambda o, s, mask: o.softmax(s * 0.125 + mask),
    "lstm_cell": _lstm,
    "batchnorm_train_relu": _batchnorm,
    "adam3": _adam3,
    "two_branches": lambda o, x1, x2: (o.relu(x1 * 2.0 + 1.0), o.sum(x2 * x2, -1)),
    "rmsnorm_swiglu": lambda o, x, w, a, b: (
        x / o.m.sqrt(o.mean(x * x, -1) + RMS_EPS) * w,
        a * o.sigmoid(a) * b,
    ),
    "ffn_up_gelu": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "matmul_4096": lambda o, a, w, bias: _gelu_erf(o, a @ w + bias),
    "conv3x3_relu": lambda o, x, w, bias: o.relu(o.conv2d(x, w, 1) + bias[None, :, None, None]),
    "attention_s128": _attention,
    "attention_s512": _attention,
}

SUITE = (
    "layernorm",
    "layernorm_lib",
    "softmax",
    "log_softmax",
    "bias_gelu_tanh",
    "residual_layernorm",
    "attn_softmax",
    "lstm_cell",
    "batchnorm_train_relu",
    "adam3",
    "two_branches",
    "rmsnorm_swiglu",
)
#: The compute cases of ../shared/bench/gpu/README.md: (example, arguments at full size).
COMPUTE: dict[str, tuple[str, dict[str, int]]] = {
    "ffn_up_gelu": ("matmul_bias_gelu", {"m": 8192, "k": 768, "n": 3072}),
    "matmul_4096": ("matmul_bias_gelu", {"m": 4096, "k": 4096, "n": 4096}),
    "conv3x3_relu": ("conv2d_relu", {"batch": 32, "channels": 64, "size": 56, "filters": 64}),
    "attention_s128": ("attention", {"batch": 16, "heads": 12, "seq": 128, "dim": 64}),
    "attention_s512": ("attention", {"batch": 8, "heads": 12, "seq": 512, "dim": 64}),
}
CASES = (*SUITE, *COMPUTE)


def _compute_args(name: str, scale: int) -> dict[str, int]:
    """A compute case's example arguments; ``scale`` divides the batch-like dimension."""
    example, args = COMPUTE[name]
    args = dict(args)
    key = {"matmul_bias_gelu": "m", "conv2d_relu": "batch", "attention": "batch"}[example]
    args[key] = max(1, args[key] // scale)
    if example == "attention" and scale > 1:
        args["heads"] = max(1, args["heads"] // 4)
    return args


def _flops(name: str, args: dict[str, int]) -> float:
    """Multiply-add FLOPs of a compute case (2 per MAC); 0 for the memory-bound suite."""
    if name not in COMPUTE:
        return 0.0
    example = COMPUTE[name][0]
    if example == "matmul_bias_gelu":
        return 2.0 * args["m"] * args["k"] * args["n"]
    if example == "conv2d_relu":
        s = args["size"]
        return 2.0 * args["batch"] * args["filters"] * s * s * args["channels"] * 9
    b, h, s, d = args["batch"], args["heads"], args["seq"], args["dim"]
    return 2.0 * 2.0 * b * h * s * s * d


# ============================================================================================
# --prepare: compile here, write the artifacts
# ============================================================================================


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


# ============================================================================================
# The runtime without the compiler (no islpy on the GPU machine)
# ============================================================================================


def import_runtime() -> types.ModuleType:
    """``polyfuse.cuda.runtime`` — without running ``polyfuse/__init__`` (which imports the
    compiler, hence islpy) when islpy is missing: the runtime needs only numpy and a driver."""
    try:
        import islpy  # noqa: F401

        import polyfuse.cuda.runtime as runtime

        return runtime
    except ImportError:
        pass
    # package shells without their __init__ (which would import the compiler); the runtime
    # reads only isl-free modules of them (cuda/runtime, cuda/compiler, poly/policy, poly/device)
    shells = (
        ("polyfuse", ROOT / "polyfuse"),
        ("polyfuse.cuda", ROOT / "cuda"),
        ("polyfuse.poly", ROOT / "poly"),
    )
    for name, path in shells:
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(path)]  # type: ignore[attr-defined]
            sys.modules[name] = module
    import polyfuse.cuda.runtime as runtime

    return runtime


def case_program(
    device: Any, directory: Path, case: dict, *, graphs: bool = True, image: str = "cubin"
) -> Any:
    """The prepared case as a :class:`DeviceProgram` on ``device`` (``image="source"`` loads
    the CUDA source as the module image: the tests' fake driver runs it in the emulator)."""
    runtime = import_runtime()
    from polyfuse.cuda.compiler import CudaBinary
    from polyfuse.cuda.launch import Launch, ScalarArg

    data = (directory / case[image]).read_bytes()
    binary = CudaBinary(case["arch"], "nvrtc", "cubin", data, None, {}, "", 0.0)
    module = device.load_binary(binary)
    launches = [
        Launch(
            lc["kernel"],
            tuple(lc["grid"]),
            tuple(lc["block"]),
            tuple(
                a if isinstance(a, str) else ScalarArg(a["value"], a["ctype"]) for a in lc["args"]
            ),
            lc["shared_bytes"],
            lc.get("function", ""),
        )
        for lc in case["launches"]
    ]
    buffers = [types.SimpleNamespace(**b) for b in case["buffers"]]
    for b in buffers:
        b.shape = tuple(b.shape)
    labels = dict(zip(case["inputs"], case["input_names"], strict=True))
    labels.update(zip(case["outputs"], case["output_names"], strict=True))
    return runtime.DeviceProgram(
        device,
        module,
        launches,
        buffers,
        case["inputs"],
        case["outputs"],
        labels=labels,
        graphs=graphs,
        name=case["name"],
    )


def draw_inputs(case: dict, seed: int = 0) -> list[np.ndarray]:
    """The case's float32 inputs: standard normal, |normal| for Adam's second moments."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape in zip(case["input_names"], case["input_shapes"], strict=True):
        a = rng.standard_normal(tuple(shape), dtype=np.float32)
        out.append(np.abs(a) if name in case["positive_inputs"] else a)
    return out


def rel_err(got: Any, want: Any) -> float:
    """‖got − want‖ / ‖want‖ in float64 (inf for NaN or a shape mismatch)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return math.inf
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))


# ============================================================================================
# Timing
# ============================================================================================


def bench(fn: Callable[[], Any], warmup_ms: float = 50, rep_ms: float = 200) -> float:
    """Median milliseconds of ``fn`` on the GPU (L2 flushed before each repetition)."""
    import torch

    try:
        from triton.testing import do_bench

        return float(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    except ImportError:
        pass
    flush = torch.empty(64 * 1024 * 1024, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / est))):
        fn()
    times = []
    for _ in range(max(10, int(rep_ms / est))):
        flush.zero_()
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return float(statistics.median(times))


def bench_host(fn: Callable[[], Any], sync: Callable[[], Any], reps: int = 20) -> float:
    """Median ms of ``fn`` by host clock (JAX: its own stream), each call synchronised."""
    fn()
    sync()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / reps * 1e3)
    return float(statistics.median(times))


def ceilings() -> dict[str, float]:
    """Measured device-to-device copy bandwidth (bytes read + written) and cuBLAS FP32 rate."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    a = torch.empty(256 * 1024 * 1024, dtype=torch.float32, device="cuda").normal_()
    b = torch.empty_like(a)
    t_copy = bench(lambda: b.copy_(a))
    n = 8192
    x = torch.randn(n, n, device="cuda")
    y = torch.randn(n, n, device="cuda")
    t_mm = bench(lambda: x @ y, rep_ms=500)
    return {
        "copy_bytes_per_s": 2 * 256 * 1024 * 1024 * 4 / (t_copy * 1e-3),
        "fp32_flops_per_s": 2.0 * n**3 / (t_mm * 1e-3),
    }


# ============================================================================================
# --run
# ============================================================================================


@dataclass
class CaseResult:
    name: str
    kernels: int
    polyfuse_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None
    xla_ms: float | None = None
    floor_ms: float | None = None
    rel_err: float | None = None
    rerun_identical: bool | None = None
    peer_rel_err: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def best_peer(self) -> float | None:
        peers = [t for t in (self.eager_ms, self.inductor_ms, self.xla_ms) if t]
        return min(peers) if peers else None


def _peer_outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def run_case(
    device: Any,
    directory: Path,
    case: dict,
    ceil: dict[str, float] | None,
    peers: Sequence[str],
    seed: int = 0,
) -> CaseResult:
    """Check and time one prepared case on the GPU (torch tensors through the runtime)."""
    import torch

    res = CaseResult(case["name"], len(case["kernels"]))
    arrays = draw_inputs(case, seed)
    xs = [torch.from_numpy(a).cuda() for a in arrays]
    peer = PEERS[case["name"]]
    tops = Ops("torch")
    with torch.no_grad():
        ref = [r.cpu().numpy() for r in _peer_outputs(peer(tops, *[x.double() for x in xs]))]
    prog = case_program(device, directory, case)
    args = dict(zip(case["inputs"], xs, strict=True))
    outs = {
        n: torch.full(tuple(r.shape), float("nan"), device="cuda")
        for n, r in zip(case["outputs"], ref, strict=True)
    }
    got = prog(args, outs)
    torch.cuda.synchronize()
    first = [g.cpu().numpy() for g in got]
    res.rel_err = max(rel_err(g, r) for g, r in zip(first, ref, strict=True))
    for o in outs.values():
        o.fill_(float("nan"))
    again = [g.cpu().numpy() for g in prog(args, outs)]
    res.rerun_identical = all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    res.polyfuse_ms = bench(lambda: prog(args, outs))
    if "eager" in peers:
        with torch.no_grad():
            out = _peer_outputs(peer(tops, *xs))
            res.peer_rel_err["eager"] = max(
                rel_err(o.cpu().numpy(), r) for o, r in zip(out, ref, strict=True)
            )
            res.eager_ms = bench(lambda: peer(tops, *xs))
    if "inductor" in peers:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(lambda *a: peer(tops, *a))
            with torch.no_grad():
                compiled(*xs)
                res.inductor_ms = bench(lambda: compiled(*xs))
        except Exception as e:  # report, keep going
            res.notes.append(f"inductor: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if "jax" in peers:
        try:
            import jax

            jops = Ops("jax")
            jf = jax.jit(lambda *a: peer(jops, *a))
            js = [jax.device_put(a) for a in arrays]
            res.xla_ms = bench_host(
                lambda: jf(*js), lambda: jax.block_until_ready(jf(*js)), reps=20
            )
        except Exception as e:
            res.notes.append(f"jax: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if ceil:
        res.floor_ms = 1e3 * max(
            case["compulsory_bytes"] / ceil["copy_bytes_per_s"],
            case["flops"] / ceil["fp32_flops_per_s"],
        )
    prog.close()
    return res


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(results: Sequence[CaseResult], cases: dict[str, dict]) -> None:
    print(
        "| case | kernels | polyfuse ms | eager | inductor | xla | floor | polyfuse / best peer "
        "| polyfuse / floor | rel_err | rerun identical | regs (spill B) |"
    )
    print("|---" * 12 + "|")
    for r in results:
        best = r.best_peer
        regs = ", ".join(
            f"{k.registers}({k.spill_bytes})" for k in cases[r.name]["kernels"] if k.registers
        )
        print(
            f"| {r.name} | {r.kernels} | {_fmt(r.polyfuse_ms)} | {_fmt(r.eager_ms)} | "
            f"{_fmt(r.inductor_ms)} | {_fmt(r.xla_ms)} | {_fmt(r.floor_ms)} | "
            f"{_fmt(r.polyfuse_ms / best if r.polyfuse_ms and best else None, 2)} | "
            f"{_fmt(r.polyfuse_ms / r.floor_ms if r.polyfuse_ms and r.floor_ms else None, 2)} | "
            f"{r.rel_err:.1e} | {r.rerun_identical} | {regs} |"
        )
        for n in r.notes:
            print(f"    note: {n}")


def _device_description() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"torch": torch.__version__}
    props = torch.cuda.get_device_properties(0)
    info.update(name=props.name, sms=props.multi_processor_count, memory=props.total_memory)
    for mod in ("triton", "jax", "cupy", "cuda.bindings"):
        try:
            m = __import__(mod, fromlist=["__version__"])
            info[mod] = getattr(m, "__version__", "?")
        except Exception:
            info[mod] = None
    return info


def run(directory: Path, out: Path, peers: Sequence[str], cases: Sequence[str] | None) -> None:
    """Measure the ceilings, then check and time every prepared case; print and write JSON."""
    runtime = import_runtime()
    manifest = load_manifest(directory)
    device = runtime.open_device(0)
    print(f"device: {device} driver {device.driver_version()}", flush=True)
    if device.arch != manifest["arch"]:
        print(f"warning: cubins are for {manifest['arch']}, the device is {device.arch}")
    ceil = ceilings()
    print(
        f"ceilings: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, cuBLAS FP32 "
        f"{ceil['fp32_flops_per_s'] / 1e12:.1f} TFLOP/s",
        flush=True,
    )
    selected = [c for c in manifest["cases"] if not cases or c["name"] in cases]
    results = []
    for case in selected:
        try:
            r = run_case(device, directory, case, ceil, peers)
        except Exception as e:  # one broken case must not hide the others
            r = CaseResult(case["name"], len(case["kernels"]), notes=[f"{type(e).__name__}: {e}"])
            r.rel_err = math.inf
        results.append(r)
        print(
            f"  {r.name}: polyfuse {_fmt(r.polyfuse_ms)} ms, best peer {_fmt(r.best_peer)} ms, "
            f"rel_err {r.rel_err:.1e}",
            flush=True,
        )
    print_table(results, {c["name"]: c for c in selected})
    report = {
        "device": _device_description(),
        "runtime": device.driver.name,
        "manifest_commit": manifest["commit"],
        "arch": manifest["arch"],
        "ceilings": ceil,
        "timing": "triton do_bench median, L2 flushed (fallback: CUDA events + 256 MB flush); "
        "JAX host clock",
        "results": [asdict(r) | {"best_peer_ms": r.best_peer} for r in results],
        "kernels": {c["name"]: [asdict(k) for k in c["kernels"]] for c in selected},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


# ============================================================================================
# --overhead: host cost per call of a 4-kernel graph
# ============================================================================================


def overhead(directory: Path, calls: int = 3000) -> dict[str, float]:
    """Microseconds of host time per call of the attention example (4 kernels)."""
    import torch

    runtime = import_runtime()
    manifest = load_manifest(directory)
    case = manifest["overhead"]
    device = runtime.open_device(0)
    arrays = draw_inputs(case)
    figures: dict[str, float] = {}
    for graphs in (True, False):
        prog = case_program(device, directory, case, graphs=graphs)
        xs = [torch.from_numpy(a).cuda() for a in arrays]
        args = dict(zip(case["inputs"], xs, strict=True))
        shapes = [
            tuple(b["shape"]) for n in case["outputs"] for b in case["buffers"] if b["name"] == n
        ]
        outs = {
            n: torch.empty(s, device="cuda") for n, s in zip(case["outputs"], shapes, strict=True)
        }
        host_args = dict(zip(case["inputs"], arrays, strict=True))
        for label, call in (
            ("torch", lambda a=args, o=outs, p=prog: p(a, o)),
            ("numpy", lambda a=host_args, p=prog: p(a)),
        ):
            for _ in range(50):
                call()
            torch.cuda.synchronize()
            n = calls if label == "torch" else calls // 10
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            torch.cuda.synchronize()
            us = (time.perf_counter() - t0) / n * 1e6
            figures[f"{label}, CUDA graphs {'on' if prog.graphs else 'off'}"] = us
        gpu_ms = bench(lambda p=prog, a=args, o=outs: p(a, o))
        figures[f"GPU time per call (graphs {'on' if prog.graphs else 'off'}), us"] = gpu_ms * 1e3
        prog.close()
    print("| per-call time, 4-kernel graph (attention example) | µs |")
    print("|---|---|")
    for k, v in figures.items():
        print(f"| {k} | {v:.1f} |")
    return figures


# ============================================================================================
# --models: whole zoo models (needs the compiler, i.e. islpy, on the GPU machine)
# ============================================================================================

MODELS = ("bert_base", "gpt2_small", "resnet50", "vit_b16")


def _run_model(name: str, size: str, device: Any, peers: Sequence[str]) -> dict[str, Any]:
    """One zoo model: compile, check against float64, time beside its PyTorch twin, and
    split polyfuse's time by kernel class (per-launch CUDA-event times; the rest is gaps)."""
    import torch

    import polyfuse
    from polyfuse.torch.zoo import torch_model

    row: dict[str, Any] = {}
    module, model = torch_model(name, size)
    t0 = time.perf_counter()
    fn = polyfuse.compile(model.inputs, model.outputs, arch=device.arch, constants=model.constants)
    row["compile_s"] = time.perf_counter() - t0
    row["kernels"] = len(fn.kernels)
    xs = [torch.from_numpy(a).cuda() for a in model.sample_inputs()]
    module = module.cuda()
    with torch.no_grad():
        ref = [r.cpu().numpy() for r in module.double()(*[x.double() for x in xs])]
        module = module.float()
        got = fn(*xs, device="cuda")
        got = got if isinstance(got, tuple) else (got,)
        row["rel_err"] = max(rel_err(g.cpu().numpy(), r) for g, r in zip(got, ref, strict=True))
        outs = [torch.empty_like(g) for g in got]
        row["polyfuse_ms"] = bench(lambda: fn(*xs, device="cuda", out=outs))
        eager = [o.cpu().numpy() for o in module(*xs)]
        row["eager_rel_err"] = max(rel_err(e, r) for e, r in zip(eager, ref, strict=True))
        if "eager" in peers:
            row["eager_ms"] = bench(lambda: module(*xs))
        if "inductor" in peers:
            torch._dynamo.reset()
            compiled = torch.compile(module)
            compiled(*xs)
            row["inductor_ms"] = bench(lambda: compiled(*xs))
    prog = fn.device_program("cuda")
    per_launch = prog.time_launches(repeats=5)
    kind_of = {k.name: kernel_kind(fn, k) for k in fn.kernels}
    by_kind: dict[str, float] = {}
    for launch, ms in zip(prog.launches, per_launch, strict=True):
        kind = {"stitched": "reductions", "reduction": "reductions"}.get(
            kind_of[launch.kernel], kind_of[launch.kernel]
        )
        by_kind[kind] = by_kind.get(kind, 0.0) + ms
    by_kind["launch gaps"] = max(0.0, row["polyfuse_ms"] - sum(per_launch))
    row["breakdown_ms"] = by_kind
    return row


def run_models(size: str, out: Path, names: Sequence[str], peers: Sequence[str]) -> None:
    """Compile and run the zoo models on the GPU beside their PyTorch twins (same weights)."""
    import torch

    from polyfuse.cuda.runtime import open_device

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = open_device(0)
    print(f"device: {device}", flush=True)
    rows = []
    for name in names:
        row: dict[str, Any] = {"model": name, "size": size}
        try:
            row.update(_run_model(name, size, device, peers))
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        rows.append(row)
        print(json.dumps(row, default=str), flush=True)
    print(
        "| model | kernels | polyfuse ms | eager | inductor | polyfuse / best | rel_err | "
        "GEMM-like | reductions | elementwise | launch gaps |"
    )
    print("|---" * 11 + "|")
    for r in rows:
        best = min([r[k] for k in ("eager_ms", "inductor_ms") if r.get(k)] or [math.nan])
        b = r.get("breakdown_ms", {})
        p = r.get("polyfuse_ms")
        print(
            f"| {r['model']} | {r.get('kernels', '-')} | {_fmt(p, 2)} | "
            f"{_fmt(r.get('eager_ms'), 2)} | {_fmt(r.get('inductor_ms'), 2)} | "
            f"{_fmt(p / best if p else None, 2)} | "
            f"{r.get('rel_err', math.inf):.1e} | {_fmt(b.get('gemm'), 2)} | "
            f"{_fmt(b.get('reductions'), 2)} | {_fmt(b.get('elementwise'), 2)} | "
            f"{_fmt(b.get('launch gaps'), 2)} |"
        )
        if "error" in r:
            print(f"    error: {r['error']}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps({"device": _device_description(), "models": rows}, indent=1, default=str)
    )
    print(f"wrote {out}")


# ============================================================================================
# CLI
# ============================================================================================


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--prepare", type=Path, metavar="DIR", help="compile the cases into DIR")
    mode.add_argument("--run", type=Path, metavar="DIR", help="check and time DIR on the GPU")
    mode.add_argument("--overhead", type=Path, metavar="DIR", help="host overhead per call")
    mode.add_argument("--models", action="store_true", help="whole zoo models (needs islpy)")
    p.add_argument("--arch", default="sm_90")
    p.add_argument("--cases", nargs="*", default=None, help=f"default: all of {', '.join(CASES)}")
    p.add_argument("--scale", type=int, default=1, help="divide the non-reduced sizes (tests)")
    p.add_argument("--peers", default="eager,inductor,jax")
    p.add_argument("--size", default="full", choices=("full", "tiny"))
    p.add_argument("--model-names", nargs="*", default=list(MODELS))
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    peers = [s for s in args.peers.split(",") if s]
    if args.prepare:
        cases = args.cases or list(CASES)
        prepare(args.prepare, cases, args.arch, args.scale)
        print(f"wrote {args.prepare / MANIFEST} ({len(cases)} cases)")
    elif args.run:
        run(args.run, args.out or RESULTS / "gpu.json", peers, args.cases)
    elif args.overhead:
        figures = overhead(args.overhead)
        if args.out:
            args.out.write_text(json.dumps(figures, indent=1))
    else:
        run_models(args.size, args.out or RESULTS / "gpu_models.json", args.model_names, peers)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
