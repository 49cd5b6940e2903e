"""Before/after tests of the GEMM passes as transformations of the kernel's isl schedule tree
(:mod:`polyfuse.poly.gemm_tree`): tiling builds the tree (k-tile band marked, phases, in-tile
bands), promotion adds the copies, pipelining shifts the k-tile band and adds the async
groups, the barriers are grafted as an extension node; isl generates the same AST from the
tree as from the flattened schedule the passes used to write. Written with isl strings on a
32 x 24 x 32 matmul in 16 x 16 block tiles of 4 x 4 threads, k-tiles of 8."""

from __future__ import annotations

import islpy as isl
import pytest
from test_gemm_passes import THREADS, _frame

from polyfuse.base.decision import Refusal
from polyfuse.poly.gemm_barriers import SYNC_AFTER, SYNC_BEFORE, barrier_tree
from polyfuse.poly.gemm_pipeline import copy_shift, pipeline_tree
from polyfuse.poly.gemm_promotion import copy_schedule, copy_tree, promote_operands
from polyfuse.poly.gemm_tree import (
    K_TILE,
    MICRO_TILE,
    add_statements,
    ast_schedule,
    extension_of,
    flat_map,
    k_tile_band,
    shift_k_tiles,
    tile_tree,
)

T = isl.schedule_node_type
#: one thread's elements: rows t0 + 4 ii0, a vector of columns 4 t1 + iv
ON_THREAD = (
    "exists (ii0, iv : d0 = 16b0 + t0 + 4ii0 and 0 <= ii0 < 4 and d1 = 16b1 + 4t1 + iv and "
    "0 <= iv < 4) and 0 <= d0 < 32 and 0 <= d1 < 32"
)


def _skeleton(node: isl.ScheduleNode) -> str:
    """The tree's shape: node kinds, mark names, band widths, sequences' children."""
    kind = node.get_type()
    if kind == T.leaf:
        return ""
    label = {
        T.domain: "domain",
        T.mark: f"mark {node.mark_get_id().get_name()}" if kind == T.mark else "",
        T.band: f"band{node.band_n_member()}" if kind == T.band else "",
        T.sequence: "seq",
        T.filter: "filter",
        T.extension: "ext",
    }[kind]
    kids = [_skeleton(node.child(i)) for i in range(node.n_children())]
    if kind == T.sequence:
        return f"{label}[{' | '.join(kids)}]"
    return label + (f"/{kids[0]}" if kids and kids[0] else "")


def _equal(got: isl.UnionMap, text: str) -> bool:
    want = isl.UnionMap(text, context=got.get_ctx())
    return got.is_equal(want.align_params(got.get_space()))


def _stmts(umap: isl.UnionMap, *names: str) -> isl.UnionMap:
    """``umap`` restricted to the statements ``names``."""
    lst = umap.get_map_list()
    out = isl.UnionMap("{ }", context=umap.get_ctx())
    for i in range(lst.n_map()):
        if lst.get_at(i).get_tuple_name(isl.dim_type.in_) in names:
            out = out.union(isl.UnionMap.from_map(lst.get_at(i)))
    return out


@pytest.fixture(scope="module")
def tiled():
    sm, shape, tiling, f = _frame()
    rows = f.statement_schedule(shape, 4, THREADS)
    red = f.reduction_band(shape, tiling.tk, THREADS)
    return sm, shape, tiling, f, rows, tile_tree(rows, red, tiling.tk, shape.update.name)


@pytest.fixture(scope="module")
def copies(tiled):
    sm, shape, tiling, f, _, _ = tiled
    got = promote_operands(f, shape, sm.model, tiling.nthreads, set(), {})
    assert not isinstance(got, Refusal), got
    return got[1]


def test_tiling_builds_the_k_tile_band_phases_and_the_micro_tile(tiled):
    """Before: the tiled rows ``[kt0, phase, sub, kk0, ii0, iv, pos]`` of the update, init and
    epilogue. After: a tree whose k-tile band (marked) holds kt0 (init at -1, epilogue at 3),
    a sequence of the phases (init and epilogue; the update), each a position band over the
    band of its loops, the update's marked as the micro-tile; flattened, the same rows."""
    _, shape, _, _, rows, tree = tiled
    assert _skeleton(tree.get_root()) == (
        f"domain/mark {K_TILE}/band1/seq[filter/band1/band4 | "
        f"filter/band1/mark {MICRO_TILE}/band4]"
    )
    band = k_tile_band(tree).band_get_partial_schedule_union_map()
    assert _equal(
        band,
        f"[{THREADS}] -> {{ S_c_update[d0, d1, r0] -> [kt0] : {ON_THREAD} and "
        "8kt0 <= r0 < 8kt0 + 8 and 0 <= r0 < 24; "
        f"S_c_init[d0, d1] -> [-1] : {ON_THREAD}; S_c_final[d0, d1] -> [3] : {ON_THREAD} }}",
    )
    phases = k_tile_band(tree).child(0)
    assert [phases.child(i).filter_get_filter().get_set_list().n_set() for i in (0, 1)] == [2, 1]
    assert tree.get_map().is_equal(rows)


