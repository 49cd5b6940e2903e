"""The GEMM + row-reduction stitch (rule 9) on one full-size transformer layer: each decision's
figures, the cheapest whole-row tile over a wider tile space than the stitch tries, and the
reduction kernel's own modelled time (the most a stitch could save). All figures modelled.

Usage::

    python benchmarks/row_stitch.py [--model bert_base|gpt2_small|vit_b16] [--arch sm_80]

Per rule-9 candidate of one layer (``polyfuse.compile`` of the zoo model with one layer,
``check_cuda=False``): the decision and its reason (:mod:`polyfuse.stitch.row_cost`); then
every whole-row tiling (BN the row or its power of two; BM 2-32; TM dividing BM; TN in
:data:`TNS`; threads a multiple of 32 up to 512 whose warps divide BM; registers within the
budget; k-tiles 8/16/32) priced by the same cost model, the cheapest shown beside the best
tile (shared memory unchecked and tilings the stitch does not generate included: a lower
bound on what a whole-row tile costs); and, when refused, the modelled time of the reduction
kernel that stays apart: were the stitch to make it vanish entirely, its gain could not
exceed that time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: register micro-tile widths tried by the wider sweep
TNS = (1, 2, 3, 4, 6, 8, 12, 16)


def whole_row_sweep(shape, device, n: int) -> list[tuple[float, tuple[int, ...]]]:
    """(modelled us, tile) of every whole-row tiling of the wider space, cheapest first."""
    from polyfuse.poly.policy import GEMM_REG_BUDGET, gemm_tile_registers
    from polyfuse.poly.promote import pipeline_stages
    from polyfuse.poly.tiling import rank_gemm_tiles
    from polyfuse.stitch.gemm_rows import _pow2

    stages = pipeline_stages(device.arch)
    out = []
    for bn in sorted({n, _pow2(n)}):
        for bm in range(2, 33):
            for tm in (t for t in range(1, 13) if bm % t == 0):
                for tn in (t for t in TNS if bn % t == 0):
                    threads = (bm // tm) * (bn // tn)
                    if threads % 32 or threads > 512 or bm % (threads // 32):
                        continue
                    if gemm_tile_registers(tm, tn) > GEMM_REG_BUDGET:
                        continue
                    for tk in (8, 16, 32):
                        tile = (bm, bn, tm, tn, tk)
                        (t,) = rank_gemm_tiles(shape, device, tile, limit=1, stages=stages)
                        out.append((t.modelled_us, tile))
    return sorted(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bert_base", choices=("bert_base", "gpt2_small", "vit_b16"))
    ap.add_argument("--arch", default="sm_80")
    args = ap.parse_args(argv)

    import polyfuse
    from polyfuse.cuda.codegen.kernel_cost import kernel_modelled
    from polyfuse.poly.device import BY_ARCH
    from polyfuse.poly.tiling import detect_gemm
    from polyfuse.stitch.gemm_rows import GEMM_ROWS_RULE, _row_shape
    from polyfuse.zoo import MODELS
    from polyfuse.zoo.backend import TeBackend

    spec = MODELS[args.model]
    cfg = dict(spec.configs["full"], layers=1)
    tb = TeBackend(seed=0, weights="zeros")
    outs = spec.define(tb, cfg)
    fn = polyfuse.compile(tb.inputs, outs, arch=args.arch, constants=tb.constants, check_cuda=False)
    device = BY_ARCH[args.arch]
    print(f"{args.model}, one layer, {args.arch} ({device.name}, {device.sms} SMs); modelled")
    scheduled = {s.name: s for s in fn.plan.scheduled}
    for d in fn.plan.stitches:
        if d.rule != GEMM_ROWS_RULE or not d.data:
            continue
        print(f"\n{d}")
        shape = detect_gemm(scheduled[d.producer[0]])
        n = _row_shape(shape)[2]
        sweep = whole_row_sweep(shape, device, n)
        if sweep:
            us, tile = sweep[0]
            print(
                f"  wider sweep ({len(sweep)} whole-row tilings): cheapest {tile} {us:.2f} us "
                f"vs best tile {d.data['best_tile']} {d.data['best_tile_us']:.2f} us: "
                f"{us - d.data['best_tile_us']:+.2f} us against {d.data['saved_us']:.2f} us saved"
            )
        if not d.stitched:
            for k in fn.kernels:
                if set(k.micrographs) == set(d.consumer):
                    m = kernel_modelled(k, device)
                    print(f"  the reduction kernel apart ({k.name}): {m}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
