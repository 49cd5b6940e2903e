"""ATen's sort-like operators on :mod:`polyfuse.ops.sorting`: ``topk``, ``sort`` (``.stable``),
``kthvalue`` and ``median`` (``.dim`` and over all elements); ``argsort`` decomposes into
``sort``.

The order is stable (ties keep their index order; torch's unstable order of ties is its own)
with NaN the largest, as torch's. A sort ranks every element of a row against the whole row
(n * n comparisons); a row longer than :data:`SORT_MAX_ROW` stays in PyTorch, whose sorts are
n log n. A topk of few elements takes rounds (2 n k comparisons) whatever the row.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from polyfuse import ops, te
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import Tensor
from polyfuse.ops._common import op_name
from polyfuse.ops.sorting import TOPK_ROUNDS_MAX_K

__all__ = ["LOWERINGS", "SORT_MAX_ROW", "unsupported_reason"]

aten = torch.ops.aten

#: Longest row a sort ranks (each element compares all n of its row: n * n per row; eager's
#: sorts are n log n).
SORT_MAX_ROW = 4096


def _zero_index(what: str) -> Tensor:
    """The index of a 0-d tensor's only element (int64 0)."""
    return te.compute((), lambda: te.const(0, "int64"), name=op_name(f"{what}_idx", None))


def _topk(x: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
    """``aten.topk``: :func:`polyfuse.ops.topk` (sorted, ties by index, NaN the largest; int64
    indices). ``sorted=False`` leaves the order to the implementation: this one sorts."""
    if not x.shape:  # a 0-d tensor is its own top 1
        return x, _zero_index("topk")
    return ops.topk(x, int(k), dim, bool(largest))


def _sort(x: Tensor, dim: int = -1, descending: bool = False, *, stable: Any = None) -> Any:
    """``aten.sort`` (``.stable`` too: this sort is stable, NaN last ascending and first
    descending, as torch's): :func:`polyfuse.ops.sort`."""
    if not x.shape:
        return x, _zero_index("sort")
    return ops.sort(x, dim, bool(descending))


def _sort_stable(x: Tensor, *, stable: Any = None, dim: int = -1, descending: bool = False) -> Any:
    return _sort(x, dim, descending)
def kth(x: Tensor, k: int, dim: int = -1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``aten.kthvalue``: the ``k``-th smallest along ``dim`` and its int64 index, read from
    :func:`polyfuse.ops.sort` (stable: among equal values the first; NaN the largest)."""
    if not x.shape:
        return x, _zero_index("kth")
    ax = dim % x.ndim
    values, idx = ops.sort(x, ax)
    return _at_position(values, ax, k - 1, keepdim), _at_position(idx, ax, k - 1, keepdim)


def median_dim(x: Tensor, dim: int = -1, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """``aten.median.dim``: the lower median along ``dim`` and its index; a row holding NaN
    gives NaN at its first NaN's index, as torch."""
    if not x.shape:
        return kth(x, 1)
    ax = dim % x.ndim
    n = x.shape[ax]
    values, idx = kth(x, (n + 1) // 2, ax, keepdim)
    if not dt.is_float(x.dtype):
        return values, idx
    k = te.reduce_axis(n, name="kn")

    def first_nan(*i: Any) -> Any:
        at = list(i) if keepdim else [*i[:ax], 0, *i[ax:]]
        at[ax] = k
        return te.min(te.where(te.isnan(x[tuple(at)]), te.cast(k, "int64"), n), axis=k)

    nan = te.compute(values.shape, first_nan, name=op_name("median_nan", None))
    out_v = te.compute(values.shape, lambda *i: te.where(nan[i] < n, math.nan, values[i]),
                       name=op_name("median", None))  # fmt: skip
    out_i = te.compute(idx.shape, lambda *i: te.where(nan[i] < n, nan[i], idx[i]),
                       name=op_name("median_idx", None))  # fmt: skip
    return out_v, out_i


def median(x: Tensor) -> Tensor:
    """``aten.median.default``: the lower median of all elements (NaN if any is)."""
    flat = ops.reshape(x, (math.prod(x.shape),)) if x.ndim != 1 else x
    return median_dim(flat, 0)[0]


def _at_position(t: Tensor, ax: int, pos: int, keepdim: bool) -> Tensor:
    """``t`` at position ``pos`` of axis ``ax`` (kept as a unit dim with ``keepdim``)."""
    shape = tuple(1 if d == ax else s for d, s in enumerate(t.shape) if keepdim or d != ax)

    def body(*i: Any) -> Any:
        at = list(i) if keepdim else [*i[:ax], 0, *i[ax:]]
        at[ax] = pos
        return t[tuple(at)]

    return te.compute(shape, body, name=op_name(f"{t.name}_at", None))


LOWERINGS: dict[Any, Callable[..., Any]] = {
    aten.topk.default: _topk,
    aten.sort.default: _sort,
    aten.sort.stable: _sort_stable,
    aten.kthvalue.default: kth,
    aten.median.dim: median_dim,
    aten.median.default: median,
}
#: the position of each operator's ``dim`` argument (None: keyword only, or ``median.default``
#: which ranks all elements)
_DIM_AT = {aten.sort.default: 1, aten.sort.stable: None, aten.topk.default: 2,
           aten.kthvalue.default: 2, aten.median.dim: 1, aten.median.default: None}  # fmt: skip


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why a sort-like node stays in PyTorch: a row longer than :data:`SORT_MAX_ROW` that it
    would rank (or None)."""
    val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.ndim == 0:
        return None
    at = _DIM_AT[node.target]
    dim = node.args[at] if at is not None and len(node.args) > at else node.kwargs.get("dim", -1)
    n = val.numel() if node.target is aten.median.default else val.shape[dim]
    if node.target is aten.topk.default:
        k = int(node.args[1])
        if k <= TOPK_ROUNDS_MAX_K and 2 * k < n:
            return None  # rounds: 2 n k comparisons
    if n > SORT_MAX_ROW:
        return f"a sort of rows longer than {SORT_MAX_ROW} (n * n comparisons per row)"
    return None