def _k_tiles_of(ext: isl.UnionMap) -> isl.UnionMap:
    """``ext`` (``{ [kt0] -> C[u0, e...] }``) with the copies' element dims and the
    parameters projected out: which k-tile's copies each k-tile runs."""
    out = isl.UnionMap("{ }", context=ext.get_ctx())
    for m in _maps(ext):
        n, name = m.dim(isl.dim_type.out), m.get_tuple_name(isl.dim_type.out)
        m = m.project_out(isl.dim_type.out, 1, n - 1).set_tuple_name(isl.dim_type.out, name)
        m = m.project_out(isl.dim_type.param, 0, m.dim(isl.dim_type.param))
        out = out.union(isl.UnionMap.from_map(m))
    return out


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    lst = umap.get_map_list()
    return [lst.get_at(i) for i in range(lst.n_map())]


def test_promotion_grafts_the_copies_as_an_extension(tiled, copies):
    """Before: the tiled tree, no extension. After: one extension node under the k-tile band
    introducing every copy instance of k-tile kt0 at kt0 (PPCG's graft), over a sequence
    (the copies at positions 0 and 1 over their counter loops | the phases); flattened, the
    copies' rows are those the promotion wrote as statements: phase 0 of their k-tile."""
    _, _, _, _, rows, tree = tiled
    assert extension_of(tree, "C_a") is None
    after = copy_tree(tree, copies, ["kt0"], 4)
    assert _skeleton(after.get_root()) == (
        f"domain/mark {K_TILE}/band1/ext/seq[filter/band1/band4 | filter/seq[filter/band1/band4"
        f" | filter/band1/mark {MICRO_TILE}/band4]]"
    )
    ext = extension_of(after, "C_a")
    assert ext is not None and ext.is_equal(extension_of(after, "C_b"))
    assert _equal(
        _k_tiles_of(ext), "{ [kt0] -> C_a[kt0] : 0 <= kt0 < 3; [kt0] -> C_b[kt0] : 0 <= kt0 < 3 }"
    )
    doms = isl.UnionSet.from_set(copies[0].domain).union(isl.UnionSet.from_set(copies[1].domain))
    assert ext.range().is_equal(doms.align_params(ext.range().get_space()))  # every instance
    assert after.get_domain().is_equal(tree.get_domain())  # the copies: no domain statements
    flat = flat_map(after)
    want = copy_schedule(isl.UnionMap("{ }", context=rows.get_ctx()), copies, ["kt0"], ["kt0"], 4)
    assert _stmts(flat, "C_a", "C_b").is_equal(want)
    assert _stmts(flat, "S_c_update", "S_c_init", "S_c_final").is_equal(rows)
    ctx = rows.get_ctx()
    ca = _stmts(flat, "C_a").range()
    ca = ca.project_out(isl.dim_type.param, 0, ca.dim(isl.dim_type.param))
    assert ca.is_subset(isl.Set("{ [kt, 0, 0, q0, q1, 0, 0] : 0 <= kt < 3 }", context=ctx))


