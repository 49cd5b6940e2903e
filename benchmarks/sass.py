"""SASS benchmark: the hot loops of the compute cases and the vector check of the suite (issue 20).

    python benchmarks/sass.py [--arch sm_80,sm_90] [--only NAME,...] [--dtype bfloat16]
                              [--json PATH] [--strict]

Every case is compiled by polyfuse for each arch at full size, then NVRTC → cubin →
nvdisasm (:mod:`polyfuse.cuda.toolchain.sass`, no GPU needed). Printed per arch:

* the compute cases of issue 20 item 2 (matmul 4096³ + bias + GELU, FFN up 8192×768·768×3072,
  conv 3×3 N32 C64→64 56², a 1×1 conv N32 C64→256 56², a stride-2 3×3 conv N32 C128→128
  56²→28², attention B8 H12 S512 D64, and BERT-base's attention output projection reading the
  heads merged through ``k // 64``, ``k % 64``): one row per kernel with the hot loop's
  instructions per iteration (FFMA share, shared loads by width, global traffic, barriers,
  integer, branches, predicated-off slots), registers, spills, shared bytes, blocks per SM and
  limiter, and the issue-bound estimate (a model, labelled so); the GEMM-like kernels (a
  k-tile loop) beside the item's targets: the FFMA share, no spills, (matmul, FFN) operand
  fragments loaded by 64/128-bit shared loads only, the share of multiply-adds on padding
  (over 5 %: the plan's reason), and each shared tile's copy (float4 or scalar, threads busy
  of the block's);
* the twelve memory-bound subgraphs of ``suite.py``: the same table (their kernels have no
  loop: the whole body), then per subgraph the vector accesses the kernel IR holds, the
  vector source lines, how many keep their width in SASS (``LDG.E.128`` / ``STG.E.128`` /
  ``LDS.128`` / ``STS.128``; ``.64`` for a 64-bit word) and how many compiled to no access at
  all (``reused``: ptxas kept the registers of an identical earlier load). ``--dtype
  bfloat16`` (or float16) builds the suite with 16-bit tensors (issue 22): their vector
  accesses are ``uint4`` words of eight halves (``uint2``: four), and the check is the same.

Everything is written to ``benchmarks/results/sass.json`` (``--json``): per case and arch the
instrument's full record of every kernel (:meth:`KernelSass.to_dict`) and the verdicts.
``--strict`` exits 1 when a GEMM-like kernel misses a target of item 2 or a vector check
fails. Without NVRTC or the disassembler it says what to install and exits 2.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402

import polyfuse  # noqa: E402
from polyfuse import examples, ops, te  # noqa: E402
from polyfuse.cuda.toolchain.sass import KernelSass, analyse, find_disassembler, format_table  # noqa: E402
from polyfuse.errors import CompilerNotFound  # noqa: E402
from polyfuse.poly.gemm_codegen import PADDING_LIMIT  # noqa: E402

DEFAULT_JSON = HERE / "results" / "sass.json"
ARCHS = ("sm_80", "sm_90")


def conv_relu(n: int, c: int, o: int, hw: int, k: int, stride: int, pad: int):
    """``relu(conv2d(x, w, bias))``, NCHW, for the 1×1 and strided cases."""
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((o, c, k, k), name="w")
    b = te.placeholder((o,), name="bias")
    y = ops.relu(ops.conv2d(x, w, b, stride=stride, padding=pad, name="conv2d"), name="relu")
    return [x, w, b], [y]


def merged_heads_projection(b: int, heads: int, s: int, d: int, n: int):
    """Attention's output projection: ``reshape(transpose(pv, (0, 2, 1, 3)), (b, s, heads *
    d)) @ w``, its operand read through ``k // d`` and ``k % d`` (float32: no split)."""
    pv = te.placeholder((b, heads, s, d), name="pv")
    w = te.placeholder((heads * d, n), name="w")
    ctx = ops.reshape(ops.transpose(pv, (0, 2, 1, 3)), (b, s, heads * d))
    return [pv, w], [ops.matmul(ctx, w, name="out_proj")]


