"""SASS of the tensor-core GPU-day cases' k-tile loops (issue 23's HMMA per non-HMMA), no GPU.

    python benchmarks/tensor_core_sass.py [--arch sm_80,sm_90] [--only NAMES] [--variants]
                                          [--json PATH]

Each case of ``gpu_cases.TENSOR_CORE`` at full size (the models' choices: bf16 and tf32
4096³, the BERT-base FFN up-projection with GELU, the ResNet 3x3 conv, attention S512;
``--variants`` adds the forced stage, fragment-buffer and k-tile variants the GPU day times
beside them) is compiled for each arch, NVRTC makes the cubin and NVIDIA's disassembler the
listing (:mod:`polyfuse.cuda.toolchain.sass`); per kernel holding HMMA, its k-tile loop's
steady state (:func:`polyfuse.cuda.toolchain.sass.hmma_loop`: the first loop holding HMMA,
every instruction of its blocks once; ``k-tiles``: the k-tiles one iteration runs, S where
the steady state is unrolled by its stages): per k-tile HMMA, LDSM, LDGSTS and the other
instructions, those per HMMA (the issue asks at most 2), registers and spills, and the block
tile. An int8
GEMM (``matmul_int8``: uint8 ``x @ W^T`` 4096³ on ``m16n8k32``) and an int8 conv
(``conv3x3_int8``: the ResNet conv's shape) are measured beside them, IMMA in the HMMA column. A
kernel
whose k-tile loop was unrolled whole has no such loop and says so. Prints a table and writes
``benchmarks/results/tensor_core_sass.json``. Without NVRTC or the disassembler it says so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from gpu_artifacts import _build_case  # noqa: E402
from gpu_cases import TENSOR_CORE  # noqa: E402

import polyfuse  # noqa: E402
from polyfuse.cuda.toolchain.compiler import compile_cuda  # noqa: E402
from polyfuse.cuda.toolchain.sass import (  # noqa: E402
    TENSOR_MMA,
    DisassemblerNotFound,
    find_disassembler,
    hmma_loop,
    parse_listing,
)
from polyfuse.errors import CompilerNotFound  # noqa: E402
from polyfuse.poly.mapping import MappingConfig  # noqa: E402

DEFAULT_JSON = HERE / "results" / "tensor_core_sass.json"
#: the cases the models decide (the rest force a stage count, k-tile or fragment buffers)
MODEL_CASES = tuple(n for n, c in TENSOR_CORE.items() if c.peers)


def _byte_matmul() -> tuple[list[Any], list[Any]]:
    """uint8 activations times an int8 ``W^T`` (``x @ W^T``, 4096³), summed in int32: the
    integer GEMM of a quantized linear on ``m16n8k32`` (no GPU-day case: SASS only)."""
    from polyfuse import te

    x = te.placeholder((4096, 4096), "uint8", name="x")
    w = te.placeholder((4096, 4096), "int8", name="w")
    r = te.reduce_axis(4096, name="r")
    y = te.compute((4096, 4096), lambda i, j: te.sum(
        te.cast(x[i, r], "int32") * te.cast(w[j, r], "int32"), axis=r), name="y")  # fmt: skip
    return [x, w], [y]


def _byte_conv() -> tuple[list[Any], list[Any]]:
    """uint8 activations convolved with int8 weights (the ResNet 3x3 stage conv of the GPU
    day: batch 32, 64 -> 64 channels, 56x56, padding 1), summed in int32: a quantized conv's
    implicit GEMM on ``m16n8k32``, both operands channels-last (SASS only)."""
    from polyfuse import ops, te

    x = te.placeholder((32, 64, 56, 56), "uint8", name="x")
    w = te.placeholder((64, 64, 3, 3), "int8", name="w")
    return [x, w], [ops.conv2d(x, w, padding=1, name="y", dtype="int32")]


#: SASS-only cases beside the GPU day's
BYTE_CASES = {"matmul_int8": _byte_matmul, "conv3x3_int8": _byte_conv}


def measure(name: str, arch: str) -> list[dict[str, Any]]:
    """Per kernel of case ``name`` on ``arch`` that holds HMMA (or IMMA): its k-tile loop's
    figures."""
    if name in BYTE_CASES:
        inputs, outputs = BYTE_CASES[name]()
        mapping = MappingConfig()
    else:
        inputs, outputs, _, _ = _build_case(name, 1)
        mapping = MappingConfig(**TENSOR_CORE[name].mapping)
    fn = polyfuse.compile(inputs, outputs, arch=arch, check_cuda=False, mapping=mapping)
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    listing = parse_listing(find_disassembler().disassemble(binary.image), arch)
    rows = []
    for k in fn.kernels:
        f = listing.get(k.function)
        if f is None or not any(i.opcode.startswith(TENSOR_MMA) for b in f.blocks
                                for i in b.instructions):  # fmt: skip
            continue
        res = binary.resources[k.function]
        tile = next((n for n in k.notes if "block tile" in n), "")
        tile = tile[tile.index("block tile") :].split(",")[0] if tile else ""
        row: dict[str, Any] = {
            "case": name,
            "arch": arch,
            "kernel": k.name,
            "tile": tile.removeprefix("block tile "),
            "registers": res.registers,
            "spill_bytes": res.spill_stores + res.spill_loads,
        }
        loop = hmma_loop(f)
        if loop is not None:  # per k-tile (a steady state unrolled by its stages holds S)
            one = loop.per_ktile()
            row.update(hmma=one.hmma, ldsm=one.ldsm, ldgsts=one.ldgsts, other=one.other,
                       per_hmma=round(loop.per_hmma, 3), ktiles=loop.ktiles)  # fmt: skip
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    head = ("case", "arch", "kernel", "tile", "k-tiles", "HMMA", "LDSM", "LDGSTS", "other",
            "/HMMA", "regs", "spill B")  # fmt: skip
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for r in rows:
        loop = ("hmma" in r and (r.get("ktiles", 1), r["hmma"], r["ldsm"], r["ldgsts"],
                                 r["other"], f"{r['per_hmma']:.2f}")
                ) or ("unrolled",) + ("",) * 5  # fmt: skip
        cells = (r["case"], r["arch"], r["kernel"], r["tile"], *loop, r["registers"],
                 r["spill_bytes"])  # fmt: skip
        lines.append(" | ".join(map(str, cells)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_80,sm_90")
    p.add_argument("--only", default="", help="comma-separated case names")
    p.add_argument("--variants", action="store_true", help="the forced variants too")
    p.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    a = p.parse_args(argv)
    names = [n for n in a.only.split(",") if n] or [
        *(TENSOR_CORE if a.variants else MODEL_CASES),
        *BYTE_CASES,
    ]
    known = [*TENSOR_CORE, *BYTE_CASES]
    unknown = [n for n in names if n not in known]
    if unknown:
        p.error(f"unknown case(s) {', '.join(unknown)}; known: {', '.join(known)}")
    try:
        find_disassembler()
    except (CompilerNotFound, DisassemblerNotFound) as e:
        print(f"needs NVRTC and nvdisasm: {e}", file=sys.stderr)
        return 2
    rows = []
    for name in names:
        for arch in a.arch.split(","):
            print(f"{name} {arch} ...", file=sys.stderr, flush=True)
            rows += measure(name, arch)
    print(table(rows))
    a.json.parent.mkdir(parents=True, exist_ok=True)
    a.json.write_text(json.dumps({"rows": rows}, indent=1))
    print(f"wrote {a.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