def test_pipelining_shifts_the_init_adds_the_async_groups_and_the_copies_extension(
    tiled, copies
):
    """Before: the init at -1, copies of k-tile kt0 grafted at kt0. After (2 stages, decided
    before the graft): the k-tile band shifted (the init at -2), a commit per k-tile from -1
    (the prologue k-tile runs it) and a wait per k-tile in phase 0, and the copies' extension
    shifted by S-1 = 1: k-tile kt0 runs the copies of kt0 + 1, from -1 on."""
    _, shape, _, f, rows, tree = tiled
    after = pipeline_tree(tree, 2, shape.init.name, ["kt0"], f.ktiles, 0, 2, 4)
    band = k_tile_band(after).band_get_partial_schedule_union_map()
    old = k_tile_band(tree).band_get_partial_schedule_union_map()
    init = f"[{THREADS}] -> {{ S_c_init[d0, d1] -> [-2] : {ON_THREAD} }}"
    assert _equal(_stmts(band, "S_c_init"), init)
    assert _stmts(band, "S_c_update", "S_c_final").is_equal(
        _stmts(old, "S_c_update", "S_c_final")
    )
    assert _equal(
        _stmts(after.get_map(), "Cp_commit", "Cp_wait"),
        "{ Cp_commit[kt0] -> [kt0, 0, 2, 0, 0, 0, 0] : -1 <= kt0 < 3; "
        "Cp_wait[kt0] -> [kt0, 0, 3, 0, 0, 0, 0] : 0 <= kt0 < 3 }",
    )
    unshifted = extension_of(copy_tree(after, copies, ["kt0"], 4), "C_a")
    grafted = copy_tree(after, copies, ["kt0"], 4, copy_shift(1, 2, 0))
    ext = extension_of(grafted, "C_a")
    assert _equal(
        _k_tiles_of(ext),
        "{ [kt0] -> C_a[kt0 + 1] : -1 <= kt0 < 2; [kt0] -> C_b[kt0 + 1] : -1 <= kt0 < 2 }",
    )
    shift = isl.UnionMap("{ [k] -> [k - 1] }", context=rows.get_ctx())
    assert ext.is_equal(unshifted.reverse().apply_range(shift).reverse())
    flat = flat_map(grafted)
    was = copy_schedule(isl.UnionMap("{ }", context=rows.get_ctx()), copies, ["kt0"], ["kt0"], 4)
    assert _stmts(flat, "C_a", "C_b").is_equal(
        was.apply_range(isl.UnionMap("{ [k, p, s, a, b, c, d] -> [k - 1, p, s, a, b, c, d] }",
                                     context=rows.get_ctx()))
    )  # fmt: skip


def test_barriers_are_grafted_around_the_update_as_an_extension(tiled):
    """Before: no barrier. After: one extension node under the update's phase introducing
    ``Sync_load`` and ``Sync_use`` for every k-tile, ordered barrier, update, barrier."""
    _, shape, _, f, _, tree = tiled
    assert extension_of(tree, SYNC_BEFORE) is None
    after = barrier_tree(tree, shape.update.name, ["kt0"], f.ktiles)
    assert _equal(
        extension_of(after, SYNC_BEFORE),
        f"{{ [kt0] -> {SYNC_BEFORE}[kt0] : 0 <= kt0 < 3; "
        f"[kt0] -> {SYNC_AFTER}[kt0] : 0 <= kt0 < 3 }}",
    )
    upd = k_tile_band(after).child(0).child(1)
    assert _skeleton(upd) == "filter/ext/seq[filter | filter/band1/mark micro_tile/band4 | filter]"
    order = upd.child(0).child(0)
    names = [order.child(i).filter_get_filter().get_set_list().get_at(0).get_tuple_name()
             for i in range(3)]  # fmt: skip
    assert names == [SYNC_BEFORE, shape.update.name, SYNC_AFTER]
    with pytest.raises(ValueError, match="cannot copy a .*extension"):
        add_statements(after, isl.UnionMap("{ X[] -> [0, 0, 0, 0, 0, 0, 0] }", context=f.ctx))


def test_the_tree_generates_the_ast_of_the_flattened_schedule(tiled, copies):
    """The whole pipelined kernel's tree (marks dropped) and the fixed-width schedule map the
    passes wrote before (phases 0 copies, 1 ``Sync_load``, 2 update, 3 ``Sync_use``) give
    isl's AST generator the same program."""
    _, shape, _, f, _, tree = tiled
    tree = pipeline_tree(tree, 2, shape.init.name, ["kt0"], f.ktiles, 0, 2, 4)
    tree = copy_tree(tree, copies, ["kt0"], 4, copy_shift(1, 2, 0))
    flat = flat_map(tree)
    tree = barrier_tree(tree, shape.update.name, ["kt0"], f.ktiles)
    ctx = flat.get_ctx()
    # the old layout: the update's phase 1 was 2, the barriers phases 1 and 3
    spread = isl.UnionMap(
        "{ [k, p, s, a, b, c, d] -> [k, 2p, s, a, b, c, d] }", context=ctx
    )  # fmt: skip
    old = flat.apply_range(spread).union(
        isl.UnionMap(
            f"{{ {SYNC_BEFORE}[k] -> [k, 1, 0, 0, 0, 0, 0] : 0 <= k < 3; "
            f"{SYNC_AFTER}[k] -> [k, 3, 0, 0, 0, 0, 0] : 0 <= k < 3 }}",
            context=ctx,
        )
    )
    context = isl.Set(
        "[b0, b1, t0, t1, p0r, p0c, p1r, p1c] -> { : 0 <= b0 < 2 and 0 <= b1 < 2 and "
        "0 <= t0 < 4 and 0 <= t1 < 4 and 0 <= p0r < 8 and 0 <= p0c < 2 and 0 <= p1r < 4 and "
        "0 <= p1c < 4 }",
        context=ctx,
    )
    old = old.align_params(context.get_space())
    was = isl.AstBuild.from_context(context).node_from_schedule_map(old).to_C_str()
    sched = ast_schedule(tree).align_params(context.get_space())
    now = isl.AstBuild.from_context(context).node_from_schedule(sched).to_C_str()
    assert "for (int c0 = -1; c0 <= 2; c0 += 1)" in was and "Sync_load(c0);" in was
    # the schedule map's iterators count the phase dim; the tree's do not (it is a sequence)
    renamed = now
    for depth in reversed(range(1, 6)):
        renamed = renamed.replace(f"c{depth}", f"c{depth + 1}")
    assert renamed == was


