"""Benchmark ``polyfuse zoo``: the built-in zoo compiled cold (fresh cache dir), then warm.

Prints a table (models, kernels, stitched kernels, kernel-cache hits of the cold run, model-cache
hits of the warm run, cold and warm seconds), the BERT-base per-stage breakdown of its cold
compile, and the warm-over-cold speedup; writes everything to ``benchmarks/results/zoo.json``.

    python benchmarks/zoo.py                 # full sizes + the nine light ONNX models
    python benchmarks/zoo.py --tiny -j 2     # quick check
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

RESULTS = Path(__file__).resolve().parent / "results" / "zoo.json"


def run_zoo(args: list[str], cache_dir: str, json_path: str) -> tuple[dict, float, int]:
    """Run ``polyfuse zoo`` in a fresh process; (report, process wall seconds, exit status)."""
    cmd = [sys.executable, "-m", "polyfuse", "zoo", *args, "--cache-dir", cache_dir]
    cmd += ["--json", json_path, "--quiet"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.stderr.strip():
        print(proc.stderr.rstrip(), file=sys.stderr)
    return json.loads(Path(json_path).read_text()), wall, proc.returncode


LIGHT = ("bvlc_alexnet", "densenet121", "inception_v1", "inception_v2", "resnet50",
         "shufflenet", "squeezenet", "vgg19", "zfnet512")  # fmt: skip


def default_models(tiny: bool) -> list[str]:
    """The built-in zoo, plus the nine light ONNX models shipped with the onnx package (full
    size only, when onnx is installed)."""
    from polyfuse.zoo import MODELS

    names = list(MODELS)
    if tiny:
        return names
    try:
        import onnx
    except ImportError:
        return names
    light = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    return names + [
        str(light / f"light_{m}.onnx") for m in LIGHT if (light / f"light_{m}.onnx").exists()
    ]


def main(argv: list[str] | None = None) -> int:
    """Cold then warm run; print and save the comparison."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "models",
        nargs="*",
        help="zoo names / .onnx paths (default: built-in zoo + onnx's light models)",
    )
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count())
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--out", default=str(RESULTS))
    ns = ap.parse_args(argv)
    models = ns.models or default_models(ns.tiny)
    extra = [*models, "--jobs", str(ns.jobs)] + (["--tiny"] if ns.tiny else [])

    with tempfile.TemporaryDirectory(prefix="polyfuse-zoo-bench-") as d:
        cold, cold_proc, rc_cold = run_zoo(extra, f"{d}/cache", f"{d}/cold.json")
        warm, warm_proc, rc_warm = run_zoo(extra, f"{d}/cache", f"{d}/warm.json")

    warm_by = {r["name"]: r for r in warm["models"]}
    head = ("model", "status", "kernels", "stitched", "kernel hits (cold)", "warm cache",
            "cold s", "warm s")  # fmt: skip
    rows = []
    for r in cold["models"]:
        w = warm_by.get(r["name"], {})
        kh = "-"
        if r["kernel_cache_hits"] is not None:
            kh = f"{r['kernel_cache_hits']}/{r['kernel_cache_hits'] + r['kernel_cache_misses']}"
        rows.append(
            (
                r["name"],
                r["status"] if r["status"] == "ok" else f"ERROR: {r['reason'][:60]}",
                str(r["kernels"] if r["kernels"] is not None else "-"),
                str(r["stitched_kernels"] if r["stitched_kernels"] is not None else "-"),
                kh,
                w.get("model_cache", "-"),
                f"{r['total_seconds']:.2f}",
                f"{w['total_seconds']:.2f}" if w else "-",
            )
        )
    widths = [max(len(x[c]) for x in [head, *rows]) for c in range(len(head))]
    fmt = lambda row: "  ".join(v.ljust(wd) for v, wd in zip(row, widths, strict=True))  # noqa: E731
    print(fmt(head))
    print("  ".join("-" * wd for wd in widths))
    for row in rows:
        print(fmt(row))

    speed_batch = cold["wall_seconds"] / max(warm["wall_seconds"], 1e-9)
    speed_proc = cold_proc / max(warm_proc, 1e-9)
    print(
        f"\ncold: {cold['wall_seconds']:.2f} s batch wall ({cold_proc:.2f} s with process start), "
        f"warm: {warm['wall_seconds']:.2f} s ({warm_proc:.2f} s); speedup "
        f"{speed_batch:.1f}x batch, {speed_proc:.1f}x process"
    )
    print(
        f"warm model-cache hits: {warm['cache']['model_hits']}/{len(warm['models'])}; "
        f"cold kernel-cache hits: {cold['cache']['kernel_hits']}/"
        f"{cold['cache']['kernel_hits'] + cold['cache']['kernel_misses']}"
    )
    bert = next((r for r in cold["models"] if r["name"] == "bert_base"), None)
    if bert and bert["status"] == "ok":
        stages = ", ".join(f"{k} {v:.2f}" for k, v in bert["compile_seconds"].items())
        total = sum(bert["compile_seconds"].values())
        size = "tiny" if ns.tiny else "full (12 layers, batch 8, seq 128)"
        print(f"BERT-base {size} cold compile: {total:.2f} s = {stages}")

    doc = {
        "jobs": ns.jobs,
        "size": "tiny" if ns.tiny else "full",
        "cpus": os.cpu_count(),
        "cold": cold,
        "warm": warm,
        "cold_process_seconds": cold_proc,
        "warm_process_seconds": warm_proc,
        "speedup_batch": speed_batch,
        "speedup_process": speed_proc,
        "exit_status": {"cold": rc_cold, "warm": rc_warm},
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0 if rc_cold == rc_warm == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
