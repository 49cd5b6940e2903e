"""The tiled GEMM kernel's isl schedule tree and the tree operations the GEMM passes apply to
it (PPCG's ``gpu_tree.c`` / ``gpu_group.c`` are the reference).

The tiling pass (:func:`tile_tree`) builds the tree of one thread's instances (the k-tile band
and the update's ``kk`` steps: isl's ``band_tile`` of the reduction band)::

    domain: update, init, epilogue (one thread's instances; b*, t* parameters)
      mark "k_tile"
        band [kt...]                       the k-tile loops (init before, epilogue after)
          sequence
            filter: init, epilogue         phase 0 ("stage": later also copies and groups)
              band [sub]                   the statement's position in its phase
                band [x0, ..., xn]         its loops (registers, epilogue position)
            filter: update                 phase 1
              band [sub]
                mark "micro_tile"
                  band [kk0, ..., pos]     the k-tile's steps and the register tile

Each later pass is an isl tree operation on it: the pipelining pass (decided first) shifts
the init S-1 k-tiles early with ``isl_schedule_node_band_shift`` (:func:`shift_k_tiles`) and
adds the async-group statements (:func:`add_statements`), the promotion pass grafts the copies
before the phases as an extension node whose relation runs k-tile kt+S-1's copies in kt
(:func:`graft_copies`), and the barrier pass grafts the barriers before and after the update
as another (:func:`graft_barriers`), as PPCG grafts its copies and synchronisation::

    mark "k_tile" / band [kt...]
      extension { [kt...] -> C_x[kt + S-1, e...] }
        sequence
          filter: C_x ...                  band [sub] / band [q...]  (the copies)
          filter: the rest                 the phases, the update's around the barriers'
                                           extension (Sync_load, update, Sync_use)

isl generates the kernel's AST from the tree (:func:`ast_schedule` drops the marks first: they
name levels, the AST does not need them).

isl adds an extension's instances only at the outer schedule points that already run
(``build_ast_from_extension`` intersects with the build's domain): the async-group commits stay
domain statements, so the pipelined prologue's k-tiles 1-S..-1 run and build their copies.

The flattened schedule (:func:`flat_map` of the tree before the barriers) keeps the
fixed-width layout ``[kt..., phase, sub, x...]`` the fragment pass and the loop planner read.
"""

from __future__ import annotations

import islpy as isl

K_TILE = "k_tile"  # mark above the k-tile band
MICRO_TILE = "micro_tile"  # mark above the update's k-steps and register tile
STAGE, UPDATE = 0, 1  # the phases: sequence positions under the k-tile band
PHASE = "ph"  # the flattened schedule's dim of the phase sequence (no loop)


def _maps(umap: isl.UnionMap) -> list[isl.Map]:
    lst = umap.get_map_list()
    return [lst.get_at(i) for i in range(lst.n_map())]


def _union(maps: list[isl.Map], ctx: isl.Context) -> isl.UnionMap:
    out = isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))
    for m in maps:
        out = out.union(isl.UnionMap.from_map(m))
    return out


def _slice(m: isl.MultiUnionPwAff, first: int, last: int) -> isl.MultiUnionPwAff:
    """Schedule dims ``first..last-1`` of ``m`` (fixed-width rows) as a band's partial
    schedule."""
    n = m.dim(isl.dim_type.out)
    return m.drop_dims(isl.dim_type.out, last, n - last).drop_dims(isl.dim_type.out, 0, first)


def _at(rows: isl.UnionMap, col: int, value: int) -> isl.UnionMap:
    """The statements of ``rows`` whose schedule dim ``col`` is the constant ``value``."""
    keep = []
    for m in _maps(rows):
        r = m.range()
        lo, hi = r.dim_min_val(col), r.dim_max_val(col)
        if not (lo.is_int() and lo.to_python() == hi.to_python()):
            raise ValueError(f"{m.get_tuple_name(isl.dim_type.in_)}: dim {col} is not a phase")
        if lo.to_python() == value:
            keep.append(m)
    return _union(keep, rows.get_ctx())


