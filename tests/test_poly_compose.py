"""Before/after tests of poly/compose.py: the schedule-tree rewrites of reduction kernels on
trees written as isl text (member order, nested bands merged, flattening, runs of 4 and the
lanes), the composition of parts and its refusals, and the mapped row-sum kernel."""

from __future__ import annotations

import islpy as isl
import pytest
from poly_inputs import scheduled

from polyfuse import ops, te
from polyfuse.poly.canonical import canonical_form
from polyfuse.poly.compose import (
    CompositionError,
    _flatten,
    _inner_runs,
    _lane_runs,
    _merge_nested,
    _reordered,
    compose,
    kept_count,
    map_reduction_kernel,
)
from polyfuse.poly.cost import choose_reduction_strategy
from polyfuse.poly.device import H100

DOM = "{ S[i, j] : 1 <= i <= 3 and 2 <= j <= 9 }"


@pytest.fixture
def ctx():
    return isl.Context()


def _tree(ctx, text: str) -> isl.Schedule:
    return isl.Schedule.read_from_str(ctx, text)


def _band(ctx, members: str, extra: str = "") -> isl.ScheduleNode:
    """The band node of ``{ domain: DOM, child: { schedule: members ... } }``."""
    return (
        _tree(ctx, f'{{ domain: "{DOM}", child: {{ schedule: "{members}"{extra} }} }}')
        .get_root()
        .child(0)
    )


def _map(node: isl.ScheduleNode) -> isl.UnionMap:
    sched = node.get_schedule()
    return sched.get_map().intersect_domain(sched.get_domain())


def _same(node: isl.ScheduleNode, text: str) -> bool:
    want = isl.UnionMap(text, context=node.get_ctx()).intersect_domain(
        isl.UnionSet(DOM, context=node.get_ctx())
    )
    return _map(node).is_equal(want)


# ------------------------------------------------------------------------------ tree rewrites


def test_reordered_permutes_members_with_their_coincidence(ctx):
    node = _band(
        ctx, "[{ S[i, j] -> [(i)] }, { S[i, j] -> [(j)] }]", ", permutable: 1, coincident: [ 1, 0 ]"
    )
    got = _reordered(node, (1, 0))
    assert _same(got, "{ S[i, j] -> [j, i] }")
    assert [got.band_member_get_coincident(i) for i in range(2)] == [0, 1]
    assert got.band_get_permutable()
    assert _reordered(node, (0, 1)) is node


def test_nested_bands_merge_into_one_band(ctx):
    t = _tree(
        ctx,
        f'{{ domain: "{DOM}", child: {{ schedule: "[{{ S[i, j] -> [(i)] }}]", '
        'child: { schedule: "[{ S[i, j] -> [(j)] }]" } } }',
    )
    got = _merge_nested(t.get_root().child(0))
    assert got.band_n_member() == 2
    assert got.child(0).get_type() == isl.schedule_node_type.leaf
    assert _same(got, "{ S[i, j] -> [i, j] }")


def test_flatten_is_the_row_major_index_from_each_members_minimum(ctx):
    node = _band(ctx, "[{ S[i, j] -> [(i)] }, { S[i, j] -> [(j)] }]")
    got = _flatten(node, isl.UnionSet(DOM, context=ctx))
    assert got.band_n_member() == 1
    assert _same(got, "{ S[i, j] -> [8i - 8 + j - 2] }")
    one = _band(ctx, "[{ S[i, j] -> [(j - 2)] }]")
    assert _flatten(one, isl.UnionSet(DOM, context=ctx)) is one  # one member from 0


def test_inner_runs_cut_the_innermost_member_under_a_mark(ctx):
    node = _band(ctx, "[{ S[i, j] -> [(i)] }, { S[i, j] -> [(j)] }]")
    got = _inner_runs(node, isl.UnionSet(DOM, context=ctx), 4)  # j - 2 in [0, 8): 2 runs
    assert got is not None
    assert got.child(0).mark_get_id().get_name() == "coarsen:4"
    assert _same(got, "{ S[i, j] -> [i, floor((j - 2) / 4), (j - 2) mod 4] }")
    # 8 columns are no whole runs of 3; a one-member band has nothing inner to cut
    assert _inner_runs(node, isl.UnionSet(DOM, context=ctx), 3) is None
    one = _band(ctx, "[{ S[i, j] -> [(j)] }]")
    assert _inner_runs(one, isl.UnionSet(DOM, context=ctx), 4) is None


