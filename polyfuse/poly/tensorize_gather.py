"""Implicit-GEMM operands of the tensorization (:mod:`polyfuse.poly.tensorize`): convolutions.

A convolution's update ``out[b, o, y, x] += where(pad, x[b, c, s*y + kh - p, s*x + kw - p], 0)
* w[o, c, kh, kw]`` is a GEMM whose ``k`` is the reduction ``(c, kh, kw)`` flattened
(row-major over the reduction dims, :func:`k_extent`), ``m = o`` and ``n = x`` with ``(b, y)``
a batch (or ``y`` folded into the columns beside a narrow ``x``: :func:`fold_columns`). Its
operands are no plain ``A[m, k]`` tiles: the shared-tile fill gathers them element by element
through their full affine subscripts (im2col in the fill; ``k`` split back into the reduction
dims once per k-tile and thread run), so any affine subscript that reads the operand's row
dim, the reduction dims and batch dims only is accepted (:func:`gather_operand`). Where the
operand's array offset is linear in the flattened ``k`` and contiguous along its tile's inner
dim (:func:`linear_k`: an OIHW weight under ``(c, kh, kw)``), its tile is copied by 16-byte
``cp.async`` chunks instead, pipelined; the reduction's order is chosen by
:mod:`polyfuse.poly.tensorize_order`. A padding select ``where(c, x[..], 0)`` is dropped where
isl proves every update instance on which ``c`` fails reads outside ``x``
(:func:`polyfuse.poly.select_free.select_free_operands`): the fill zero-fills every element
outside the array (the operand is ``guarded``), which is the select's 0.
"""

from __future__ import annotations

import math
from dataclasses import replace

import islpy as isl

from polyfuse.graph.expr import Binary, Read, Select, zero_padded_read
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.promote import access_function
from polyfuse.poly.select_free import select_free_operands
from polyfuse.poly.tiling import affine_coefficients


def affine_index(
    name: str, acc: isl.Map, not_affine: str = ""
) -> list[tuple[tuple[int, ...], int]] | str:
    """Per array dim of tensor ``name`` read through ``acc``, the subscript's coefficients
    over the statement's dims and its constant (:func:`affine_coefficients`), or why the
    access has no such form (``not_affine`` is appended to the reason a subscript gives)."""
    f = access_function(acc)
    n_in = f.dim(isl.dim_type.in_)
    try:
        pma = isl.PwMultiAff.from_map(f)
    except isl.Error:
        return f"{name}'s access is not a function"
    index = []
    for i in range(pma.dim(isl.dim_type.out)):
        pieces = pma.get_pw_aff(i).get_pieces()
        aff = affine_coefficients(pieces[0][1], n_in) if len(pieces) == 1 else None
        if aff is None:
            return f"{name}'s subscript {i} is not affine{not_affine}"
        index.append(aff)
    return index


def k_extent(shape: GemmShape) -> tuple[int, int]:
    """The first and last ``k`` of the GEMM: the reduction's bounds where it has one dim, else
    ``0 .. prod(extents) - 1`` (the dims flattened row-major)."""
    if len(shape.red) == 1:
        return shape.red[0]
    return 0, math.prod(hi - lo + 1 for lo, hi in shape.red) - 1


def k_parts(shape: GemmShape, k: str) -> list[str]:
    """Each reduction dim's value at the flattened ``k`` (C text): ``k`` itself for one dim."""
    if len(shape.red) == 1:
        return [k]
    ext = [hi - lo + 1 for lo, hi in shape.red]
    out = []
    for i, (lo, _) in enumerate(shape.red):
        inner = math.prod(ext[i + 1 :])
        v = f"{k} / {inner}" if inner > 1 else k
        v = f"({v}) % {ext[i]}" if i else f"({v})"
        out.append(f"({lo} + {v})" if lo else v)
    return out


def gather_operand(
    name: str, acc: isl.Map, shape: tuple[int, ...], nd: int, mine: int, other: int
) -> tuple[tuple[tuple[tuple[int, ...], int], ...], bool, int] | str:
    """``(index, k_inner, inner_dim)`` of an operand gathered into its shared tile (see the
    module doc): per array dim the affine subscript over the update's dims, whether the tile
    keeps ``k`` innermost (the array's innermost subscript does not move with the row dim
    ``mine``), the array's innermost dim (trailing extents of 1 skipped); or why not."""
    index = affine_index(name, acc, " (a grouped conv's channel)")
    if isinstance(index, str):
        return index
    if any(c[other] for c, _ in index):
        return f"{name} reads the other operand's dim"
    if not any(c[mine] for c, _ in index) or not any(any(c[nd:]) for c, _ in index):
        return f"{name} does not read both its row dim and the reduction"
    last = max((i for i, e in enumerate(shape) if e > 1), default=len(shape) - 1)
    return tuple(index), not index[last][0][mine], last


