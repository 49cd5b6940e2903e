"""The stage-count table: the shared-memory stages ALCOP's latency model gives each GEMM.

For every GEMM kernel of the cases below (compiled, not run), per arch: the tile the ranking
chose, the k-tiles of the pipelined loop, the stage count S of
:func:`polyfuse.poly.costs.stages.choose_stages`, the shared bytes of its S stages against the
GEMM budget, and the reason; each candidate S's modelled figures (T_load, T_use, blocks per
SM, kernel cycles) or its refusal go to the JSON. Modelled figures only: no GPU is involved.

    python benchmarks/stages.py                       # sm_80 and sm_90, table + JSON
    python benchmarks/stages.py --arch sm_90 --json out.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import polyfuse
from polyfuse import examples, ops, te
from polyfuse.poly.device import A100, H100
from polyfuse.poly.kernel_map import stage_problem
from polyfuse.poly.policy import gemm_tile_budget
from polyfuse.poly.promote import GemmKernel

HERE = Path(__file__).resolve().parent
DEVICES = {"sm_80": A100, "sm_90": H100}


def _qk(batch: int = 16, heads: int = 12, seq: int = 128, dim: int = 64):
    """BERT-base attention scores Q·Kᵀ on [B, H, S, D] (S = 128)."""
    q = te.placeholder((batch, heads, seq, dim), name="q")
    k = te.placeholder((batch, heads, seq, dim), name="k")
    return [q, k], [ops.matmul(q, ops.transpose(k, (0, 1, 3, 2)), name="scores")]


def cases():
    """(name, inputs, outputs) of the table's graphs at full size."""
    mm = examples.matmul_bias_gelu(4096, 4096, 4096)
    ffn = examples.matmul_bias_gelu(8192, 768, 3072)
    conv = examples.conv2d_relu(batch=32, channels=64, size=56, filters=64)
    return [
        ("matmul 4096^3", *mm[:2]),
        ("FFN up 8192x768 . 768x3072", *ffn[:2]),
        ("BERT QK^T 16x12x128x64", *_qk()),
        ("conv3x3 N32 C64->64 56^2", *conv[:2]),
    ]


def rows(arch: str) -> list[dict]:
    """One row per GEMM kernel of every case on ``arch``."""
    device = DEVICES[arch]
    out = []
    for name, inputs, outputs in cases():
        fn = polyfuse.compile(inputs, outputs, arch, check_cuda=False)
        for mm in fn.plan.mapped:
            if not isinstance(mm, GemmKernel):
                continue
            stage_notes = [n[len("stages: ") :] for n in mm.notes if n.startswith("stages: ")]
            per_stage = 4 * sum(p.floats for p in mm.promotions)
            row = {
                "case": name,
                "arch": arch,
                "kernel": mm.scheduled.name,
                "tile": list(mm.tiling.choice) if mm.tiling and mm.tiling.choice else None,
                "stages": mm.stages,
                "stage_bytes": per_stage,
                "shared_bytes": per_stage * mm.stages,
                "budget_bytes": gemm_tile_budget(device),
                "reason": stage_notes[0] if stage_notes else "not pipelined (one k-tile loop)",
                "candidates": stage_notes[1:],
            }
            if mm.stages > 1:
                row["ktiles"] = stage_problem(mm).ktiles
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_80,sm_90")
    ap.add_argument("--json", default=str(HERE / "measured" / "stages.json"))
    args = ap.parse_args(argv)
    table = [r for arch in args.arch.split(",") for r in rows(arch)]
    head = f"{'case':30} {'arch':6} {'tile (BM,BN,TM,TN,TK)':24} {'kt':>5} {'S':>2} {'shared B':>9}"
    print(head + "  reason")
    for r in table:
        tile = ",".join(map(str, r["tile"])) if r["tile"] else "-"
        print(
            f"{r['case']:30} {r['arch']:6} {tile:24} {r.get('ktiles', 1):>5} {r['stages']:>2} "
            f"{r['shared_bytes']:>9}  {r['reason']}"
        )
        for c in r["candidates"]:
            print(f"{'':40}{c}")
    Path(args.json).write_text(json.dumps(table, indent=1) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
