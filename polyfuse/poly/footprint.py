"""Global-memory footprints computed exactly by isl.

The bytes a kernel moves are, per global tensor, the number of distinct elements it reads plus
the number it writes, times the element size: the image of the statement domains under the
read (or write) access relation, counted by ``isl_set_count_val``. The emulator counts the
same quantity by instrumenting the generated code, so the two cross-check each other; the
analytic count works at full size where emulation would be slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import islpy as isl

from polyfuse.poly.guard import Exhausted, Limits, bounded
from polyfuse.poly.islutil import maps_of
from polyfuse.poly.model import PolyModel
from polyfuse.poly.placement import Placement

ITEMSIZE = 4  # float32: the element size where a tensor's own is not at hand
#: isl's bounds on one count: 30k operations in-process, 200k in a child stopped after 1 s
COUNT_LIMITS = Limits(operations=200_000, seconds=1.0, inline=30_000)


@dataclass
class Footprint:
    """Distinct bytes read and written per global tensor by one kernel."""

    reads: dict[str, int]
    writes: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())


def global_footprint(model: PolyModel, placements: dict[str, Placement]) -> Footprint:
    """Exact distinct global bytes read/written by the statements of ``model``."""
    reads: dict[str, int] = {}
    writes: dict[str, int] = {}
    for name, p in placements.items():
        if p.space != "global":
            continue
        t = model.tensors.get(name)
        most = math.prod(t.shape) if t is not None else None
        r = 0 if p.register_copy else _images(model.reads, model.domain, name, most)
        w = _images(model.writes, model.domain, name, most)
        size = t.itemsize if t is not None else ITEMSIZE
        if r:
            reads[name] = r * size
        if w:
            writes[name] = w * size
    return Footprint(reads, writes)


def read_overlap(parts: list[tuple[PolyModel, dict[str, Placement]]], tensor: str) -> int:
    """Bytes of global ``tensor`` that several kernels in ``parts`` read: the sum of their
    distinct reads minus the distinct reads of all of them together (one launch running them
    all reads each element once in the count)."""
    sets = []
    size = ITEMSIZE
    for model, placements in parts:
        if tensor in model.tensors:
            size = model.tensors[tensor].itemsize
        p = placements.get(tensor)
        if p is None or p.space != "global" or p.register_copy:
            continue
        img = _image(model.reads, model.domain, tensor)
        if img is not None:
            sets.append(img)
    if len(sets) < 2:
        return 0
    union = sets[0]
    for s in sets[1:]:
        union = union.union(s)
    counts = [count_points(s) for s in [*sets, union.coalesce()]]
    if any(c is None for c in counts):
        return 0  # isl cannot count them: no overlap is claimed
    return (sum(counts[:-1]) - counts[-1]) * size


def _image(um: isl.UnionMap, domain: isl.UnionSet, tensor: str) -> isl.Set | None:
    img = None
    for m in maps_of(um.intersect_domain(domain)):
        if m.get_tuple_name(isl.dim_type.out) == tensor:
            img = m.range() if img is None else img.union(m.range())
    return None if img is None else img.coalesce()


def _images(um: isl.UnionMap, domain: isl.UnionSet, tensor: str, most: int | None) -> int:
    """Distinct elements of ``tensor`` that ``um`` touches; ``most`` (the tensor's size) when
    isl cannot count them."""
    img = _image(um, domain, tensor)
    if img is None:
        return 0
    n = count_points(img)
    return n if n is not None or most is None else most


def count_points(s: isl.Set) -> int | None:
    """The number of points of the parameter-free set ``s``; None when isl cannot count them
    within :data:`COUNT_LIMITS`.

    Most footprints are boxes (a whole tensor or a slice of it): their count is the product of
    the extents, checked by isl (the box is a subset of ``s``) instead of ``isl_set_count_val``,
    which enumerates millions of points at full size. Anything else is counted by isl.
    """

    def count() -> int:
        box = _box_count(s)
        if box is not None:
            return box
        text = s.count_val().to_str()
        if text is None or not text.lstrip("-").isdigit():  # isl gave up without an error
            raise isl.Error(f"isl could not count the set ({text})")
        return int(text)

    try:
        return bounded(s.get_ctx(), count, COUNT_LIMITS, str, int).value
    except Exhausted:
        return None


def _box_count(s: isl.Set) -> int | None:
    if s.dim(isl.dim_type.param) or s.n_basic_set() != 1:
        return None
    ctx = s.get_ctx()
    box, count = isl.Set.universe(s.get_space()), 1
    for i in range(s.dim(isl.dim_type.set)):
        lo, hi = s.dim_min_val(i), s.dim_max_val(i)
        if not (lo.is_int() and hi.is_int()):
            return None
        a, b = lo.to_python(), hi.to_python()
        box = box.lower_bound_val(isl.dim_type.set, i, isl.Val.int_from_si(ctx, a))
        box = box.upper_bound_val(isl.dim_type.set, i, isl.Val.int_from_si(ctx, b))
        count *= max(0, b - a + 1)
    return count if box.is_subset(s) else None


def block_read_bytes(
    model: PolyModel,
    domain: isl.UnionSet,
    context: isl.Set,
    block_params: list[str],
    placements: dict[str, Placement],
) -> int | None:
    """Distinct global bytes one block reads: the cost model's L2 traffic of a kernel whose
    threads share their reads (a convolution's window, a broadcast bias), which the L1 serves
    once per block instead of once per thread.

    ``domain`` is the kernel's statement instances, parametric in its block and thread
    parameters (a mapped schedule's domain); ``context`` their ranges. The block is an interior
    one: each block parameter at the middle of its range (an edge block of a padded convolution
    reads fewer rows). None where isl cannot count a footprint within :data:`COUNT_LIMITS`.
    """
    fixed = context
    for b in block_params:
        i = fixed.find_dim_by_name(isl.dim_type.param, b)
        if i < 0:
            continue
        at = fixed.move_dims(isl.dim_type.set, 0, isl.dim_type.param, i, 1)
        lo, hi = at.dim_min_val(0), at.dim_max_val(0)
        if not (lo.is_int() and hi.is_int()):
            return None
        mid = (lo.to_python() + hi.to_python()) // 2
        fixed = fixed.fix_val(isl.dim_type.param, i, isl.Val.int_from_si(fixed.get_ctx(), mid))
    total = 0
    for name, p in placements.items():
        if p.space != "global" or p.register_copy:
            continue
        img = _image(model.reads, domain, name)
        if img is None:
            continue
        img = img.intersect_params(fixed.align_params(img.get_space()))
        img = img.project_out(isl.dim_type.param, 0, img.dim(isl.dim_type.param)).coalesce()
        n = count_points(img)
        if n is None:
            return None
        t = model.tensors.get(name)
        total += n * (t.itemsize if t is not None else ITEMSIZE)
    return total
