"""Loop quality of the compute cases of issue 20 item 2, measured in SASS for sm_80 and sm_90.

Each case of ``benchmarks/sass.py`` is compiled at full size, its cubin disassembled, and the
hot k-tile loop of every GEMM-like kernel held to the item's targets: the FFMA share (matmul
and FFN >= 85 %, convs and attention >= 80 %), no spills, matmul/FFN operand fragments by
64/128-bit shared loads only, multiply-adds on padding <= 5 % (or the reason in the plan),
every shared tile copied as float4 by all the block's threads. A regression of the code
generator (a loop no longer unrolled, a select back in the update, an address recomputed, a
spill) fails here. Needs NVRTC and nvdisasm/cuobjdump (``pip install 'polyfuse[sass]'``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from kernel_checks import require_sass_tools as require_tools

import polyfuse
from polyfuse.cuda.toolchain.sass import analyse

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import sass as bench  # noqa: E402

ARCHS = ("sm_80", "sm_90")
_RESULTS: dict[tuple[str, str], list[dict]] = {}


def verdicts(case: str, arch: str) -> list[dict]:
    """benchmarks/sass.py's item-2 rows of one case on one arch (compiled once per run)."""
    key = (case, arch)
    if key not in _RESULTS:
        ins, outs = bench.CASES[case].build()
        kernels, _, fn = bench.run_case(case, ins, outs, arch)
        _RESULTS[key] = bench.gemm_rows(case, kernels, bench.CASES[case], bench.gemm_plan(fn))
    return _RESULTS[key]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "case",
    # attention at S=512 takes 7 s per arch: the slow tier checks it (CI runs both tiers)
    [pytest.param(c, marks=pytest.mark.slow) if c == "attention_s512" else c for c in bench.CASES],
)
def test_hot_loops_meet_item_2(case, arch):
    require_tools()
    rows = verdicts(case, arch)
    assert rows, f"{case}: no GEMM-like kernel with a k-tile hot loop"
    want = bench.CASES[case]
    for v in rows:
        where = f"{case}/{v['kernel']} {arch}"
        assert v["ffma_share"] >= want.ffma_target, f"{where}: FFMA {v['ffma_share']:.1%}"
        assert v["spill_bytes"] == 0, f"{where}: spills"
        if want.vector_fragments:
            assert v["lds_widths"].get("32", 0) == 0, f"{where}: 32-bit shared loads"
            assert v["lds_widths"].get("128", 0) > 0, f"{where}: no 128-bit fragment loads"
        assert v["padding"] <= bench.PADDING_LIMIT or "no fold" in v["padding_reason"], where
        for t in v["tiles"]:  # every tile copied as float4 by every thread of the block
            assert t["width"] == 4 and t["busy_threads"] == t["threads"], f"{where}: {t}"
        assert v["ok"], where


@pytest.mark.parametrize("arch", ARCHS)
def test_conv3x3_has_no_padding_and_one_ffma_per_term(arch):
    """The issue's 0 % FFMA conv: every term an FFMA (no FMUL/FADD/FSEL select), and its 56
    columns tiled without padding (8x8 pixels per block instead of 64 columns)."""
    require_tools()
    (v,) = verdicts("conv3x3", arch)
    assert v["padding"] == 0.0
    assert v["fmul_fadd"] == [0, 0] and v["ffma_share"] >= 0.80


def test_launch_bounds_leave_ptxas_room_no_spills():
    """The 1x1 conv on 64x64 blocks of 8x8 micro-tiles, k-tile 8: a bound at 128 registers
    (the estimate 120 + 8) made ptxas spill 24 B in the hot loop on sm_90; the bound now
    leaves REGISTER_MARGIN registers (6 blocks of <= 168)."""
    require_tools()
    from polyfuse.poly.mapping import MappingConfig

    ins, outs = bench.CASES["conv1x1"].build()
    fn = polyfuse.compile(
        ins, outs, "sm_90", check_cuda=False, mapping=MappingConfig(gemm_tile=(64, 64, 8, 8, 8))
    )
    (k,) = fn.kernels
    assert "__launch_bounds__(64, 6)" in k.source
    (ks,) = analyse(fn.cuda_source, ("sm_90",), kernels=fn.kernels).kernels
    assert ks.resources is not None
    assert ks.resources.spill_stores == ks.resources.spill_loads == 0
    assert ks.hot.kind == "k-tile" and ks.hot.mix["local"] == 0
