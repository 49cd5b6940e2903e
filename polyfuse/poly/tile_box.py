"""The box of a promoted operand's per-block footprint, in the view its copy moves best.

:mod:`polyfuse.poly.promote` asks isl for the footprint of one block tile per k-tile (the
image of the padded tile under the read's access function) and copies its bounding box into
shared memory. Two rewrites of that box let the copy move 128-bit vectors where the plain box
cannot (:func:`polyfuse.poly.vectorize.prove_vector_copy` decides, as for any box):

1. **Contiguous dims merged.** Where the box covers an array dimension whole (``lo = 0``,
   extent = the array's), that dimension and the one outside it are contiguous in memory: the
   box is viewed with them as one dimension (a conv weight box ``64 x 8 x 3 x 3`` of a
   ``64 x 64 x 3 x 3`` array is ``64 x 72`` of ``64 x 576``; a 1x1 conv's ``128 x 8 x 1 x 1``
   is ``128 x 8``). The view is an affine map isl applies to the access function, so every
   later step (footprint, vector proof, copy domain) runs on the view unchanged; the readers
   index the tile through the same map (:attr:`TileBox.merge`).
2. **Start aligned.** Where the innermost lower bound is the same residue ``c`` modulo the
   vector width for every block and k-tile (a conv's padding shifts the input row by -1), the
   box starts ``c`` elements earlier and its extent rounds up to whole vectors: a few extra
   elements per row (zeros, or elements no thread reads) for 128-bit copies.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import islpy as isl

from polyfuse.base.decision import DecisionKind, Refusal, noted, refused
from polyfuse.base.decision_data import TileBoxData
from polyfuse.poly.vectorize import VECTOR_WIDTH, VectorProof, prove_vector_copy


@dataclass
class TileBox:
    """A footprint's box in its view: lower bounds (C text and isl), extents, the array's
    shape in the view, the vector proof, and the view itself."""

    fp: isl.Set  # the elements the copy moves (in the view)
    lo_t: list[str]
    lo_c: list[isl.PwAff]
    size: list[int]
    shape: tuple[int, ...]
    proof: VectorProof
    #: per view dimension, its coefficient on each array dimension (empty: the array's own)
    merge: tuple[tuple[int, ...], ...] = ()
    notes: list[str] = field(default_factory=list)


def _aff_text(pa: isl.PwAff) -> str | None:
    """The isl text of a single-piece affine function (for building constraints)."""
    pieces = pa.get_pieces()
    if len(pieces) != 1:
        return None
    _, aff = pieces[0]
    s = str(aff)
    i, j = s.find("[("), s.rfind(")]")
    return s[i + 2 : j] if i >= 0 and j > i else None


def _no(name: str, why: str) -> Refusal:
    """The footprint of array ``name`` refused as a shared tile."""
    return refused(DecisionKind.GEMM_TILE, f"the footprint of {name} {why}", name)


def _bounds(fp: isl.Set, name: str) -> tuple[list[str], list[isl.PwAff], list[int]] | Refusal:
    lo_t, lo_c, size = [], [], []
    for i in range(fp.dim(isl.dim_type.set)):
        try:
            lo, hi = fp.dim_min(i), fp.dim_max(i)
            span = hi.sub(lo).max_val()
        except isl.Error:  # e.g. grouped conv: the subscript's hull is not bounded
            return _no(name, "is not bounded per tile")
        txt = _aff_text(lo)
        if not span.is_int() or txt is None:
            return _no(name, "has no fixed-size box")
        lo_t.append(txt)
        size.append(span.to_python() + 1)
        lo_c.append(lo)
    return lo_t, lo_c, size


def _constant(pa: isl.PwAff, ranges: isl.Set) -> int | None:
    """The value of ``pa`` when it is one constant over the parameter ``ranges``."""
    pa = pa.intersect_params(ranges)
    lo, hi = pa.min_val(), pa.max_val()
    return lo.to_python() if lo.is_int() and hi.is_int() and lo.eq(hi) else None


def merge_groups(
    size: list[int], lo_c: list[isl.PwAff], shape: tuple[int, ...], ranges: isl.Set
) -> list[list[int]]:
    """The array's dims grouped outermost first: a dim joins the group of the dim outside it
    when the box covers it whole (from 0, the array's extent)."""
    groups: list[list[int]] = []
    for d in range(len(size)):
        whole = size[d] == shape[d] and _constant(lo_c[d], ranges) == 0
        if groups and whole:
            groups[-1].append(d)
        else:
            groups.append([d])
    return groups


def _view(ctx: isl.Context, name: str, groups: list[list[int]], shape) -> isl.Map:
    """``{ name[i...] -> name[m...] }``: each group's dims as one row-major index."""
    ins = [f"i{d}" for d in range(len(shape))]
    outs = []
    for g in groups:
        terms, mult = [], 1
        for d in reversed(g):
            terms.append(f"{mult} * i{d}")
            mult *= shape[d]
        outs.append(" + ".join(reversed(terms)))
    return isl.Map(f"{{ {name}[{', '.join(ins)}] -> {name}[{', '.join(outs)}] }}", context=ctx)


def tile_box(
    name: str, hull: isl.Map, tile: isl.Set, ranges: isl.Set, shape: tuple[int, ...]
) -> TileBox | Refusal:
    """The box (in its view) of the footprint of ``tile`` under access function ``hull`` of
    array ``name`` of ``shape`` (parameters in ``ranges``), or why there is none (a refusal
    about the array)."""
    fp = hull.intersect_domain(tile).range().intersect_params(ranges).coalesce()
    got = _bounds(fp, name)
    if isinstance(got, Refusal):
        return got
    lo_t, lo_c, size = got
    notes: list[str] = []
    merge: tuple[tuple[int, ...], ...] = ()
    groups = merge_groups(size, lo_c, shape, ranges)
    if len(groups) < len(size):
        view = _view(fp.get_ctx(), name, groups, shape)
        fp = fp.apply(view).coalesce()
        got = _bounds(fp, name)
        if isinstance(got, Refusal):
            return got
        old_size, old = list(size), "x".join(map(str, size))
        lo_t, lo_c, size = got
        rows = []
        for g in groups:
            coef = [0] * len(shape)
            mult = 1
            for d in reversed(g):
                coef[d] = mult
                mult *= shape[d]
            rows.append(tuple(coef))
        merge = tuple(rows)
        shape = tuple(math.prod(shape[d] for d in g) for g in groups)
        why = (
            f"box {old} viewed as {'x'.join(map(str, size))} of "
            f"{'x'.join(map(str, shape))} (dims it covers whole are contiguous)"
        )
        data = TileBoxData(name, "merged dims", old_size, list(size))
        notes.append(noted(DecisionKind.GEMM_LOOP, why, name, data=data))
    proof = prove_vector_copy(fp, lo_t, size, shape)
    if proof.width == 1:
        wide = _aligned(fp, lo_t, lo_c, size, shape, ranges)
        if wide is not None:
            before = list(size)
            fp, lo_t, lo_c, size, proof, note = wide
            data = TileBoxData(name, "aligned", before, list(size))
            notes.append(noted(DecisionKind.GEMM_LOOP, note, name, data=data))
    return TileBox(fp, lo_t, lo_c, size, shape, proof, merge, notes)


def _aligned(fp, lo_t, lo_c, size, shape, ranges):
    """The box widened to start on a vector boundary, when that proves vector copies."""
    w = VECTOR_WIDTH
    if not size or shape[-1] % w:
        return None
    if not fp.is_equal(_box_set(fp, lo_t, size).intersect_params(fp.params())):
        return None  # holes (a strided conv's input): widening would copy them too
    c = _constant(lo_c[-1].mod_val(isl.Val.int_from_si(fp.get_ctx(), w)), ranges)
    if c is None:
        return None
    n = -(-(size[-1] + c) // w) * w
    if c == 0 and n == size[-1]:
        return None
    lo_t = lo_t[:-1] + [f"({lo_t[-1]}) - {c}"]
    lo_c = lo_c[:-1] + [lo_c[-1].add_constant_val(isl.Val.int_from_si(fp.get_ctx(), -c))]
    size2 = size[:-1] + [n]
    fp2 = _box_set(fp, lo_t, size2).intersect_params(ranges)
    proof = prove_vector_copy(fp2, lo_t, size2, shape)
    if proof.width == 1:
        return None
    note = (
        f"box row widened {size[-1]} -> {n} to start on a {4 * w}-byte boundary "
        f"({c} element(s) earlier)"
    )
    return fp2, lo_t, lo_c, size2, proof, note


def _box_set(fp: isl.Set, lo_t: list[str], size: list[int]) -> isl.Set:
    """``{ name[e] : lo <= e < lo + size }`` in the space of ``fp``."""
    params = [fp.get_dim_name(isl.dim_type.param, i) for i in range(fp.dim(isl.dim_type.param))]
    name = fp.get_tuple_name() if fp.has_tuple_id() else ""
    es = [f"e{i}" for i in range(len(size))]
    cons = " and ".join(f"{b} <= {e} < {b} + {s}" for e, b, s in zip(es, lo_t, size, strict=True))
    text = f"[{', '.join(params)}] -> {{ {name}[{', '.join(es)}] : {cons} }}"
    return isl.Set(text, context=fp.get_ctx())
