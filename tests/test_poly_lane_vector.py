"""Before/after tests of poly/lane_vector.py: a reduction kernel's lanes take runs of 4
consecutive elements (float4) where isl proves it, over band points written as isl text."""

from __future__ import annotations

import islpy as isl
import pytest
from poly_inputs import one

from polyfuse import ops, te
from polyfuse.poly.canonical import form_of
from polyfuse.poly.cost import choose_reduction_strategy
from polyfuse.poly.device import H100
from polyfuse.poly.lane_vector import choose_lane_vectors, part_band


def _sum(shape: tuple[int, ...], axis: int | None):
    """(scheduled sum of x over ``axis``, its strategy on H100)."""
    x = te.placeholder(shape, name="x")
    sm = one([x], ops.reduce_sum(x, axis=axis, name="s"))
    up = next(s for s in sm.model.statements if s.role == "update")
    return sm, choose_reduction_strategy(form_of(up.tensor), H100)


def _lanes(sm, strategy, band: str):
    """The decision for the one part whose loop band (kept..., f) is ``band``."""
    um = isl.UnionMap(band, context=sm.model.ctx)
    return choose_lane_vectors(sm.model, sm.schedule, [um], strategy, H100)


# ------------------------------------------------------------------------------ part_band


def test_part_band_is_kept_members_then_the_flattened_loop():
    ctx = isl.Context()
    dom = isl.UnionSet(
        "{ S_u[d0, r0] : 0 <= d0 < 4 and 0 <= r0 < 8; S_i[d0] : 0 <= d0 < 4 }", context=ctx
    )
    loop = isl.MultiUnionPwAff.from_union_map(isl.UnionMap("{ S_u[d0, r0] -> [r0] }", context=ctx))
    outer = isl.MultiUnionPwAff.from_union_map(
        isl.UnionMap("{ S_u[d0, r0] -> [d0]; S_i[d0] -> [d0] }", context=ctx)
    )
    want = "{ S_u[d0, r0] -> [d0, r0] : 0 <= d0 < 4 and 0 <= r0 < 8 }"
    assert part_band(outer, loop, dom).is_equal(isl.UnionMap(want, context=ctx))
    # an all-reduce has no kept members: the band is the loop alone (S_i has no loop)
    want = "{ S_u[d0, r0] -> [r0] : 0 <= d0 < 4 and 0 <= r0 < 8 }"
    assert part_band(None, loop, dom).is_equal(isl.UnionMap(want, context=ctx))


# ------------------------------------------------------------------------------ decisions


def test_rows_of_4096_take_runs_of_four_with_float4_loads():
    sm, st = _sum((64, 4096), 1)
    lv = _lanes(sm, st, "{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < 4096 }")
    c = lv.coarsening
    assert (c.factor, c.tail) == (4, False)
    # the accumulator is one element per row, not a run: it stays a register
    assert c.vector == {"x": True, "s_acc": False}
    assert c.why_scalar == {"s_acc": "start offset not a multiple of 4 for some thread"}
    assert lv.strategy == st and st.lanes == 1024  # 1024 runs: the lanes keep their count
    assert c.reason == (
        "4-element runs per lane along the reduced/row axis (lanes 1024 -> 1024, combine "
        "unchanged) on H100-SXM5-80GB; float4 proven for x; scalar: s_acc (start offset not a "
        "multiple of 4 for some thread)"
    )


def test_an_all_reduce_with_a_ragged_end_keeps_a_scalar_tail():
    sm, st = _sum((1002,), None)
    lv = _lanes(sm, st, "{ S_s_update[r0] -> [r0] : 0 <= r0 < 1002 }")
    assert (lv.coarsening.factor, lv.coarsening.tail) == (4, True)
    assert lv.coarsening.reason.endswith(
        "; scalar tail where a loop's extent is not a multiple of 4"
    )


@pytest.mark.parametrize("row", [47, 6])
def test_rows_not_a_multiple_of_four_stay_one_element_per_lane_step(row):
    sm, st = _sum((64, row), 1)
    band = f"{{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < {row} }}"
    lv = _lanes(sm, st, band)
    assert lv.coarsening.factor == 1 and lv.strategy == st
    assert lv.coarsening.reason == (
        "one element per lane step: no float4 access (s_acc: start offset not a multiple of 4 "
        "for some thread; x: start offset not a multiple of 4 for some thread)"
    )


def test_runs_need_a_whole_run_in_some_part():
    """Rows of 4 are aligned and contiguous, but a loop that runs 2 of their elements has no
    whole run: one element per lane step, and the reason says so (it said "no float4 access"
    and named only the accumulator, though x was proven)."""
    sm, st = _sum((64, 4), 1)
    lv = _lanes(sm, st, "{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < 4 }")
    assert lv.coarsening.factor == 4
    lv = _lanes(sm, st, "{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < 2 }")
    assert lv.coarsening.factor == 1 and lv.coarsening.vector == {"x": True, "s_acc": False}
    assert lv.coarsening.reason == (
        "one element per lane step: float4 proven for x, but no loop runs a whole run of 4"
    )


def test_x_reductions_are_refused_before_any_proof():
    sm, st = _sum((4096, 64), 0)
    assert st.form.kind == "x"
    lv = _lanes(sm, st, "{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < 4096 }")
    assert lv.coarsening.factor == 1 and lv.coarsening.vector == {}
    assert lv.coarsening.reason == (
        "one element per lane step: lanes stride the outer (reduced) dimension of an "
        "x-reduction, not a contiguous one"
    )


def test_empty_bands_are_skipped():
    sm, st = _sum((64, 4096), 1)
    ctx = sm.model.ctx
    full = isl.UnionMap(
        "{ S_s_update[d0, r0] -> [d0, r0] : 0 <= d0 < 64 and 0 <= r0 < 4096 }", context=ctx
    )
    empty = isl.UnionMap.empty(full.get_space())
    lv = choose_lane_vectors(sm.model, sm.schedule, [empty, full], st, H100)
    assert lv.coarsening.factor == 4 and lv.coarsening.vector["x"]
