"""``topk`` and ``sort``: the first elements along an axis in a total order, and their indices.

An element comes before another when it is larger (smaller for ``largest=False``) or equal with
a lower index, so ties keep their order (a stable sort); NaN is larger than every number, as in
torch and ONNX's reference (a lexsort): first when largest, last otherwise. Indices are int64
(torch's and ONNX's index dtype). Two lowerings of that order, both plain reductions that isl
schedules like any other:

- ranks (any k, and ``sort``): each element's rank (how many elements come before it), the
  index of each rank below k, then the values gathered through those indices; three computes
  whatever k, n * n comparisons per row;
- rounds (small k over long rows, :data:`TOPK_ROUNDS_MAX_K`): round r finds the first element
  after round r-1's in the order, reading only that one element; 2 n k comparisons per row in
  2k chained reductions.

(k rounds that each excluded every earlier index made 2k reductions reading all earlier
rounds: stitching them grew with k squared, and k=105 of 256 compiled for hours, onnx fuzz at
larger sizes seed 9147; a NaN found no index, n came back.)
"""

from __future__ import annotations

from collections.abc import Sequence

from polyfuse import te
from polyfuse.errors import ExpressionError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.ops._common import as_operand, compute_op, highest, lowest, norm_axis, op_name

__all__ = ["TOPK_ROUNDS_MAX_K", "sort", "topk"]

#: topk takes ``k`` rounds of (next value, its first index) when ``k`` is at most this and the
#: rounds compare fewer pairs than the ranks (2 n k < n n): 2k reductions chained one after the
#: other compile in seconds, where at n = 32000 and k = 1 the ranks' n * n comparisons took
#: 25 s of emulator time per row.
TOPK_ROUNDS_MAX_K = 8


