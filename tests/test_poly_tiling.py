"""Before/after tests of poly/tiling.py: GEMM detection on small isl models and schedules
written as isl text, access rows of isl maps, and the tile sizes the ranking picks."""

from __future__ import annotations

import pytest
from poly_inputs import isl_map, matmul, modelled, one, unscheduled, with_schedule

from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind, Refusal
from polyfuse.errors import ScheduleError
from polyfuse.poly.device import H100
from polyfuse.poly.tiling import (
    FORCED_TILE_REASON,
    LOOP_FFMA_FLOOR,
    NO_PERIOD,
    _independent_dims,
    _tiling,
    affine_rows,
    choose_gemm_tiles,
    detect_gemm,
    loop_share,
    rank_gemm_tiles,
)

MM = "0 <= d0 <= 7 and 0 <= d1 <= 15"
DOMAIN = (
    f"{{ S_c_init[d0, d1] : {MM}; S_c_update[d0, d1, r0] : {MM} and 0 <= r0 <= 11; "
    f"S_c_final[d0, d1] : {MM} }}"
)
MEMBER = {  # a band member of the 8x12x16 matmul, per statement
    "d0": ("d0", "d0", "d0"),
    "d1": ("d1", "d1", "d1"),
    "r": ("0", "r0", "11"),
}


def _band(order: list[str], coincident: list[int], permutable: int = 1) -> str:
    """isl's schedule tree of the 8x12x16 matmul with band members ``order``."""
    members = ", ".join(
        f"{{ S_c_init[d0, d1] -> [({i})]; S_c_update[d0, d1, r0] -> [({u})]; "
        f"S_c_final[d0, d1] -> [({f})] }}"
        for i, u, f in (MEMBER[m] for m in order)
    )
    seq = ", ".join(
        f'{{ filter: "{{ {s} }}" }}'
        for s in ("S_c_init[d0, d1]", "S_c_update[d0, d1, r0]", "S_c_final[d0, d1]")
    )
    return (
        f'{{ domain: "{DOMAIN}", child: {{ schedule: "[{members}]", permutable: {permutable}, '
        f"coincident: [ {', '.join(map(str, coincident))} ], child: {{ sequence: [ {seq} ] }} }} }}"
    )


@pytest.fixture(scope="module")
def mm():
    return one(*matmul(8, 12, 16))


# ------------------------------------------------------------------------------ detect_gemm


def test_matmul_shape_names_extents_operands_and_reuse(mm):
    shape = detect_gemm(mm)
    assert not isinstance(shape, str)
    assert shape.data == [(0, 7), (0, 15)]
    assert shape.red == [(0, 11)]
    assert [s.name for s in (shape.init, shape.update)] == ["S_c_init", "S_c_update"]
    assert [s.name for s in shape.epilogue] == ["S_c_final"]
    assert [n for n, _ in shape.operands] == ["a", "b"]
    dom = f"{MM} and 0 <= r0 <= 11"
    want = {
        "a": isl_map(f"{{ S_c_update[d0, d1, r0] -> a[d0, r0] : {dom} }}", mm.model.ctx),
        "b": isl_map(f"{{ S_c_update[d0, d1, r0] -> b[r0, d1] : {dom} }}", mm.model.ctx),
    }
    assert all(m.is_equal(want[n]) for n, m in shape.operands)
    # a ignores the columns (reused along d1), b the rows (reused along d0)
    assert shape.reuse == [{1}, {0}]


def test_matmul_under_isl_text_of_its_own_band_is_the_same_shape(mm):
    sm = with_schedule(mm, _band(["d0", "d1", "r"], [1, 1, 0]))
    shape = detect_gemm(sm)
    assert not isinstance(shape, str) and shape.reuse == [{1}, {0}]


