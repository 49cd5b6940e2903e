"""The GPU machine's half of the benchmark: the runtime without the compiler, timing, ``--run``
(check and time every prepared case beside the peers) and ``--overhead`` (host cost per call)."""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
import types
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gpu_artifacts import ROOT, PreparedCase, import_polyfuse, load_cases
from gpu_cases import PEERS, Ops


def import_runtime() -> types.ModuleType:
    """``polyfuse.cuda.runtime``: ``import polyfuse`` imports the compiler (islpy) only when a
    compiler name is first used, so the runtime and ``polyfuse.load`` need only numpy and a
    driver (tests/test_gpu_benchmark.py holds it)."""
    import_polyfuse()
    import polyfuse.cuda.runtime as runtime

    return runtime


def case_program(device: Any, case: PreparedCase, *, graphs: bool = True) -> Any:
    """The prepared case as a :class:`DeviceProgram` on ``device``: the runtime loads the
    artifact's cubin for the device's arch (the fake driver runs its CUDA source instead)."""
    return case.graph.device_program(device, graphs=graphs)


def draw_inputs(case: PreparedCase, seed: int = 0) -> list[np.ndarray]:
    """The case's inputs as float32 arrays: standard normal, |normal| for Adam's second
    moments, rounded to each input's dtype (a bfloat16 input holds bfloat16 values, so the
    float64 reference starts from what the kernels read); :func:`typed` stores them."""
    rng = np.random.default_rng(seed)
    out = []
    for name, shape, dtype in zip(
        case.input_names, case.input_shapes, case.input_dtypes, strict=True
    ):
        a = rng.standard_normal(tuple(shape), dtype=np.float32)
        a = np.abs(a) if name in case.positive_inputs else a
        out.append(typed(a, dtype).astype(np.float32) if dtype != "float32" else a)
    return out


def typed(a: np.ndarray, dtype: str) -> np.ndarray:
    """``a`` stored as ``dtype`` (bfloat16 through ml_dtypes)."""
    if dtype == "bfloat16":
        import ml_dtypes

        return a.astype(ml_dtypes.bfloat16)
    return a.astype(dtype)


def torch_dtype(dtype: str) -> Any:
    import torch

    return getattr(torch, dtype)


def rel_err(got: Any, want: Any) -> float:
    """‖got − want‖ / ‖want‖ in float64 (inf for NaN or a shape mismatch)."""
    g = np.asarray(got, np.float64)
    w = np.asarray(want, np.float64)
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return math.inf
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-300))


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
    """Measured device-to-device copy bandwidth (bytes read + written) and cuBLAS's 8192³
    rates: FP32 (TF32 off), TF32 and bf16 (tensor cores; the tensor-core cases' floors)."""
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
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        t_tf32 = bench(lambda: x @ y, rep_ms=300)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False
    xb, yb = x.bfloat16(), y.bfloat16()
    t_bf16 = bench(lambda: xb @ yb, rep_ms=300)
    return {
        "launch_ms": launch_ms(),
        "copy_bytes_per_s": 2 * 256 * 1024 * 1024 * 4 / (t_copy * 1e-3),
        "fp32_flops_per_s": 2.0 * n**3 / (t_mm * 1e-3),
        "tf32_flops_per_s": 2.0 * n**3 / (t_tf32 * 1e-3),
        "bf16_flops_per_s": 2.0 * n**3 / (t_bf16 * 1e-3),
    }


def launch_ms() -> float:
    """Median ms of a CUDA graph of one 1-element kernel timed like every case (``bench``):
    the launch, the first DRAM access and the timing's own cost, which every case and peer
    pays once per launch and the floor leaves out."""
    import torch

    tiny = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tiny.add_(1)  # warm-up off the capture stream, as torch.cuda.graphs asks
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tiny.add_(1)
    return bench(graph.replay)


