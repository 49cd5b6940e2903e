"""Multi-stage pipelining of a GEMM's global->shared copies (issue 23 item 2, ALCOP).

The stage model (ALCOP's Table I, :mod:`polyfuse.poly.costs.stages`), the passes' steps on
hand-built IR (buffer expansion, producer/consumer stage indices, exact wait count), the
prologue / steady state / epilogue split of a tiny GEMM, and S = 2, 3, 4 run on the emulator
against numpy at odd sizes in plain and race-check builds; a planted wrong wait count and a
planted missing barrier are caught; NVRTC sm_80/sm_90 compile S = 3, 4 without spills.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import polyfuse
from polyfuse import examples, ops, te
from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KAsyncCopy,
    KCommit,
    KCopy,
    KernelIR,
    KFor,
    KInt,
    KOp,
    KStmt,
    KTile,
    KVar,
    KWait,
    MemSpace,
)
from polyfuse.cuda.codegen.lower_pipeline import (
    expand_stages,
    lower_pipeline_sync,
    stage_consumers,
    stage_producers,
)
from polyfuse.cuda.codegen.lower_promotions import Pipeline, PromotedTile, lower_promotions
from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import RaceError
from polyfuse.poly.costs.stages import (
    MAX_STAGES,
    StageProblem,
    choose_stages,
    pipeline_latency,
)
from polyfuse.poly.device import A100, H100
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.policy import gemm_tile_budget

RNG = np.random.default_rng(23)
TILE = (32, 32, 4, 4, 8)  # 64 threads, k-tile 8: odd K gives a partial last k-tile


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> Emulator:
    return Emulator(cache_dir=tmp_path_factory.mktemp("stagecache"), workers=2)


# --------------------------------------------------------------------------------------------
# The stage model (ALCOP Table I)
# --------------------------------------------------------------------------------------------


def test_pipeline_latency_is_alcops_two_cases():
    # hidden: T_load <= (N_pipe * N_mplx - 1) * T_use -> the loop runs at the use rate
    assert pipeline_latency(300.0, 100.0, 10, 2, 2) == 1000.0
    assert pipeline_latency(300.0, 100.0, 10, 4, 1) == 1000.0
    # load-bound: (T_load + T_use) * N_loop / N_pipe
    assert pipeline_latency(300.0, 100.0, 10, 2, 1) == pytest.approx(2000.0)
    assert pipeline_latency(300.0, 100.0, 12, 3, 1) == pytest.approx(1600.0)


def _problem(**kw) -> StageProblem:
    base = dict(
        fma_per_ktile=128 * 128 * 8,
        stage_bytes=8448,
        ktiles=512,
        blocks=1024,
        threads=256,
        registers=120,
        dram_bytes=2 * 4096 * 4096 * 4,
    )
    base.update(kw)
    return StageProblem(**base)


def test_compute_bound_tile_keeps_two_stages():
    """A 128x128 FP32 tile computes ~1200 cycles per k-tile: one tile in flight hides the
    load, so more stages only take shared memory."""
    c = choose_stages(_problem(), H100)
    assert c.stages == 2 and "its load is hidden" in c.reason
    two = c.candidates[0]
    assert two.hidden and two.t_use > two.t_load


def test_load_bound_tile_takes_more_stages():
    """A small tile with few blocks per SM cannot hide a DRAM round trip with one tile in
    flight: the model takes the stages that hide it (or the most that fit)."""
    small = _problem(fma_per_ktile=32 * 32 * 8, stage_bytes=2112, blocks=64, threads=64)
    c = choose_stages(small, A100)
    assert c.stages > 2
    chosen = c.candidates[c.stages - 2]
    assert chosen.t_kernel < c.candidates[0].t_kernel
    assert str(c.stages) in c.reason and "ALCOP" in c.reason


def test_stage_counts_over_the_budget_are_refused_with_the_reason():
    budget = gemm_tile_budget(H100)
    big = _problem(fma_per_ktile=32 * 32 * 8, stage_bytes=budget // 3 + 64, blocks=64)
    c = choose_stages(big, H100)
    refused = {x.stages: x.refused for x in c.candidates if x.refused}
    assert set(refused) == {3, 4}
    per = budget // 3 + 64
    assert refused[3] == f"3 x {per} B = {3 * per} B > {budget} B budget"
    assert c.stages == 2
    assert all(x.shared_bytes <= budget for x in c.candidates if not x.refused)
    # forced over the budget: the largest count that fits, the refusal in the reason
    f = choose_stages(big, H100, forced=4)
    assert f.stages == 2 and "4 stages forced, refused (4 x" in f.reason
    # nothing fits: single-buffered, every refusal named
    none = choose_stages(_problem(stage_bytes=budget), H100)
    assert none.stages == 1 and none.reason.startswith("single-buffered: S=2 refused")


def test_stages_never_exceed_the_k_tiles_unless_forced():
    c = choose_stages(_problem(fma_per_ktile=1024, stage_bytes=512, ktiles=3, blocks=8), A100)
    assert c.stages <= 3
    assert c.candidates[-1].refused == "more stages than the 3 k-tiles"
    assert choose_stages(_problem(ktiles=3), A100, forced=4).stages == 4
    with pytest.raises(ValueError, match="1 to 4"):
        choose_stages(_problem(), A100, forced=MAX_STAGES + 1)


# --------------------------------------------------------------------------------------------
# The passes on hand-built IR
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_promotion_pass_expands_buffers_and_rewrites_stage_indices(stages):
    """Before: one k-tile loop whose copy statement names its own k-tile kt0 + S - 1 (the
    schedule runs copies S-1 k-tiles early), a commit and a wait statement. After: the tile
    has S buffers (stage the first dim), the copy is a cp.async into stage (kt0 + S-1) % S of
    its own k-tile's box, the reads use stage kt0 % S, and the wait lets exactly the S-1
    newer groups fly."""
    kt = KVar("kt0")
    ahead = KOp("+", (kt, KInt(stages - 1)))
    col = KOp("+", (KVar("p0c"), KOp("*", (KInt(8), ahead))))
    loop = KFor(
        "kt0",
        KInt(1 - stages),
        KOp("<=", (kt, KInt(6))),
        1,
        [KStmt("C_a", (ahead, KVar("p0r"), col)), KStmt("Commit", (kt,)), KStmt("Wait", (kt,))],
    )
    before = KernelIR("k", (), (("t0", 64),), (loop,), ("mg",))
    lo = (KInt(0), KOp("*", (KInt(8), kt)))
    tile = PromotedTile(
        "a", "C_a", lo, (16, 8), (16, 56), (False, False), (("p0r", 8), ("p0c", 8)),
        frozenset({"U"}),
    )  # fmt: skip
    after = lower_promotions(before, [tile], Pipeline(stages, "kt0", ("kt0",), "Commit", "Wait"))
    assert before.allocs == () and after.allocs[0].shape == (stages, 16, 8)
    assert after.tiles[0].stage == KOp("%", (kt, KInt(stages)))  # consumer: kt0 % S
    copy, commit, wait = after.body[0].body
    assert isinstance(copy, KAsyncCopy) and commit == KCommit() and wait == KWait(stages - 1)
    assert copy.dst_index[0] == KOp("%", (ahead, KInt(stages)))  # producer: (kt0+S-1) % S
    assert copy.dst_index[2] == KOp("-", (col, KOp("*", (KInt(8), ahead))))  # its own box
    # single-stage: no stage dim, plain copies
    plain = lower_promotions(before, [tile])
    assert plain.allocs[0].shape == (16, 8) and plain.tiles[0].stage is None


def _one_tile_ir(stages: int) -> KernelIR:
    """The promotion pass's output for one tile ``s_a`` (16x8) over k-tile loop kt0: a copy
    whose first coordinate is the k-tile it fills (kt0 + S-1), a commit and a wait."""
    kt = KVar("kt0")
    ahead = KOp("+", (kt, KInt(stages - 1)))
    copy = KCopy("s_a", (ahead, KVar("p0r"), KVar("p0c")), "a", (KVar("p0r"), KVar("p0c")))
    loop = KFor(
        "kt0",
        KInt(1 - stages),
        KOp("<=", (kt, KInt(6))),
        1,
        [copy, KStmt("Commit", (kt,)), KStmt("Wait", (kt,))],
    )
    alloc = KAlloc("s_a", MemSpace.SHARED, "", (16, 8))
    tile = KTile("a", "s_a", (KInt(0), KOp("*", (KInt(8), kt))), frozenset({"U"}))
    return KernelIR("k", (), (("t0", 64),), (loop,), ("mg",), allocs=(alloc,), tiles=(tile,))


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_expand_stages_adds_the_stage_dim(stages):
    before = _one_tile_ir(stages)
    after = expand_stages(before, frozenset({"s_a"}), stages)
    assert before.allocs[0].shape == (16, 8) and after.allocs[0].shape == (stages, 16, 8)
    assert expand_stages(before, frozenset({"s_b"}), stages).allocs == before.allocs


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stage_producers_copy_async_into_their_k_tiles_stage(stages):
    before = _one_tile_ir(stages)
    after = stage_producers(before, frozenset({"s_a"}), stages)
    (copy_before, *_), (copy, *_) = before.body[0].body, after.body[0].body
    assert type(copy_before) is KCopy and isinstance(copy, KAsyncCopy)
    assert copy.dst_index[0] == KOp("%", (copy_before.dst_index[0], KInt(stages)))
    assert copy.dst_index[1:] == copy_before.dst_index[1:] and copy.src == "a"


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_stage_consumers_read_stage_kt_mod_s(stages):
    before = _one_tile_ir(stages)
    after = stage_consumers(before, frozenset({"s_a"}), "kt0", stages)
    assert before.tiles[0].stage is None
    assert after.tiles[0].stage == KOp("%", (KVar("kt0"), KInt(stages)))


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_pipeline_sync_waits_with_exactly_s_minus_1_groups_pending(stages):
    before = _one_tile_ir(stages)
    after = lower_pipeline_sync(before, "Commit", "Wait", stages)
    _, commit, wait = after.body[0].body
    assert before.body[0].body[1] == KStmt("Commit", (KVar("kt0"),))
    assert commit == KCommit() and wait == KWait(stages - 1)


# --------------------------------------------------------------------------------------------
# A tiny GEMM through the whole path
# --------------------------------------------------------------------------------------------


def _matmul(m: int, k: int, n: int, stages: int | None, arch: str = "sm_80", tile=TILE):
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    c = ops.matmul(a, b)
    cfg = MappingConfig(gemm_tile=tile, gemm_stages=stages)
    fn = polyfuse.compile([a, b], [c], arch, check_cuda=False, mapping=cfg)
    arrays = [RNG.standard_normal((m, k)).astype(np.float32)]
    arrays.append(RNG.standard_normal((k, n)).astype(np.float32))
    return fn, arrays


def _loops(src: str) -> list[tuple[int, int]]:
    """(first, last) k-tile of each pipelined piece: loops and single-iteration blocks."""
    loop = r"for \(int kt0 = \(?(-?\d+)\)?; \(kt0 <= \(?(-?\d+)\)?\)"
    out = [(int(a), int(b)) for a, b in re.findall(loop, src)]
    out += [(int(a), int(a)) for a in re.findall(r"const int kt0 = \(?(-?\d+)\)?;", src)]
    return sorted(out)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_prologue_steady_state_and_epilogue(stages):
    """K = 75 in k-tiles of 8: 10 k-tiles. The prologue runs S-1 iterations of copies and
    commits before k-tile 0; the steady state copies k-tile kt+S-1 into stage (kt+S-1) % S,
    commits, waits with S-1 groups pending and reads stage kt % S; the last S-1 k-tiles copy
    nothing but still commit (empty groups), so one wait count holds in every iteration."""
    fn, _ = _matmul(37, 75, 43, stages)
    src = fn.cuda_source
    pieces = _loops(src)
    assert pieces[0] == (1 - stages, -1)  # the prologue: S-1 k-tiles in flight
    assert pieces[-1][1] == 9 and pieces[1][0] == 0
    assert src.count(f"__pipeline_wait_prior({stages - 1});") == 2  # steady, epilogue
    assert src.count("__pipeline_wait_prior(") == 2
    assert f"(kt0 % {stages}) * " in src and f"((kt0 + {stages - 1}) % {stages}) * " in src
    assert f"s_a[{stages * 256}];" in src and f"s_b[{stages * 264}];" in src
    start = re.search(rf"(for \(int kt0 = |const int kt0 = ){10 - stages + 1};", src)
    assert start is not None
    epilogue = src[start.start() :]
    epilogue = epilogue[: epilogue.index("\n  }\n")]
    assert "__pipeline_memcpy_async" not in epilogue and "__pipeline_commit();" in epilogue
    notes = "\n".join(n for m in fn.plan.mapped if m for n in m.notes)
    assert f"shared tiles in {stages} stages over k-tile loop kt0" in notes
    assert f"stages: {stages} stages (forced)" in notes


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("size", [(37, 75, 43), (50, 21, 33)])
def test_pipelined_gemm_matches_numpy_plain_and_race_checked(stages, size):
    """Odd M, N, K (no multiple of the tile): partial tiles, a partial last k-tile, and with
    K = 21 (3 k-tiles) S = 4 puts every k-tile into the prologue."""
    fn, (a, b) = _matmul(*size, stages)
    want = a.astype(np.float64) @ b.astype(np.float64)
    for race in (False, "shadow"):
        got = fn(a, b, race_check=race)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stages", [3, 4])
def test_pipelined_conv_and_epilogue_chain_match_the_reference(stages):
    """An implicit-GEMM conv (odd channels, filters and image) and matmul + bias + GELU with
    S stages, plain and race-checked."""
    for inputs, outputs, reference in (
        examples.conv2d_relu(batch=2, channels=19, size=9, filters=7)[:3],
        examples.matmul_bias_gelu(45, 70, 38)[:3],
    ):
        cfg = MappingConfig(gemm_stages=stages)
        fn = polyfuse.compile(inputs, outputs, "sm_80", check_cuda=False, mapping=cfg)
        assert f"__pipeline_wait_prior({stages - 1});" in fn.cuda_source
        arrays = examples.random_inputs(inputs)
        for race in (False, "shadow"):
            got = fn(*arrays, race_check=race)
            assert examples.max_error(got, reference(*arrays)) < 1e-3


def test_stage_count_model_picks_inside_the_budget_and_says_why():
    fn, (a, b) = _matmul(40, 200, 36, None)
    notes = [n for m in fn.plan.mapped if m for n in m.notes if n.startswith("stages: ")]
    assert notes and "ALCOP's latency model" in notes[0]
    s = int(re.search(r"stages: (\d) stages", notes[0]).group(1))
    assert 2 <= s <= MAX_STAGES
    assert f"__pipeline_wait_prior({s - 1});" in fn.cuda_source
    np.testing.assert_allclose(fn(a, b), a @ b, rtol=1e-4, atol=1e-4)


# --------------------------------------------------------------------------------------------
# Planted bugs the emulator catches
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_planted_wrong_wait_count_reads_poison(emu, stages):
    """Waiting with one group too many in flight (S instead of S-1) reads a stage whose
    cp.async has not landed: the emulator's poison (all-ones bytes, NaN) reaches the output."""
    fn, arrays = _matmul(37, 75, 43, stages)
    src = fn.cuda_source
    exact = f"__pipeline_wait_prior({stages - 1});"
    assert exact in src
    bufs = fn._bind(arrays, {})
    emu.load(src).run(fn.launches, bufs)
    (out,) = [v for k, v in bufs.items() if v.shape == (37, 43)]
    np.testing.assert_allclose(out, arrays[0] @ arrays[1], rtol=1e-4, atol=1e-4)
    mutant = src.replace(exact, f"__pipeline_wait_prior({stages});")
    bufs = fn._bind(arrays, {})
    emu.load(mutant).run(fn.launches, bufs)
    (out,) = [v for k, v in bufs.items() if v.shape == (37, 43)]
    assert np.isnan(out).any()


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize("which", ["after wait", "after use"])
def test_planted_missing_barrier_is_a_race(emu, stages, which):
    """Deleting the barrier between the wait and the reads (a thread reads words another
    thread's cp.async wrote) or the one after the reads (the next copy overwrites a stage
    still being read) is reported by the race-check build."""
    fn, arrays = _matmul(37, 75, 43, stages)
    src = fn.cuda_source
    steady = src.index("for (int kt0 = 0;")
    wait = src.index(f"__pipeline_wait_prior({stages - 1});", steady)
    first = src.index("__syncthreads();", wait)
    at = first if which == "after wait" else src.index("__syncthreads();", first + 1)
    mutant = src[:at] + " " * len("__syncthreads();") + src[at + 16 :]
    emu.load(src, racecheck=True).run(fn.launches, fn._bind(arrays, {}))
    with pytest.raises(RaceError) as info:
        emu.load(mutant, racecheck=True).run(fn.launches, fn._bind(arrays, {}))
    assert info.value.space == "shared"