def test_band_tile_of_the_reduction_band_is_the_k_tile_split(tiled):
    """isl's ``band_tile`` (sizes TK = 8, point loops shifted) of the reduction band (``r0``
    for the update, -TK for the init, KT x TK for the epilogue) gives the tiling pass's
    k-tile band as its tile band and the update's in-tile steps ``kk0`` as its point band
    (:func:`tile_tree` tiles the band :meth:`TileFrame.reduction_band` so and moves the point
    band into the micro-tile band, whose first dim is then ``kk0``)."""
    _, shape, tiling, f, rows, tree = tiled
    ctx = rows.get_ctx()
    assert (ctx.get_tile_scale_tile_loops(), ctx.get_tile_shift_point_loops()) == (0, 1)
    dom = tree.get_domain()
    red = isl.UnionMap(
        f"[{THREADS}] -> {{ S_c_update[d0, d1, r0] -> [r0]; S_c_init[d0, d1] -> [-8]; "
        "S_c_final[d0, d1] -> [24] }",
        context=ctx,
    ).intersect_domain(dom)
    band = isl.Schedule.from_domain(dom).get_root().child(0)
    band = band.insert_partial_schedule(isl.MultiUnionPwAff.from_union_map(red))
    sizes = isl.MultiVal.zero(band.band_get_space()).set_val(0, isl.Val.int_from_si(ctx, 8))
    tiles = band.band_tile(sizes)
    assert tiles.band_get_partial_schedule_union_map().is_equal(
        k_tile_band(tree).band_get_partial_schedule_union_map()
    )
    kk = rows.apply_range(isl.UnionMap("{ [k, p, s, a, b, c, d] -> [a] }", context=ctx))
    assert tiles.child(0).band_get_partial_schedule_union_map().is_equal(kk)
    assert _equal(red, f.reduction_band(shape, tiling.tk, THREADS).intersect_domain(dom).to_str())


def test_the_prologue_builds_its_copies_only_because_the_commits_run_there(tiled, copies):
    """The copies' extension (shifted by S-1 = 1) adds k-tile 0's copies at k-tile -1 only
    where that k-tile already runs: with the init shifted alone the k-tile loop starts at 0
    and those copies vanish; with the pipelining pass's commits (domain statements from -1 on)
    the loop starts at -1 and runs them."""
    _, shape, _, f, _, tree = tiled
    ctx = tree.get_ctx()
    context = isl.Set(
        "[b0, b1, t0, t1, p0r, p0c, p1r, p1c] -> { : 0 <= b0 < 2 and 0 <= b1 < 2 and "
        "0 <= t0 < 4 and 0 <= t1 < 4 and 0 <= p0r < 8 and 0 <= p0c < 2 and 0 <= p1r < 4 and "
        "0 <= p1c < 4 }",
        context=ctx,
    )
    shifted = shift_k_tiles(tree, {shape.init.name: [-1]})
    piped = pipeline_tree(tree, 2, shape.init.name, ["kt0"], f.ktiles, 0, 2, 4)
    code = []
    for t in (shifted, piped):
        t = ast_schedule(copy_tree(t, copies, ["kt0"], 4, copy_shift(1, 2, 0)))
        sched = t.align_params(context.get_space())
        code.append(isl.AstBuild.from_context(context).node_from_schedule(sched).to_C_str())
    assert "for (int c0 = 0; c0 <= 2; c0 += 1)" in code[0] and "Cp_commit" not in code[0]
    assert "for (int c0 = -1; c0 <= 2; c0 += 1)" in code[1] and "Cp_commit(c0);" in code[1]
    assert "C_a(c0 + 1," in code[0] and "C_a(c0 + 1," in code[1]
