"""Issue 23's SASS bar over whole models: every tensor-core kernel of the 16-bit zoo, no GPU.

    python benchmarks/zoo_sass.py [MODELS ...] [--arch sm_80,sm_90] [--dtype bfloat16]
                                  [--json PATH]

Each zoo model (default: BERT-base, GPT-2 small, ViT-B/16, ResNet-50, MobileNetV2) is built
at full size in a 16-bit dtype (its GEMMs and convolutions on tensor cores) and compiled for
each arch; NVRTC makes the cubin and NVIDIA's disassembler the listing
(:mod:`polyfuse.cuda.toolchain.sass`). Per kernel holding HMMA: its block tile, whether its
steady k-tile loop is unrolled by its stages, the k-tiles one iteration of its k-tile loop runs,
its non-HMMA instructions per HMMA there (:func:`polyfuse.cuda.toolchain.sass.hmma_loop`; none
where every k-tile is unrolled), registers and spills. Per model and arch a summary line: the
tensor-core kernels, those with a k-tile loop, the most others per HMMA, how many are over
the issue's 2, and the kernels that spill. Prints the summary table (``-v``: every kernel)
and writes ``benchmarks/results/zoo_sass.json``. Without NVRTC or the disassembler it says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "zoo_sass.json"
MODELS = ("bert_base", "gpt2_small", "vit_b16", "resnet50", "mobilenet_v2")
#: the issue's bar: at most this many other instructions per HMMA in a k-tile loop
BAR = 2.0


def model_kernels(name: str, arch: str, dtype: str = "bfloat16") -> list[dict[str, Any]]:
    """Per tensor-core kernel of zoo model ``name`` compiled for ``arch``: its hot-loop
    figures (see the module doc)."""
    import polyfuse
    from polyfuse import zoo
    from polyfuse.cuda.toolchain.compiler import compile_cuda
    from polyfuse.cuda.toolchain.sass import (
        TENSOR_MMA,
        find_disassembler,
        hmma_loop,
        parse_listing,
    )

    ins, outs, consts, _ = zoo.build(name, "full", weights="zeros", dtype=dtype)
    fn = polyfuse.compile(ins, outs, arch=arch, constants=consts, check_cuda=False)
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    listing = parse_listing(find_disassembler().disassemble(binary.image), arch)
    rows = []
    for k in fn.kernels:
        f = listing.get(k.function)
        ops = [i.opcode for b in f.blocks for i in b.instructions] if f is not None else []
        if not any(o.startswith(TENSOR_MMA) for o in ops):
            continue
        tile = next((n for n in k.notes if "block tile" in n), "")
        tile = tile[tile.index("block tile") + len("block tile ") :].split(",")[0] if tile else ""
        res = binary.resources[k.function]
        loop = hmma_loop(f)
        rows.append(
            {
                "kernel": k.name,
                "tile": tile,
                "unrolled": any("steady k-tile loop unrolled" in n for n in k.notes),
                "ktiles": loop.ktiles if loop else None,
                "per_hmma": round(loop.per_hmma, 3) if loop else None,
                "registers": res.registers,
                "spill_bytes": res.spill_stores + res.spill_loads,
            }
        )
    return rows


def summary(name: str, arch: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The model's line: kernels, looped kernels, the most others per HMMA, those over the
    bar, spilling kernels."""
    looped = [r["per_hmma"] for r in rows if r["per_hmma"] is not None]
    return {
        "model": name,
        "arch": arch,
        "tensor_kernels": len(rows),
        "looped": len(looped),
        "max_per_hmma": max(looped, default=None),
        "over_bar": sum(v > BAR for v in looped),
        "spilling": sum(r["spill_bytes"] > 0 for r in rows),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", default=list(MODELS))
    p.add_argument("--arch", default="sm_80,sm_90")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    p.add_argument("--json", type=Path, default=RESULTS, help=f"default {RESULTS}")
    p.add_argument("-v", "--verbose", action="store_true", help="every kernel's line too")
    a = p.parse_args(argv)
    from polyfuse.cuda.toolchain.compiler import available_compilers
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, find_disassembler

    if "nvrtc" not in available_compilers():
        print("zoo_sass: NVRTC is not installed (pip install '.[nvrtc]')", file=sys.stderr)
        return 1
    try:
        find_disassembler()
    except DisassemblerNotFound as e:
        print(f"zoo_sass: {e}", file=sys.stderr)
        return 1
    out: dict[str, Any] = {"dtype": a.dtype, "bar": BAR, "models": []}
    head = ("model", "arch", "tensor kernels", "k-tile loops", "max /HMMA", f"over {BAR:g}",
            "spilling")  # fmt: skip
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for name in a.models:
        for arch in a.arch.split(","):
            print(f"{name} {arch} ...", file=sys.stderr, flush=True)
            rows = model_kernels(name, arch, a.dtype)
            s = summary(name, arch, rows)
            out["models"].append({**s, "kernels": rows})
            lines.append(" | ".join(str(s[k]) for k in (
                "model", "arch", "tensor_kernels", "looped", "max_per_hmma", "over_bar",
                "spilling")))  # fmt: skip
            if a.verbose:
                for r in rows:
                    print(f"  {r['kernel']:28s} {r['tile']:24s} unrolled={r['unrolled']!s:5s} "
                          f"k-tiles={r['ktiles']} /HMMA={r['per_hmma']} regs={r['registers']} "
                          f"spill={r['spill_bytes']}")  # fmt: skip
    print("\n".join(lines))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps(out, indent=1))
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
