"""Before/after tests of poly/promote.py: the access function a tile copies through, the
soundness of padded k-tiles, and the promotion of one block tile (footprint box, stride and
padding, copy layout, the tiled schedule's statements), with its refusals."""

from __future__ import annotations

import islpy as isl
import pytest
from poly_inputs import isl_map, matmul, one

from polyfuse import te
from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.poly.device import H100
from polyfuse.poly.gemm_barriers import SYNC_AFTER, SYNC_BEFORE
from polyfuse.poly.gemm_kernel import gemm_placements
from polyfuse.poly.gemm_pipeline import COMMIT, WAIT
from polyfuse.poly.gemm_promotion import invariant_operands
from polyfuse.poly.gemm_shape import access_function
from polyfuse.poly.gemm_tile_schedule import padded_reduction_reads
from polyfuse.poly.gemm_tree import extension_of
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.promote import build_gemm_kernel
from polyfuse.poly.tiling import choose_gemm_tiles, detect_gemm


def _shape(inputs, out):
    sm = one(inputs, out)
    shape = detect_gemm(sm)
    assert not isinstance(shape, str), shape
    return sm, shape


def _kernel(inputs, out, tile, stages: int = 1):
    sm, shape = _shape(inputs, out)
    return build_gemm_kernel(sm, shape, choose_gemm_tiles(shape, H100, forced=tile), stages)


def _maps(gk, stmt: str) -> list[isl.Map]:
    return [m for m in maps_of(gk.schedule_map) if m.get_tuple_name(isl.dim_type.in_) == stmt]


# ------------------------------------------------------------------------------ access function


def test_access_function_drops_the_domain_and_the_padding_guard():
    padded = isl_map("{ S[o, k] -> x[o + k - 1] : 0 <= o < 8 and 0 <= k < 3 and 1 <= o + k < 9 }")
    got = access_function(padded)
    assert got.is_equal(isl_map("{ S[o, k] -> x[o + k - 1] }", got.get_ctx()))


def test_access_function_of_a_division_stays_exact_on_its_domain():
    grouped = isl_map(
        "{ S[co, ci] -> x[16 * floor(co / 16) + ci] : 0 <= co < 64 and 0 <= ci < 16 }"
    )
    got = access_function(grouped)  # the hull is no function: gisted, still one element
    assert got.is_single_valued()
    assert got.intersect_domain(grouped.domain()).is_equal(grouped)
    # valid past the domain too (padded channel steps): 16 floor(co / 16) + ci at ci = 20
    at = isl.Set("{ S[co, ci] : co = 37 and ci = 20 }", context=got.get_ctx())
    assert got.intersect_domain(at).range().is_equal(isl.Set("{ x[52] }", context=got.get_ctx()))


# ------------------------------------------------------------------------------ padded k-tiles


def test_padded_k_tiles_of_a_matmul_read_zeros():
    sm, shape = _shape(*matmul(8, 12, 8))
    for tk in ([8], [12], [16]):  # the padded steps k = 12.. read past a's rows and b's columns
        assert padded_reduction_reads(shape, tk, sm.model) is None


def test_padded_k_tiles_through_a_folded_layout_are_refused():
    """``a[i, 12h + k]`` with ``k < 12``: padded steps ``k >= 12`` read head h+1's elements."""
    a, b = te.placeholder((8, 48), name="a"), te.placeholder((48, 8), name="b")
    k = te.reduce_axis(12, name="k")
    c = te.compute((4, 8, 8), lambda h, i, j: te.sum(a[i, 12 * h + k] * b[12 * h + k, j], axis=k))
    sm, shape = _shape([a, b], c)
    assert padded_reduction_reads(shape, [12], sm.model) is None  # no padded step
    for tk in (8, 16):
        assert padded_reduction_reads(shape, [tk], sm.model) == Refusal(
            DecisionKind.GEMM_TILE,
            f"k-tile {tk}: some padded reduction steps would read a, b inside their arrays "
            "(not zeros)",
            (shape.update.prim,),
        )
    # one factor past its array is enough: w[k, j] has 12 rows
    w = te.placeholder((12, 8), name="w")
    c = te.compute((4, 8, 8), lambda h, i, j: te.sum(a[i, 12 * h + k] * w[k, j], axis=k))
    sm, shape = _shape([a, w], c)
    assert padded_reduction_reads(shape, [16], sm.model) is None


