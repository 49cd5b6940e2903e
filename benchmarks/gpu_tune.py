"""``--tune`` (the GPU machine, with islpy): the cost model's top GEMM tilings of the compute
cases timed on the GPU beside their modelled times.

This is what the tile ranking (``poly/tiling.rank_gemm_tiles`` → the cost model) is checked
against: per GEMM-like micrograph of each case of :data:`gpu_cases.COMPUTE` at full size,
``polyfuse tune`` builds the top ``--top`` candidates, times each kernel (median of its
launches) and reports measured and modelled µs. Nothing is stored: the tune cache is the GPU
machine's, which is given back after the day. One JSON out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gpu_cases import COMPUTE, _compute_args

#: The module the ``module:function`` model arguments name (this file, on sys.path).
MODULE = Path(__file__).stem


def build(name: str) -> tuple[list, list]:
    """The inputs and outputs of compute case ``name`` at full size."""
    from polyfuse import examples

    inputs, outputs, _ = getattr(examples, COMPUTE[name][0])(**_compute_args(name, 1))
    return inputs, outputs


def ffn_up_gelu() -> tuple[list, list]:
    return build("ffn_up_gelu")


def matmul_4096() -> tuple[list, list]:
    return build("matmul_4096")


def conv3x3_relu() -> tuple[list, list]:
    return build("conv3x3_relu")


def attention_s128() -> tuple[list, list]:
    return build("attention_s128")


def attention_s512() -> tuple[list, list]:
    return build("attention_s512")


def run_tune(out: Path, arch: str = "sm_90", top: int = 6, cases: list[str] | None = None) -> Any:
    """Time the top tilings of every case; write and return the JSON report."""
    from polyfuse.cache import CompileCache
    from polyfuse.tune import _tuned_json, tune

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    report: dict[str, Any] = {"arch": arch, "top": top, "cases": {}}
    for name in cases or list(COMPUTE):
        try:
            found = tune(f"{MODULE}:{name}", arch, top=top, cache=CompileCache(), say=print)
            report["cases"][name] = [_tuned_json(t) for t in found]
        except Exception as e:  # one case must not hide the others
            report["cases"][name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"tune {name}: {type(e).__name__}: {e}", flush=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
    return report
