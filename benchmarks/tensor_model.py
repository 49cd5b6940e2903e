"""The cost model on the tensor-core cases against their last H100 times (no GPU needed).

    python benchmarks/tensor_model.py [--arch sm_90] [--json PATH]

Every case of ``gpu_cases.TENSOR_CORE`` is compiled with today's code at full size and its
kernels go through the cost model (:mod:`polyfuse.poly.costs`, the kernel IR estimate: the
mma instructions on the tensor pipe at :attr:`polyfuse.poly.device.DeviceSpec.mma_tflops`, the
fills, ``ldmatrix`` and epilogue on the others); a case's modelled time is one timed call of
its launches. Beside it the last time measured on an H100 for that case
(``measured/h100-2026-11-26-4960172-defaults.json`` for the default cases,
``measured/h100-2026-11-26-e2ee7c1.json`` for the forced variants, whose kernels the mapping
fixes), and measured / modelled: the band is 0.67-1.5 (issue 20). The measured kernels are
those commits', not rebuilt: a default case whose choice changed since (its stage count,
its tile) is compared with a different kernel, which the table says. Every figure here is
MODELLED but the measured column. Writes ``benchmarks/results/tensor_model.json``.
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
from polyfuse.cuda.codegen.kernel_cost import describe_kernel  # noqa: E402
from polyfuse.poly.costs import call_us, model_kernel, peak_floor_us  # noqa: E402
from polyfuse.poly.device import device_for_arch  # noqa: E402
from polyfuse.poly.mapping import MappingConfig  # noqa: E402

#: where each case's last H100 time comes from: the defaults' run, else the variants' run
DAYS = (
    HERE / "measured" / "h100-2026-11-26-4960172-defaults.json",
    HERE / "measured" / "h100-2026-11-26-e2ee7c1.json",
)
DEFAULT_JSON = HERE / "results" / "tensor_model.json"
BAND = (0.67, 1.5)


def measured() -> dict[str, tuple[float, str]]:
    """``{case: (ms, commit)}``: each tensor-core case's time from the first day that has it."""
    out: dict[str, tuple[float, str]] = {}
    for path in DAYS:
        day = json.loads(path.read_text())
        for r in day["run"]["results"]:
            if r["name"] in TENSOR_CORE and r.get("polyfuse_ms") and r["name"] not in out:
                commit = day["run"].get("prepared_commit") or day["commit"]
                out[r["name"]] = (r["polyfuse_ms"], commit)
    return out


def model_case(name: str, arch: str = "sm_90") -> dict[str, Any]:
    """Case ``name`` compiled for ``arch`` today: its kernels' modelled times, bounds and
    peak floors, and the call's modelled time."""
    device = device_for_arch(arch)
    inputs, outputs, _, _ = _build_case(name, 1)
    mapping = MappingConfig(**TENSOR_CORE[name].mapping)
    fn = polyfuse.compile(inputs, outputs, arch=arch, check_cuda=False, mapping=mapping)
    descs = [describe_kernel(k) for k in fn.kernels]
    modelled = [model_kernel(d, device) for d in descs]
    return {
        "modelled_us": round(call_us(modelled), 3),
        "kernels": [
            {
                "name": k.name,
                "modelled_us": round(m.us, 3),
                "bound": m.bound,
                "floor_us": round(peak_floor_us(d, device), 3),
                "mma_per_thread": d.mix.mma,
            }
            for k, d, m in zip(fn.kernels, descs, modelled, strict=True)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="sm_90")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON)
    ap.add_argument("--only", default="", help="comma-separated case names")
    args = ap.parse_args(argv)
    times = measured()
    names = [n for n in TENSOR_CORE if not args.only or n in args.only.split(",")]
    rows = []
    print(f"{'case':26s} {'measured ms':>11s} {'commit':>7s} {'modelled ms':>11s} "
          f"{'meas/model':>10s}  bounds (MODELLED on {args.arch})")  # fmt: skip
    for name in names:
        r = model_case(name, args.arch)
        ms, commit = times.get(name, (None, ""))
        ratio = ms * 1e3 / r["modelled_us"] if ms else None
        inside = ratio is not None and BAND[0] <= ratio <= BAND[1]
        rows.append({"case": name, "measured_ms": ms, "commit": commit, "ratio": ratio,
                     "in_band": inside, **r})  # fmt: skip
        bounds = ", ".join(k["bound"] for k in r["kernels"])
        meas = f"{ms:11.3f} {commit:>7s}" if ms else f"{'not yet':>11s} {'':>7s}"
        fit = f"{ratio:10.2f}{'' if inside else ' *'}" if ratio else f"{'':>10s}"
        print(f"{name:26s} {meas} {r['modelled_us'] / 1e3:11.3f} {fit}  {bounds}")
    timed = [r for r in rows if r["ratio"] is not None]
    n = sum(r["in_band"] for r in timed)
    print(f"{n}/{len(timed)} measured cases inside {BAND[0]}-{BAND[1]} (* outside); "
          f"{len(rows) - len(timed)} not yet measured")  # fmt: skip
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"arch": args.arch, "band": BAND, "rows": rows}, indent=1))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