# ------------------------------------------------------------------------------ one tile


@pytest.fixture(scope="module")
def mm():
    """64x40x64 matmul in 32x32 blocks of 8x8 threads with 4x4 registers, k-tiles of 8."""
    return _kernel(*matmul(64, 40, 64), (32, 32, 4, 4, 8))


def test_promoted_boxes_strides_padding_and_copy_grids(mm):
    a, b = mm.promotions
    ctx = a.lo[0].get_ctx()
    rng = "0 <= b0 <= 1 and 0 <= b1 <= 1 and 0 <= kt0 <= 4"

    def lo(expr: str) -> isl.PwAff:
        return isl.PwAff(f"[b0, b1, kt0] -> {{ [({expr})] : {rng} }}", context=ctx)

    # a: rows of the block (32 b0 ..) x the k-tile's columns (8 kt0 ..), in a 32x8 tile
    assert (a.tensor, a.copy_stmt, a.size, a.stride, a.pad, a.width) == (
        "a",
        "C_a",
        [32, 8],
        [8, 1],
        0,
        4,
    )
    assert a.lo[0].is_equal(lo("32b0")) and a.lo[1].is_equal(lo("8kt0"))
    # 32 rows x 2 float4 per row: the block's 64 threads copy one vector each
    assert (a.thread_grid, a.grid) == ((32, 2), (("p0r", 32), ("p0c", 2)))
    # b: 8x32, rows padded 32 -> 36 words (a row stride of 32 banks would conflict)
    assert (b.size, b.stride, b.pad, b.width, b.floats) == ([8, 32], [36, 1], 4, 4, 288)
    assert b.lo[0].is_equal(lo("8kt0")) and b.lo[1].is_equal(lo("32b1"))
    assert (b.thread_grid, b.grid) == ((8, 8), (("p1r", 8), ("p1c", 8)))
    assert a.bounds_check == b.bounds_check == [False, False]  # whole tiles
    assert "last dim padded 32->36 against bank conflicts" in b.reason
    assert a.reason.endswith("128-bit vector copy: rows contiguous, extent 8 a multiple of 4, "
                             "isl proves every start 16-byte aligned")  # fmt: skip


