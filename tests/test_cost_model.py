"""The one cost model (issue 20, item 3): calibration, peaks, and every consumer asking it.

The calibration data (``benchmarks/measured/calibration_kernels.json``) holds the kernels the
two measured H100 days timed, as the model's descriptions (written by
``benchmarks/calibration_data.py``), so these tests need neither a GPU, git history nor a
disassembler; the ones that check the SASS path skip without one.
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples, ops, te
from polyfuse.poly.device import A100, H100
from polyfuse.poly.mapping import MappingConfig
from polyfuse.reference import evaluate

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

FITTED_DAY, HELD_OUT_DAY = "2026-11-22", "2026-11-25"
BAND = (0.67, 1.5)


def _days():
    import calibration

    return calibration.load()


def _has_disassembler() -> bool:
    from polyfuse.cuda.toolchain.compiler import available_compilers
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, find_disassembler

    if not available_compilers():
        return False
    try:
        find_disassembler()
    except DisassemblerNotFound:
        return False
    return True


# ------------------------------------------------------------------------------ calibration


def test_calibration_within_the_band_on_every_case_of_the_fitted_day():
    import calibration

    days = _days()
    rows = calibration.model_day(days[FITTED_DAY])
    assert len(rows) == 17
    outside = {c: r["ratio"] for c, r in rows.items() if not BAND[0] <= r["ratio"] <= BAND[1]}
    assert outside == {}, outside
    # the table the benchmark prints says "modelled" and names the day's commit
    text = calibration.format_day(FITTED_DAY, days[FITTED_DAY], rows)
    assert "modelled" in text and "fc634f1" in text and "17 of 17 within" in text


def test_held_out_day_stays_in_the_band_but_for_the_conv_fill():
    """2026-11-25 (commit fcb3b1c) was not fitted on. Its one miss is conv3x3_relu: the SASS
    instrument cannot count its thread-dependent fill loops (the serial s_w fill on 9 of 64
    threads), so the model sees too little work there."""
    import calibration

    rows = calibration.model_day(_days()[HELD_OUT_DAY])
    outside = {c for c, r in rows.items() if not BAND[0] <= r["ratio"] <= BAND[1]}
    assert outside <= {"conv3x3_relu"}
    assert rows["conv3x3_relu"]["ratio"] > 1  # modelled too fast, not too slow


def test_declared_constants_are_the_fit_on_the_fitted_day():
    import calibration

    got = calibration.fit(_days()[FITTED_DAY]["cases"])
    from polyfuse.poly.costs import CONSTANTS

    declared = {n: v for n, v, _ in CONSTANTS.table()} | {"l2_gbps": H100.l2_gbps}
    for name, value in got.items():
        assert declared[name] == pytest.approx(value), name
    sources = {n: src for n, _, src in CONSTANTS.table()}
    assert all(re.search(r"measured|fitted|assumed|architecture", s) for s in sources.values())


def test_never_faster_than_the_measured_peak_of_the_bounding_resource():
    from polyfuse.poly.costs import KernelDesc, model_kernel, peak_floor_us

    count = 0
    for day in _days().values():
        for case in day["cases"].values():
            for d in case["kernels"]:
                desc = KernelDesc.from_json(d)
                m = model_kernel(desc, H100)
                floor = peak_floor_us(desc, H100)
                assert m.us >= floor, (desc.name, m.us, floor)
                # and not faster than the measured copy / cuBLAS rates themselves
                assert desc.dram_bytes / (m.us * 1e-6) <= H100.bandwidth_gbps * 1e9
                assert desc.flops / (m.us * 1e-6) <= H100.throughput_tflops * 1e12
                count += 1
    assert count == 27 + 23  # every kernel of both days (fewer on 2026-11-25: Layer 3 packs)


# ------------------------------------------------------------------------------ GEMM tiles


def _gemm_shape(m: int, k: int, n: int):
    from polyfuse.poly.tiling import detect_gemm

    ins, outs, _ = examples.matmul_bias_gelu(m, k, n)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    shape = detect_gemm(fn.plan.scheduled[0])
    assert not isinstance(shape, str)
    return shape


@pytest.mark.parametrize("device", [H100, A100], ids=["H100", "A100"])
def test_tile_candidates_of_matmul_4096_get_distinct_modelled_times(device):
    from polyfuse.poly.tiling import rank_gemm_tiles

    ranked = rank_gemm_tiles(_gemm_shape(4096, 4096, 4096), device)
    times = [t.modelled_us for t in ranked]
    assert len(ranked) == 8
    assert len({round(t, 2) for t in times}) == 8, times
    assert times == sorted(times)
    # never faster than the FP32 peak measured (H100) or on the datasheet (A100)
    assert times[0] * 1e-6 >= 2 * 4096**3 / (device.throughput_tflops * 1e12)


def _conv_shape(device_arch: str = "sm_90", stride: int = 1):
    from polyfuse.poly.tiling import detect_gemm

    x = te.placeholder((32, 64, 56, 56), name="x")
    w = te.placeholder((64, 64, 3, 3), name="w")
    b = te.placeholder((64,), name="bias")
    y = ops.relu(ops.conv2d(x, w, b, stride=stride, padding=1))
    fn = polyfuse.compile([x, w, b], [y], device_arch, check_cuda=False)
    shape = detect_gemm(fn.plan.scheduled[0])
    assert not isinstance(shape, str)
    return shape


def _forced(shape, tile, device=H100):
    from polyfuse.poly.tiling import rank_gemm_tiles

    (t,) = rank_gemm_tiles(shape, device, tile, stages=2)
    assert t.code is not None and t.estimate is not None
    return t


def test_tile_estimate_describes_the_loop_code_the_passes_emit():
    """The ranking prices each tiling on the loop code it will get (issue 20 item 2), not on
    tile sizes alone: unrolled steps, fragment loads by vector width, float4 tile copies,
    launch bounds, the fold that removes padding. Counts as the SASS of those kernels has
    them (benchmarks/tile_check.py)."""
    mm = _forced(_gemm_shape(4096, 4096, 4096), (64, 64, 8, 8, 32)).code
    assert (mm.body_steps, mm.bodies, mm.stages) == (32, 1, 2)  # 8x8 x 32 = 2048: whole
    assert mm.fragment_loads == {4: 128}  # A's rows and B's columns as LDS.128 only
    assert [(t.tensor, t.size, t.width, t.copies) for t in mm.tiles] == [
        ("a", (64, 32), 4, 8),
        ("w", (32, 64), 4, 8),
    ]
    assert (mm.min_blocks, mm.register_cap) == (6, 168)  # 136 registers fit 6 x 64 threads
    conv = _forced(_conv_shape(), (64, 64, 8, 8, 8)).code
    assert conv.padding == 0.0  # 56 columns: 8x8 pixels per block, not 64 columns
    assert (conv.body_steps, conv.bodies) == (18, 4)  # 3x3 window x 2 channels, kk0 by 2
    # weights: 18 words per row and body, 2-word aligned (the channel loop steps by 18):
    # LDS.64; the input window (ow + kw) word by word
    assert conv.fragment_loads == {2: 288, 1: 288}
    assert [(t.tensor, t.size, t.width) for t in conv.tiles] == [
        ("x", (1, 8, 10, 16), 4),  # 10 columns widened to 16 from a 16-byte boundary
        ("w", (64, 72), 4),  # 64 x 8 x 3 x 3 viewed as 64 x 72
    ]


def test_shared_wavefronts_see_bank_conflicts_and_l1_whole_lines():
    """A 128-bit load is four quarter-warp wavefronts when conflict-free; distinct words of
    one phase in one bank serialise. A copy whose rows are shorter than a warp's request
    costs whole 128-byte lines in L1."""
    import numpy as np

    from polyfuse.poly.costs.gemm_code import _line_waste, _wavefronts

    lanes = np.arange(32) * 4  # 32 lanes, consecutive 16-byte vectors
    assert _wavefronts([(0, 4)], lanes) == 4
    rows16 = (np.arange(32) // 8) * 16 + (np.arange(32) % 8) * 0  # 4 rows of 16 words
    assert _wavefronts([(0, 1)], rows16) == 2  # rows 0 and 2 share bank 0: 2-way
    rows20 = (np.arange(32) // 8) * 20
    assert _wavefronts([(0, 1)], rows20) == 1  # a padded row: 4 banks
    assert _line_waste(8, 4) == 0  # 8 lanes x 16 B: one whole line per row
    assert _line_waste(4, 4) == 512  # 64-byte rows: 8 half-used lines for 512 B


def test_vector_groups_match_the_word_by_word_grouping():
    """The fragment loads' grouping (array masks, for speed: ranking prices some 300 tilings a
    GEMM) gives the groups of the plain definition: w consecutive words from a multiple of w,
    128-bit first, then 64-bit, the rest one by one, where the run-time offset allows."""
    import numpy as np

    from polyfuse.poly.costs.gemm_code import _vector_groups

    def plain(addresses, align):
        left, out = sorted(set(int(a) for a in addresses)), []
        for w in (4, 2):
            if align % w or len(left) < w:
                continue
            have = set(left)
            starts = [a for a in left if a % w == 0 and all(a + i in have for i in range(w))]
            taken = {a + i for a in starts for i in range(w)}
            left = [a for a in left if a not in taken]
            out += [(a, w) for a in starts]
        return out + [(a, 1) for a in left]

    rng = np.random.default_rng(7)
    for _ in range(300):
        lo = int(rng.integers(-40, 40))
        addr = lo + rng.choice(64, size=int(rng.integers(1, 40)))
        for align in (1, 2, 4, 8):
            assert _vector_groups(addr, align) == plain(addr, align), (addr, align)
    assert _vector_groups(np.arange(8), 4) == [(0, 4), (4, 4)]
    assert _vector_groups(np.array([1, 2, 3, 4, 5, 6]), 4) == [(2, 2), (4, 2), (1, 1), (6, 1)]


def test_fragment_loads_do_not_depend_on_the_dims_an_operand_does_not_move_along():
    """The fragment-load memo keys a dim the operand's tile does not move along (zero words per
    unit) as one value; the loads priced with the dim's real extent, vector width and kept
    loop are the same, so candidates that differ in the other operand share the result."""
    import itertools

    from polyfuse.poly.costs.gemm_code import _loads_of

    _loads_of.cache_clear()
    rng = __import__("numpy").random.default_rng(11)
    checked = 0
    for _ in range(150):
        nd, nr = int(rng.integers(2, 4)), int(rng.integers(1, 3))
        k = tuple(int(rng.choice([0, 0, 1, 4, 33, 65])) for _ in range(nd + nr))
        threads = tuple(int(rng.choice([1, 2, 4, 8, 16])) for _ in range(nd))
        regs = tuple(int(rng.choice([1, 2, 4, 8])) for _ in range(nd))
        body = tuple(int(rng.choice([1, 2, 4, 8])) for _ in range(nr))
        vw = 4 if regs[-1] % 4 == 0 else 1
        kept = tuple(j for j in range(nr) if rng.random() < 0.4)
        base, sf = int(rng.integers(0, 70)), int(rng.choice([0, 1056]))
        for unit, window in itertools.product((False, True), repeat=2):
            full = _loads_of(k, base, regs, threads, vw, body, kept, sf, unit, window, nd)
            norm = _loads_of(
                k, base, tuple(r if k[d] else 1 for d, r in enumerate(regs)), threads,
                vw if k[nd - 1] else 1, tuple(b if k[nd + j] else 1 for j, b in enumerate(body)),
                tuple(j for j in kept if k[nd + j]), sf, unit, window, nd,
            )  # fmt: skip
            assert full == norm, (k, regs, threads, vw, body, kept)
            checked += 0 in k
    assert checked > 100  # most cases have a dim the operand does not move along


def test_loop_code_is_memoized_and_shared():
    """A tiling priced again (another rank of the same micrograph) costs a lookup."""
    from polyfuse.poly.costs.gemm_code import Operand, TileLayout, loop_code
    from polyfuse.poly.device import device_for_arch

    a = Operand("A", (64, 32), (((1, 0, 0), 0), ((0, 0, 1), 0)))
    b = Operand("B", (32, 64), (((0, 0, 1), 0), ((0, 1, 0), 0)))
    args = ((a, b), (64, 64), (32,), TileLayout((64, 64), (8, 8), (16,)), (8, 8))
    first = loop_code(*args, device_for_arch("sm_80"))
    assert loop_code(*args, device_for_arch("sm_80")) is first
    assert first.accumulators == 64 and first.fragment_loads


def test_unbounded_8x8_tiles_are_modelled_at_the_registers_ptxas_takes():
    """Without a launch bound ptxas took 124-130 registers for the 256-thread 8x8 tiles (two
    blocks of 256 threads at <= 128); the model took the estimate plus the bound's margin
    (136, 152 with single-stage copies): one block per SM, the 128x128x32 matmul 1.24x slower
    than its SASS. Now the async tiles are bound at the estimate (256, 2) and a single-stage
    one without a bound is modelled at what its code keeps live (the copies' vectors reuse
    the fragments' registers)."""
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.gemm_loops import unbounded_registers

    assert unbounded_registers(8, 8, False) == unbounded_registers(8, 8, True) == 120
    assert unbounded_registers(4, 4, True) == 72  # 64 + 8 the copies need beyond 8 fragments
    shape = _gemm_shape(4096, 4096, 4096)
    for tile, bound in (((128, 128, 8, 8, 16), (2, 128)), ((128, 128, 8, 8, 32), (0, 0))):
        t = _forced(shape, tile)
        assert (t.code.min_blocks, t.code.register_cap) == bound
        assert t.estimate.registers <= 128
        assert model_kernel(t.estimate, H100).occupancy.blocks_per_sm == 2


def test_grouped_conv_operand_is_priced_within_bounds_and_tiled():
    """A grouped conv reads its input channel ``16 * floor(co / 16) + ci``: no affine
    function. Its subscript is kept as the affine bound ``co + ci`` and a slack of 15 (the
    convex hull of isl's access), so the estimate's shared tile covers isl's real box, and
    the micrograph is ranked and GEMM-tiled (a box of every dim's extents dropped every
    candidate over the shared-memory budget: the kernel was one element per thread)."""
    from polyfuse.poly.promote import GemmKernel
    from polyfuse.poly.tiling import affine_rows, detect_gemm, rank_gemm_tiles

    x = te.placeholder((32, 64, 56, 56), name="x")
    gw = te.placeholder((64, 16, 3, 3), name="gw")
    y = ops.relu(ops.conv2d(x, gw, padding=1, stride=2, groups=4))
    plain = polyfuse.compile(
        [x, gw], [y], "sm_80", check_cuda=False, mapping=MappingConfig(gemm=False)
    )
    shape = detect_gemm(plain.plan.scheduled[0])
    assert not isinstance(shape, str)
    acc = dict(shape.operands)
    rows, slack, periods = affine_rows(acc["x"])
    assert slack == (0, 15, 0, 0)
    assert all(p[0] < 0 for p in periods)  # co + ci is bounded, not a reshape's period
    assert rows[1] == ((0, 1, 0, 0, 1, 0, 0), 0)  # co + ci
    assert affine_rows(acc["gw"])[1] == (0, 0, 0, 0)
    ranked = rank_gemm_tiles(shape, A100, stages=2)
    assert ranked
    fn = polyfuse.compile([x, gw], [y], "sm_80", check_cuda=False)
    (gk,) = [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    (real,) = [p for p in gk.promotions if p.tensor == "x"]
    (tile,) = [rank_gemm_tiles(shape, A100, gk.tiling.choice, stages=2)[0]]
    (est,) = [t for t in tile.code.tiles if t.tensor == "x"]
    assert est.floats >= math.prod(real.size)  # bounded: never below isl's box
    # the same conv, small enough to emulate: GEMM-tiled, and right
    xs = te.placeholder((2, 32, 12, 12), name="x")
    ws = te.placeholder((32, 8, 3, 3), name="gw")
    ys = ops.relu(ops.conv2d(xs, ws, padding=1, stride=2, groups=4))
    small = polyfuse.compile([xs, ws], [ys], "sm_80", check_cuda=False)
    assert [p for kp in small.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    rng = np.random.default_rng(0)
    ins = [rng.standard_normal(t.shape).astype(np.float32) for t in (xs, ws)]
    (want,) = evaluate([ys], {xs: ins[0], ws: ins[1]})
    np.testing.assert_allclose(small(*ins, device="emulate"), want, rtol=1e-4, atol=1e-4)


def _merged_heads(b: int, heads: int, s: int, d: int, n: int):
    """float32 attention output projection over the heads merged: ``pv[b, k // d, s, k % d]``."""
    pv = te.placeholder((b, heads, s, d), name="pv")
    w = te.placeholder((heads * d, n), name="w")
    ctx = ops.reshape(ops.transpose(pv, (0, 2, 1, 3)), (b, s, heads * d))
    return pv, w, ops.matmul(ctx, w, name="out")


def test_a_reshaped_operand_is_priced_per_period_and_tiled():
    """BERT's float32 output projection reads ``pv[b, k // 64, s, k % 64]``: no affine
    function, and no affine bound either, so the estimate priced every tiling's ``pv`` tile as
    the box of all its dims' extents copied in scalars (128x128: 262144 floats, "does not
    fit") and chose a 32x16 tile at one FFMA in ten (modelled 436 us on an A100). Within a
    k-tile inside one period of 64 both subscripts are affine (``k // 64`` fixed, ``k % 64``
    stepping with k): priced so, the best tile is 64x128 at 86 % FFMA, modelled 87 us, the
    tile copied as float4 — what isl's own box of the kernel says."""
    from polyfuse.poly.costs.gemm_code import Operand, TileLayout, loop_code
    from polyfuse.poly.device import device_for_arch
    from polyfuse.poly.promote import GemmKernel
    from polyfuse.poly.tiling import LOOP_FFMA_FLOOR, affine_rows, detect_gemm, loop_share

    pv, w, out = _merged_heads(8, 12, 128, 64, 768)
    fn = polyfuse.compile([pv, w], [out], "sm_80", check_cuda=False)
    shape = detect_gemm(fn.plan.scheduled[0])
    assert not isinstance(shape, str)
    rows, slack, periods = affine_rows(dict(shape.operands)["pv"])
    # update dims (b, s, n, k): k // 64 is 0 within a period, k % 64 is k; both period 64
    assert rows == (((1, 0, 0, 0), 0), ((0, 0, 0, 0), 0), ((0, 1, 0, 0), 0), ((0, 0, 0, 1), 0))
    assert slack == (0, 0, 0, 0)
    assert periods == ((-1, 0, 0), (3, 64, 1), (-1, 0, 0), (3, 64, -64))
    (gk,) = [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    t = gk.tiling
    assert t.code is not None and loop_share(t.code) >= LOOP_FFMA_FLOOR
    assert math.prod(t.block) >= 64 * 128 and t.modelled_us < 100  # was 32x16, 436 us
    (est,) = [c for c in t.code.tiles if c.tensor == "pv"]
    (real,) = [p for p in gk.promotions if p.tensor == "pv"]
    assert est.width == 4 and est.floats >= math.prod(real.size)
    # a k-tile across a period (48 over periods of 64) is priced as before: scalar, whole box
    op = Operand("pv", pv.shape, rows, slack, periods)
    wop = Operand("w", w.shape, (((0, 0, 0, 1), 0), ((0, 0, 1, 0), 0)))
    lay = TileLayout((1, 64, 128), (1, 16, 16), (48,), 2)
    args = ((op, wop), (8, 128, 768), (768,))
    across = loop_code(*args, lay, (4, 8), device_for_arch("sm_80"))
    inside = loop_code(*args, replace(lay, tk=(32,)), (4, 8), device_for_arch("sm_80"))
    assert [c.width for c in across.tiles] == [1, 4]
    assert across.tiles[0].floats == 64 * 128 * 48  # every dim's extent
    assert [c.width for c in inside.tiles] == [4, 4]


def test_a_reshaped_operand_tile_computes_the_projection():
    """The merged-heads projection at odd sizes, GEMM-tiled with the periodic operand's
    tile: equal to numpy in both thread orders."""
    from polyfuse.poly.promote import GemmKernel

    pv, w, out = _merged_heads(2, 3, 19, 16, 40)
    fn = polyfuse.compile([pv, w], [out], "sm_80", check_cuda=False)
    assert [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    rng = np.random.default_rng(3)
    a = rng.standard_normal(pv.shape).astype(np.float32)
    b = rng.standard_normal(w.shape).astype(np.float32)
    want = np.transpose(a.astype(np.float64), (0, 2, 1, 3)).reshape(2, 19, 48) @ b
    for race in (False, True):
        got = fn(a, b, device="emulate", race_check=race)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_outer_reduction_dims_are_tiled_by_one_where_whole_they_fit_no_tile():
    """ViT's patch embedding (a 16x16 stride-16 conv of 3 channels): the longest reduction dim
    (the window's rows) is k-tiled and the others were kept whole, so every tiling's weight
    tile held all 3 channels (64 x 3 x 8 x 16 floats at 64 rows) and none fitted: one output
    element per thread. Where none fits whole, the reduction dims outside the k-tiled one
    are tiled by 1 (a k-tile loop each): GEMM-tiled, and equal to float64 in both thread
    orders."""
    from polyfuse.poly.promote import GemmKernel

    x = te.placeholder((2, 3, 64, 64), name="x")
    w = te.placeholder((40, 3, 16, 16), name="w")
    y = ops.conv2d(x, w, stride=16, name="patches")
    fn = polyfuse.compile([x, w], [y], "sm_80", check_cuda=False)
    (gk,) = [p for kp in fn.plan.kernel_plans for p in kp.parts if isinstance(p, GemmKernel)]
    assert gk.tiling.tk[0] == 1 and gk.tiling.tk[2] == 16
    (k,) = fn.kernels
    assert any(
        n.startswith("reduction dims 0 (extent 3) tiled by 1: whole, with the k-tile of dim 1")
        for n in k.notes
    )
    rng = np.random.default_rng(5)
    ins = [rng.standard_normal(t.shape).astype(np.float32) for t in (x, w)]
    (want,) = evaluate([y], {x: ins[0].astype(np.float64), w: ins[1].astype(np.float64)})
    for race in (False, True):
        got = fn(*ins, device="emulate", race_check=race)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_tilings_below_the_loop_quality_floor_are_not_ranked():
    """On an A100 the model alone cannot tell a 76 % FFMA conv loop from an 83 % one (both
    FP32-pipe bound); the floor keeps the ranking where the instrument agrees (issue 20)."""
    from polyfuse.poly.tiling import LOOP_FFMA_FLOOR, loop_share, rank_gemm_tiles

    ranked = rank_gemm_tiles(_conv_shape("sm_80"), A100, stages=2)
    assert ranked and all(loop_share(t.code) >= LOOP_FFMA_FLOOR for t in ranked)
    assert any(
        "not ranked: their k-tile loop would be below 80% FFMA" in r for r in ranked[0].reasons
    )
    low = _forced(_conv_shape("sm_80"), (64, 64, 4, 8, 8), A100)
    assert loop_share(low.code) < LOOP_FFMA_FLOOR  # the 4x8 micro-tile: 288 window words


@pytest.mark.slow  # 10 s (the fast tier's budget)
@pytest.mark.skipif(not _has_disassembler(), reason="needs NVRTC and nvdisasm (polyfuse[sass])")
def test_tile_estimate_agrees_with_the_sass_of_the_kernels_it_ranks():
    """The ranking's estimate against the instrument on the built kernels of its first
    choices: modelled time within 10 %, k-tile FFMA share within 3 points (the SASS of the
    old estimate's 1.2-1.4x conv mismatch; see benchmarks/tile_check.py for every case)."""
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.cuda.toolchain.sass import analyse
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.tiling import loop_share, rank_gemm_tiles

    x = te.placeholder((32, 64, 56, 56), name="x")
    w = te.placeholder((64, 64, 3, 3), name="w")
    b = te.placeholder((64,), name="bias")
    conv = [x, w, b], [ops.relu(ops.conv2d(x, w, b, padding=1))]
    ins, outs, _ = examples.matmul_bias_gelu(4096, 4096, 4096)
    for (ins_, outs_), shape, top in (
        ((ins, outs), _gemm_shape(4096, 4096, 4096), 2),
        (conv, _conv_shape(), 1),
    ):
        for t in rank_gemm_tiles(shape, H100, limit=top, stages=2):
            fn = polyfuse.compile(
                ins_, outs_, "sm_90", check_cuda=False, mapping=MappingConfig(gemm_tile=t.choice)
            )
            (k,) = fn.kernels
            (ks,) = analyse(fn.cuda_source, ("sm_90",), kernels=[k]).kernels
            sass = model_kernel(describe_kernel(k, ks), H100)
            ratio = t.modelled_us / sass.us
            assert 0.9 <= ratio <= 1.1, (t.choice, t.modelled_us, sass.us)
            assert ks.hot.kind == "k-tile" and ks.resources.spill_stores == 0
            share = loop_share(t.code, worst=False)
            assert abs(share - ks.hot.mix.ffma_share) <= 0.03, (t.choice, share)


# ------------------------------------------------------------------------------ tune


def test_tune_without_a_gpu_prints_a_ranked_list_of_distinct_modelled_times(monkeypatch):
    from polyfuse import tune as tune_mod
    from polyfuse.cache import CompileCache

    monkeypatch.setattr(tune_mod, "_open_gpu", lambda runtime, say: say("tune: no GPU") or None)
    lines: list[str] = []
    found = tune_mod.tune("matmul_bias_gelu", "sm_90", cache=CompileCache(None), say=lines.append)
    text = "\n".join(lines)
    assert "modelled choice kept" in text and "no GPU" in text
    times = [float(x) for x in re.findall(r"modelled\s+([0-9.]+) us", text)]
    assert len(times) == len(found[0].candidates) >= 2
    assert times == sorted(times) and len(set(times)) == len(times), text


# ------------------------------------------------------------------------------ Layer 3


def test_pack_of_two_96_block_gemms_is_not_modelled_above_the_fp32_peak():
    """Two independent GEMMs of 96 blocks each (fewer than the H100's 132 SMs): packing them
    into one launch may gain the idle SMs, never more FP32 work than the measured peak."""
    from polyfuse.cuda.codegen.layer3 import part_shape
    from polyfuse.stitch.parallel import PackConfig, modelled_us, pack_layout

    m, k, n = 2048, 4096, 768  # 16 x 6 = 96 blocks of 128 x 128
    a1, a2 = te.placeholder((m, k), name="a1"), te.placeholder((m, k), name="a2")
    w1, w2 = te.placeholder((k, n), name="w1"), te.placeholder((k, n), name="w2")
    tile = MappingConfig(gemm_tile=(128, 128, 8, 8, 8))
    fn = polyfuse.compile(
        [a1, w1, a2, w2],
        [ops.matmul(a1, w1), ops.matmul(a2, w2)],
        "sm_90",
        check_cuda=False,
        mapping=tile,
        pack=False,
    )
    parts = [part_shape(kern) for kern in fn.kernels]
    assert [p.grid for p in parts] == [96, 96]
    layout = pack_layout(parts)
    assert not isinstance(layout, str)
    flops = 2 * 2.0 * m * k * n
    packed = modelled_us(parts, H100, PackConfig(), layout)
    assert flops / (packed * 1e-6) <= H100.throughput_tflops * 1e12
    alone = [modelled_us([p], H100, PackConfig()) for p in parts]
    for us in alone:
        assert flops / 2 / (us * 1e-6) <= H100.throughput_tflops * 1e12


# ------------------------------------------------------------------------------ no SASS


def test_the_model_works_without_the_disassembler(monkeypatch):
    from polyfuse.cuda.codegen import kernel_cost
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound
    from polyfuse.poly.costs import model_kernel, peak_floor_us

    def missing(*a, **kw):
        raise DisassemblerNotFound("no SASS disassembler found (test)")

    analyse = sys.modules["polyfuse.cuda.toolchain.sass.analyse"]
    monkeypatch.setattr(analyse, "find_disassembler", missing)
    ins, outs, _ = examples.matmul_bias_gelu(1024, 1024, 1024)
    one = MappingConfig(split_k=1)  # one GEMM kernel (the model sums K in 2 parts at 64 blocks)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False, mapping=one)
    descs, how = kernel_cost.describe_kernels(fn.kernels, fn.cuda_source, "sm_90")
    assert how.startswith("kernel IR estimate") and "no SASS" in how
    (d,) = descs
    assert d.source == "kernel IR estimate" and d.mix.ffma >= 1024  # K multiply-adds a thread
    m = model_kernel(d, H100)
    assert math.isfinite(m.us) and m.us >= peak_floor_us(d, H100)
    assert "modelled" in str(m) and "kernel IR estimate" in str(m)


def test_ir_work_is_a_kernel_fact_the_compile_cache_keeps(tmp_path):
    from polyfuse.cache import CompileCache

    ins, outs, _ = examples.softmax(64, 256)
    cache = CompileCache(tmp_path)
    first = polyfuse.compile(ins, outs, check_cuda=False, cache=cache)
    again = polyfuse.compile(ins, outs, check_cuda=False, cache=cache)
    assert again.cache_stats["hits"] >= 1
    w1, w2 = first.kernels[0].facts.work, again.kernels[0].facts.work
    assert w1 is not None and w1 == w2 and w1.mix.ldg > 0


@pytest.mark.skipif(not _has_disassembler(), reason="needs NVRTC and nvdisasm (polyfuse[sass])")
def test_ir_estimate_is_close_to_the_sass_count():
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.cuda.toolchain.sass import analyse

    ins, outs, _ = examples.matmul_bias_gelu(1024, 1024, 1024)
    for arch in ("sm_80", "sm_90"):  # one GEMM kernel, not split in parts (split-K)
        fn = polyfuse.compile(ins, outs, arch, check_cuda=False, mapping=MappingConfig(split_k=1))
        (k,) = fn.kernels
        (ks,) = analyse(fn.cuda_source, (arch,), kernels=fn.kernels).kernels
        ir, sass = describe_kernel(k).mix, describe_kernel(k, ks).mix
        assert ir.ffma == pytest.approx(sass.ffma, rel=0.02)
        assert ir.slots == pytest.approx(sass.slots, rel=0.25)
        # the tile-fill loops start at the thread's row: SASS cannot count their trips (once),
        # the IR estimate counts them for thread 0
        assert sass.global_read_bytes <= ir.global_read_bytes <= 2 * sass.global_read_bytes


@pytest.mark.skipif(not _has_disassembler(), reason="needs NVRTC and nvdisasm (polyfuse[sass])")
def test_sass_counts_a_kernels_static_shared_memory_once():
    """analyse() once passed a kernel's static + dynamic bytes as the launch's dynamic pool,
    so ptxas's static arrays were counted twice in occupancy (and the model's input)."""
    from polyfuse.cuda.toolchain.sass import analyse

    ins, outs, _ = examples.matmul_bias_gelu(256, 256, 256)
    fn = polyfuse.compile(ins, outs, "sm_90", check_cuda=False)
    (k,) = fn.kernels
    (ks,) = analyse(fn.cuda_source, ("sm_90",), kernels=fn.kernels).kernels
    assert ks.resources is not None and ks.resources.shared_bytes > 0
    assert ks.shared_bytes == k.shared_bytes == ks.resources.shared_bytes


# ------------------------------------------------------------------------------ consumers


def test_a_contraction_is_never_split_into_partial_reductions():
    """A matmul whose weight is its largest input has the 'x' canonical form, whose lanes
    would each combine K / 8 terms: the split pass cut it into partial reductions (two
    kernels and K / 4096 partial sums) instead of leaving it to the GEMM path (split-K, a
    decision of the GEMM tile model, is off here)."""
    from polyfuse.base.decision import DecisionKind

    a, w = te.placeholder((1024, 4096), name="a"), te.placeholder((4096, 1536), name="w")
    one = MappingConfig(split_k=1)
    fn = polyfuse.compile([a, w], [ops.matmul(a, w)], "sm_90", check_cuda=False, mapping=one)
    (rec,) = [r for r in fn.plan.records() if DecisionKind.SPLIT_REDUCTION in r.kinds]
    assert rec.data["chunks"] == 1 and "contraction" in rec.reason
    (k,) = fn.kernels
    assert any(DecisionKind.GEMM_TILE in r.kinds for r in fn.plan.kernel_plans[0].layout)


def test_split_and_elements_per_thread_decisions_are_modelled():
    from polyfuse.base.decision import DecisionKind

    x = te.placeholder((4, 1 << 18), name="x")
    fn = polyfuse.compile([x], [ops.reduce_sum(x, axis=1, name="s")], "sm_90", check_cuda=False)
    (rec,) = [r for r in fn.plan.records() if DecisionKind.SPLIT_REDUCTION in r.kinds]
    one, two = rec.data["modelled_us"]
    assert rec.data["chunks"] > 1 and two < one and "modelled" in rec.reason
    # one stage: four blocks keep little in flight (Little's law), not the DRAM rate
    assert 4 * 4 * (1 << 18) / (one * 1e-6) < 0.2 * H100.bandwidth_gbps * 1e9
    y = te.placeholder((4096, 4096), name="y")
    fn = polyfuse.compile([y], [ops.relu(y, name="r")], "sm_90", check_cuda=False)
    (rec,) = [r for r in fn.plan.records() if DecisionKind.ELEMENTS_PER_THREAD in r.kinds]
    assert rec.data["factor"] in (4, 8) and "modelled" in rec.reason


# ------------------------------------------------- held out: tilings timed on a GPU


def test_spearman_and_ranks():
    import tile_ranking

    assert tile_ranking._ranks([3.0, 1.0, 2.0, 1.0]) == [4.0, 1.5, 3.0, 1.5]
    assert tile_ranking.spearman([1, 2, 3], [10, 20, 30]) == pytest.approx(1.0)
    assert tile_ranking.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(tile_ranking.spearman([1, 2, 3], [5, 5, 5]))


def test_the_model_picks_near_the_fastest_tiling_timed_on_the_h200():
    """The H200 day of 2026-11-26 timed six tilings of each attention GEMM; the model (fitted
    on other days) must price every timed tiling and pick one within 1.2x of the fastest."""
    import json

    import tile_ranking

    day = json.loads(tile_ranking.DEFAULT_DAY.read_text())
    day["tune"]["cases"] = {"attention_s128": day["tune"]["cases"]["attention_s128"]}
    rows = tile_ranking.check_day(day)
    assert [r["micrograph"] for r in rows] == ["mg1", "mg5"]
    for r in rows:
        assert len(r["candidates"]) == 6
        assert all(c["modelled_us"] > 0 and c["measured_us"] > 0 for c in r["candidates"])
        assert 1.0 <= r["pick_vs_best"] <= 1.2, r


def test_tile_check_agreement_without_a_ranked_candidate():
    """``tile_check.py --top 0 --tiles ...`` compares given tilings only: the summary has no
    first choice to judge (it raised ValueError on the empty ranking)."""
    import tile_check

    row = {"case": "c", "arch": "sm_90", "micrograph": "mg0", "rank": None, "ratio": 1.0,
           "sass_us": 5.0, "ffma_share": [0.9, 0.9], "hot_loop": "k-tile"}  # fmt: skip
    got = tile_check.agreement([row])
    assert got["candidates"] == 1 and got["first_choice_within_2pct_of_sass_best"] == {}


# ------------------------------------------------------------------------------ tensor pipe


def test_tensorized_gemms_are_bound_by_the_tensor_pipe_and_near_their_h100_times():
    """bf16 4096³ on sm_90 (the default: S = 4, fragments double-buffered): the IR estimate
    counts every mma.sync (4096³ / 2048 multiply-adds per warp instruction), the model bounds
    it by the tensor pipe at the device's mma rate, never below the tensor-pipe floor, and
    within the band of the H100's 0.476 ms (2026-11-26). Before, a tensorized kernel had no
    work estimate and was priced by its bytes alone: 41 us, 11.5x too fast. A single-stage
    loop waits for its own copies every k-tile (fill latency); tf32 runs at half the rate.
    The block phases (the tensor pipe's time plus the first fill and the epilogue of one
    block per SM) bind the pipelined ones."""
    import tensor_model

    from polyfuse.poly.device import MMA_FMA_PER_INSTRUCTION

    times = tensor_model.measured()
    for name, bound in (
        ("matmul_bf16", "block phases"),
        ("matmul_bf16_s1", "fill latency"),
        ("matmul_tf32_k32_s3", "block phases"),
    ):
        r = tensor_model.model_case(name, "sm_90")
        (k,) = r["kernels"]
        assert k["bound"] == bound, (name, k)
        assert k["modelled_us"] >= k["floor_us"] > 0
        ms, _ = times[name]
        assert BAND[0] <= ms * 1e3 / r["modelled_us"] <= BAND[1], (name, ms, r)
        # 512 blocks of 8 warps: every warp's share of the 4096³ multiply-adds
        per_warp = 4096**3 / MMA_FMA_PER_INSTRUCTION / (512 * 8)
        assert k["mma_per_thread"] == per_warp * (2 if name.startswith("matmul_tf32") else 1)


def test_a_tensor_core_epilogue_does_not_overlap_its_blocks_mma():
    """bf16 FFN up + GELU (8192x768 . 768x3072) on sm_90: one block per SM, 24 k-steps each,
    then a GELU epilogue over 128 accumulators per thread that no other block's mma hides.
    The IR work estimate holds that tail (no mma in it, the GELU's FP32 work all in it), the
    block phases bind, and the model lands in the band of the H100's 0.237 ms (2026-11-26):
    before, the tensor pipe alone priced it at 0.146 ms (1.63x too fast)."""
    import tensor_model

    from polyfuse.cuda.codegen.kernel_cost import describe_kernel

    r = tensor_model.model_case("ffn_up_gelu_bf16", "sm_90")
    (k,) = r["kernels"]
    assert k["bound"] == "block phases", k
    ms, _ = tensor_model.measured()["ffn_up_gelu_bf16"]
    assert BAND[0] <= ms * 1e3 / r["modelled_us"] <= BAND[1], (ms, r)

    a = te.placeholder((256, 192), "bfloat16", name="a")
    w = te.placeholder((192, 384), "bfloat16", name="w")
    h = ops.matmul(a, w, name="h")
    fn = polyfuse.compile([a, w], [ops.gelu(h, name="g")], "sm_90", check_cuda=False)
    (kern,) = fn.kernels
    d = describe_kernel(kern)
    assert d.tail is not None and d.tail.mma == 0 < d.mix.mma
    assert 0 < d.tail.slots < d.mix.slots and d.tail.fp32 == d.mix.fp32 > 0
    assert 0 < d.tail.ldgsts < d.mix.ldgsts  # the first fills are in it, the loop's are not


def test_block_phases_add_the_tail_to_the_loop_at_one_block_per_sm():
    """One block per SM: a longer tail (epilogue) lengthens the block phases by exactly its
    issue time, though the tensor pipe is busier than the issue slots overall; a kernel with
    no tail (no k-step loop) prices no block phases."""
    from polyfuse.poly.costs import KernelDesc, Mix, model_kernel
    from polyfuse.poly.device import device_for_arch

    dev = device_for_arch("sm_90")
    mix = Mix(slots=4000, mma=1536)
    base = KernelDesc("k", "test", 132, 256, 255, 98304, mix, bytes_written=1 << 20)
    short = model_kernel(base.with_(tail=Mix(slots=500)), dev)
    long = model_kernel(base.with_(tail=Mix(slots=1500), mix=mix + Mix(slots=1000)), dev)
    assert short.occupancy.blocks_per_sm == 1 and long.bound == "block phases"
    clock = dev.sustained_clock_mhz * 1e6
    added = 1000 * 8 / dev.schedulers_per_sm / clock * 1e6  # 8 warps on 4 schedulers
    got = long.bounds_us["block phases"] - short.bounds_us["block phases"]
    assert got == pytest.approx(added, rel=1e-6)
    assert model_kernel(base, dev).bounds_us["block phases"] == 0


def test_ir_work_counts_the_tensor_core_nodes():
    """The IR estimate of a tensorized kernel sees its fills (16-byte cp.async chunks), its
    ldmatrix loads (4 bytes a register per lane) and its mma; a pipelined loop (S = 3) has no
    synchronous fill phases, a single-stage one (S = 1) one per k-tile."""
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel

    a = te.placeholder((256, 512), "bfloat16", name="a")
    w = te.placeholder((512, 384), "bfloat16", name="w")
    for stages, phases in ((3, 0), (1, 512 // 32)):
        fn = polyfuse.compile(
            [a, w], [ops.matmul(a, w, name="mm")], "sm_80", check_cuda=False,
            mapping=MappingConfig(gemm_stages=stages),
        )  # fmt: skip
        (k,) = fn.kernels
        d = describe_kernel(k)
        assert d.source == "kernel IR estimate"
        warps = k.grid[0] * k.block[0] // 32
        assert d.mix.mma * warps == 256 * 512 * 384 / 2048
        # every element of both operands' tiles copied once per block, 16 bytes a chunk
        assert d.mix.ldgsts * d.threads * d.blocks >= 2 * (256 * 512 + 512 * 384)
        assert d.mix.lds > 0 and d.sync_phases == phases, (stages, d.sync_phases)


@pytest.mark.skipif(not _has_disassembler(), reason="needs NVRTC and nvdisasm (polyfuse[sass])")
@pytest.mark.usefixtures("main_tilings")
def test_sass_mix_counts_the_mma_instructions():
    """The SASS path's mix counts HMMA as the tensor pipe's instructions, as the IR does."""
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.cuda.toolchain.sass import analyse
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import device_for_arch

    a = te.placeholder((512, 512), "bfloat16", name="a")
    w = te.placeholder((512, 512), "bfloat16", name="w")
    for arch in ("sm_80", "sm_90"):
        fn = polyfuse.compile([a, w], [ops.matmul(a, w, name="mm")], arch, check_cuda=False)
        (k,) = fn.kernels
        (ks,) = analyse(fn.cuda_source, (arch,), kernels=fn.kernels).kernels
        sass = describe_kernel(k, ks)
        assert sass.mix.mma == describe_kernel(k).mix.mma > 0
        # the tail: what is left outside the k-step loops (k-steps ptxas peeled off included)
        assert sass.tail is not None and 0 < sass.tail.slots < sass.mix.slots
        assert sass.tail.mma < sass.mix.mma
    # a 64-deep product: ptxas unrolls both k-tiles, no loop is left: all of it is tail,
    # priced as one block phase (it was no phase at all: bound by DRAM latency alone)
    a = te.placeholder((1024, 64), "bfloat16", name="a")
    w = te.placeholder((64, 1024), "bfloat16", name="w")
    fn = polyfuse.compile([a, w], [ops.matmul(a, w, name="mm")], "sm_90", check_cuda=False)
    (k,) = fn.kernels
    (ks,) = analyse(fn.cuda_source, ("sm_90",), kernels=fn.kernels).kernels
    d = describe_kernel(k, ks)
    assert not [lp for lp in ks.loops if lp.mix.cost_mix().mma] and d.tail == d.mix
    assert model_kernel(d, device_for_arch("sm_90")).bounds_us["block phases"] > 0