def _floor_ms(case: PreparedCase, ceil: dict[str, float]) -> float:
    """max(compulsory bytes / copy rate, FLOPs / cuBLAS's rate in the case's math)."""
    rate = ceil.get(f"{case.math}_flops_per_s", ceil["fp32_flops_per_s"])
    return 1e3 * max(case.compulsory_bytes / ceil["copy_bytes_per_s"], case.flops / rate)


@dataclass
class CaseResult:
    name: str
    kernels: int
    polyfuse_ms: float | None = None
    eager_ms: float | None = None
    inductor_ms: float | None = None
    xla_ms: float | None = None
    floor_ms: float | None = None
    #: one empty launch timed the same way (:func:`launch_ms`): ``floor_ms + launch_ms`` is
    #: what a single-kernel case can reach at best
    launch_ms: float | None = None
    rel_err: float | None = None
    rerun_identical: bool | None = None
    peer_rel_err: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    #: each launch's median time, timed apart with CUDA events (what the cost model's
    #: per-kernel figures are checked against: benchmarks/tensor_model.py)
    kernel_ms: list[float] = field(default_factory=list)

    @property
    def best_peer(self) -> float | None:
        peers = [t for t in (self.eager_ms, self.inductor_ms, self.xla_ms) if t]
        return min(peers) if peers else None


