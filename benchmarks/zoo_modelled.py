"""The built-in zoo's kernels as the cost model prices them (MODELLED, no GPU): per model, the
kernel count, the modelled total and its costliest kernels, each beside its floor (its
distinct global bytes at the measured copy rate, or its FLOPs at the measured cuBLAS FP32
rate, whichever is longer).

This is where kernels that leave the GPU idle show up without a GPU: a matrix-vector product
run as one serial loop per output on two blocks, a GEMM its epilogue kept off the tiles.

    python benchmarks/zoo_modelled.py                     # full size, sm_90, every model
    python benchmarks/zoo_modelled.py lstm deepfm --arch sm_80 --top 3
    python benchmarks/zoo_modelled.py bert_base --dtype bfloat16   # GEMMs on tensor cores

Writes ``benchmarks/results/zoo_modelled.json`` (``zoo_modelled_<dtype>.json`` for a 16-bit
``--dtype``). A Layer 3 pack is priced as its packing decision priced it, each part on its own
blocks (its kernel IR alone would price every block at its costliest part, as ``--models``
does), and its floor is its bytes alone. A tensorized kernel's floor counts its ``mma.sync``
instructions at the device's tensor-core rate (:func:`polyfuse.poly.costs.peak_floor_us`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "zoo_modelled.json"


def model_rows(name: str, arch: str, size: str = "full", dtype: str = "float32") -> dict:
    """Compile zoo model ``name`` (its inputs and weights of ``dtype``) for ``arch`` and
    price every kernel."""
    import polyfuse
    from polyfuse import zoo
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.poly.costs import mma_floor_us, model_kernel, peak_floor_us
    from polyfuse.poly.device import device_for_arch

    dev = device_for_arch(arch)
    t0 = time.perf_counter()
    ins, outs, consts, _ = zoo.build(name, size, weights="zeros", dtype=dtype)
    fn = polyfuse.compile(ins, outs, constants=consts, check_cuda=False, arch=arch)
    seconds = time.perf_counter() - t0
    packed = {d.name: d.packed_us for d in fn.plan.packs if d.packed and d.packed_us}
    kernels = []
    for k in fn.kernels:
        d = describe_kernel(k)
        m = model_kernel(d, dev)
        us = packed.get(k.name, m.us)  # a pack: Layer 3's price, each part on its blocks
        if k.name in packed:  # a pack's IR prices every block at its costliest part: bytes
            floor = (k.bytes_read + k.bytes_written) / (dev.bandwidth_gbps * 1e9) * 1e6
        else:  # FLOPs at the FP32 rate, mma at the tensor cores', bytes at the copy rate
            floor = peak_floor_us(d, dev)
        kernels.append(
            {
                "kernel": k.name,
                "grid": k.grid[0] * k.grid[1] * k.grid[2],
                "block": k.block[0] * k.block[1] * k.block[2],
                "modelled_us": us,
                "floor_us": floor,
                # its mma.sync at the tensor cores' rate (0: no tensor cores)
                "mma_floor_us": mma_floor_us(d, dev),
                "bound": "Layer 3 pack" if k.name in packed else m.bound,
            }
        )
    kernels.sort(key=lambda r: -r["modelled_us"])
    return {
        "model": name,
        "arch": arch,
        "size": size,
        "dtype": dtype,
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
    ap.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16"),
        help="the models' inputs and weights (16-bit: GEMMs and convolutions on tensor cores)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, default=None, help=f"default {RESULTS}")
    args = ap.parse_args(argv)
    if args.json is None:
        suffix = "" if args.dtype == "float32" else f"_{args.dtype}"
        args.json = RESULTS.with_name(f"zoo_modelled{suffix}.json")
    names = args.models or list(zoo.MODELS)
    rows = []
    print(f"| model | kernels | modelled us | floor us | modelled / floor |  ({args.arch}, "
          f"{args.dtype}, MODELLED)")  # fmt: skip
    print("|---|---|---|---|---|")
    for name in names:
        print(f"{name} ...", file=sys.stderr, flush=True)
        r = model_rows(name, args.arch, args.size, args.dtype)
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
    head = {"arch": args.arch, "size": args.size, "dtype": args.dtype}
    args.json.write_text(json.dumps({**head, "models": rows}, indent=1))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
