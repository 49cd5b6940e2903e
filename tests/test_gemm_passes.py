"""Before/after tests of the GEMM passes that :func:`polyfuse.poly.promote.build_gemm_kernel`
composes, written with isl strings: the tiled statement rows
(:mod:`polyfuse.poly.gemm_tile_schedule`), promotion copies (:mod:`polyfuse.poly.gemm_promotion`)
and pipeline stages (:mod:`polyfuse.poly.gemm_pipeline`); and the GEMM mapping's refusals, kept
as typed records (:func:`polyfuse.poly.kernel_map.map_gemm`). The passes as transformations of
the kernel's schedule tree (and the barriers) are tested in ``tests/test_gemm_tree.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import islpy as isl
import pytest
from poly_inputs import matmul, one, scheduled

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.poly.device import H100
from polyfuse.poly.gemm_pipeline import (
    async_group_schedule,
    copy_shift,
    pipeline_shifts,
    pipelined_loop,
)
from polyfuse.poly.gemm_promotion import copy_schedule, promote_operands
from polyfuse.poly.gemm_shape import access_groups
from polyfuse.poly.gemm_tile_schedule import tile_frame
from polyfuse.poly.kernel_map import map_gemm, map_kernel
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles

THREADS = "b0, b1, t0, t1"


def _frame(tile=(16, 16, 4, 4, 8), m=32, k=24, n=32):
    sm = one(*matmul(m, k, n))
    shape = detect_gemm(sm)
    assert not isinstance(shape, Refusal), shape
    (tiling,) = rank_gemm_tiles(shape, H100, tile, limit=1)
    return sm, shape, tiling, tile_frame(shape, sm.model, tiling)


def _equal(got: isl.UnionMap | isl.Set, text: str) -> bool:
    ctx = got.get_ctx()
    want = (
        isl.UnionMap(text, context=ctx)
        if isinstance(got, isl.UnionMap)
        else isl.Set(text, context=ctx)
    )
    return got.is_equal(want)


# ------------------------------------------------------------------ tiling of the schedule


def test_tiling_maps_the_band_to_blocks_threads_registers_and_k_tiles():
    """Before: isl's band ``S[d0, d1, r0] -> [d0, d1, r0]`` over 32 x 32 x 24. After: block
    tiles 16 x 16 of 4 x 4 threads, each thread 4 rows cyclic and a run of 4 columns (a vector
    store: isl proves every run aligned), k-tiles of 8; init before k-tile 0, the epilogue
    after the last (k-tile 3); the update in phase 1, the others in phase 0."""
    sm, shape, _, f = _frame()
    assert _equal(
        f.tile,
        "[b0, b1, kt0] -> { S_c_update[d0, d1, r0] : 16b0 <= d0 < 16b0 + 16 and "
        "16b1 <= d1 < 16b1 + 16 and 8kt0 <= r0 < 8kt0 + 8 }",
    )
    assert _equal(f.ranges, "[b0, b1, kt0] -> { : 0 <= b0 < 2 and 0 <= b1 < 2 and 0 <= kt0 < 3 }")
    assert f.regs == ["ii0", "iv"] and f.reg_shape == [4, 4]
    assert f.vector_stores == {"S_c_final": "c"}
    on_thread = (
        "d0 = 16b0 + t0 + 4ii0 and 0 <= ii0 < 4 and d1 = 16b1 + 4t1 + iv and 0 <= iv < 4 and "
        "0 <= d0 < 32 and 0 <= d1 < 32"
    )
    got = f.statement_schedule(shape, 4, THREADS)
    assert _equal(
        got,
        f"[{THREADS}] -> {{ S_c_update[d0, d1, r0] -> [kt0, 1, 0, kk0, ii0, iv, 0] : "
        f"{on_thread} and r0 = 8kt0 + kk0 and 0 <= kk0 < 8 and 0 <= r0 < 24; "
        f"S_c_init[d0, d1] -> [-1, 0, 0, 0, ii0, iv, 0] : {on_thread}; "
        f"S_c_final[d0, d1] -> [3, 0, 0, 0, ii0, iv, 0] : {on_thread} }}",
    )
    assert f.epilogue_guards(shape, [16, 16]) == {"S_c_final": [(0, None), (0, None)]}


def test_tiling_spreads_columns_cyclically_when_stores_stay_scalar():
    """Two columns per thread are no vector: thread t1 takes columns t1 and t1 + 8; a partial
    block tile (30 columns in 2 x 16) guards the epilogue."""
    _, shape, _, f = _frame((16, 16, 4, 2, 8), n=30)
    assert f.vector_stores == {} and f.store_why == "epilogue stores scalar: 2 columns per thread"
    assert f.regs == ["ii0", "ii1"] and f.reg_shape == [4, 2]
    got = f.update_at(shape.update, 3, THREADS)
    assert _equal(
        got,
        f"[{THREADS}] -> {{ S_c_update[d0, d1, r0] -> [kt0, 1, 0, kk0, ii0, ii1] : "
        "d0 = 16b0 + t0 + 4ii0 and 0 <= ii0 < 4 and d1 = 16b1 + t1 + 8ii1 and 0 <= ii1 < 2 and "
        "r0 = 8kt0 + kk0 and 0 <= kk0 < 8 and 0 <= d0 < 32 and 0 <= d1 < 32 and 0 <= r0 < 24 }",
    )
    assert f.epilogue_guards(shape, [16, 16]) == {"S_c_final": [(0, None), (0, 29)]}


# ------------------------------------------------------------------------ promotion copies


def test_promotion_copies_each_operands_block_footprint_once():
    """Before: ``a[d0, r0]`` read by the tile. After: a 16 x 8 shared tile of a copied by an
    8 x 2 grid of threads in float4s (its copy domain: one instance per vector, thread
    (p0r, p0c) taking rows p0r + 8q and the vector at column 4 p0c)."""
    sm, shape, tiling, f = _frame()
    got = promote_operands(f, shape, sm.model, tiling.nthreads, set(), {})
    assert not isinstance(got, Refusal), got
    (pa, pb), (ca, cb) = got
    assert (pa.tensor, pa.size, pa.stride, pa.width, pa.grid) == (
        "a",
        [16, 8],
        [8, 1],
        4,
        (("p0r", 8), ("p0c", 2)),
    )
    assert (pb.tensor, pb.size, pb.width, pb.grid) == ("b", [8, 16], 4, (("p1r", 4), ("p1c", 4)))
    assert _equal(
        ca.domain,
        "[b0, b1, p0r, p0c] -> { C_a[kt0, e0, e1] : (e0 - p0r) mod 8 = 0 and "
        "(e1 + 4p0c) mod 8 = 0 and 0 <= b0 < 2 and 0 <= b1 < 2 and 0 <= kt0 < 3 and "
        "16b0 <= e0 < 16b0 + 16 and 8kt0 <= e1 < 8kt0 + 8 }",
    )
    # the copies in the schedule: loops q0, q1 from 0 (constant trip counts), k-tile kt0
    ctx = ca.domain.get_ctx()
    empty = isl.UnionMap("{ }", context=ctx)
    sched = copy_schedule(empty, [ca], ["kt0"], ["kt0"], 4)
    threads = isl.Set("[p0r, p0c] -> { : 0 <= p0r < 8 and 0 <= p0c < 2 }", context=ctx)
    assert _equal(
        sched.intersect_params(threads.align_params(sched.get_space())),
        "[b0, b1, p0r, p0c] -> { C_a[kt0, e0, e1] -> [kt0, 0, 0, q0, q1, 0, 0] : "
        "e0 = 16b0 + p0r + 8q0 and e1 = 8kt0 + 4p0c + 8q1 and 0 <= p0r < 8 and 0 <= p0c < 2 "
        "and 0 <= b0 < 2 and 0 <= b1 < 2 and 0 <= kt0 < 3 and 0 <= q0 < 2 and q1 = 0 }",
    )
    # pipelined, the copies of k-tile kt0 run one k-tile early
    early = copy_schedule(empty, [ca], ["kt0"], ["kt0 - 1"], 4)
    shift = isl.UnionMap("{ [k, a, b, c, d, e, f] -> [k - 1, a, b, c, d, e, f] }", context=ctx)
    assert early.is_equal(sched.apply_range(shift))


def test_promotion_stages_one_tile_per_access_of_a_tensor():
    """``sum_r a[i, r] * a[r, j]``: a read at two places is two access groups, each its own
    shared tile with its own footprint box and copy statement (was: refused, one tile per
    tensor). The copy domains are isl's footprints of the two accesses: rows of the block's
    i-tile for the first, rows of the k-tile for the second."""
    a = te.placeholder((16, 16), name="a")
    r = te.reduce_axis(16, name="r")
    sm = one([a], te.compute((16, 16), lambda i, j: te.sum(a[i, r] * a[r, j], axis=r), name="c"))
    shape = detect_gemm(sm)
    groups = access_groups(shape)
    assert [(g.tensor, g.key, len(g.reads)) for g in groups] == [("a", "a", 1), ("a", "a__1", 1)]
    ctx = groups[0].access.get_ctx()
    s = shape.update.name
    assert groups[0].access.is_equal(isl.Map(f"{{ {s}[i, j, r] -> a[i, r] }}", context=ctx))
    assert groups[1].access.is_equal(isl.Map(f"{{ {s}[i, j, r] -> a[r, j] }}", context=ctx))
    (tiling,) = rank_gemm_tiles(shape, H100, (16, 16, 2, 2, 8), limit=1)
    f = tile_frame(shape, sm.model, tiling)
    got = promote_operands(f, shape, sm.model, tiling.nthreads, set(), {})
    assert not isinstance(got, Refusal)
    proms, copies = got
    assert [(p.tensor, p.array, p.copy_stmt) for p in proms] == [
        ("a", "a", "C_a"),
        ("a__1", "a", "C_a__1"),
    ]
    # BM x TK rows of the i-tile; TK whole rows of a for the second (8 x 16, contiguous:
    # tile_box views them as one dim of 128)
    assert [p.size for p in proms] == [[16, 8], [128]]
    assert proms[0].merge == () and proms[1].merge == ((16, 1),)
    # each tile serves the read of its own access
    assert [p.reads for p in proms] == [g.reads for g in groups]
    assert groups[0].reads[0] is not groups[1].reads[0]
    assert [c.stmt for c in copies] == ["C_a", "C_a__1"]


# -------------------------------------------------------------------------- pipeline stages


@pytest.mark.parametrize(
    ("ktiles", "stages", "copies", "want"),
    [
        ([4], 2, 2, (2, 0)),  # one k-tile loop of 4 k-tiles with shared tiles: pipelined
        ([4], 3, 2, (3, 0)),
        ([1], 2, 2, (1, None)),  # nothing to overlap
        ([4, 3], 2, 2, (1, None)),  # k-tiles over two loops
        ([1, 3], 2, 2, (2, 1)),  # the one loop of several k-tiles
        ([4], 2, 0, (1, None)),  # no shared tiles
        ([4], 1, 2, (1, None)),
    ],
)
def test_pipelined_loop(ktiles, stages, copies, want):
    assert pipelined_loop(ktiles, stages, copies) == want


def test_pipelining_moves_copies_early_and_groups_them():
    """Before: copies of k-tile kt0 at kt0, the init at -1. After (3 stages): the copies'
    extension is shifted to kt0 - 2 along the pipelined loop and the k-tile band's shift moves
    the init to -3 along every k-tile loop; one commit per k-tile from -2 on and a wait per
    k-tile."""
    assert copy_shift(1, 3, 0) == [-2]
    assert pipeline_shifts("S_init", 1, 3) == {"S_init": [-2]}
    assert copy_shift(2, 2, 1) == [0, -1]
    assert pipeline_shifts("S_init", 2, 2) == {"S_init": [-1, -1]}
    ctx = isl.Context()
    got = async_group_schedule(isl.UnionMap("{ }", context=ctx), ["kt0"], [4], 0, 3, 2, 3)
    assert _equal(
        got,
        "{ Cp_commit[kt0] -> [kt0, 0, 2, 0, 0, 0] : -2 <= kt0 < 4; "
        "Cp_wait[kt0] -> [kt0, 0, 3, 0, 0, 0] : 0 <= kt0 < 4 }",
    )


# ----------------------------------------------------------- refusals kept as typed records


def test_map_gemm_keeps_the_refusal_of_a_tiling_it_cannot_build():
    """``sum_r a[i, r] * b[r, j] * w[i, j, r]``: GEMM-like, but ``w`` is reused by no thread
    of the block and cannot be promoted. The refusal (was dropped: None) names the
    micrograph and the tiling, and the plain mapping's notes say why there is no GEMM
    tiling."""
    a, b = te.placeholder((64, 64), name="a"), te.placeholder((64, 64), name="b")
    w = te.placeholder((64, 64, 64), name="w")
    r = te.reduce_axis(64, name="r")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, r] * b[r, j] * w[i, j, r], axis=r), name="c")
    sm = one([a, b, w], c)
    got = map_gemm(sm, H100, MappingConfig())
    assert isinstance(got, Refusal) and got.kind == DecisionKind.GEMM_TILE
    assert got.subject == (sm.name,) and not got.record.made
    assert got.reason.endswith(": w is not reused across threads: not promoted")
    mapped = map_kernel(None, [sm], None, H100, MappingConfig())  # type: ignore[arg-type]
    assert f"no GEMM tiling: {got.reason}" in mapped.notes


def test_a_square_of_one_tensor_is_a_tiled_gemm_with_two_tiles():
    """matmul(a, a) reads ``a`` through two relations: one shared tile per access (it was a
    plain loop nest: 'a is read through two different accesses: not promoted'); NVRTC
    compiles it and the emulator matches numpy."""
    import numpy as np

    a = te.placeholder((64, 48), name="a")
    r = te.reduce_axis(32, name="r")
    # a[i, r] @ a[j, 16 + r]^T: two boxes of one array, at different column offsets
    g = te.compute((64, 64), lambda i, j: te.sum(a[i, r] * a[j, 16 + r], axis=r), name="g")
    fn = polyfuse.compile([a], [g], "sm_90", check_cuda=True)
    (k,) = fn.kernels
    assert not any(n.startswith("no GEMM tiling") for n in k.notes)
    shared = sorted(n.split(":")[0] for n in k.notes if ": shared (" in n)
    assert shared == ["a", "a__1"]
    assert "s_a_t1" in k.source and "s_a[" in k.source
    x = np.random.default_rng(7).standard_normal((64, 48)).astype(np.float32)
    got = fn(x, device="emulate")
    want = x[:, :32].astype(np.float64) @ x[:, 16:48].astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
def test_map_gemm_refuses_when_no_tiling_fits_shared_memory():
    """A forced tiling of a contraction over two reduction dims (only the longer is tiled):
    its shared tiles exceed the budget, a FOOTPRINT refusal naming the bytes (was dropped:
    None)."""
    a = te.placeholder((64, 64, 48), name="a")
    b = te.placeholder((64, 48, 64), name="b")
    r, s = te.reduce_axis(64, name="r"), te.reduce_axis(48, name="s")
    c = te.compute((64, 64), lambda i, j: te.sum(a[i, r, s] * b[r, s, j], axis=[r, s]))
    sm = one([a, b], c)
    got = map_gemm(sm, H100, MappingConfig(gemm_tile=(64, 64, 4, 4, 32)))
    assert isinstance(got, Refusal) and got.kind == DecisionKind.FOOTPRINT, got
    assert got.reason.startswith("no ranked tiling is sound and fits: rejected block tile 64x64")
    assert "B per block" in got.reason and got.subject == (sm.name,)


def test_map_gemm_is_silent_on_what_is_not_gemm_like():
    x = te.placeholder((8, 64), name="x")
    assert map_gemm(one([x], ops.reduce_sum(x, axis=1)), H100, MappingConfig()) is None


# ------------------------------------------- one GEMM dispatch, owned by the GEMM modules

ROOT = Path(__file__).resolve().parents[1]
#: the modules that may test a kernel's class against GemmKernel: the GEMM path's own entry
GEMM_DISPATCH = {"polyfuse/poly/gemm_kernel.py"}


def gemm_class_tests(source: str) -> list[int]:
    """Lines of ``source`` that call ``isinstance(x, GemmKernel)`` (also in a tuple of
    classes, or as ``promote.GemmKernel``)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance"):
            continue
        if len(node.args) == 2 and any(
            getattr(n, "id", getattr(n, "attr", "")) == "GemmKernel" for n in ast.walk(node.args[1])
        ):
            out.append(node.lineno)
    return out


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "polyfuse").rglob("*.py"))
)
def test_no_gemm_kernel_class_test_outside_the_gemm_dispatch(path):
    if path not in GEMM_DISPATCH:
        assert gemm_class_tests((ROOT / path).read_text()) == []