def test_elementwise_epilogue_follows_the_final_in_micrograph_order():
    a, b = te.placeholder((8, 12), name="a"), te.placeholder((12, 16), name="b")
    bias = te.placeholder((16,), name="bias")
    r = te.reduce_axis(12, name="r")
    c = te.compute((8, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    y = ops.relu(te.compute((8, 16), lambda i, j: c[i, j] + bias[j], name="y"), name="z")
    shape = detect_gemm(one([a, b, bias], y))
    assert not isinstance(shape, str)
    assert [s.name for s in shape.epilogue] == ["S_c_final", "S_y", "S_z"]
    assert [n for n, _ in shape.operands] == ["a", "b"]  # bias is an epilogue input


@pytest.mark.parametrize(
    ("order", "coincident", "permutable", "why"),
    [
        (["d1", "d0", "r"], [1, 1, 0], 1, "isl's band is not the data loops of S_c_init"),
        (["d0", "d1", "r"], [1, 0, 0], 1, "data members are not coincident"),
        (["d0", "d1", "r"], [1, 1, 0], 0, "the outer band is not permutable over the data dims"),
        (["d0"], [1], 1, "the outer band is not permutable over the data dims"),
    ],
)
def test_refused_band_orders(mm, order, coincident, permutable, why):
    """Tiling maps the band's first members to the data dims: isl's band must run them, in
    the update's order, parallel and permutable."""
    assert _why(detect_gemm(with_schedule(mm, _band(order, coincident, permutable)))) == why


def _why(got) -> str:
    """The reason of ``detect_gemm``'s refusal (a :class:`Refusal` of a GEMM tile)."""
    assert isinstance(got, Refusal) and got.kind == DecisionKind.GEMM_TILE, got
    return got.reason


def test_refused_without_an_outer_band(mm):
    assert _why(detect_gemm(unscheduled(mm.model))) == "no outer band"


def _ab():
    a = te.placeholder((8, 12), name="a")
    return a, te.placeholder((12, 16), name="b"), te.reduce_axis(12, name="r")


def test_refused_reductions_that_are_not_gemm_like():
    a, b, r = _ab()
    mx = te.compute((8, 16), lambda i, j: te.max(a[i, r] * b[r, j], axis=r), name="c")
    assert _why(detect_gemm(one([a, b], mx))) == "the reduction is not a sum"
    x = te.placeholder((12,), name="x")
    mv = te.compute((8,), lambda i: te.sum(a[i, r] * x[r], axis=r), name="mv")
    assert _why(detect_gemm(one([a, x], mv))) == "fewer than two data dimensions"
    a3 = te.placeholder((8, 16, 12), name="a3")
    c3 = te.compute((8, 16), lambda i, j: te.sum(a3[i, j, r] * a[i, r], axis=r), name="c3")
    assert _why(detect_gemm(one([a3, a], c3))) == (
        "fewer than two operands are reused across threads (memory-bound)"
    )
    e = te.compute((8, 12), lambda i, j: a[i, j] * 2.0, name="e")
    assert _why(detect_gemm(one([a], e))) == "not exactly one reduction"
    s = te.compute((8, 16), lambda i, j: te.sum(a[i, r] + b[r, j], axis=r), name="s")
    assert _why(detect_gemm(one([a, b], s))) == "the update is not a product of reads"


def test_refused_float64_operands():
    a = te.placeholder((8, 12), name="a", dtype="float64")
    b = te.placeholder((12, 16), name="b", dtype="float64")
    r = te.reduce_axis(12, name="r")
    c = te.compute((8, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    assert _why(detect_gemm(one([a, b], c))) == "the operands are not float32"


def test_refused_producer_inside_the_micrograph_and_epilogue_at_another_element():
    a, b8 = te.placeholder((8, 12), name="a"), te.placeholder((12, 8), name="b")
    r = te.reduce_axis(12, name="r")
    p = ops.relu(a, name="p")
    c = te.compute((8, 8), lambda i, j: te.sum(p[i, r] * b8[r, j], axis=r), name="c")
    _, model = modelled([a, b8], [c])
    assert _why(detect_gemm(unscheduled(model))) == (
        "statements run before the reduction (producers in the micrograph)"
    )
    c = te.compute((8, 8), lambda i, j: te.sum(a[i, r] * b8[r, j], axis=r), name="c")
    d = te.compute((8, 8), lambda i, j: c[i, j] * c[j, i], name="d")
    _, model = modelled([a, b8], [d])
    assert _why(detect_gemm(unscheduled(model))) == "S_d reads c at another element"


# ------------------------------------------------------------------------------ access rows


def test_independent_dims_of_an_access():
    m = isl_map("{ S[d0, d1, r0] -> a[d0, r0] : 0 <= d0 < 8 and 0 <= d1 < 16 and 0 <= r0 < 12 }")
    assert _independent_dims(m, 2) == {1}
    w = isl_map("{ S[n, co, oh, r0] -> w[co, r0] : 0 <= n < 2 and 0 <= co < 8 and 0 <= oh < 4 }")
    assert _independent_dims(w, 3) == {0, 2}


def test_affine_rows_of_matmul_and_padded_strided_conv():
    m = isl_map("{ S[d0, d1, r0] -> a[d0, r0] : 0 <= d0 < 8 and 0 <= d1 < 16 and 0 <= r0 < 12 }")
    assert affine_rows(m) == ((((1, 0, 0), 0), ((0, 0, 1), 0)), (0, 0), (NO_PERIOD,) * 2)
    # the padding guard (a bound of the domain) is no part of the subscripts
    conv = isl_map(
        "{ S[n, co, oh, ow, ci, kh, kw] -> x[n, ci, oh + kh - 1, 2ow + kw - 1] : "
        "0 <= n < 2 and 0 <= co < 8 and 0 <= oh < 4 and 0 <= ow < 4 and 0 <= ci < 3 and "
        "0 <= kh < 3 and 0 <= kw < 3 and 0 <= oh + kh - 1 < 4 }"
    )
    assert affine_rows(conv) == (
        (
            ((1, 0, 0, 0, 0, 0, 0), 0),
            ((0, 0, 0, 0, 1, 0, 0), 0),
            ((0, 0, 1, 0, 0, 1, 0), -1),
            ((0, 0, 0, 2, 0, 0, 1), -1),
        ),
        (0, 0, 0, 0),
        (NO_PERIOD,) * 4,
    )


def test_affine_rows_bound_a_division_from_above_with_its_slack():
    # grouped conv's input channel: co + ci - 15 <= 16 floor(co / 16) + ci <= co + ci
    grouped = isl_map(
        "{ S[co, ci] -> x[16 * floor(co / 16) + ci] : 0 <= co < 64 and 0 <= ci < 16 }"
    )
    assert affine_rows(grouped) == ((((1, 1), 0),), (15,), (NO_PERIOD,))
    # floor(i / 3) + j: a period with another dim's term is no reshape's; bounded
    mixed = isl_map("{ S[i, j] -> a[floor(i / 3) + j] : 0 <= i < 8 and 0 <= j < 4 }")
    assert affine_rows(mixed) == ((), (), ())


def test_affine_rows_of_a_reshape_are_periodic():
    # i mod 3 = i - 3 floor(i / 3): the row i within a tile of i inside one period of 3
    assert affine_rows(isl_map("{ S[i, j] -> a[i mod 3] : 0 <= i < 8 and 0 <= j < 4 }")) == (
        (((1, 0), 0),),
        (0,),
        ((0, 3, -3),),
    )
    # floor(i / 2): constant within such a tile, one more per period
    half = isl_map("{ S[i, j] -> a[floor(i / 2), j] : 0 <= i < 8 and 0 <= j < 4 }")
    assert affine_rows(half) == ((((0, 0), 0), ((0, 1), 0)), (0, 0), ((0, 2, 1), NO_PERIOD))


def test_affine_rows_give_up_on_subscripts_with_neither_form():
    assert affine_rows(isl_map("{ S[i] -> a[o] : 0 <= i < 8 and o >= i }")) == ((), (), ())


# ------------------------------------------------------------------------------ tile sizes


def test_forced_tiling_is_the_candidate_with_the_k_tile_clipped(mm):
    shape = detect_gemm(mm)
    t = choose_gemm_tiles(shape, H100, forced=(8, 16, 2, 4, 32))
    assert (t.block, t.threads, t.tk, t.regs) == ([8, 16], [4, 4], [12], [2, 4])
    assert t.choice == (8, 16, 2, 4, 12)  # a k-tile past K = 12 is the tiling of 12
    assert (t.nthreads, t.accumulators) == (16, 8)
    assert t.reasons[:2] == [
        "matrix plane: data dims 0 (rows, extent 8) x 1 (columns, extent 16); reused dims [0, 1]",
        f"{FORCED_TILE_REASON}=(8, 16, 2, 4, 32)",
    ]
    assert t.reasons[2].startswith(
        "block tile 8x16, 4x4 threads, register micro-tile 2x4 (8 accumulators), k-tile 12: "
    )
    assert t.code is not None and t.estimate is not None and t.modelled_us > 0
    # a forced tiling is given even where the ranking would not take it (16 threads)
    assert (
        rank_gemm_tiles(shape, H100, (8, 16, 2, 4, 32), forced_reason="tuned")[0].reasons[1]
        == "tuned=(8, 16, 2, 4, 32)"
    )


def test_ranked_tilings_best_first_distinct_and_within_the_floor():
    shape = detect_gemm(one(*matmul(256, 512, 256)))
    ranked = rank_gemm_tiles(shape, H100, limit=3)
    assert len(ranked) == 3
    times = [t.modelled_us for t in ranked]
    assert times == sorted(times) and len(set(times)) == 3
    for rank, t in enumerate(ranked):
        assert t.nthreads in (64, 128, 256)
        assert t.tk == [t.choice[4]] and t.block == list(t.choice[:2])
        assert loop_share(t.code) >= LOOP_FFMA_FLOOR
        assert ("cost-model rank" in " ".join(t.reasons)) == (rank > 0)
    # the tilings below the loop-quality floor are named, not silently dropped
    assert "tilings not ranked: their k-tile loop would be below 80% FFMA" in ranked[0].reasons[1]


def test_unfolded_tiling_puts_the_matrix_plane_on_rows_and_columns():
    # conv's data dims (n, co, oh, ow): rows = co (dim 1), columns = ow (dim 3)
    t = _tiling(4, 1, 3, 0, [64, 3, 3], (64, 32, 8, 4, 8))
    assert (t.block, t.threads, t.tk) == ([1, 64, 1, 32], [1, 8, 1, 8], [8, 3, 3])
    assert t.regs == [1, 8, 1, 4] and t.choice == (64, 32, 8, 4, 8)


def test_no_tiling_fits_is_a_schedule_error_not_an_index_error():
    """Two reduction dims of 512: only the longest (the first) is k-tiled, the other stays
    whole, so every candidate's shared tile of a is BM x TK x 512 floats, past the budget."""
    a, b = te.placeholder((64, 512, 512), name="a"), te.placeholder((512, 512, 64), name="b")
    r1, r2 = te.reduce_axis(512, name="r1"), te.reduce_axis(512, name="r2")
    c = te.compute(
        (64, 64), lambda i, j: te.sum(a[i, r1, r2] * b[r1, r2, j], axis=[r1, r2]), name="c"
    )
    shape = detect_gemm(one([a, b], c))
    assert not isinstance(shape, str)
    with pytest.raises(ScheduleError, match=r"^c: no GEMM tiling fits H100-SXM5-80GB"):
        choose_gemm_tiles(shape, H100)