def test_lane_runs_give_each_lane_runs_of_four(ctx):
    t = _tree(
        ctx, '{ domain: "{ S[f] : 0 <= f <= 31 }", child: { schedule: "[{ S[f] -> [(f)] }]" } }'
    )
    node = t.get_root().child(0)
    got, lane = _lane_runs(node, node.band_get_partial_schedule(), t.get_domain(), 2, 4)
    # f = 4 (l0 + 2 c0) + j: serial c0, the point j under the mark, the lane l0
    sched = got.get_schedule()
    want = "{ S[f] -> [floor(f / 8), f mod 4] : 0 <= f <= 31 }"
    assert (
        sched.get_map().intersect_domain(t.get_domain()).is_equal(isl.UnionMap(want, context=ctx))
    )
    assert got.child(0).mark_get_id().get_name() == "coarsen:4"
    lanes = isl.UnionMap.from_multi_union_pw_aff(lane)
    assert lanes.is_equal(
        isl.UnionMap("{ S[f] -> [floor(f / 4) mod 2] : 0 <= f <= 31 }", context=ctx)
    )


# ------------------------------------------------------------------------------ composition


def _stitched(reader):
    """``s = rowsum(x)``, ``t = x * s[reader(i)]``, ``u = rowsum(t)``: two parts."""
    x = te.placeholder((64, 1024), name="x")
    s = ops.reduce_sum(x, axis=1, name="s")
    t = te.compute((64, 1024), lambda i, j: x[i, j] * s[reader(i)], name="t")
    g, parts = scheduled([x], [ops.reduce_sum(t, axis=1, name="u")])
    assert [p.model.micrograph.prims for p in parts] == [["s"], ["t", "u"]]
    return g, parts


def test_two_parts_compose_under_one_kept_band():
    g, parts = _stitched(lambda i: i)
    assert kept_count(parts[0]) == 1
    model, sched, laneless = compose(g, parts, 1)
    assert laneless == {"S_s_init", "S_s_final", "S_u_init", "S_u_final"}
    root = sched.get_root().child(0)
    assert root.band_n_member() == 1 and root.band_member_get_coincident(0)
    seq = root.child(0)
    marks = [seq.child(i).child(0).mark_get_id().get_name() for i in range(seq.n_children())]
    assert marks == ["part:mg0", "part:mg1"]
    # every statement runs at its own row, the parts in order within it
    outer = isl.UnionMap.from_multi_union_pw_aff(root.band_get_partial_schedule())
    want = (
        "{ S_s_init[d] -> [d]; S_s_update[d, r] -> [d]; S_s_final[d] -> [d]; "
        "S_t[d, j] -> [d]; S_u_init[d] -> [d]; S_u_update[d, r] -> [d]; S_u_final[d] -> [d] }"
    )
    assert outer.intersect_domain(model.domain).is_equal(
        isl.UnionMap(want, context=model.ctx).intersect_domain(model.domain)
    )


def test_refused_compositions_name_the_failing_check():
    g, parts = _stitched(lambda i: 63 - i)  # row i reads the sum of row 63 - i
    with pytest.raises(CompositionError, match=r"^mg1: a dependence crosses kept points"):
        compose(g, parts, 1)
    x, y = te.placeholder((64, 1024), name="x"), te.placeholder((32, 1024), name="y")
    g, parts = scheduled([x, y], [ops.reduce_sum(x, axis=1), ops.reduce_sum(y, axis=1)])
    # (the band's reduction member, tried as an outer member after the rows, is not parallel:
    # the refusal still names why the rows themselves do not match)
    with pytest.raises(CompositionError, match=r"^mg1: kept extents differ from \[\(0, 63\)\]$"):
        compose(g, parts, 1)


def test_parts_out_of_dependence_order_are_refused():
    """Given the reader's part first, the union model took t's read of s as an anti
    dependence and the composed schedule (t before s in every row) passed isl's check."""
    g, parts = _stitched(lambda i: i)
    with pytest.raises(
        CompositionError, match="parts not in dependence order: t reads s, which a later part"
    ):
        compose(g, parts[::-1], 1)


