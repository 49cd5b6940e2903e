"""Benchmark compile time against model depth: BERT and GPT-2 stacks at 12/24/48/96 layers.

Each (model, depth) compiles in a fresh process with an empty cache directory (cold), then in
another fresh process on the same directory (warm: schedules, stitch decisions, kernels and
CUDA binaries come from the cache). Both runs time the polyfuse stages and then the CUDA
compile (NVRTC or nvcc, when one is installed). Prints seconds per stage and per layer, the
96-over-12 ratio, the issue-10 targets, and writes ``benchmarks/results/compile_scaling.json``.

    python benchmarks/compile_scaling.py                       # bert + gpt2, 12/24/48/96
    python benchmarks/compile_scaling.py --layers 12 24 --models bert

Wall seconds depend on what else the machine runs; CPU seconds (of the compiling process,
NVRTC included) are printed next to them and the load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "compile_scaling.json"
MODELS = ("bert", "gpt2")
LAYERS = (12, 24, 48, 96)
STAGES = ("graph", "partition+schedule", "stitch", "map+place+codegen")


def worker(model: str, layers: int, cuda: bool) -> dict:
    """Compile one stack in this process (cache from $POLYFUSE_CACHE); seconds per stage."""
    import polyfuse
    from polyfuse.cache import CompileCache
    from polyfuse.cuda.toolchain.compiler import CompilerNotFound, available_compilers
    from polyfuse.zoo import transformers
    from polyfuse.zoo.backend import TeBackend

    define, configs = {
        "bert": (transformers.bert_model, transformers.BERT),
        "gpt2": (transformers.gpt2_model, transformers.GPT2),
    }[model]
    t0 = time.perf_counter()
    tb = TeBackend(weights="zeros")
    outputs = define(tb, dict(configs["full"], layers=layers))
    build_s = time.perf_counter() - t0
    cache = CompileCache.default()
    w0, c0 = time.perf_counter(), time.process_time()
    fn = polyfuse.compile(
        tb.inputs, outputs, constants=tb.constants, cache=cache, check_cuda=False, name=model
    )
    compile_s, compile_cpu = time.perf_counter() - w0, time.process_time() - c0
    res = {
        "model": model,
        "layers": layers,
        "kernels": len(fn.kernels),
        "functions": len({k.function or k.name for k in fn.kernels}),
        "build_seconds": build_s,
        "compile_seconds": compile_s,
        "compile_cpu_seconds": compile_cpu,
        "stages": dict(fn.plan.seconds),
        "cache_hits": fn.cache_stats["hits"],
        "cache_misses": fn.cache_stats["misses"],
        "cuda_compiler": None,
        "cuda_seconds": None,
        "cuda_cpu_seconds": None,
        "cuda_cached": None,
    }
    if cuda and available_compilers():
        w0, c0 = time.perf_counter(), time.process_time()
        try:
            binary = fn.check_cuda(fn.arch)
        except CompilerNotFound:
            binary = None
        if binary is not None:
            res["cuda_seconds"] = time.perf_counter() - w0
            res["cuda_cpu_seconds"] = time.process_time() - c0
            res["cuda_compiler"] = binary.compiler
            res["cuda_cached"] = binary.cached
    return res


def run_worker(model: str, layers: int, cache_dir: str, cuda: bool) -> dict:
    """One compile in a fresh process with ``POLYFUSE_CACHE=cache_dir``."""
    env = dict(os.environ, POLYFUSE_CACHE=cache_dir)
    cmd = [sys.executable, __file__, "--worker", model, str(layers)]
    cmd += [] if cuda else ["--no-cuda"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{model} x{layers} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _f(x: float | None, digits: int = 2) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def table(rows: list[dict]) -> str:
    head = ["model", "layers", "kernels", "functions", "run", *STAGES, "compile s", "cpu s",
            "s/layer", "cuda s", "total s"]  # fmt: skip
    lines = []
    for r in rows:
        for run in ("cold", "warm"):
            x = r[run]
            cuda = x["cuda_seconds"]
            total = x["compile_seconds"] + (cuda or 0.0)
            lines.append(
                [r["model"], str(r["layers"]), str(x["kernels"]), str(x["functions"]), run]
                + [_f(x["stages"].get(s)) for s in STAGES]
                + [
                    _f(x["compile_seconds"]),
                    _f(x["compile_cpu_seconds"]),
                    _f(x["compile_seconds"] / r["layers"], 3),
                    _f(cuda),
                    _f(total),
                ]  # fmt: skip
            )
    widths = [max(len(v[c]) for v in [head, *lines]) for c in range(len(head))]
    fmt = lambda v: "  ".join(s.rjust(w) for s, w in zip(v, widths, strict=True))  # noqa: E731
    return "\n".join([fmt(head), "  ".join("-" * w for w in widths), *map(fmt, lines)])


def targets(rows: list[dict]) -> list[tuple[str, bool | None, str]]:
    """The issue-10 checks on the measured rows: (claim, holds or None if unmeasured, figures)."""
    by = {(r["model"], r["layers"]): r for r in rows}
    out: list[tuple[str, bool | None, str]] = []
    for m in sorted({r["model"] for r in rows}):
        a, b = by.get((m, 12)), by.get((m, 96))
        if a and b:
            ratio = b["cold"]["compile_seconds"] / a["cold"]["compile_seconds"]
            cpu = b["cold"]["compile_cpu_seconds"] / a["cold"]["compile_cpu_seconds"]
            out.append((f"{m}: 96 layers <= 9x 12 layers (cold, no CUDA)", ratio <= 9.0,
                        f"{ratio:.2f}x wall, {cpu:.2f}x cpu"))  # fmt: skip
        c = by.get((m, 48))
        if c:
            s, cpu = c["cold"]["compile_seconds"], c["cold"]["compile_cpu_seconds"]
            out.append((f"{m}: 48 layers <= 5 s cold without CUDA compile", s <= 5.0,
                        f"{s:.2f} s wall, {cpu:.2f} s cpu"))  # fmt: skip
    bert = by.get(("bert", 12))
    if bert:
        x = bert["cold"]
        if x["cuda_seconds"] is None:
            out.append(("bert: 12 layers cold with NVRTC <= 3 s", None, "no CUDA compiler"))
        else:
            s = x["compile_seconds"] + x["cuda_seconds"]
            cpu = x["compile_cpu_seconds"] + x["cuda_cpu_seconds"]
            out.append((f"bert: 12 layers cold with {x['cuda_compiler']} <= 3 s", s <= 3.0,
                        f"{s:.2f} s wall, {cpu:.2f} s cpu"))  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--layers", nargs="+", type=int, default=list(LAYERS))
    ap.add_argument("--no-cuda", action="store_true", help="skip the NVRTC/nvcc compile")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "LAYERS"), help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.worker:
        print(json.dumps(worker(ns.worker[0], int(ns.worker[1]), not ns.no_cuda)))
        return 0

    load0 = os.getloadavg()
    rows = []
    for model in ns.models:
        for layers in ns.layers:
            with tempfile.TemporaryDirectory(prefix="polyfuse-scaling-") as d:
                cold = run_worker(model, layers, d, not ns.no_cuda)
                warm = run_worker(model, layers, d, not ns.no_cuda)
            rows.append({"model": model, "layers": layers, "cold": cold, "warm": warm})
            print(f"  {model} x{layers}: cold {cold['compile_seconds']:.2f} s, "
                  f"warm {warm['compile_seconds']:.2f} s", file=sys.stderr)  # fmt: skip
    load1 = os.getloadavg()
    print(table(rows))
    print(f"\nload average {load0[0]:.2f} at start, {load1[0]:.2f} at end, "
          f"{os.cpu_count()} cpus")  # fmt: skip
    checks = targets(rows)
    for claim, ok, figures in checks:
        verdict = {True: "yes", False: "NO", None: "n/a"}[ok]
        print(f"{verdict:>3}  {claim}: {figures}")
    doc = {
        "cpus": os.cpu_count(),
        "loadavg_start": load0,
        "loadavg_end": load1,
        "rows": rows,
        "targets": [{"claim": c, "holds": ok, "figures": f} for c, ok, f in checks],
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