# --------------------------------------------------------------------------------------------
# NVRTC
# --------------------------------------------------------------------------------------------


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("stages", [3, 4])
def test_nvrtc_compiles_three_and_four_stages_without_spills(arch, stages):
    fn, _ = _matmul(1000, 1000, 1000, stages, arch, tile=(128, 128, 8, 8, 8))
    assert f"__pipeline_wait_prior({stages - 1});" in fn.cuda_source
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    (res,) = binary.resources.values()
    assert res.spill_stores == res.spill_loads == 0
    assert res.shared_bytes >= stages * 4 * (128 * 8 + 8 * 132)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("stages", [3, 4])
def test_hot_loop_ffma_share_holds_with_more_stages(stages):
    """The 4096^3 matmul's k-tile loop with S stages (stage index ``kt % S`` instead of
    ``kt % 2``) keeps its 512 FFMA and an FFMA share >= 0.85 (tests/test_sass.py's bar for
    S = 2; measured 0.869 / 0.881 for S = 3 / 4 on sm_80), with S-1 k-tiles peeled."""
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, analyse, find_disassembler

    try:
        find_disassembler()
    except DisassemblerNotFound:
        pytest.skip("no SASS disassembler")
    ins, outs, _ = examples.matmul_bias_gelu(4096, 4096, 4096)
    cfg = MappingConfig(gemm_tile=(128, 128, 8, 8, 8), gemm_stages=stages)
    fn = polyfuse.compile(ins, outs, "sm_80", check_cuda=False, name="mm", mapping=cfg)
    (k,) = analyse(fn.cuda_source, ("sm_80",), kernels=fn.kernels).kernels
    assert k.hot.kind == "k-tile" and k.hot.iterations == 512 - stages + 1
    assert k.hot.mix["FFMA"] == 512 and k.hot.mix.ffma_share >= 0.85
    assert k.resources.spill_stores == 0
    assert k.resources.shared_bytes == stages * 4 * (128 * 8 + 8 * 132)


def test_forced_stages_without_a_pipelined_loop_say_why():
    """K = 8 is one k-tile: nothing to pipeline; the forced count is refused in the notes."""
    fn, (a, b) = _matmul(33, 8, 20, 3)
    notes = [n for m in fn.plan.mapped if m for n in m.notes if n.startswith("stages: ")]
    assert notes == ["stages: 1, not the forced 3 (no single k-tile loop of several k-tiles "
                     "with shared tiles)"]  # fmt: skip
    assert "__pipeline" not in fn.cuda_source
    np.testing.assert_allclose(fn(a, b), a @ b, rtol=1e-4, atol=1e-4)