def test_each_copy_instance_is_one_vector_of_the_k_tiles_footprint(mm):
    (ca,) = _maps(mm, "C_a")
    names = [
        mm.context.get_dim_name(isl.dim_type.param, i)
        for i in range(mm.context.dim(isl.dim_type.param))
    ]
    fixed = [n for n in names if n not in ("p0r", "p0c")]
    block = isl.Set(
        f"[{', '.join(fixed)}] -> {{ : {' and '.join(f'{n} = 0' for n in fixed)} }}",
        context=ca.get_ctx(),
    ).align_params(ca.get_space())
    # every thread (p0r, p0c) of block 0 at k-tile 1 runs one instance: the vector starting
    # at a[p0r, 8 + 4 p0c]
    inst = ca.domain().intersect_params(block)
    inst = inst.intersect(isl.Set("{ C_a[kt0, e0, e1] : kt0 = 1 }", context=ca.get_ctx()))
    firsts = inst.project_out(isl.dim_type.param, 0, inst.dim(isl.dim_type.param))
    want = "{ C_a[1, e0, e1] : 0 <= e0 < 32 and (e1 = 8 or e1 = 12) }"
    assert firsts.is_equal(isl.Set(want, context=ca.get_ctx()))
    # 64 instances for the block's 64 threads, every thread one: (p0r, p0c) as set dims
    inst = inst.intersect_params(mm.context.align_params(inst.get_space()))
    for name in ("p0r", "p0c"):
        pos = inst.find_dim_by_name(isl.dim_type.param, name)
        inst = inst.move_dims(isl.dim_type.set, 0, isl.dim_type.param, pos, 1)
    inst = inst.project_out(isl.dim_type.param, 0, inst.dim(isl.dim_type.param))
    assert inst.count_val().to_python() == 64
    assert inst.project_out(isl.dim_type.set, 2, 3).count_val().to_python() == 64
    # and isl schedules the copies of k-tile kt0 first (phase 0), before its barrier and the
    # update (phase 1): the barriers are grafted around the update in every k-tile
    ext = extension_of(mm.schedule_tree, SYNC_BEFORE)
    assert ext is not None and ext.is_equal(
        isl.UnionMap(
            f"{{ [kt0] -> {SYNC_BEFORE}[kt0] : 0 <= kt0 <= 4; "
            f"[kt0] -> {SYNC_AFTER}[kt0] : 0 <= kt0 <= 4 }}",
            context=ca.get_ctx(),
        ).align_params(ext.get_space())
    )
    phase = ca.range().project_out(isl.dim_type.param, 0, ca.dim(isl.dim_type.param))
    assert phase.dim_min_val(1).to_python() == phase.dim_max_val(1).to_python() == 0
    (up,) = _maps(mm, "S_c_update")
    assert up.range().dim_min_val(1).to_python() == 1


def test_tiled_schedule_places_init_update_and_epilogue(mm):
    ctx = mm.context.get_ctx()
    assert mm.iterators == ["kt0", "ph", "sub", "kk0", "ii0", "iv", "pos"]
    assert (mm.reg_iters, mm.reg_shape) == (["ii0", "iv"], [4, 4])
    # the epilogue stores whole float4 runs of the thread's columns
    assert mm.vector_stores == {"S_c_final": "c"}
    (up,) = _maps(mm, "S_c_update")
    # element (d0, d1, r0) of block (0, 0) for thread (1, 2): register ii0 = 1 of its rows
    # (d0 = t0 + 8 ii0), vector lane iv = 1 (d1 = 4 t1 + iv), k-tile 2 step 3
    pt = isl.Set(
        "[b0, b1, t0, t1] -> { S_c_update[9, 9, 19] : b0 = 0 and b1 = 0 and t0 = 1 and t1 = 2 }",
        context=ctx,
    )
    img = up.intersect_domain(pt.align_params(up.get_space())).range()
    img = img.project_out(isl.dim_type.param, 0, img.dim(isl.dim_type.param))
    assert img.is_equal(isl.Set("{ [2, 1, 0, 3, 1, 1, 0] }", context=ctx))
    (init,) = _maps(mm, "S_c_init")
    (fin,) = _maps(mm, "S_c_final")
    first = init.range().project_out(isl.dim_type.param, 0, init.dim(isl.dim_type.param))
    last = fin.range().project_out(isl.dim_type.param, 0, fin.dim(isl.dim_type.param))
    assert first.dim_max_val(0).to_python() == -1 and last.dim_min_val(0).to_python() == 5
    assert mm.guards == {"S_c_final": [(0, None), (0, None)]}  # whole tiles: no guard


def test_partial_tiles_are_bounds_checked_and_guarded():
    gk = _kernel(*matmul(50, 37, 70), (32, 32, 4, 4, 8))
    assert [p.bounds_check for p in gk.promotions] == [[True, True], [True, True]]
    assert gk.guards == {"S_c_final": [(0, 49), (0, 69)]}
    # rows of 70 floats: a thread's runs of 4 columns are not 16-byte aligned
    assert gk.vector_stores == {}
    assert (
        "epilogue stores scalar: c: vector starts are not 16-byte aligned (row length 70; start "
        "offsets mod 4 take more than 0)"
    ) in gk.notes