def linear_k(
    index: tuple[tuple[tuple[int, ...], int], ...],
    arr: tuple[int, ...],
    shape: GemmShape,
    mine: int,
    k_inner: bool,
) -> tuple[tuple[int, ...], int, int] | None:
    """``(coefficients over the data dims, k's coefficient, constant)`` of a gathered operand's
    row-major array offset where it is ``data part + s * k + constant`` (``k`` the flattened
    reduction, :func:`k_extent`: the subscripts' reduction coefficients, weighted by the
    array's strides, are ``s`` times the flattening's own strides) and consecutive elements
    along the tile's innermost dim are consecutive in memory (``s = 1`` where k is innermost,
    else the row dim ``mine``'s coefficient 1): an OIHW weight under the ``(c, kh, kw)``
    order, whose every run of k is contiguous. Such a tile may be copied by 16-byte chunks
    with no division of k; else None. The coefficients are isl's (:func:`affine_index`)."""
    nd, nr = len(shape.data), len(shape.red)
    strides = [math.prod(arr[i + 1 :]) for i in range(len(arr))]
    lin = [sum(c[d] * s for (c, _), s in zip(index, strides, strict=True)) for d in range(nd + nr)]
    const = sum(k * s for (_, k), s in zip(index, strides, strict=True))
    ext = [hi - lo + 1 for lo, hi in shape.red]
    sk = lin[-1]
    if lin[nd:] != [sk * math.prod(ext[j + 1 :]) for j in range(nr)]:
        return None
    if (sk if k_inner else lin[mine]) != 1:
        return None
    if nr > 1:  # k = sum (r_j - lo_j) * kstr_j: the reduction's lower bounds go to the constant
        const += sum(lin[nd + j] * lo for j, (lo, _) in enumerate(shape.red))
    return tuple(lin[:nd]), sk, const


def chunked_k(
    index: tuple[tuple[tuple[int, ...], int], ...],
    arr: tuple[int, ...],
    shape: GemmShape,
    k_inner: bool,
    chunk: int = 8,
) -> bool:
    """Whether a gathered operand stored k-innermost is filled by 16-byte chunks, each run of
    ``chunk`` consecutive ``k`` (from a multiple of ``chunk``) one aligned run of its innermost
    dim: that dim's subscript is the innermost reduction dim alone (coefficient 1; isl's
    coefficients, :func:`affine_index`), no other subscript reads that reduction dim (the
    padding test is the same for the chunk's elements), its extent and the innermost extent
    of the array are multiples of ``chunk`` (a run stays in one value of the outer reduction
    dims; every array row starts aligned), and its first element ``constant + lo`` too: a
    channels-last conv input under the ``(kh, kw, c)`` order."""
    if not k_inner or not shape.red:
        return False
    nd, nr = len(shape.data), len(shape.red)
    last = max((i for i, e in enumerate(arr) if e > 1), default=len(arr) - 1)
    coeffs, const = index[last]
    want = [0] * (nd + nr - 1) + [1]
    if list(coeffs) != want or any(c[-1] for i, (c, _) in enumerate(index) if i != last):
        return False
    lo, hi = shape.red[-1]
    return (hi - lo + 1) % chunk == 0 and arr[last] % chunk == 0 and (const + lo) % chunk == 0


def linear_alignment(
    name: str, lin: tuple[tuple[int, ...], int, int], chunk: int, along: int | None, lo: int
) -> str:
    """Why a :func:`linear_k` operand's 16-byte chunks do not all start 16-byte aligned, or
    "": every coefficient but the one the chunks run along (data dim ``along``; None: k) a
    multiple of ``chunk`` elements, and the first chunk's offset (the constant plus ``lo``,
    the first value of that dim; chunks then step by ``chunk``) too."""
    coeffs, sk, const = lin
    others = [c for d, c in enumerate(coeffs) if d != along] + ([] if along is None else [sk])
    bad = [c for c in others if c % chunk]
    if bad:
        return f"{name}'s offset moves by {bad[0]} elements (not a multiple of {chunk})"
    if (const + lo) % chunk:
        return f"{name}'s tile rows start at element {const + lo} mod {chunk} (not 16-byte aligned)"
    return ""