def tile_tree(
    rows: isl.UnionMap, red: isl.UnionMap, tk: list[int], update: str
) -> isl.Schedule:
    """The tiling pass's tree from the tiled ``rows`` of the update, init and epilogue
    (``[kt x nr, phase, sub, kk x nr, x...]``; the update in phase :data:`UPDATE`, the others
    in :data:`STAGE`); see the module docstring for its shape.

    The k-tile split is isl's ``band_tile`` of the reduction band ``red`` (``r - lo`` per
    reduction dim for the update, -TK for the init, KT x TK for the epilogue) with sizes
    ``tk``: the tile band is the k-tile band, the point band (the context's shifted point
    loops: ``kk``) moves into the micro-tile band below the phases (isl sinks a band only to
    the leaves), ahead of the register loops from ``rows``."""
    ctx = rows.get_ctx()
    nr = len(tk)
    full = isl.MultiUnionPwAff.from_union_map(rows)
    width = full.dim(isl.dim_type.out)
    dom = rows.domain()
    node = isl.Schedule.from_domain(dom).get_root().child(0)
    node = node.insert_partial_schedule(
        isl.MultiUnionPwAff.from_union_map(red.intersect_domain(dom))
    )
    sizes = isl.MultiVal.zero(node.band_get_space())
    for j, k in enumerate(tk):
        sizes = sizes.set_val(j, isl.Val.int_from_si(ctx, k))
    node = node.band_tile(sizes).child(0)
    point = node.band_get_partial_schedule()
    node = node.delete().parent().insert_mark(isl.Id(K_TILE, context=ctx)).child(0)
    phases = [_at(rows, nr, p) for p in (STAGE, UPDATE)]
    filters = isl.UnionSetList.alloc(ctx, 2)
    for p in phases:
        filters = filters.add(p.domain())
    node = node.child(0).insert_sequence(filters)
    for i, p in enumerate(phases):
        mine = full.intersect_domain(p.domain())
        steps = point.intersect_domain(p.domain()).flat_range_product(
            _slice(mine, 2 * nr + 2, width)
        )
        inner = node.child(i).child(0).insert_partial_schedule(_slice(mine, nr + 1, nr + 2))
        inner = inner.child(0).insert_partial_schedule(steps)
        if i == UPDATE:
            inner = inner.insert_mark(isl.Id(MICRO_TILE, context=ctx)).child(0)
        node = inner.ancestor(inner.get_tree_depth() - node.get_tree_depth())
    assert update in {m.get_tuple_name(isl.dim_type.in_) for m in _maps(phases[UPDATE])}
    return node.get_schedule()


def k_tile_band(tree: isl.Schedule) -> isl.ScheduleNode:
    """The band under the :data:`K_TILE` mark."""
    node = tree.get_root()
    while not (
        node.get_type() == isl.schedule_node_type.mark
        and node.mark_get_id().get_name() == K_TILE
    ):
        node = node.child(0)
    return node.child(0)


def add_statements(tree: isl.Schedule, rows: isl.UnionMap) -> isl.Schedule:
    """``tree`` with the statements of ``rows`` (fixed-width, as the flattened tree: a
    sequence contributes the position of the child the statement joins) in its domain, its
    bands and the filters of its sequences; marks kept. The tree must have no extension node
    yet (the barriers are grafted last)."""
    root = isl.Schedule.from_domain(tree.get_domain().union(rows.domain())).get_root()
    full = isl.MultiUnionPwAff.from_union_map(rows)
    return _copy(tree.get_root().child(0), root.child(0), rows, full, 0).get_schedule()


def _copy(
    old: isl.ScheduleNode,
    new: isl.ScheduleNode,
    rows: isl.UnionMap,
    full: isl.MultiUnionPwAff,
    col: int,
) -> isl.ScheduleNode:
    """Rebuild the subtree ``old`` at the leaf ``new`` with ``rows`` (``full``: as a
    multi-dimensional function) added from schedule dim ``col`` on; returns the node at
    ``new``'s position."""
    kind = old.get_type()
    T = isl.schedule_node_type
    if kind == T.leaf:
        return new
    if kind == T.mark:
        new = new.insert_mark(old.mark_get_id())
        return _copy(old.child(0), new.child(0), rows, full, col).parent()
    if kind == T.band:
        k = old.band_n_member()
        part = old.band_get_partial_schedule()
        if not rows.is_empty():
            part = part.union_add(_slice(full, col, col + k).align_params(part.get_space()))
        new = new.insert_partial_schedule(part)
        return _copy(old.child(0), new.child(0), rows, full, col + k).parent()
    if kind == T.sequence:
        ctx = old.get_ctx()
        parts = [_at(rows, col, i) for i in range(old.n_children())]
        filters = isl.UnionSetList.alloc(ctx, old.n_children())
        for i, p in enumerate(parts):
            filters = filters.add(old.child(i).filter_get_filter().union(p.domain()))
        new = new.insert_sequence(filters)
        for i, p in enumerate(parts):
            mine = full.intersect_domain(p.domain())
            new = _copy(old.child(i).child(0), new.child(i).child(0), p, mine, col + 1)
            new = new.parent().parent()
        return new
    raise ValueError(f"add_statements: cannot copy a {kind} node")


def shift_k_tiles(tree: isl.Schedule, shifts: dict[str, list[int]]) -> isl.Schedule:
    """``tree`` with its k-tile band shifted by ``shifts`` (per statement, a constant per
    k-tile dim; the others by 0): ``isl_schedule_node_band_shift``."""
    band = k_tile_band(tree)
    space = band.band_get_space()
    nr = space.dim(isl.dim_type.set)
    dom = tree.get_domain()
    sets = dom.get_set_list()
    shift = None
    for i in range(sets.n_set()):
        s = sets.get_at(i)
        vals = shifts.get(s.get_tuple_name(), [0] * nr)
        mv = isl.MultiVal.zero(space)
        for j, v in enumerate(vals):
            mv = mv.set_val(j, isl.Val.int_from_si(s.get_ctx(), v))
        part = isl.MultiUnionPwAff.multi_val_on_domain(isl.UnionSet.from_set(s), mv)
        shift = part if shift is None else shift.union_add(part)
    assert shift is not None
    return band.band_shift(shift).get_schedule()


