"""The built-in zoo's kernels as the cost model prices them (MODELLED, no GPU): per model, the
kernel count, the modelled total and its costliest kernels, each beside its floor (its
distinct global bytes at the measured copy rate, or its FLOPs at the measured cuBLAS FP32
rate, whichever is longer).

This is where kernels that leave the GPU idle show up without a GPU: a matrix-vector product
run as one serial loop per output on two blocks, a GEMM its epilogue kept off the tiles.

    python benchmarks/zoo_modelled.py                     # full size, sm_90, every model
    python benchmarks/zoo_modelled.py lstm deepfm --arch sm_80 --top 3

Writes ``benchmarks/results/zoo_modelled.json``. A Layer 3 pack is priced as its packing
decision priced it, each part on its own blocks (its kernel IR alone would price every block
at its costliest part, as ``--models`` does), and its floor is its bytes alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "zoo_modelled.json"


def model_rows(name: str, arch: str, size: str = "full") -> dict:
    """Compile zoo model ``name`` for ``arch`` and price every kernel."""
    import polyfuse
    from polyfuse import zoo
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import device_for_arch

    dev = device_for_arch(arch)
    t0 = time.perf_counter()
    ins, outs, consts, _ = zoo.build(name, size, weights="zeros")
    fn = polyfuse.compile(ins, outs, constants=consts, check_cuda=False, arch=arch)
    seconds = time.perf_counter() - t0
    packed = {d.name: d.packed_us for d in fn.plan.packs if d.packed and d.packed_us}
    kernels = []
    for k in fn.kernels:
        d = describe_kernel(k)
        m = model_kernel(d, dev)
        us = packed.get(k.name, m.us)  # a pack: Layer 3's price, each part on its blocks
        flops = 0.0 if k.name in packed else d.flops  # a pack's IR: every block's costliest
        floor = max(
            (k.bytes_read + k.bytes_written) / (dev.bandwidth_gbps * 1e9),
            flops / (dev.throughput_tflops * 1e12),
        )
        kernels.append(
            {
                "kernel": k.name,
                "grid": k.grid[0] * k.grid[1] * k.grid[2],
                "block": k.block[0] * k.block[1] * k.block[2],
                "modelled_us": us,
                "floor_us": floor * 1e6,
                "bound": "Layer 3 pack" if k.name in packed else m.bound,
            }
        )
    kernels.sort(key=lambda r: -r["modelled_us"])
    return {
        "model": name,
        "arch": arch,
        "size": size,
        "kernels": len(kernels),
        "modelled_us": sum(r["modelled_us"] for r in kernels),
        "floor_us": sum(r["floor_us"] for r in kernels),
        "compile_s": seconds,
        "costliest": kernels,
    }


def main(argv: list[str] | None = None) -> int:
    from polyfuse import zoo

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", help="zoo model names (default: all)")
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--size", default="full", choices=("tiny", "full"))
    ap.add_argument("--top", type=int, default=4, help="costliest kernels printed per model")
    ap.add_argument("--json", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    names = args.models or list(zoo.MODELS)
    rows = []
    print(f"| model | kernels | modelled us | floor us | modelled / floor |  ({args.arch}, "
          "MODELLED)")  # fmt: skip
    print("|---|---|---|---|---|")
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        r = model_rows(name, args.arch, args.size)
        rows.append(r)
        print(f"| {name} | {r['kernels']} | {r['modelled_us']:.0f} | {r['floor_us']:.0f} | "
              f"{r['modelled_us'] / max(r['floor_us'], 1e-9):.2f} |")  # fmt: skip
    for r in rows:
        print(f"\n{r['model']}: costliest kernels (MODELLED)")
        for k in r["costliest"][: args.top]:
            shape = f"{k['grid']:7d} x {k['block']:4d}"
            print(f"  {k['kernel']:32s} {shape}  {k['modelled_us']:8.1f} us "
                  f"(floor {k['floor_us']:.1f}, {k['bound']})")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"arch": args.arch, "size": args.size, "models": rows},
                                    indent=1))  # fmt: skip
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