def test_the_gemm_class_check_catches_one_planted_in_the_driver():
    driver = (ROOT / "polyfuse/driver.py").read_text()
    assert gemm_class_tests(driver) == [] and "GemmKernel" not in driver
    assert "TensorCoreKernel" not in driver  # the tensorized kernel goes through lower_gemm
    planted = driver + (
        "\n\ndef planted(mm):\n    return isinstance(mm, GemmKernel)\n"
        "\n\ndef planted2(mm):\n    return isinstance(mm, (TensorCoreKernel, promote.GemmKernel))\n"
    )
    assert len(gemm_class_tests(planted)) == 2


def test_the_gemm_dispatch_lowers_and_places_gemm_kernels_only():
    """The driver's and the placement's one question, answered by the GEMM modules: a tiled
    GEMM is lowered by its own passes (its promoted operands counted as global reads), a
    plain kernel is not the GEMM path's."""
    from polyfuse.cuda.codegen.gemm_lowering import lower_gemm
    from polyfuse.poly.gemm_kernel import as_gemm_kernel, gemm_placements, kernel_placements
    from polyfuse.poly.kernel_map import place_kernel

    ins, out = matmul(64, 40, 64)
    graph, (sm,) = scheduled(ins, [out])
    gk = map_kernel(graph, [sm], None, H100, MappingConfig())
    assert as_gemm_kernel(gk) is gk and kernel_placements(gk) == gemm_placements(gk)
    pl = place_kernel(gk, H100)
    assert {t: p.space for t, p in pl.items() if p.space == "shared"} == {
        "a": "shared",
        "b": "shared",
    }
    got = lower_gemm("k0", gk, pl, graph.idents)
    assert got is not None and got.notes == gk.notes
    assert "__shared__" in got.kernel.source and "__syncthreads()" in got.kernel.source
    assert {t: p.space for t, p in got.footprint_placements.items()} == {
        "a": "global",
        "b": "global",
        "c": "global",
        "c_acc": "register",
    }
    plain = map_kernel(graph, [sm], None, H100, MappingConfig(gemm=False))
    assert as_gemm_kernel(plain) is None and kernel_placements(plain) is None
    assert lower_gemm("k0", plain, place_kernel(plain, H100), graph.idents) is None


def test_the_gemm_dispatch_lowers_a_tensorized_kernel_onto_mma():
    """A 16-bit GEMM mapped onto tensor cores is lowered by the same entry: no isl AST (its
    loops are written by the mma lowering), mma.sync in the kernel, its shared operand tiles
    counted as global reads."""
    from polyfuse.cuda.codegen.gemm_lowering import lower_gemm
    from polyfuse.poly.kernel_map import place_kernel
    from polyfuse.poly.tensorize import TensorCoreKernel

    a = te.placeholder((64, 48), name="a", dtype="float16")
    b = te.placeholder((48, 40), name="b", dtype="float16")
    out = ops.matmul(a, b, name="mm")
    graph, (sm,) = scheduled([a, b], [out])
    tk = map_kernel(graph, [sm], None, H100, MappingConfig())
    assert isinstance(tk, TensorCoreKernel)
    pl = place_kernel(tk, H100)
    low = lower_gemm("k0_mm", tk, pl, graph.idents)
    assert low is not None and low.ast is None and low.kernel.facts.mma
    assert "pf_mma_m16n8k16_f32_f16" in low.kernel.source
    assert {t: p.space for t, p in low.footprint_placements.items() if t in ("a", "b")} == {
        "a": "global",
        "b": "global",
    }