def _peer_outputs(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def run_case(
    device: Any,
    case: PreparedCase,
    ceil: dict[str, float] | None,
    peers: Sequence[str],
    seed: int = 0,
) -> CaseResult:
    """Check and time one prepared case on the GPU (torch tensors through the runtime)."""
    import torch

    res = CaseResult(case.name, len(case.kernels))
    if case.peers is not None:
        peers = [p for p in peers if p in case.peers]
    # a tf32 case's peers run in TF32 too (cuBLAS TF32 is what it is compared with)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = case.math == "tf32"
    try:
        return _run_case(device, case, ceil, peers, seed, res)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def _host(t: Any) -> np.ndarray:
    """A torch tensor as a float32 (or wider) numpy array on the host."""
    import torch

    return (t.float() if t.dtype in (torch.bfloat16, torch.float16) else t).cpu().numpy()


def _run_case(
    device: Any,
    case: PreparedCase,
    ceil: dict[str, float] | None,
    peers: Sequence[str],
    seed: int,
    res: CaseResult,
) -> CaseResult:
    import torch

    arrays = draw_inputs(case, seed)
    xs = [
        torch.from_numpy(a).cuda().to(torch_dtype(d))
        for a, d in zip(arrays, case.input_dtypes, strict=True)
    ]
    peer = PEERS[case.name]
    tops = Ops("torch")
    with torch.no_grad():
        ref = [r.cpu().numpy() for r in _peer_outputs(peer(tops, *[x.double() for x in xs]))]
    prog = case_program(device, case)
    args = dict(zip(case.inputs, xs, strict=True))
    outs = {
        n: torch.full(tuple(r.shape), float("nan"), device="cuda", dtype=torch_dtype(d))
        for n, r, d in zip(case.outputs, ref, case.output_dtypes, strict=True)
    }
    got = prog(args, outs)
    torch.cuda.synchronize()
    first = [_host(g) for g in got]
    res.rel_err = max(rel_err(g, r) for g, r in zip(first, ref, strict=True))
    for o in outs.values():
        o.fill_(float("nan"))
    again = [_host(g) for g in prog(args, outs)]
    res.rerun_identical = all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    res.polyfuse_ms = bench(lambda: prog(args, outs))
    try:
        res.kernel_ms = prog.time_launches(repeats=10)
    except Exception as e:  # report, keep going: the call's time is what the day needs
        res.notes.append(f"per-kernel times: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if "eager" in peers:
        with torch.no_grad():
            out = _peer_outputs(peer(tops, *xs))
            res.peer_rel_err["eager"] = max(
                rel_err(_host(o), r) for o, r in zip(out, ref, strict=True)
            )
            res.eager_ms = bench(lambda: peer(tops, *xs))
    if "inductor" in peers:
        try:
            torch._dynamo.reset()
            compiled = torch.compile(lambda *a: peer(tops, *a))
            with torch.no_grad():
                out = _peer_outputs(compiled(*xs))
                res.peer_rel_err["inductor"] = max(
                    rel_err(_host(o), r) for o, r in zip(out, ref, strict=True)
                )
                res.inductor_ms = bench(lambda: compiled(*xs))
        except Exception as e:  # report, keep going
            res.notes.append(f"inductor: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if "jax" in peers:
        try:
            import jax

            jops = Ops("jax")
            jf = jax.jit(lambda *a: peer(jops, *a))
            js = [jax.device_put(a) for a in arrays]
            out = _peer_outputs(jf(*js))
            res.peer_rel_err["xla"] = max(
                rel_err(np.asarray(o), r) for o, r in zip(out, ref, strict=True)
            )
            res.xla_ms = bench_host(
                lambda: jf(*js), lambda: jax.block_until_ready(jf(*js)), reps=20
            )
        except Exception as e:
            res.notes.append(f"jax: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
    if ceil:
        res.floor_ms = _floor_ms(case, ceil)
        res.launch_ms = ceil.get("launch_ms")
    prog.close()
    return res


def over_launch(ms: float | None, floor: float | None, launch: float | None) -> float | None:
    """``ms`` over the floor plus one empty launch (None where one is unknown)."""
    return ms / (floor + launch) if ms and floor and launch else None


def _fmt(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def print_table(results: Sequence[CaseResult], cases: dict[str, PreparedCase]) -> None:
    print(
        "| case | kernels | polyfuse ms | eager | inductor | xla | floor | polyfuse / best peer "
        "| polyfuse / floor | polyfuse / (floor + launch) | rel_err | rerun identical "
        "| regs (spill B) |"
    )
    print("|---" * 13 + "|")
    for r in results:
        best = r.best_peer
        regs = ", ".join(
            f"{k.registers}({k.spill_bytes})" for k in cases[r.name].kernels if k.registers
        )
        print(
            f"| {r.name} | {r.kernels} | {_fmt(r.polyfuse_ms)} | {_fmt(r.eager_ms)} | "
            f"{_fmt(r.inductor_ms)} | {_fmt(r.xla_ms)} | {_fmt(r.floor_ms)} | "
            f"{_fmt(r.polyfuse_ms / best if r.polyfuse_ms and best else None, 2)} | "
            f"{_fmt(r.polyfuse_ms / r.floor_ms if r.polyfuse_ms and r.floor_ms else None, 2)} | "
            f"{_fmt(over_launch(r.polyfuse_ms, r.floor_ms, r.launch_ms), 2)} | "
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


def fake_device(cases: Sequence[PreparedCase] = ()) -> Any:
    """A device on tests/fake_cuda.py's driver: "device memory" is host memory and kernels
    run in the CPU emulator — for each case's saved cubin, the CUDA source it was compiled
    from. It checks the GPU day's plumbing where no GPU exists (CI) and times nothing."""
    sys.path.insert(0, str(ROOT / "tests"))
    from fake_cuda import FakeBindings, FakeGPU

    from polyfuse.cuda.runtime import Device
    from polyfuse.cuda.runtime.bindings_driver import BindingsDriver

    gpu = FakeGPU()
    for case in cases:
        for binary in case.graph.binaries.values():
            gpu.images[bytes(binary.image)] = case.graph.cuda_source
    return Device(driver=BindingsDriver(FakeBindings(gpu)))


def check_case_on_host(device: Any, case: PreparedCase, seed: int = 0) -> CaseResult:
    """The fake driver's run of one case: numpy in and out, the torch float64 peer as the
    reference, a second run compared bit for bit; no timings."""
    import torch

    res = CaseResult(case.name, len(case.kernels), notes=["fake driver: not timed"])
    arrays = draw_inputs(case, seed)
    with torch.no_grad():
        out = PEERS[case.name](Ops("torch"), *[torch.from_numpy(a).double() for a in arrays])
    ref = [r.numpy() for r in _peer_outputs(out)]
    prog = case_program(device, case)
    stored = [typed(a, d) for a, d in zip(arrays, case.input_dtypes, strict=True)]
    args = dict(zip(case.inputs, stored, strict=True))
    first = [np.array(g, np.float32 if g.dtype.itemsize == 2 else g.dtype) for g in prog(args)]
    res.rel_err = max(rel_err(g, r) for g, r in zip(first, ref, strict=True))
    again = [np.array(g, a.dtype) for g, a in zip(prog(args), first, strict=True)]
    res.rerun_identical = all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    prog.close()
    return res


def run(
    directory: Path,
    out: Path,
    peers: Sequence[str],
    cases: Sequence[str] | None,
    fake: bool = False,
) -> None:
    """Measure the ceilings, then check and time every prepared case; print and write JSON.
    ``fake``: on tests/fake_cuda.py's driver (no GPU; checks only, see :func:`fake_device`)."""
    runtime = import_runtime()
    prepared = load_cases(directory)
    device = fake_device(prepared.cases) if fake else runtime.open_device(0)
    print(f"device: {device} driver {device.driver_version()}", flush=True)
    if not fake and device.arch != prepared.arch:
        print(f"warning: cubins are for {prepared.arch}, the device is {device.arch}")
    ceil: dict[str, float] = {}
    if not fake:
        ceil = ceilings()
        print(
            f"ceilings: empty launch {ceil['launch_ms'] * 1e3:.1f} us, "
            f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, cuBLAS FP32 "
            f"{ceil['fp32_flops_per_s'] / 1e12:.1f}, TF32 {ceil['tf32_flops_per_s'] / 1e12:.1f}, "
            f"bf16 {ceil['bf16_flops_per_s'] / 1e12:.1f} TFLOP/s",
            flush=True,
        )
    selected = [c for c in prepared.cases if not cases or c.name in cases]
    results = []
    for case in selected:
        try:
            if fake:
                r = check_case_on_host(device, case)
            else:
                r = run_case(device, case, ceil, peers)
        except Exception as e:  # one broken case must not hide the others
            r = CaseResult(case.name, len(case.kernels), notes=[f"{type(e).__name__}: {e}"])
            r.rel_err = math.inf
        results.append(r)
        print(
            f"  {r.name}: polyfuse {_fmt(r.polyfuse_ms)} ms, best peer {_fmt(r.best_peer)} ms, "
            f"rel_err {r.rel_err:.1e}",
            flush=True,
        )
    print_table(results, {c.name: c for c in selected})
    report = {
        "device": {"name": "fake driver (CPU emulator)"} if fake else _device_description(),
        "runtime": device.driver.name,
        "prepared_commit": prepared.commit,
        "arch": prepared.arch,
        "ceilings": ceil,
        "timing": "triton do_bench median, L2 flushed (fallback: CUDA events + 256 MB flush); "
        "JAX host clock",
        "results": [asdict(r) | {"best_peer_ms": r.best_peer} for r in results],
        "kernels": {c.name: [asdict(k) for k in c.kernels] for c in selected},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1, default=str))
    print(f"wrote {out}")


def overhead(directory: Path, calls: int = 3000) -> dict[str, float]:
    """Microseconds of host time per call of the attention example (4 kernels)."""
    import torch

    runtime = import_runtime()
    case = load_cases(directory).overhead
    if case is None:
        raise SystemExit(f"{directory}: no overhead graph: run --prepare {directory}")
    device = runtime.open_device(0)
    arrays = draw_inputs(case)
    figures: dict[str, float] = {}
    for graphs in (True, False):
        prog = case_program(device, case, graphs=graphs)
        xs = [torch.from_numpy(a).cuda() for a in arrays]
        args = dict(zip(case.inputs, xs, strict=True))
        outs = {
            n: torch.empty(s, device="cuda")
            for n, s in zip(case.outputs, case.output_shapes, strict=True)
        }
        host_args = dict(zip(case.inputs, arrays, strict=True))
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
