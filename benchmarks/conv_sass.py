"""SASS of tensorized convolutions' k-tile loops (issue 23's "HMMA per non-HMMA" figure).

    python benchmarks/conv_sass.py [--arch sm_80,sm_90] [--size N,C,O,H,W] [--dtype bfloat16]

Per case (conv 3x3 pad 1, 1x1, 3x3 stride 2; NCHW, bias + ReLU epilogue) and arch: NVRTC →
cubin → nvdisasm (:mod:`polyfuse.cuda.toolchain.sass`, no GPU), the tensorized kernel (a 3x3
conv's input and weight go through channels-last copies first: the ``channels_last`` graph
pass; those kernels are named at the end of the line), then the first SASS loop that
holds HMMA (the k-tile loop's steady state; its fills unrolled): HMMA, LDSM, LDGSTS and the
other instructions per k-tile (an iteration of a steady state unrolled by its stages runs S
k-tiles), other per HMMA (the issue asks at most 2) and per useful HMMA
(those of the block tile inside the GEMM: a 128-row tile on 64 channels computes half zeros),
registers and spills; and the instrument's hot loop (trip counts applied; ``body`` where the
k-tile loop was unrolled whole, e.g. a 1x1 conv of two k-tiles). Without NVRTC or nvdisasm it
says so.
"""

from __future__ import annotations

import argparse
import math
import sys

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import compile_cuda
from polyfuse.cuda.toolchain.sass import analyse, find_disassembler, hmma_loop, parse_listing
from polyfuse.errors import CompilerNotFound

CASES = {"3x3 pad 1": (3, 1, 1), "1x1": (1, 1, 0), "3x3 stride 2": (3, 2, 1)}


def conv(size: tuple[int, ...], k: int, stride: int, pad: int, dtype: str):
    """``relu(conv2d(x, w, bias))`` in ``dtype``, NCHW."""
    n, c, o, h, w = size
    x = te.placeholder((n, c, h, w), dtype, name="x")
    wt = te.placeholder((o, c, k, k), dtype, name="w")
    b = te.placeholder((o,), dtype, name="bias")
    y = ops.relu(ops.conv2d(x, wt, b, stride=stride, padding=pad, name="conv"), name="y")
    return [x, wt, b], [y]


def measure(size, case: str, arch: str, dtype: str) -> dict:
    """The k-tile loop's per-iteration figures of one conv on ``arch``."""
    ins, outs = conv(size, *CASES[case], dtype)
    fn = polyfuse.compile(ins, outs, arch=arch, check_cuda=False)
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    # the tensorized kernel (a channels-last conv also has its operands' transposing kernels)
    ks = analyse(fn.cuda_source, (arch,), kernels=fn.kernels).kernels
    (k,) = [k for k in ks if k.hot.mix["HMMA"] or k.per_thread["HMMA"]]
    res = binary.resources[k.function]
    f = parse_listing(find_disassembler().disassemble(binary.image), arch)[k.function]
    out: dict = {"regs": res.registers, "spills": res.spill_stores + res.spill_loads}
    loop = hmma_loop(f)
    if loop is not None:  # per k-tile (a steady state unrolled by its stages runs S of them)
        one = loop.per_ktile()
        out["loop"] = {"HMMA": one.hmma, "LDSM": one.ldsm, "LDGSTS": one.ldgsts,
                       "other": one.other, "k-tiles": loop.ktiles}  # fmt: skip
    mix = k.hot.mix
    out["hot"] = (k.hot.kind, mix["HMMA"], mix.total - mix["HMMA"])
    out["copies"] = [c.kernel for c in ks if c is not k]
    (tk,) = [t for t in fn.kernels if t.name == k.kernel]
    out["notes"] = [n for n in tk.notes if "block tile" in n or "order" in n]
    # the share of the block tile's HMMA on the GEMM (rows: output channels; columns: the
    # output width, or height x width where folded)
    n, c, o, h, w = size
    kk, stride, pad = CASES[case]
    oh, ow = (h + 2 * pad - kk) // stride + 1, (w + 2 * pad - kk) // stride + 1
    plans = [d for kp in fn.plan.kernel_plans for d in kp.layout]
    (layout,) = [d for d in plans if getattr(d.data, "block", None)]
    bm, bn = layout.data.block[:2]
    folded = any("folded into the columns" in n for n in tk.notes)
    cols = oh * ow if folded else ow
    out["useful"] = o / (-(-o // bm) * bm) * cols / (-(-cols // bn) * bn)
    out["tile"] = f"{bm}x{bn}"
    # HMMA per warp and k-tile the source issues (ptxas drops those whose results no store
    # reads: a column tile past a single column block), and of them on the GEMM
    bk = layout.data.block[2]
    out["useful_hmma"] = bm * bn // math.prod(layout.data.warps) // 128 * bk // 16 * out["useful"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_80,sm_90")
    p.add_argument("--size", default="2,64,128,56,56", help="N,C,O,H,W")
    p.add_argument("--dtype", default="bfloat16")
    a = p.parse_args(argv)
    size = tuple(int(v) for v in a.size.split(","))
    try:
        find_disassembler()
    except (CompilerNotFound, Exception) as e:  # noqa: BLE001 (say what is missing)
        print(f"needs NVRTC and nvdisasm: {e}", file=sys.stderr)
        return 2
    for case in CASES:
        for arch in a.arch.split(","):
            r = measure(size, case, arch, a.dtype)
            hot = r["hot"]
            line = f"{case:13s} {arch}: regs {r['regs']}, spills {r['spills']}; "
            if "loop" in r:
                lp = r["loop"]
                line += (
                    f"k-tile loop per k-tile ({lp['k-tiles']} per iteration): HMMA "
                    f"{lp['HMMA']}, LDSM {lp['LDSM']}, LDGSTS "
                    f"{lp['LDGSTS']}, other {lp['other']} ({lp['other'] / lp['HMMA']:.2f} per "
                    f"HMMA, {lp['other'] / r['useful_hmma']:.2f} per useful HMMA: {r['tile']} "
                    f"tile, {r['useful']:.0%} of its HMMA on the GEMM)"
                )
            else:
                line += "no loop holds HMMA"
            line += f"; instrument hot {hot[0]}: HMMA {hot[1]}, other {hot[2]}"
            if r["copies"]:
                line += f"; other kernels: {', '.join(r['copies'])}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
