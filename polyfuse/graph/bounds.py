"""Bounds as isl facts: every access of a compute stays inside its tensor.

``te.compute`` calls :func:`check_bounds` on each compute it builds. For every read and the
write, isl takes the access relation over the points where the access is evaluated (the
iteration domain, narrowed by the affine ``te.where`` conditions around a read, see
:func:`polyfuse.graph.access.guarded_reads`) and subtracts the tensor's box; a non-empty rest
is an out-of-bounds access, reported with its lexicographically first witness (loop point and
subscripts) as an :class:`~polyfuse.base.errors.ExpressionError`. A guard that is not affine
narrows by its affine part only, so a read under a data-dependent guard is checked at its
worst. A data-dependent subscript (``te.data_index``) is not checked: its values are only known
at run time.

Because every access is proven inside its tensor here, the polyhedral model does not clip
reads to the tensor: its relations are exactly the elements accessed.

Cost: one isl map per distinct access text, cached; the same op in every layer of a model
shares its text (loop dimensions are named by position), so a deep model pays once per layer
kind, not per layer.
"""

from __future__ import annotations

import threading

import islpy as isl

from polyfuse.base.errors import ExpressionError
from polyfuse.graph import expr as ex
from polyfuse.graph.access import relation_text

__all__ = ["check_bounds"]

#: The largest number of access checks remembered (the cache is cleared when it fills up).
CACHE_LIMIT = 1 << 16

_lock = threading.Lock()
_ctx: isl.Context | None = None
#: (domain text, access text, shape) -> None (inside) or the first witness point.
_cache: dict[tuple[str, str, tuple[int, ...]], tuple[int, ...] | None] = {}


def check_bounds(t: ex.Tensor) -> None:
    """Raise :class:`ExpressionError` when compute ``t`` reads or writes outside a tensor.

    The message names the compute, the tensor, the dimension and an offending subscript with
    the loop point that produces it.
    """
    assert t.op is not None
    text, reads = relation_text(t)
    hit = _witness(text.domain, text.write, t.shape)
    if hit is not None:
        raise ExpressionError(_message(t, "writes", t, hit))
    for r, (m_s, shape) in zip(reads, text.reads, strict=True):
        hit = _witness(text.domain, m_s, shape)
        if hit is not None:
            raise ExpressionError(_message(t, "reads", r.tensor, hit))


def _witness(domain: str, access: str, shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """The first (loop point + subscripts) of ``access`` outside ``shape``, or None."""
    key = (domain, access, shape)
    with _lock:
        if key in _cache:
            return _cache[key]
        global _ctx
        if _ctx is None:
            _ctx = isl.Context()
        m = isl.Map(access, context=_ctx).intersect_domain(isl.Set(domain, context=_ctx))
        box = " and ".join(f"0 <= a{i} < {n}" for i, n in enumerate(shape)) or "true"
        subs = ", ".join(f"a{i}" for i in range(len(shape)))
        tensor = m.get_tuple_name(isl.dim_type.out)  # T for the write, X for a read
        inside = isl.Set(f"{{ {tensor}[{subs}] : {box} }}", context=_ctx)
        outside = m.subtract_range(inside)
        hit = None
        if not outside.is_empty():
            p = outside.wrap().lexmin().sample_point()
            n = p.get_space().dim(isl.dim_type.set)
            hit = tuple(
                int(p.get_coordinate_val(isl.dim_type.set, k).to_python()) for k in range(n)
            )
        if len(_cache) >= CACHE_LIMIT:
            _cache.clear()
        _cache[key] = hit
        return hit


def _message(t: ex.Tensor, verb: str, tensor: ex.Tensor, hit: tuple[int, ...]) -> str:
    """One line: compute, tensor, dimension, offending subscript and the loop point."""
    assert t.op is not None
    loops = [a for a in t.op.axes + t.op.reduce_axes if a.extent > 1]
    point, index = hit[: len(loops)], hit[len(loops) :]
    at = {a.uid: v for a, v in zip(loops, point, strict=True)}
    where = ", ".join(f"{a.name}={at.get(a.uid, a.lo)}" for a in t.op.axes + t.op.reduce_axes)
    d = next(d for d, (i, n) in enumerate(zip(index, tensor.shape, strict=True)) if not 0 <= i < n)
    return (
        f"compute '{t.name}' {verb} tensor '{tensor.name}' out of bounds: dimension {d} "
        f"index {index[d]} is outside [0, {tensor.shape[d]}) at {where or 'its only point'}; "
        "shrink the compute's shape or guard the access with te.where"
    )