def test_scalar_stores_for_two_columns_per_thread():
    gk = _kernel(*matmul(64, 40, 64), (32, 32, 4, 2, 8))
    assert gk.vector_stores == {} and "epilogue stores scalar: 2 columns per thread" in gk.notes


def test_two_stages_over_one_k_tile_loop():
    gk = _kernel(*matmul(64, 40, 64), (32, 32, 4, 4, 8), stages=2)
    assert (gk.stages, gk.pipelined) == (2, "kt0")
    ctx = gk.context.get_ctx()

    def kts(stmt: str) -> isl.Set:
        (m,) = _maps(gk, stmt)
        return m.domain()

    # one async group per k-tile from k-tile -1 (the first copies), the wait from 0
    assert kts(COMMIT).is_equal(isl.Set(f"{{ {COMMIT}[kt0] : -1 <= kt0 <= 4 }}", context=ctx))
    assert kts(WAIT).is_equal(isl.Set(f"{{ {WAIT}[kt0] : 0 <= kt0 <= 4 }}", context=ctx))
    # the copies of k-tile kt0 run at kt0 - 1, after the init at -2
    (ca,) = _maps(gk, "C_a")
    pt = isl.Set("{ C_a[3, e0, e1] }", context=ctx).align_params(ca.get_space())
    assert ca.intersect_domain(pt).range().dim_max_val(0).to_python() == 2
    (init,) = _maps(gk, "S_c_init")
    assert init.range().dim_max_val(0).to_python() == -2
    # a single k-tile has nothing to overlap
    one_tile = _kernel(*matmul(64, 8, 64), (32, 32, 4, 4, 8), stages=2)
    assert (one_tile.stages, one_tile.pipelined) == (1, "")


# ------------------------------------------------------------------------------ operands


def test_k_invariant_operand_held_in_registers_not_promoted():
    a, b, s = (
        te.placeholder(sh, name=n) for sh, n in (((16, 16), "a"), ((16, 16), "b"), ((16,), "s"))
    )
    r = te.reduce_axis(16, name="r")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * b[r, j] * s[i], axis=r), name="c")
    sm, shape = _shape([a, b, s], c)
    ((name, fn, arr),) = invariant_operands(shape, sm.model)
    assert (name, arr) == ("s", (16,))
    assert fn.is_equal(isl_map("{ S_c_update[d0, d1, r0] -> s[d0] }", fn.get_ctx()))
    gk = build_gemm_kernel(sm, shape, choose_gemm_tiles(shape, H100, forced=(16, 16, 2, 2, 8)))
    assert [p.tensor for p in gk.promotions] == ["a", "b"]
    assert [(f.tensor, f.hoisted) for f in gk.fragments][0] == ("s", True)
    place = gemm_placements(gk)
    assert {n: p.space for n, p in place.items()} == {
        "c": "global",
        "c_acc": "register",
        "a": "shared",
        "b": "shared",
        "s": "global",
    }
    assert place["s"].reason.startswith("k-invariant operand: register fragment r_s_frag[2]")
    assert place["c_acc"].reason == "register micro-tile 2x2 per thread (4 accumulators)"


def test_refused_promotions():
    a = te.placeholder((16, 16), name="a")
    r = te.reduce_axis(16, name="r")
    square = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * a[r, j], axis=r), name="c")
    gk = _kernel([a], square, (16, 16, 2, 2, 8))  # one tile per access (was refused)
    assert [(p.tensor, p.array) for p in gk.promotions] == [("a", "a"), ("a__1", "a")]
    b, w = te.placeholder((16, 16), name="b"), te.placeholder((16, 16, 16), name="w")
    c = te.compute((16, 16), lambda i, j: te.sum(a[i, r] * b[r, j] * w[i, j, r], axis=r))
    assert _kernel([a, b, w], c, (16, 16, 2, 2, 8)) == Refusal(
        DecisionKind.GEMM_TILE, "w is not reused across threads: not promoted", ("w",)
    )