def phase_sequence(tree: isl.Schedule) -> isl.ScheduleNode:
    """The sequence of the phases under the k-tile band (below the copies' extension node
    once they are grafted: ``ext / seq[copies | phases]``)."""
    node = k_tile_band(tree).child(0)
    if node.get_type() == isl.schedule_node_type.extension:
        node = node.child(0).child(1).child(0)
    assert node.get_type() == isl.schedule_node_type.sequence
    return node


def graft_copies(tree: isl.Schedule, extension: isl.UnionMap, rows: isl.UnionMap) -> isl.Schedule:
    """``tree`` with the copy statements introduced by ``extension`` (``{ [kt...] ->
    C[...] }``: the copies each k-tile runs) grafted before the phases, as PPCG grafts its
    copies: one extension node over a sequence (copies, phases). Under it each copy runs at
    its position and loops, dims ``sub`` and ``x...`` of its fixed-width ``rows``.

    The graft sits at the k-tile band's child, not in phase 0: isl builds an extension's
    instances only at the schedule points its subtree already runs, and a filter restricts
    those to the points where its own statements run (phase 0 runs the init and epilogue
    only at the first and last k-tile, and the async groups when pipelined)."""
    band = k_tile_band(tree)
    nr = band.band_n_member()
    full = isl.MultiUnionPwAff.from_union_map(rows)
    width = full.dim(isl.dim_type.out)
    node = isl.ScheduleNode.from_extension(extension).child(0)
    node = node.insert_partial_schedule(_slice(full, nr + 1, nr + 2)).child(0)
    node = node.insert_partial_schedule(_slice(full, nr + 2, width))
    graft = node.ancestor(node.get_tree_depth())
    return band.child(0).graft_before(graft).get_schedule()


def flat_map(tree: isl.Schedule) -> isl.UnionMap:
    """The flattened schedule ``[kt..., phase, sub, x...]`` of ``tree`` (before the barriers):
    ``isl_schedule_get_map``, which isl refuses with an extension node, plus the grafted
    copies' rows: the k-tile their extension runs them in, phase :data:`STAGE`, then their
    own bands."""
    band = k_tile_band(tree)
    node = band.child(0)
    if node.get_type() != isl.schedule_node_type.extension:
        return tree.get_map()
    seq = node.child(0)
    rest = band.band_get_partial_schedule_union_map().flat_range_product(
        seq.child(1).child(0).get_subtree_schedule_union_map()
    )
    inner = seq.child(0).child(0).get_subtree_schedule_union_map()
    width = _maps(inner)[0].dim(isl.dim_type.out)
    xs = ", ".join(f"x{i}" for i in range(width))
    staged = isl.UnionMap(f"{{ [{xs}] -> [{STAGE}, {xs}] }}", context=tree.get_ctx())
    copies = node.extension_get_extension().reverse()
    return rest.union(copies.flat_range_product(inner.apply_range(staged)))


def graft_barriers(
    tree: isl.Schedule, update: str, before: isl.UnionMap, after: isl.UnionMap
) -> isl.Schedule:
    """``tree`` with the barrier statements ``before`` and ``after`` (``{ [kt...] ->
    Sync[kt...] }`` from the k-tile band's schedule) grafted before and after the update:
    one extension node over a sequence (barrier, update, barrier), as PPCG inserts its
    synchronisation."""
    upd = phase_sequence(tree).child(UPDATE)
    names = upd.filter_get_filter().get_set_list()
    assert update in {names.get_at(i).get_tuple_name() for i in range(names.n_set())}
    upd = upd.child(0)
    upd = upd.graft_before(isl.ScheduleNode.from_extension(before))
    upd = upd.graft_after(isl.ScheduleNode.from_extension(after))
    return upd.get_schedule()


def extension_of(tree: isl.Schedule, stmt: str) -> isl.UnionMap | None:
    """The extension relation of ``tree`` that introduces ``stmt`` (the copies' ``{ [kt...]
    -> C[...] }``, the barriers' ``{ [kt...] -> Sync[kt...] }``), or None."""
    found: list[isl.UnionMap] = []

    def visit(node: isl.ScheduleNode) -> bool:
        if node.get_type() == isl.schedule_node_type.extension:
            ext = node.extension_get_extension()
            if stmt in {m.get_tuple_name(isl.dim_type.out) for m in _maps(ext)}:
                found.append(ext)
        return True

    tree.get_root().foreach_descendant_top_down(visit)
    return found[0] if found else None


def ast_schedule(tree: isl.Schedule) -> isl.Schedule:
    """``tree`` without its marks: what isl's AST generator gets (the marks name the levels
    for the passes; in the AST they would be mark nodes around the loops)."""

    def drop(node: isl.ScheduleNode) -> isl.ScheduleNode:
        return node.delete() if node.get_type() == isl.schedule_node_type.mark else node

    return tree.get_root().map_descendant_bottom_up(drop).get_schedule()