@dataclass(frozen=True)
class Case:
    """A compute case: its builder, and the FFMA share item 2 asks of its GEMM-like loops."""

    build: Callable[[], tuple[list[Any], list[Any]]]
    what: str
    ffma_target: float
    #: operand fragments must load as 64/128-bit shared loads only (no LDS.32 in the loop)
    vector_fragments: bool = False


def _example(f, *args, **kw) -> Callable[[], tuple[list[Any], list[Any]]]:
    def build():
        ins, outs, _ = f(*args, **kw)
        return list(ins), list(outs)

    return build


CASES: dict[str, Case] = {
    "matmul4096_bias_gelu": Case(
        _example(examples.matmul_bias_gelu, 4096, 4096, 4096),
        "matmul 4096^3 + bias + GELU",
        0.85,
        True,
    ),
    "ffn_up": Case(
        _example(examples.matmul_bias_gelu, 8192, 768, 3072),
        "FFN up 8192x768 . 768x3072",
        0.85,
        True,
    ),
    "conv3x3": Case(
        _example(examples.conv2d_relu, batch=32, channels=64, size=56, filters=64),
        "conv 3x3 N32 C64->64 56^2 + bias + ReLU",
        0.80,
    ),
    "conv1x1": Case(
        lambda: conv_relu(32, 64, 256, 56, 1, 1, 0), "conv 1x1 N32 C64->256 56^2", 0.80
    ),
    "conv3x3_s2": Case(
        lambda: conv_relu(32, 128, 128, 56, 3, 2, 1), "conv 3x3 stride 2 N32 C128->128 56->28", 0.80
    ),
    "attention_s512": Case(
        _example(examples.attention, batch=8, heads=12, seq=512, dim=64),
        "attention B8 H12 S512 D64 (QK^T, softmax, PV)",
        0.80,
    ),
    "attention_out_proj": Case(
        lambda: merged_heads_projection(8, 12, 128, 64, 768),
        "attention output projection B8 S128, heads 12x64 merged -> 768",
        0.80,
        True,
    ),
    "patch_embed": Case(
        lambda: conv_relu(8, 3, 768, 224, 16, 16, 0),
        "ViT patch embedding N8 C3->768 16x16 stride 16 at 224^2",
        0.80,
    ),
}


def run_case(name: str, ins, outs, arch: str) -> tuple[list[KernelSass], float, Any]:
    """The instrument's records of every kernel of one case on one arch, compile seconds and
    the compiled graph (its plan holds the GEMM kernels' decisions)."""
    t0 = time.perf_counter()
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False, name=name)
    report = analyse(fn.cuda_source, (arch,), kernels=fn.kernels, name=name)
    return report.kernels, time.perf_counter() - t0, fn


