"""The memory-bound suite in bfloat16 beside float32 (MODELLED): bytes and times.

Usage::

    python benchmarks/dtypes.py [--only NAMES] [--dtype bfloat16] [--arch sm_90] [--json PATH]

Every subgraph of :mod:`suite` is compiled at full size twice, with float32 placeholders and
with ``--dtype`` ones (bfloat16 by default; the computes follow the typing rules, so a
bfloat16 graph stores bfloat16 tensors and computes in float32 registers). Printed per
subgraph: kernels, global bytes (isl footprints, in the dtype's element size), the modelled
time of each compile (:mod:`polyfuse.cuda.codegen.kernel_time`, summed over kernels), their ratios,
and the widest global access the plan chose (words of 16-bit lanes, or float4).

Every time here is MODELLED, not measured: no GPU ran here (``benchmarks/gpu.py`` measures
on one). Writes the rows as JSON (default ``benchmarks/results/dtypes.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import suite  # noqa: E402

import polyfuse  # noqa: E402
from polyfuse.cache import CompileCache  # noqa: E402
from polyfuse.cuda.codegen.kernel_time import kernel_us  # noqa: E402
from polyfuse.poly.device import device_for_arch  # noqa: E402

DEFAULT_JSON = HERE / "results" / "dtypes.json"


def _widest(fn: polyfuse.CompiledGraph) -> str:
    """The widest global access word in the generated source (16-bit buffers move as uint4 or
    uint2 words; a float4 in a 16-bit graph is a shared-memory copy, which holds float32)."""
    src = "".join(k.source for k in fn.kernels)
    for word, text in (("uint4", "128-bit"), ("uint2", "64-bit"), ("float4", "128-bit")):
        if f"reinterpret_cast<const {word}*>" in src or f"reinterpret_cast<{word}*>" in src:
            return text
    return "scalar"


def measure(name: str, dtype: str, arch: str) -> dict:
    """Compile subgraph ``name`` with ``dtype`` placeholders; its kernels, bytes and model."""
    device = device_for_arch(arch)
    ins, outs, _ = suite.build(name, 1, dtype=dtype)
    fn = polyfuse.compile(ins, outs, arch=arch, check_cuda=False, cache=CompileCache(), name=name)
    us = [kernel_us(k, device) for k in fn.kernels]
    return {
        "kernels": len(fn.kernels),
        "global_bytes": fn.global_bytes(),
        "compulsory_bytes": fn.compulsory_bytes(),
        "modelled_us": round(sum(us), 3),
        "widest_access": _widest(fn),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default="", help="comma-separated subgraph names")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    ap.add_argument("--arch", default="sm_90", help="device table entry (sm_90: H100)")
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    args = ap.parse_args(argv)
    names = [n for n in args.only.split(",") if n] or list(suite.BUILDERS)
    device = device_for_arch(args.arch)
    rows = []
    for n in names:
        print(f"compiling {n} ...", file=sys.stderr, flush=True)
        rows.append({"name": n, "float32": measure(n, "float32", args.arch),
                     args.dtype: measure(n, args.dtype, args.arch)})  # fmt: skip
    print(f"MODELLED times on {device} (no GPU ran): float32 vs {args.dtype}")
    head = (
        f"{'subgraph':22} {'k32/k16':>7} {'MiB f32':>9} {'MiB 16':>8} {'bytes x':>7} "
        f"{'us f32':>8} {'us 16':>8} {'time x':>6}  {'widest f32/16':>17}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        a, b = r["float32"], r[args.dtype]
        print(
            f"{r['name']:22} {a['kernels']:>3}/{b['kernels']:<3} "
            f"{a['global_bytes'] / 2**20:>9.1f} {b['global_bytes'] / 2**20:>8.1f} "
            f"{b['global_bytes'] / a['global_bytes']:>7.2f} {a['modelled_us']:>8.1f} "
            f"{b['modelled_us']:>8.1f} {b['modelled_us'] / a['modelled_us']:>6.2f}  "
            f"{a['widest_access']:>8}/{b['widest_access']:<8}"
        )
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "kind": "MODELLED (no GPU): polyfuse.cuda.codegen.kernel_time",
        "arch": args.arch,
        "device": str(device),
        "dtype": args.dtype,
        "rows": rows,
    }
    path.write_text(json.dumps(doc, indent=1))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