# ------------------------------------------------------------------------------ mapping


def _row_sum():
    x = te.placeholder((64, 1024), name="x")
    g, (sm,) = scheduled([x], [ops.reduce_sum(x, axis=1, name="s")])
    return g, sm, choose_reduction_strategy(canonical_form(sm), H100)


def test_row_sum_maps_rows_to_blocks_and_lanes_along_the_row():
    g, sm, st = _row_sum()
    assert (st.kept_tile, st.lanes) == (1, 256)
    mk = map_reduction_kernel(g, [sm], st)
    ctx = mk.schedule.get_ctx()
    want = isl.UnionSet(
        "[b0, r0, l0] -> { S_s_init[b0] : r0 = 0 and 0 <= b0 <= 63; "
        "S_s_update[b0, r] : r0 = 0 and 0 <= b0 <= 63 and 0 <= l0 <= 255 and 0 <= r <= 1023 "
        "and (r - l0) mod 256 = 0; S_s_final[b0] : r0 = 0 and 0 <= b0 <= 63 }",
        context=ctx,
    )
    assert mk.schedule.get_domain().is_equal(want)
    assert (mk.block_params, mk.thread_params, mk.lane_params) == (["b0"], ["r0"], ["l0"])
    assert (mk.grid, mk.block) == (64, 256)
    assert mk.laneless == {"S_s_init", "S_s_final"} and mk.combined == {"s"}
    assert mk.thread_order == [("r0", 1), ("l0", 256)] and mk.coarsening is None


def test_row_sum_lanes_take_runs_of_four_where_proven():
    g, sm, st = _row_sum()
    mk = map_reduction_kernel(g, [sm], st, H100, elements_per_thread=None)
    assert mk.coarsening is not None and mk.coarsening.factor == 4
    ctx = mk.schedule.get_ctx()
    # 256 lanes x one run of 4 cover the row of 1024: lane l0 runs 4 l0 .. 4 l0 + 3
    upd = mk.schedule.get_domain().extract_set(
        isl.Set("[b0, r0, l0] -> { S_s_update[d, r] }", context=ctx).get_space()
    )
    want = (
        "[b0, r0, l0] -> { S_s_update[b0, r] : r0 = 0 and 0 <= b0 <= 63 and "
        "4l0 <= r <= 4l0 + 3 and 0 <= r <= 1023 }"
    )
    assert upd.is_equal(isl.Set(want, context=ctx))
    assert mk.notes[1] == mk.coarsening.reason


def test_an_x_reduction_fused_with_a_padding_aligns_its_kept_tile_to_its_own_columns():
    """torch fuzz seed 7262: a column max fused with a padding of its input. The kernel's
    kept band spans the padded columns 0..3, the reduction's only 1..2; a kept tile of 2
    put columns 1 and 2 in different tiles, so half of each block skipped the combine's
    barriers (a divergent ``__syncthreads``: a hang on a GPU). The kept tile now tiles the
    reduction's range too."""
    import numpy as np

    import polyfuse

    x = te.placeholder((4, 2), "float16", name="x")
    n = te.compute((4, 2), lambda i, j: -x[i, j], name="neg")
    w = te.compute((4, 2), lambda i, j: te.cast(n[i, j], "float32"), name="w")
    m = ops.reduce_max(w, axis=0, name="colmax")
    p = ops.pad(te.compute((4, 2), lambda i, j: n[i, j] * 2.0, name="b"), [(0, 0), (1, 1)])
    fn = polyfuse.compile([x], [m, p], check_cuda=False)
    (k,) = fn.kernels
    assert "kept tile 1, not 2, tiles the kept ranges [0, 3], [1, 2]" in " ".join(k.notes)
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    xv = np.random.default_rng(0).standard_normal((4, 2)).astype(np.float16)
    for order in (False, True):
        got_m, got_p = fn(xv, device="emulate", race_check=order)
        np.testing.assert_array_equal(got_m, (-xv).astype(np.float32).max(0))
        np.testing.assert_array_equal(got_p, np.pad(-xv * 2, [(0, 0), (1, 1)]))
