"""The GEMM tile estimate against the SASS of the kernels it ranks (issue 20, items 2 and 3).

    python benchmarks/tile_check.py [--arch sm_90,sm_80] [--only CASE,...] [--top 3]
                                    [--tiles 128x128x8x8x8,...] [--json PATH]

For each compute case of ``sass.py`` (matmul 4096³, FFN up, the convs, attention) and each
arch, the cost model's ``--top`` ranked tilings of every GEMM-like micrograph are built as the
compiler builds them (``MappingConfig.gemm_tile``, the same fold, promotions and loop passes),
compiled with NVRTC and disassembled (no GPU). Per candidate it prints what the ranking priced
— the *GEMM tile estimate* (:func:`polyfuse.poly.costs.gemm.gemm_tile_desc`, from the loop
code the passes will emit) — beside what the instrument counts in the real kernel's SASS
(:func:`polyfuse.cuda.codegen.kernel_cost.describe_sass`), both through the same model
(:func:`polyfuse.poly.costs.model_kernel`): modelled µs of each and their ratio, the k-tile
loop's FFMA share predicted and counted, instructions per thread, registers and spills,
occupancy. The last lines give the agreement over every candidate (the ratio's range and
geometric mean) and whether the two rank the candidates alike. Everything printed is
*modelled*: no GPU ran these kernels. JSON: ``results/tile_check.json``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import sass as bench  # noqa: E402

import polyfuse  # noqa: E402
from polyfuse.cuda.codegen.kernel_cost import describe_kernel  # noqa: E402
from polyfuse.cuda.toolchain.sass import analyse, find_disassembler  # noqa: E402
from polyfuse.errors import CompilerNotFound  # noqa: E402
from polyfuse.poly.costs import model_kernel  # noqa: E402
from polyfuse.poly.device import device_for_arch  # noqa: E402
from polyfuse.poly.mapping import MappingConfig  # noqa: E402
from polyfuse.poly.promote import GemmKernel, pipeline_stages  # noqa: E402
from polyfuse.poly.tiling import GemmShape, detect_gemm, loop_share, rank_gemm_tiles  # noqa: E402

DEFAULT_JSON = HERE / "results" / "tile_check.json"
CHECK_CASES = ("matmul4096_bias_gelu", "ffn_up", "conv3x3", "conv1x1", "conv3x3_s2")


def _tile(text: str) -> tuple[int, int, int, int, int]:
    parts = tuple(int(x) for x in text.lower().split("x"))
    if len(parts) != 5:
        raise argparse.ArgumentTypeError(f"tile {text!r}: BMxBNxTMxTNxTK, e.g. 128x128x8x8x8")
    return parts  # type: ignore[return-value]


def check_case(
    name: str, arch: str, top: int, extra: list[tuple[int, ...]] = ()
) -> list[dict[str, Any]]:
    """One row per GEMM micrograph and candidate tiling of case ``name`` on ``arch``."""
    device = device_for_arch(arch)
    ins, outs = bench.CASES[name].build()
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False, name=name)
    rows = []
    for sm in fn.plan.scheduled:
        shape = detect_gemm(sm)
        if not isinstance(shape, GemmShape):
            continue
        mg = sm.model.micrograph.name
        ranked = rank_gemm_tiles(shape, device, limit=top, stages=pipeline_stages(arch))
        tiles = [t.choice for t in ranked]
        tiles += [t for t in extra if t not in tiles]
        for rank, tile in enumerate(tiles):
            (est,) = rank_gemm_tiles(shape, device, tile, stages=pipeline_stages(arch))
            assert est.estimate is not None
            built = polyfuse.compile(
                ins, outs, arch, check_cuda=False, name=name, mapping=MappingConfig(gemm_tile=tile)
            )
            report = analyse(built.cuda_source, (arch,), kernels=built.kernels)
            gemm = {
                kp.name
                for kp in built.plan.kernel_plans
                for p in kp.parts
                if isinstance(p, GemmKernel) and p.scheduled.model.micrograph.name == mg
            }
            for k, ks in zip(built.kernels, report.kernels, strict=True):
                if k.name not in gemm:
                    continue
                sass = model_kernel(describe_kernel(k, ks), device)
                model = model_kernel(est.estimate, device)
                r = ks.resources
                assert est.code is not None
                predicted = loop_share(est.code, worst=False)
                rows.append(
                    {
                        "case": name,
                        "arch": arch,
                        "micrograph": mg,
                        "kernel": k.name,
                        "tile": list(tile),
                        "rank": rank + 1 if rank < len(ranked) else None,
                        "estimate_us": round(model.us, 2),
                        "sass_us": round(sass.us, 2),
                        "ratio": round(model.us / sass.us, 4),
                        "bound": [model.bound, sass.bound],
                        "ffma_share": [round(predicted, 3), round(ks.hot.mix.ffma_share, 4)],
                        "hot_loop": ks.hot.kind,
                        "slots": [round(est.estimate.mix.slots), round(ks.per_thread.total)],
                        "registers": [est.estimate.registers, r.registers if r else None],
                        "spill_bytes": (r.spill_stores + r.spill_loads) if r else None,
                        "blocks_per_sm": [
                            model.occupancy.blocks_per_sm,
                            sass.occupancy.blocks_per_sm,
                        ],
                    }
                )
    return rows


def _format(rows: list[dict[str, Any]]) -> str:
    head = ["case", "arch", "kernel", "rank", "tile", "estimate us", "SASS us", "ratio"]
    head += ["FFMA est/SASS", "slots est/SASS", "regs est/SASS", "spill B", "blocks/SM"]
    body = [
        [
            r["case"],
            r["arch"],
            r["kernel"],
            str(r["rank"] or "-"),
            "x".join(map(str, r["tile"])),
            f"{r['estimate_us']:.1f}",
            f"{r['sass_us']:.1f}",
            f"{r['ratio']:.3f}",
            f"{r['ffma_share'][0]:.0%} / {r['ffma_share'][1]:.1%} ({r['hot_loop']})",
            f"{r['slots'][0]} / {r['slots'][1]}",
            f"{r['registers'][0]} / {r['registers'][1]}",
            str(r["spill_bytes"]),
            f"{r['blocks_per_sm'][0]} / {r['blocks_per_sm'][1]}",
        ]
        for r in rows
    ]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(x, widths, strict=True)) for x in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def agreement(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The ratio's range and geometric mean, the FFMA shares' largest gap, and per case and
    arch whether the estimate's first choice is within 2 % of the best by SASS."""
    ratios = [r["ratio"] for r in rows]
    gaps = [abs(r["ffma_share"][0] - r["ffma_share"][1]) for r in rows if r["hot_loop"] == "k-tile"]
    same: dict[str, bool] = {}
    for key in {(r["case"], r["arch"], r["micrograph"]) for r in rows}:
        group = [r for r in rows if (r["case"], r["arch"], r["micrograph"]) == key]
        ranked = [r for r in group if r["rank"]]
        if not ranked:  # only --tiles given (--top 0): no first choice to judge
            continue
        first = min(ranked, key=lambda r: r["rank"])
        best = min(r["sass_us"] for r in group)
        same["/".join(key)] = first["sass_us"] <= 1.02 * best
    return {
        "candidates": len(rows),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
        "ratio_geomean": round(math.exp(sum(math.log(x) for x in ratios) / len(ratios)), 4),
        "ffma_share_gap_max": round(max(gaps), 4) if gaps else None,
        "first_choice_within_2pct_of_sass_best": same,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arch", default="sm_90,sm_80", help="comma-separated (default both)")
    ap.add_argument("--only", default=",".join(CHECK_CASES), help="comma-separated cases")
    ap.add_argument("--top", type=int, default=3, help="ranked candidates per micrograph")
    ap.add_argument("--tiles", default="", help="more tilings to build, BMxBNxTMxTNxTK,...")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"default {DEFAULT_JSON}")
    args = ap.parse_args(argv)
    extra = [_tile(t) for t in args.tiles.split(",") if t.strip()]
    try:
        dis = find_disassembler()
    except CompilerNotFound as e:
        print(f"tile check: {e}", file=sys.stderr)
        return 2
    print(f"GEMM tile estimate vs SASS ({dis}); every time is modelled, not measured")
    rows: list[dict[str, Any]] = []
    try:
        for arch in [a.strip() for a in args.arch.split(",") if a.strip()]:
            for name in [c.strip() for c in args.only.split(",") if c.strip()]:
                got = check_case(name, arch, args.top, extra)
                print(f"  {name} {arch}: {len(got)} kernels", file=sys.stderr)
                rows += got
    except CompilerNotFound as e:
        print(f"tile check: {e}", file=sys.stderr)
        return 2
    print(_format(rows))
    agree = agreement(rows)
    print(
        f"\nagreement over {agree['candidates']} kernels: estimate / SASS modelled time "
        f"{agree['ratio_min']:.3f}..{agree['ratio_max']:.3f} (geometric mean "
        f"{agree['ratio_geomean']:.3f}); k-tile FFMA share predicted within "
        f"{100 * (agree['ffma_share_gap_max'] or 0):.1f} points"
    )
    for key, ok in sorted(agree["first_choice_within_2pct_of_sass_best"].items()):
        verdict = "within 2 %" if ok else "NOT within 2 %"
        print(f"  {key}: first choice {verdict} of the best of the candidates by SASS")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"rows": rows, "agreement": agree}, indent=1))
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
