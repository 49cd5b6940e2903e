"""Small conveniences over islpy lists and names."""

from __future__ import annotations

import islpy as isl


def sets_of(u: isl.UnionSet) -> list[isl.Set]:
    """The per-space sets of a union set."""
    lst = u.get_set_list()
    return [lst.get_at(i) for i in range(lst.n_set())]


def maps_of(u: isl.UnionMap) -> list[isl.Map]:
    """The per-space maps of a union map."""
    lst = u.get_map_list()
    return [lst.get_at(i) for i in range(lst.n_map())]


def zero_deltas(d: isl.UnionSet) -> bool:
    """Whether every vector in ``d`` (a deltas set) is zero."""
    for s in sets_of(d):
        zero = isl.Set.universe(s.get_space())
        for i in range(s.dim(isl.dim_type.set)):
            zero = zero.fix_val(isl.dim_type.set, i, isl.Val.zero(s.get_ctx()))
        if not s.is_subset(zero):
            return False
    return True


def zero_distance(deps: isl.UnionMap, sched: isl.UnionMap) -> bool:
    """Whether every dependence in ``deps`` has distance zero under schedule ``sched``."""
    if deps.is_empty():
        return True
    return zero_deltas(deps.apply_domain(sched).apply_range(sched).deltas())


def top_band(sched: isl.Schedule) -> isl.ScheduleNode | None:
    """The schedule's outermost node when it is a band (the one mapped to blocks and threads)."""
    root = sched.get_root()
    if not root.has_children() or root.child(0).get_type() != isl.schedule_node_type.band:
        return None
    return root.child(0)


def parallel_depth(sched: isl.Schedule) -> int:
    """Leading coincident (parallel) members of the top band; 0 without one."""
    node = top_band(sched)
    n = 0
    while node is not None and n < node.band_n_member() and node.band_member_get_coincident(n):
        n += 1
    return n


def injective(u: isl.UnionMap) -> bool:
    """``u.is_injective()``, decided faster for one map with parameters (a mapped kernel's
    block and thread ids): ``[p] -> { D -> R }`` is injective for every ``p`` exactly when
    ``{ [D, p] -> [R, p] }`` is injective, and isl decides the latter without carrying the
    parameters through its existentials (batch norm's register checks: 5x faster)."""
    maps = maps_of(u)
    if len(maps) != 1 or maps[0].dim(isl.dim_type.param) == 0:
        return u.is_injective()
    m = maps[0]
    n = m.dim(isl.dim_type.param)
    out = m.dim(isl.dim_type.out)
    m = m.add_dims(isl.dim_type.out, n)
    for i in range(n):
        m = m.equate(isl.dim_type.param, i, isl.dim_type.out, out + i)
    m = m.move_dims(isl.dim_type.in_, m.dim(isl.dim_type.in_), isl.dim_type.param, 0, n)
    return m.is_injective()


def rename_tuples(u: isl.UnionSet | isl.UnionMap, names: dict[str, str]):
    """``u`` with the tuple names in ``names`` replaced (others kept).

    The pieces are put together in the order of their text: a union's order is that of
    isl's hash table, which follows the order of insertion, and isl's scheduler follows it,
    so the result does not depend on the names ``u`` had."""
    if isinstance(u, isl.UnionSet):
        sets = [
            s.set_tuple_name(names.get(s.get_tuple_name(), s.get_tuple_name())) for s in sets_of(u)
        ]
        out = isl.UnionSet.empty(u.get_space())
        for s in sorted(sets, key=str):
            out = out.union(isl.UnionSet.from_set(s))
        return out
    maps = []
    for m in maps_of(u):
        a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
        m = m.set_tuple_name(isl.dim_type.in_, names.get(a, a))
        maps.append(m.set_tuple_name(isl.dim_type.out, names.get(b, b)))
    res = isl.UnionMap.empty(u.get_space())
    for m in sorted(maps, key=str):
        res = res.union(isl.UnionMap.from_map(m))
    return res


def drop_params(s, names: list[str]):
    """``s`` (a set, union set or map) with those of the parameters ``names`` it has projected
    out (a block's footprint without its thread ids)."""
    for p in names:
        pos = s.get_space().find_dim_by_name(isl.dim_type.param, p)
        if pos >= 0:
            s = s.project_out(isl.dim_type.param, pos, 1)
    return s
