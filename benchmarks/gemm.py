"""GEMM benchmark (CPU side): tiling choices, ptxas resources and global bytes of the compute cases.

    python benchmarks/gemm.py [--no-emulate] [--json PATH] [--arch sm_80]

For each compute case of issue 12 (matmul 4096³ + bias + GELU, FFN up, conv 3×3, attention at
two sizes, matmul 512³) at full size: polyfuse.compile wall time, the tile sizes the cost model
(:mod:`polyfuse.poly.costs`) chose and its modelled time from the tile estimate, then per arch
every kernel's modelled time from its SASS instruction mix (or from its IR estimate without a
disassembler; a model, not a measurement; no GPU is used here), and ptxas's
registers / spill bytes for sm_80 and sm_90 when NVRTC or nvcc is installed, with each GEMM
kernel's hot loop as the SASS instrument counts it (:mod:`polyfuse.cuda.toolchain.sass`, needs ``pip
install 'polyfuse[sass]'``): instructions per k-tile, FFMA, FMUL and FADD apart (a product
that is not fused shows as FMUL + FADD), the FFMA share and the shared loads by width. Unless
``--no-emulate``, a reduced size of each case runs on the CPU emulator twice, with the GEMM path
and with it off (``MappingConfig(gemm=False)``, the one-element-per-thread kernel), and prints
the emulator-counted global bytes: *requested* (every load and store, repeats included) beside
*distinct* (unique elements touched).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, KernelSass, analyse
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import device_for_arch
from polyfuse.poly.mapping import MappingConfig

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "gemm.json"
COMPILE_BUDGET_S = 1.0  # issue 12: compile time of each case on the development machines


def matmul_bias_gelu(m: int, k: int, n: int):
    a, w, b = (
        te.placeholder((m, k), name="a"),
        te.placeholder((k, n), name="w"),
        te.placeholder((n,), name="b"),
    )
    return [a, w, b], [ops.gelu(ops.add(ops.matmul(a, w), b))]


def matmul(m: int, k: int, n: int):
    a, w = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="w")
    return [a, w], [ops.matmul(a, w)]


def conv_bias_relu(n: int, c: int, o: int, hw: int):
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((o, c, 3, 3), name="w")
    b = te.placeholder((o, 1, 1), name="b")
    return [x, w, b], [ops.relu(ops.add(ops.conv2d(x, w, padding=1), b))]


def attention(b: int, h: int, s: int, d: int):
    q, k, v = (te.placeholder((b, h, s, d), name=nm) for nm in "qkv")
    scores = ops.mul(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), 1.0 / math.sqrt(d))
    return [q, k, v], [ops.matmul(ops.softmax(scores, axis=-1), v)]


#: name -> (builder, full-size args, emulated-size args)
CASES: dict[str, tuple[Any, tuple[int, ...], tuple[int, ...]]] = {
    "matmul4096_bias_gelu": (matmul_bias_gelu, (4096, 4096, 4096), (96, 80, 112)),
    "ffn_up": (matmul_bias_gelu, (8192, 768, 3072), (128, 48, 96)),
    "conv3x3_bias_relu": (conv_bias_relu, (32, 64, 64, 56), (2, 8, 8, 14)),
    "attention_s128": (attention, (16, 12, 128, 64), (2, 2, 32, 16)),
    "attention_s512": (attention, (8, 12, 512, 64), (1, 2, 64, 16)),
    "matmul512": (matmul, (512, 512, 512), (512, 512, 512)),
}


def _gemm_tiles(fn) -> list[tuple[Any, Decided]]:
    """(kernel, GEMM tiling record) of every register/shared-tiled kernel (typed records)."""
    return [
        (k, r)
        for k, kp in zip(fn.kernels, fn.plan.kernel_plans, strict=True)
        for r in kp.layout
        if DecisionKind.GEMM_TILE in r.kinds
    ]


def _gemm_notes(fn) -> list[str]:
    return [
        f"{k.name}: {r.reason}: modelled {r.data['modelled_us']:.1f} us" for k, r in _gemm_tiles(fn)
    ]


def hot_loop(k: KernelSass) -> dict[str, Any]:
    """A GEMM kernel's hot loop per iteration, from its SASS: every instruction, the FP32
    multiply-adds apart (FFMA) from unfused multiplies and adds (FMUL, FADD), the shared
    loads by width in bits."""
    m = k.hot.mix
    return {
        "kind": k.hot.kind,
        "trip": k.hot.loop.trip.iterations if k.hot.loop else 1,
        "kk_trip": k.hot.inner.trip.iterations if k.hot.inner else None,
        "instructions": m.total,
        "ffma": m["FFMA"],
        "fmul": m["FMUL"],
        "fadd": m["FADD"],
        "ffma_share": round(m.ffma_share, 4),
        "lds": {str(b): m.width("LDS", b) for b in (32, 64, 128)},
    }


def modelled(kernel: Any, sass: KernelSass | None, arch: str) -> dict[str, Any]:
    """The cost model's time of one kernel on ``arch``'s device: from its SASS mix when the
    instrument analysed it, else from the IR estimate (the record says which)."""
    if kernel is None:
        return {}
    m = model_kernel(describe_kernel(kernel, sass), device_for_arch(arch))
    return {"modelled_us": round(m.us, 3), "bound": m.bound, "mix": m.source}


def full_size(name: str, arch: str) -> dict[str, Any]:
    build, args, _ = CASES[name]
    ins, outs = build(*args)
    t0 = time.perf_counter()
    fn = polyfuse.compile(inputs=ins, outputs=outs, arch=arch, check_cuda=False, name=name)
    seconds = time.perf_counter() - t0
    row: dict[str, Any] = {
        "compile_s": seconds,
        "kernels": len(fn.kernels),
        "gemm": _gemm_notes(fn),
    }
    if available_compilers():
        res = {}
        for a in ("sm_80", "sm_90"):
            fa = polyfuse.compile(inputs=ins, outputs=outs, arch=a, check_cuda=False, name=name)
            binary = fa.check_cuda(a)
            gemm = {k.function or k.name for k, _ in _gemm_tiles(fa)}
            try:
                sass = {
                    k.function: k for k in analyse(fa.cuda_source, (a,), kernels=fa.kernels).kernels
                }
            except DisassemblerNotFound as e:
                sass, row["sass_note"] = {}, str(e)
            by_function = {k.function or k.name: k for k in fa.kernels}
            res[a] = [
                {
                    "kernel": r.kernel,
                    "registers": r.registers,
                    "spill_stores": r.spill_stores,
                    "spill_loads": r.spill_loads,
                    "smem": r.shared_bytes,
                    **(
                        {"hot_loop": hot_loop(sass[r.kernel])}
                        if r.kernel in gemm and r.kernel in sass
                        else {}
                    ),
                    **modelled(by_function.get(r.kernel), sass.get(r.kernel), a),
                }
                for k, r in binary.resources.items()
                if k == r.kernel  # (also listed under the plan's kernel names)
            ]
        row["ptxas"] = res
    return row


def emulated(name: str, arch: str) -> dict[str, Any]:
    build, _, args = CASES[name]
    ins, outs = build(*args)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    out: dict[str, Any] = {"size": list(args)}
    results = []
    for label, cfg in (("gemm", MappingConfig()), ("naive", MappingConfig(gemm=False))):
        fn = polyfuse.compile(inputs=ins, outputs=outs, arch=arch, check_cuda=False, mapping=cfg)
        got = fn(*arrays, device="emulate")
        results.append(np.asarray(got, dtype=np.float64))
        out[label] = {"requested": fn.requested_bytes(), "distinct": fn.traffic_bytes()}
    out["max_abs_diff"] = float(np.abs(results[0] - results[1]).max())
    return out


def _loop_cell(h: dict[str, Any] | None) -> str:
    if h is None:
        return ""
    kk = f", kk loop x{h['kk_trip']}" if h["kk_trip"] else ", kk unrolled"
    lds = "/".join(f"{h['lds'][b]:g}" for b in ("32", "64", "128"))
    return (
        f"; SASS {h['kind']} loop: {h['instructions']:g} instr/iter, {h['ffma']:g} FFMA "
        f"({h['ffma_share']:.0%}), {h['fmul']:g} FMUL + {h['fadd']:g} FADD unfused, "
        f"LDS.32/64/128 {lds}{kk}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-emulate", action="store_true", help="skip the emulator byte counts")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    ap.add_argument("--arch", default="sm_80")
    args = ap.parse_args(argv)
    print(f"polyfuse GEMM benchmark, arch {args.arch} (no GPU: no kernel times are measured)")
    results: dict[str, Any] = {}
    for name in CASES:
        r = {"full": full_size(name, args.arch)}
        if not args.no_emulate:
            r["emulated"] = emulated(name, args.arch)
        results[name] = r
        f = r["full"]
        budget = "ok" if f["compile_s"] <= COMPILE_BUDGET_S else f"OVER {COMPILE_BUDGET_S:.0f} s"
        print(
            f"\n{name} {CASES[name][1]}: compile {f['compile_s']:.2f} s ({budget}), "
            f"{f['kernels']} kernels"
        )
        for g in f["gemm"]:
            print(f"  {g}")
        for a, lst in f.get("ptxas", {}).items():
            cells = ", ".join(
                f"{x['kernel']} {x['registers']} regs {x['smem']} B smem "
                f"{x['spill_stores']}/{x['spill_loads']} B spills"
                + _loop_cell(x.get("hot_loop"))
                + (
                    f"; modelled {x['modelled_us']:.1f} us {x['bound']}-bound (mix: {x['mix']})"
                    if "modelled_us" in x
                    else ""
                )
                for x in lst
            )
            print(f"  ptxas {a}: {cells}")
        if "sass_note" in f:
            print(f"  no SASS loop counts: {f['sass_note']}")
        e = r.get("emulated")
        if e:
            g, nv = e["gemm"], e["naive"]
            print(
                f"  emulated at {tuple(e['size'])}: requested / distinct bytes: GEMM path "
                f"{g['requested']} / {g['distinct']}, one element per thread "
                f"{nv['requested']} / {nv['distinct']} (requested ratio "
                f"{nv['requested'] / max(1, g['requested']):.1f}x); "
                f"max |diff| {e['max_abs_diff']:.2g}"
            )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
