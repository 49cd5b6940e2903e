"""Scatters: ``data`` with updates written at run-time positions (``torch.scatter``,
``scatter_add``, ``index_put``, ONNX's ScatterElements and ScatterND).

A compute defines each output element by an expression, so a scatter is written from the
output's side: per output element ``p``, a reduction over the update rows ``r`` that name it.
With no reduction the last such row replaces the element (the row found as a max over ``r``,
its update read at run time; torch leaves the winner among duplicates unspecified, ONNX says the
last); with ``add``/``mul``/``max``/``min`` all of them combine with it. ``|data| * rows``
comparisons: cheap for the few rows of a cache update or a one-hot, quadratic for a scatter as
large as its target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.ops._common import compute_op, highest, lowest, op_name

__all__ = ["SCATTER_REDUCTIONS", "index_put", "scatter", "scatter_rows"]

#: How matching updates combine with the old element (None: the last one replaces it).
SCATTER_REDUCTIONS = (None, "add", "mul", "max", "min")

Hit = Callable[[Sequence[Expr], Expr], Expr]


def scatter_rows(
    data: Tensor,
    rows: int,
    hit: Hit,
    update: Hit,
    reduce: str | None = None,
    name: str | None = None,
    guard: Callable[[Sequence[Expr], Expr], Expr] | None = None,
    include_self: bool = True,
) -> Tensor:
    """``data`` with, per element ``p``, the update rows ``r < rows`` for which ``hit(p, r)``
    holds written in (``update(p, r)`` reads row ``r``'s value for ``p``): the last of them
    (``reduce`` None; ``guard(p, value)`` keeps ``data`` where no row can reach), or all of
    them combined by ``reduce`` with the element (``include_self``) or among themselves
    (the element kept where none hits)."""
    name = op_name("scatter", name)
    if reduce not in SCATTER_REDUCTIONS:
        raise ExpressionError(
            f"scatter '{name}': reduce={reduce!r}; use one of None, 'add', 'mul', 'max', 'min'"
        )
    dtype = data.dtype
    if reduce is not None:
        neutral = {"add": te.const(0, dtype), "mul": te.const(1, dtype),
                   "max": lowest(dtype), "min": highest(dtype)}[reduce]  # fmt: skip
        red, pick = {"add": (te.sum, lambda a, b: a + b), "mul": (te.prod, lambda a, b: a * b),
                     "max": (te.max, te.maximum), "min": (te.min, te.minimum)}[reduce]  # fmt: skip

        def reduced(*p: IterVar) -> Expr:
            r = te.reduce_axis(rows, name="rs")
            return red(te.where(hit(p, r), update(p, r), neutral), axis=r)

        combined = compute_op(data.shape, reduced, f"{name}_{reduce}", "scatter")
        if include_self:
            return compute_op(data.shape, lambda *p: pick(data[p], combined[p]), name, "scatter")
        last = _last_rows(data, rows, hit, name)
        return compute_op(
            data.shape, lambda *p: te.where(last[p] >= 0, combined[p], data[p]), name, "scatter"
        )
    last = _last_rows(data, rows, hit, name)

    def body(*p: IterVar) -> Expr:
        r = te.data_index(te.maximum(last[p], 0))
        value = te.where(last[p] >= 0, update(p, r), data[p])
        return value if guard is None else guard(p, value)

    return compute_op(data.shape, body, name, "scatter")


def _last_rows(data: Tensor, rows: int, hit: Hit, name: str) -> Tensor:
    """Per element of ``data``, the last update row naming it (int64), or -1."""

    def last_row(*p: IterVar) -> Expr:
        r = te.reduce_axis(rows, name="rs")
        return te.max(te.where(hit(p, r), te.cast(r, "int64"), te.const(-1, "int64")), axis=r)

    return compute_op(data.shape, last_row, f"{name}_row", "scatter")


def _in_range(v: Expr, n: int) -> Expr:
    """An index read at run time, a negative one counted from the end (int64)."""
    return te.where(v < 0, v + n, v)


def scatter(
    data: Tensor,
    axis: int,
    index: Tensor,
    src: Tensor | float | int,
    reduce: str | None = None,
    name: str | None = None,
    include_self: bool = True,
) -> Tensor:
    """``torch.scatter``/ONNX ScatterElements: ``out = data`` with ``out[q with q[axis] =
    index[q]] = src[q]`` for each ``q`` of ``index`` (negative indices from the end; ``src`` a
    tensor at least ``index``'s size on every axis, or a number), ``reduce`` combining instead
    of replacing. ``index`` addresses ``data`` element by element: the same rank, no larger on
    the axes but ``axis``."""
    name = op_name("scatter", name)
    ax = axis % data.ndim if data.ndim else 0
    same_rank = index.ndim == data.ndim
    if not same_rank or any(
        q > d for a, (q, d) in enumerate(zip(index.shape, data.shape, strict=True)) if a != ax
    ):
        raise ExpressionError(
            f"scatter '{name}': index {index.shape} does not fit data {data.shape} outside "
            f"axis {ax}"
        )
    if isinstance(src, Tensor) and (
        src.ndim != index.ndim or any(s < q for s, q in zip(src.shape, index.shape, strict=True))
    ):
        raise ExpressionError(
            f"scatter '{name}': src {src.shape} is smaller than index {index.shape}"
        )
    n, span = data.shape[ax], index.shape[ax]

    def inside(p: Sequence[Expr]) -> Expr | None:
        """``p`` lies inside the index's extent on every axis but ``axis`` (affine: it guards
        the reads of ``index`` and ``src`` at ``p``'s coordinates)."""
        c: Expr | None = None
        for d, (q, m) in enumerate(zip(index.shape, data.shape, strict=True)):
            if d != ax and q < m:
                c = p[d] < q if c is None else c & (p[d] < q)
        return c

    def at(p: Sequence[Expr], r: Expr) -> tuple[Expr, ...]:
        return (*p[:ax], r, *p[ax + 1 :])

    def hit(p: Sequence[Expr], r: Expr) -> Expr:
        h = te.equal(_in_range(index[at(p, r)], n), te.cast(p[ax], index.dtype))
        c = inside(p)
        return h if c is None else c & h

    def update(p: Sequence[Expr], r: Expr) -> Expr:
        v = src[at(p, r)] if isinstance(src, Tensor) else as_expr(src)
        return te.cast(v, data.dtype) if isinstance(src, Tensor) else v

    def guard(p: Sequence[Expr], value: Expr) -> Expr:
        c = inside(p)
        return value if c is None else te.where(c, value, data[tuple(p)])

    return scatter_rows(data, span, hit, update, reduce, name, guard, include_self)


def index_put(
    data: Tensor,
    indices: Sequence[Tensor | None],
    values: Tensor | float | int,
    accumulate: bool = False,
    name: str | None = None,
) -> Tensor:
    """``torch.index_put`` (``data[indices] = values``, ``+=`` with ``accumulate``): the
    index tensors (None: the whole dim) broadcast together to the rows' shape ``B``;
    ``values`` broadcast to the shape of ``data[indices]`` — ``B`` in place of the indexed
    dims when they are adjacent, in front otherwise, as numpy and torch place it."""
    name = op_name("index_put", name)
    lst = list(indices) + [None] * (data.ndim - len(indices))
    dims = [d for d, i in enumerate(lst) if i is not None]
    if not dims or len(lst) > data.ndim:
        raise ExpressionError(f"index_put '{name}': {len(indices)} indices for {data.shape}")
    idx = [lst[d] for d in dims]
    b = _broadcast([i.shape for i in idx if i is not None], name)
    rows = math.prod(b)
    rest = [d for d in range(data.ndim) if d not in dims]
    adjacent = dims == list(range(dims[0], dims[-1] + 1))

    def row_coords(r: Expr) -> list[Expr]:
        out, stride = [], rows
        for s in b:
            stride //= s
            out.append((r // stride) % s if s > 1 else as_expr(0))
        return out

    def read_bcast(t: Tensor, coords: Sequence[Expr]) -> Expr:
        """``t`` read at ``coords`` broadcast from the right (size-1 dims read at 0)."""
        own = coords[len(coords) - t.ndim :] if t.ndim else []
        return t[tuple(as_expr(0) if s == 1 else c for s, c in zip(t.shape, own, strict=True))]

    def hit(p: Sequence[Expr], r: Expr) -> Expr:
        rc = row_coords(r)
        match: Expr | None = None
        for d, t in zip(dims, idx, strict=True):
            assert t is not None
            eq = te.equal(_in_range(read_bcast(t, rc), data.shape[d]), te.cast(p[d], t.dtype))
            match = eq if match is None else match & eq
        assert match is not None
        return match

    if isinstance(values, Tensor):
        # the values by row: the last row naming an element is read at a run-time row, which
        # must be a whole subscript (a row's coordinates are // and % of it)
        def by_row(r: IterVar, *q: IterVar) -> Expr:
            rc = row_coords(r)
            coords = [*q[: dims[0]], *rc, *q[dims[0] :]] if adjacent else [*rc, *q]
            return te.cast(read_bcast(values, coords), data.dtype)

        shape = (rows, *(data.shape[d] for d in rest))
        flat = compute_op(shape, by_row, f"{name}_values", "scatter")

    def update(p: Sequence[Expr], r: Expr) -> Expr:
        if not isinstance(values, Tensor):
            return as_expr(values)
        return flat[(r, *(p[d] for d in rest))]

    return scatter_rows(data, rows, hit, update, "add" if accumulate else None, name)


def _broadcast(shapes: Sequence[tuple[int, ...]], name: str) -> tuple[int, ...]:
    nd = max(len(s) for s in shapes)
    out = [1] * nd
    for s in shapes:
        for k, v in enumerate(s, nd - len(s)):
            if v != 1 and out[k] not in (1, v):
                raise ExpressionError(f"index_put '{name}': index shapes {list(shapes)} differ")
            out[k] = max(out[k], v)
    return tuple(out)