def topk(
    x: Tensor, k: int, axis: int = -1, largest: bool = True, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """The ``k`` first elements of ``x`` along ``axis`` in the order above (largest first, or
    smallest first with ``largest=False``) and their int64 indices, each of ``x``'s shape with
    ``k`` along the axis. A ``k`` outside ``[1, n]`` is an ``ExpressionError``."""
    name = op_name("topk", name)
    x = as_operand("topk", name, "x", x)
    ax = norm_axis("topk", name, x, axis)
    n = x.shape[ax]
    if not 1 <= k <= n:
        raise ExpressionError(f"topk '{name}': k={k} out of range for axis {ax} of size {n}")
    order = _Order(x, ax, largest, name)
    idx = order.rounds(k) if k <= TOPK_ROUNDS_MAX_K and 2 * k < n else order.ranks(k)
    values = compute_op(
        idx.shape, lambda *r: x[order.at_axis(r, te.data_index(idx[r]))], name, "topk"
    )
    return values, idx


def sort(
    x: Tensor, axis: int = -1, descending: bool = False, name: str | None = None
) -> tuple[Tensor, Tensor]:
    """``x`` sorted along ``axis`` (ascending, or descending) and the int64 indices it came
    from: stable (equal elements keep their order), NaN last ascending and first descending,
    as ``torch.sort``. The ranks lowering: n * n comparisons per row."""
    name = op_name("sort", name)
    x = as_operand("sort", name, "x", x)
    ax = norm_axis("sort", name, x, axis)
    order = _Order(x, ax, descending, name)
    idx = order.ranks(x.shape[ax])
    values = compute_op(
        idx.shape, lambda *r: x[order.at_axis(r, te.data_index(idx[r]))], name, "sort"
    )
    return values, idx


def _iota64(k: Expr) -> Expr:
    return te.cast(k, "int64")


class _Order:
    """The total order along axis ``ax`` of ``x``, and the two lowerings of its first k."""

    def __init__(self, x: Tensor, ax: int, largest: bool, name: str) -> None:
        self.x, self.ax, self.largest, self.n, self.name = x, ax, largest, x.shape[ax], name
        self.floating = dt.is_float(x.dtype)

    def at_axis(self, i: Sequence[Expr], v: Expr) -> tuple[Expr, ...]:
        return (*i[: self.ax], v, *i[self.ax + 1 :])

    def before(self, a: Expr, b: Expr, lower: Expr) -> Expr:
        """``a`` (at a ``lower`` index or not) comes before ``b``."""
        strict = a > b if self.largest else a < b
        tie = te.equal(a, b)
        if self.floating:  # NaN is the largest: first with largest=1, last with largest=0
            nan_a, nan_b = te.isnan(a), te.isnan(b)
            strict = strict | (
                (nan_a & te.equal(b, b)) if self.largest else (nan_b & te.equal(a, a))
            )
            tie = tie | (nan_a & nan_b)
        return strict | (tie & lower)

    def ranks(self, kk: int) -> Tensor:
        """Indices of the first ``kk`` through every element's rank (n * n comparisons)."""
        x, n = self.x, self.n
        one, zero = te.const(1, "int64"), te.const(0, "int64")

        def rank_body(*i: IterVar) -> Expr:
            j = te.reduce_axis(n, name="kr")
            first = self.before(x[self.at_axis(i, j)], x[i], j < i[self.ax])
            return te.sum(te.where(first, one, zero), axis=j)

        rank = compute_op(x.shape, rank_body, f"{self.name}_rank", "topk")

        def idx_body(*r: IterVar) -> Expr:
            j = te.reduce_axis(n, name="ki")
            hit = te.equal(rank[self.at_axis(r, j)], _iota64(r[self.ax]))
            return te.sum(te.where(hit, _iota64(j), zero), axis=j)

        return compute_op(self._shape(kk), idx_body, f"{self.name}_idx", "topk")

    def rounds(self, kk: int) -> Tensor:
        """Indices of the first ``kk``, one round each: the extreme value among the elements
        after the previous round's (NaN-aware), then the first index holding it."""
        x, n, ax, dtype = self.x, self.n, self.ax, self.x.dtype
        one_row = self._shape(1)
        keys: list[Tensor] = []
        for r in range(kk):
            prev = keys[-1] if keys else None

            def after(i: Sequence[Expr], j: Expr, prev: Tensor | None = prev) -> Expr | None:
                """Element ``j`` of row ``i`` comes after the previous round's element."""
                if prev is None:
                    return None
                p = self._index(prev[self.at_axis(i, as_expr(0))])
                return self.before(x[self.at_axis(i, te.data_index(p))], x[self.at_axis(i, j)],
                                   p < _iota64(j))  # fmt: skip

            def extreme(*i: IterVar, after=after) -> Expr:  # noqa: ANN001
                j = te.reduce_axis(n, name="kv")
                v, cand = x[self.at_axis(i, j)], after(i, j)
                if self.largest:  # te.max propagates NaN: NaN comes first
                    return te.max(v if cand is None else te.where(cand, v, lowest(dtype)), axis=j)
                if self.floating:  # NaN comes last: only when nothing else is left
                    cand = te.equal(v, v) if cand is None else cand & te.equal(v, v)
                return te.min(v if cand is None else te.where(cand, v, highest(dtype)), axis=j)

            m = compute_op(one_row, extreme, f"{self.name}_round{r}_value", "topk")

            def first_at(*i: IterVar, after=after, m=m) -> Expr:  # noqa: ANN001
                """The first candidate index holding ``m``, else n + the first NaN's."""
                j = te.reduce_axis(n, name="kj")
                v, cand, jj = x[self.at_axis(i, j)], after(i, j), _iota64(j)
                hit = te.equal(v, m[i])
                miss = te.const(2 * n, "int64")
                if self.floating:
                    miss = te.where(te.isnan(v), jj + n, miss)
                key = te.where(hit, jj, miss)
                return te.min(key if cand is None else te.where(cand, key, 2 * n), axis=j)

            keys.append(compute_op(one_row, first_at, f"{self.name}_round{r}_index", "topk"))

        def gathered(*r: IterVar) -> Expr:
            out: Expr = self._index(keys[-1][self.at_axis(r, as_expr(0))])
            for q in range(kk - 2, -1, -1):
                at_q = self._index(keys[q][self.at_axis(r, as_expr(0))])
                out = te.where(te.equal(r[ax], q), at_q, out)
            return out

        return compute_op(self._shape(kk), gathered, f"{self.name}_idx", "topk")

    def _index(self, key: Expr) -> Expr:
        """A round's index from its key (n + j for a NaN at j)."""
        return te.where(key >= self.n, key - self.n, key)

    def _shape(self, kk: int) -> tuple[int, ...]:
        return tuple(kk if d == self.ax else s for d, s in enumerate(self.x.shape))