def split_shape(shape: GemmShape, d: int, og: int) -> GemmShape:
    """``shape`` with data dim ``d`` split into ``(g, o)``, ``d = og * g + o`` (``0 <= o <
    og``): a grouped conv's output channel into its group (a batch dim) and the channel in the
    group (the GEMM's rows), on which the input's channel ``(d // og) * cg + c`` is affine. The
    operands' accesses are composed with the split (the update's tuple keeps its name)."""
    lo, hi = shape.data[d]
    assert lo == 0 and (hi + 1) % og == 0
    name = shape.update.domain.get_tuple_name()
    nd, nr = len(shape.data), len(shape.red)
    old = [f"d{i}" for i in range(nd)] + [f"r{i}" for i in range(nr)]
    new = [*old[:d], "pg", "po", *old[d + 1 :]]
    src = [*old[:d], f"{og} * pg + po", *old[d + 1 :]]
    split = isl.Map(
        f"{{ {name}[{', '.join(new)}] -> {name}[{', '.join(src)}] : 0 <= po < {og} }}",
        context=shape.update.domain.get_ctx(),
    )
    data = [*shape.data[:d], (0, (hi + 1) // og - 1), (0, og - 1), *shape.data[d + 1 :]]
    operands = [(t, split.apply_range(acc).coalesce()) for t, acc in shape.operands]
    return replace(shape, data=data, operands=operands)


def group_splits(shape: GemmShape) -> list[tuple[int, int]]:
    """The ``(d, og)`` splits worth trying where no dim pair matched: data dims read through a
    floor division by some operand (a grouped conv's channel), each divisor ``og`` of the
    dim's extent from the largest (2 <= og < extent)."""
    out = []
    for d, (lo, hi) in enumerate(shape.data):
        if lo != 0 or not any(_divides_dim(acc, d) for _, acc in shape.operands):
            continue
        e = hi + 1
        out += [(d, og) for og in range(e - 1, 1, -1) if e % og == 0]
    return out


def _divides_dim(acc: isl.Map, d: int) -> bool:
    """Whether some subscript of ``acc`` is no affine function and involves data dim ``d``."""
    f = access_function(acc)
    try:
        pma = isl.PwMultiAff.from_map(f)
    except isl.Error:
        return False
    n_in = f.dim(isl.dim_type.in_)
    for i in range(pma.dim(isl.dim_type.out)):
        pieces = pma.get_pw_aff(i).get_pieces()
        if len(pieces) == 1 and affine_coefficients(pieces[0][1], n_in) is not None:
            continue
        if any(p[1].involves_dims(isl.dim_type.in_, d, 1) for p in pieces):
            return True
    return False


def factor_read(f) -> Read | None:
    """The read of a factor ``read``, ``int32(read)`` of a byte tensor, or either under
    ``where(c, ., 0)`` (:func:`polyfuse.graph.expr.zero_padded_read`), else None."""
    return zero_padded_read(f)


def guarded_operands(shape: GemmShape, model, body: Binary) -> set[str] | str:
    """The operands read under a padding select, each proven by isl to fail only outside its
    array (the fill's zero-fill is the select's 0), or why not."""
    selects = [factor_read(f) for f in (body.a, body.b) if isinstance(f, Select)]
    if not selects:
        return set()
    box = list(shape.data) + list(shape.red)
    arrays = {t: tuple(model.tensors[t].shape) for t, _ in shape.operands}
    access = {t: access_function(m) for t, m in shape.operands}
    free = select_free_operands(shape, box, arrays, access)
    mine = {
        t
        for t, m in shape.operands
        if any(r is f and mm is m for f in selects for r, mm in shape.update.reads)
    }
    if not mine or not mine <= set(free):
        return f"a select in the update is not proven to zero only reads outside {sorted(mine)}"
    return mine


def fold_columns(
    shape: GemmShape, m: int, n: int, a_index: tuple[tuple[tuple[int, ...], int], ...], narrow: int
) -> int | None:
    """The data dim to fold into the GEMM's columns with ``n`` (B's row dim; ``m`` A's, whose
    subscripts are ``a_index``), or None: the dim just outside ``n`` where ``n`` is narrower
    than ``narrow`` (the smallest block tile's columns), both start at 0, it is not ``m`` and A
    does not read it (a conv's output rows beside a narrow output width: ``N = rows x width``,
    so whole block tiles; B is then gathered, so the caller folds only where B's fill is scalar
    anyway)."""
    p = n - 1
    (lp, _), (ln, hn) = shape.data[p] if p >= 0 else (1, 0), shape.data[n]
    if p < 0 or p == m or lp or ln or hn + 1 >= narrow:
        return None
    if any(c[p] for c, _ in a_index):
        return None
    return p
