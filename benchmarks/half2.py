"""Native 16-bit pairs (cuda/codegen/lower_half2.py) in SASS: instructions per element before
and after, for float16 and bfloat16 elementwise kernels (issue 22 item 2).

    python benchmarks/half2.py [--arch sm_80,sm_90] [--json PATH]

Each case is compiled twice for each arch (the pass off: widen every lane to float, compute,
round pairs back with ``__floats2half2_rn``; the pass on: ``__hadd2_rn``/``__hmul2_rn`` on the
loaded words), then NVRTC → cubin → nvdisasm (:mod:`polyfuse.cuda.toolchain.sass`, no GPU).
The kernels are straight-line (no loop; the shape fills whole groups, so no scalar tail runs):
printed per case are the SASS instructions of the reachable code, divided by the elements a
thread handles, and the unpacking/conversion/integer instructions among them (``F2F``/``F2FP``/
``HADD2.F32``/``PRMT``/``SHF``/``IMAD.U32``/``SHL``/``LOP3``: the 16-bit lanes' widening and
packing, plus the address arithmetic both variants share). ``(x + y) * z``
is refused by the pass (the float32 path does not round the sum), so it is listed with its
reason and no change. Counts, not times: no GPU ran here.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polyfuse
import polyfuse.cuda.codegen.lower as lower_mod
from polyfuse import te
from polyfuse.cuda.toolchain.compiler import compile_cuda
from polyfuse.cuda.toolchain.sass.parse import build_blocks, parse_listing
from polyfuse.cuda.toolchain.sass.tools import find_disassembler

SHAPE = (1024, 2048)  # whole groups on an A100 and an H100 (4 or 8 lanes per thread)
CASES = {
    "x + y": lambda x, y, z, d: x + y,
    "x * y": lambda x, y, z, d: x * y,
    "cast(x + y) * z": lambda x, y, z, d: te.cast(x + y, d) * z,
    "(x + y) * z": lambda x, y, z, d: (x + y) * z,
}
#: 16-bit unpacking/packing and float conversions (the work the pairs save)
CONVERT = ("F2F", "F2FP", "PRMT", "SHF", "SHL", "LOP3", "IMAD.U32", "HADD2.F32")


def _compile(dtype: str, body, arch: str, native: bool) -> polyfuse.CompiledGraph:
    saved = lower_mod.lower_half2
    if not native:
        lower_mod.lower_half2 = lambda ir: (ir, [])
    try:
        x, y, z = (te.placeholder(SHAPE, dtype, name=n) for n in "xyz")
        o = te.compute(SHAPE, lambda i, j: body(x[i, j], y[i, j], z[i, j], dtype), name="o")
        return polyfuse.compile([x, y, z], [o], arch=arch, check_cuda=False)
    finally:
        lower_mod.lower_half2 = saved


def _count(fn: polyfuse.CompiledGraph, arch: str, dis) -> dict:
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    (sass,) = parse_listing(dis.disassemble(binary.image), arch).values()
    if not sass.blocks:
        sass.blocks = build_blocks(sass.instructions)
    code = [i for i in sass.reachable if i.base not in ("NOP",) and not i.never]
    conv = [i for i in code if any(i.opcode.startswith(c) for c in CONVERT)]
    (res,) = binary.resources.values()
    return {
        "instructions": len(code),
        "conversions": len(conv),
        "arith": sorted({i.opcode for i in code if i.base in ("HADD2", "HMUL2", "HFMA2",
                                                               "FADD", "FMUL", "FFMA")}),
        "registers": res.registers,
        "spills": res.spill_stores + res.spill_loads,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="sm_80,sm_90")
    ap.add_argument("--json", default=str(Path(__file__).parent / "results" / "half2.json"))
    args = ap.parse_args(argv)
    dis = find_disassembler()
    rows = []
    for arch in args.arch.split(","):
        for dtype in ("float16", "bfloat16"):
            for name, body in CASES.items():
                on = _compile(dtype, body, arch, True)
                (k,) = on.kernels
                lanes = next(int(n.split()[0]) for n in k.notes if "elements per thread" in n)
                note = next((n for n in k.notes if n.startswith("native 16-bit pairs")), "")
                before = _count(_compile(dtype, body, arch, False), arch, dis)
                after = _count(on, arch, dis)
                rows.append(
                    {"arch": arch, "dtype": dtype, "case": name, "lanes": lanes,
                     "before": before, "after": after, "decision": note}
                )  # fmt: skip
                b, a = before["instructions"] / lanes, after["instructions"] / lanes
                print(
                    f"{arch} {dtype:8} {name:16} {lanes} lanes: {b:5.2f} -> {a:5.2f} "
                    f"instructions/element (convert/integer {before['conversions']} -> "
                    f"{after['conversions']} per thread; {' '.join(after['arith'])}; "
                    f"{after['registers']} regs, {after['spills']} B spills)"
                )
                print(f"    {note}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