def gemm_plan(fn) -> dict[str, dict[str, Any]]:
    """Per GEMM kernel of ``fn``'s plan: the padding record (share of the multiply-adds on
    padding, and its reason when over the limit) and each shared tile's copy: vector width,
    copying threads busy of the block's."""
    out: dict[str, dict[str, Any]] = {}
    for kp in fn.plan.kernel_plans:
        pad = [d for d in kp.layout if d.data.get("what") == "padding"]
        if not pad:
            continue
        tiles = []
        for mm in kp.parts:
            for p in getattr(mm, "promotions", []):
                rank = len(p.size)
                along = [n // (p.width if d == rank - 1 else 1) for d, n in enumerate(p.size)]
                busy = math.prod(min(g, a) for g, a in zip(p.thread_grid, along, strict=True))
                tiles.append((p.tensor, p.width, busy, math.prod(p.thread_grid)))
        out[kp.name] = {
            "padding": pad[0].data["waste"],
            "explained": pad[0].data["explained"],
            "why": pad[0].reason,
            "tiles": tiles,
        }
    return out


def gemm_rows(
    name: str, kernels: list[KernelSass], case: Case, plan: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    """The item-2 verdict of each GEMM-like kernel of a case (a GEMM kernel of the plan, or a
    kernel with a k-tile hot loop): FFMA share, no spills, vector fragment loads where the case
    asks, padding within the limit or its reason in the plan. A GEMM kernel whose reduction
    runs in two k-tiles has no loop left (the pipeline's first and last iterations are peeled):
    its hot code is the whole body, prologue and epilogue included, and is held to the same
    targets."""
    out = []
    for k in kernels:
        if k.hot.kind != "k-tile" and not (k.kernel in plan and k.hot.kind == "body"):
            continue
        spills = (k.resources.spill_stores + k.resources.spill_loads) if k.resources else 0
        share = k.hot.mix.ffma_share
        lds = k.hot.mix.widths.get("LDS", {})
        lds32 = lds.get(32, 0)
        info = plan.get(k.kernel, {})
        waste = info.get("padding", 0.0)
        explained = info.get("explained", True)
        ok = share >= case.ffma_target and spills == 0 and explained
        ok = ok and not (case.vector_fragments and lds32)
        out.append(
            {
                "case": name,
                "kernel": k.kernel,
                "arch": k.arch,
                "loop": k.hot.kind,
                "ffma_share": round(share, 4),
                "fmul_fadd": [k.hot.mix["FMUL"], k.hot.mix["FADD"]],
                "target": case.ffma_target,
                "spill_bytes": spills,
                "lds_widths": {
                    str(b): n for b, n in sorted(k.hot.mix.widths.get("LDS", {}).items())
                },
                "vector_fragments": case.vector_fragments,
                "padding": waste,
                "padding_reason": info.get("why", ""),
                "tiles": [
                    {"tensor": t, "width": w, "busy_threads": b, "threads": n}
                    for t, w, b, n in info.get("tiles", [])
                ],
                "ok": ok,
            }
        )
    return out


def vector_row(name: str, kernels: list[KernelSass]) -> dict[str, Any]:
    """The vector check of one suite subgraph (all its kernels)."""
    checks = [k.vector for k in kernels if k.vector is not None]
    lines = [a for c in checks for a in c.accesses]
    return {
        "case": name,
        "kernels": len(kernels),
        "expected": sum(c.expected for c in checks),
        "vector_lines": len(lines),
        "lines_full_width": sum(bool(a.sass) and a.ok for a in lines),
        "words": sorted({a.word for a in lines}),
        "reused": sum(not a.sass for a in lines),  # ptxas reused an identical earlier load
        "ok": all(c.ok for c in checks),
        "problems": [f"{k.kernel}: {p}" for k in kernels if k.vector for p in k.vector.problems],
    }


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default=",".join(ARCHS), help="comma-separated (default both)")
    ap.add_argument("--only", default="", help="comma-separated case / subgraph names")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                    help="the suite's tensors (the compute cases stay float32)")  # fmt: skip
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    args = ap.parse_args(argv)
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    try:
        dis = find_disassembler()
    except CompilerNotFound as e:
        print(f"sass benchmark: {e}", file=sys.stderr)
        return 2
    compute = [n for n in CASES if not only or n in only]
    memory = [n for n in suite.NAMES if not only or n in only]
    print(f"polyfuse SASS benchmark ({dis}); estimates are modelled, not measured")
    results: dict[str, Any] = {
        "disassembler": str(dis), "dtype": args.dtype, "compute": {}, "suite": {}
    }  # fmt: skip
    verdicts: list[dict[str, Any]] = []
    vectors: list[dict[str, Any]] = []
    try:
        for arch in archs:
            rows: list[KernelSass] = []
            mem_rows: list[KernelSass] = []
            for name in compute:
                ins, outs = CASES[name].build()
                ks, secs, fn = run_case(name, ins, outs, arch)
                print(f"  {name} {arch}: {len(ks)} kernels, {secs:.1f} s", file=sys.stderr)
                rows += [_renamed(k, name) for k in ks]
                results["compute"].setdefault(name, {})[arch] = [k.to_dict() for k in ks]
                verdicts += gemm_rows(name, ks, CASES[name], gemm_plan(fn))
            for name in memory:
                ins, outs, _ = suite.build(name, dtype=args.dtype)
                ks, secs, _ = run_case(name, ins, outs, arch)
                print(f"  {name} {arch}: {len(ks)} kernels, {secs:.1f} s", file=sys.stderr)
                results["suite"].setdefault(name, {})[arch] = [k.to_dict() for k in ks]
                vectors.append({**vector_row(name, ks), "arch": arch})
                mem_rows += [_renamed(k, name) for k in ks]
            if rows:
                print(f"\n== compute cases, {arch}: hot loop per iteration ==")
                print(format_table(rows))
            if mem_rows:
                print(f"\n== memory-bound suite, {arch}: hot loop (or body) per iteration ==")
                print(format_table(mem_rows))
    except CompilerNotFound as e:
        print(f"sass benchmark: {e}", file=sys.stderr)
        return 2
    if verdicts:
        print("\n== GEMM-like hot loops vs issue 20 item 2 ==")
        head = ["case", "kernel", "arch", "loop", "FFMA", "target", "spill B", "LDS 32/64/128"]
        head += ["padding", "shared tiles (vector, busy threads)", "verdict"]
        body = [
            [
                v["case"],
                v["kernel"],
                v["arch"],
                v["loop"],
                f"{v['ffma_share']:.1%}",
                f">= {v['target']:.0%}",
                str(v["spill_bytes"]),
                "/".join(str(v["lds_widths"].get(b, 0)) for b in ("32", "64", "128"))
                + (" (64/128 only)" if v["vector_fragments"] else ""),
                f"{v['padding']:.1%}" + (" (why: plan)" if v["padding"] > PADDING_LIMIT else ""),
                ", ".join(
                    f"{t['tensor']} {'f4' if t['width'] == 4 else 'f1'} "
                    f"{t['busy_threads']}/{t['threads']}"
                    for t in v["tiles"]
                ),
                "ok" if v["ok"] else "MISSED",
            ]
            for v in verdicts
        ]
        print(_table([head, *body]))
        for v in verdicts:
            if v["padding"] > PADDING_LIMIT:
                print(f"  {v['case']} {v['arch']} padding: {v['padding_reason']}")
    if vectors:
        print(f"\n== memory-bound suite ({args.dtype}): vector accesses in SASS ==")
        head = ["subgraph", "arch", "kernels", "IR vector", "vector lines", "words"]
        head += ["full width", "reused"]
        head.append("verdict")
        body = [
            [
                v["case"],
                v["arch"],
                str(v["kernels"]),
                str(v["expected"]),
                str(v["vector_lines"]),
                "/".join(v["words"]) or "-",
                str(v["lines_full_width"]),
                str(v["reused"]),
                "ok" if v["ok"] else "FAILED",
            ]
            for v in vectors
        ]
        print(_table([head, *body]))
        for v in vectors:
            for p in v["problems"]:
                print(f"  {v['case']} {v['arch']}: {p}")
    results["gemm_targets"] = verdicts
    results["vectors"] = vectors
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.json}")
    missed = [v for v in verdicts if not v["ok"]] + [v for v in vectors if not v["ok"]]
    return 1 if args.strict and missed else 0


def _renamed(k: KernelSass, case: str) -> KernelSass:
    """``k`` with the case in its kernel name (one table holds every case)."""
    return replace(k, kernel=f"{case}/{k.kernel}")


if __name__ == "__main__":
    raise SystemExit(main())
