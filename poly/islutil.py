"""Small conveniences over islpy lists."""

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
