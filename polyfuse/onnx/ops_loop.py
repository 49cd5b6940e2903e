"""ONNX ``Loop`` whose iterations are independent (no loop-carried values), vectorised over the
iteration index.

Every body value that depends on the iteration becomes a tensor with a leading axis of the trip
count ``M`` (:class:`_Batched`: ``t[m]`` is the value at iteration ``m``); an operator applied to
such values is the same operator on the stacked tensors with its axes shifted by one, and the
scan outputs are the stacked tensors themselves (a new leading axis of ``M``, as onnxruntime
and the torch exporter read the spec's "concatenating"; the ONNX reference evaluator
``np.vstack``-s them, which agrees for 1-D per-iteration values only). Values that do not
depend on the iteration are converted as in the main graph (folded when known).

A ``Slice`` of a loop-invariant tensor whose bounds depend on the iteration (the bags of
``nn.EmbeddingBag``: ``ids[offsets[m]:offsets[m + 1]]``) has a length that varies with ``m``:
it is *ragged* (:class:`_Ragged`). Gathering rows by it, unsqueezing it, combining it
elementwise (with values of the same bounds) and finally reducing over its ragged axis become
one masked reduction over the whole sliced axis: ``out[m, ..] = reduce_k where(lo[m] <= k <
hi[m], elem(m, k, ..), identity)`` — a gather + reduction. Anything else that depends on the
iteration is an :class:`UnsupportedOpError` naming the Loop, listed before conversion by
:func:`loop_problem`.
"""

from __future__ import annotations

import math
from collections import ChainMap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from polyfuse import ops, te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.analysis import subgraphs
from polyfuse.onnx.common import (
    HANDLERS,
    NODE_CHECKS,
    Ctx,
    Value,
    as_bool,
    attrs_of,
    bidx,
    bshape,
    host_value,
    ints_of,
    iota64,
    node_label,
    register_op,
    reshape_to,
    scalar_of,
)
from polyfuse.onnx.convert import convert_node, located, node_inputs
from polyfuse.onnx.ops_elementwise import BINARY_OPS, UNARY_NAMES, unary_table
from polyfuse.onnx.ops_reduce import REDUCE_OPS

__all__ = ["loop_problem"]

#: elementwise operators: the same operator on stacked values (shapes padded after the M axis)
_ELEMENTWISE = frozenset(BINARY_OPS) | frozenset(UNARY_NAMES) | {"Where", "Clip", "Cast"}
#: operators with a form on iteration-dependent values
_BATCHED = (
    _ELEMENTWISE
    | frozenset(REDUCE_OPS)
    | {
        "Unsqueeze",
        "Squeeze",
        "Reshape",
        "Flatten",
        "Transpose",
        "Gather",
        "Slice",
        "Concat",
        "Shape",
        "Size",
    }
)
#: operators that may read a ragged slice (reductions end it)
_RAGGED_MAPS = (frozenset(BINARY_OPS) | frozenset(UNARY_NAMES) | {"Where"}) - {"Identity"}
_RAGGED_REDUCE = {"ReduceSum": "sum", "ReduceMean": "sum", "ReduceMax": "max", "ReduceMin": "min"}
_MAX_TRIPS = 1 << 20


@dataclass
class _Batched:
    """A body value that depends on the iteration: ``v[m]`` is its value at iteration ``m``."""

    v: Tensor | np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape at one iteration."""
        return tuple(self.v.shape[1:])


@dataclass
class _Ragged:
    """A slice ``src[lo[m]:hi[m]]`` along axis 0 of a loop-invariant tensor of ``n`` rows, after
    gathers and elementwise maps: at iteration ``m`` its shape is ``(hi[m] - lo[m], *rest)`` and
    its element at source row ``k`` is ``elem(m, k, rest_index)``."""

    n: int
    rest: tuple[int, ...]
    start: Tensor  # the Slice's starts / ends: per iteration (M, 1) or invariant (1,)
    end: Tensor
    elem: Callable[[Expr, Expr, tuple[Expr, ...]], Expr]
    batched: tuple[bool, bool]  # whether start / end have the M axis

    def _bound(self, t: Tensor, m: Expr, batched: bool) -> Expr:
        lead = (m,) if batched else ()
        v = t[(*lead, *[as_expr(0)] * (t.ndim - len(lead)))]
        v = te.where(v < 0, v + self.n, v)  # Slice: negative counts from the end, then
        return te.minimum(te.maximum(v, 0), self.n)  # clamps to [0, n] (in v's dtype: exact)

    def lo(self, m: Expr) -> Expr:
        return self._bound(self.start, m, self.batched[0])

    def hi(self, m: Expr) -> Expr:
        return self._bound(self.end, m, self.batched[1])

    def same_bounds(self, o: _Ragged) -> bool:
        return self.n == o.n and self.start is o.start and self.end is o.end


# --------------------------------------------------------------------------- static check


def loop_problem(node: onnx.NodeProto) -> str | None:
    """Why ``node`` (a Loop) cannot be vectorised, from its structure alone; None when it can.

    Propagates value kinds through the body: the iteration number is per-iteration ("B"),
    outer values and the condition are invariant ("U"), a Slice of an invariant tensor with
    per-iteration bounds is ragged ("R").
    """
    carried = node.input[2:]
    if carried:
        return (
            f"{len(carried)} loop-carried value(s): polyfuse vectorises only loops whose "
            "iterations are independent (scan outputs only)"
        )
    body = attrs_of(node)["body"]
    kinds: dict[str, str] = {body.input[0].name: "B", body.input[1].name: "U"}
    for bn in body.node:
        where = f"body node '{node_label(bn)}' ({bn.op_type})"
        if subgraphs(bn):
            return f"{where} has a subgraph of its own (nested control flow)"
        ks = [kinds.get(i, "U") for i in bn.input if i]
        if "R" in ks:
            why = _ragged_problem(bn, [kinds.get(i, "U") if i else "" for i in bn.input])
            if why:
                return f"{where}: {why}"
            kind = "B" if bn.op_type in _RAGGED_REDUCE else "R"
        elif "B" in ks:
            if bn.op_type not in _BATCHED:
                return f"{where} depends on the iteration and has no vectorised form"
            if bn.op_type in ("Shape", "Size"):
                kind = "U"
            elif bn.op_type == "Slice" and kinds.get(bn.input[0], "U") == "U":
                kind = "R"
            else:
                kind = "B"
        else:
            kind = "U"
        kinds.update(dict.fromkeys(bn.output, kind))
    has_cond = len(node.input) > 1 and bool(node.input[1])  # without it the body's is ignored
    if has_cond and kinds.get(body.output[0].name, "U") != "U":
        return "the loop condition depends on the iteration (a while loop)"
    for o in body.output[1:]:
        if kinds.get(o.name) == "R":
            return f"scan output '{o.name}' is a slice whose length varies with the iteration"
    return None


def _ragged_problem(node: onnx.NodeProto, kinds: list[str]) -> str | None:
    op = node.op_type
    if op == "Gather" and kinds[0] == "U" and kinds[1] == "R":
        return None
    if op in ("Unsqueeze", "Identity") and kinds[0] == "R" and "R" not in kinds[1:]:
        return None
    if op in _RAGGED_MAPS or op in _RAGGED_REDUCE:
        return None
    return (
        "reads a slice whose bounds depend on the iteration; only Gather (rows by it), "
        "Unsqueeze, elementwise ops and ReduceSum/Mean/Max/Min over its sliced axis may"
    )


NODE_CHECKS["Loop"] = loop_problem


# --------------------------------------------------------------------------- conversion


@register_op("Loop")
def _loop(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    why = loop_problem(node)
    if why:
        raise UnsupportedOpError(why)
    if not ins or ins[0] is None:
        raise UnsupportedOpError("no trip count M: a loop bounded only by its condition")
    trips = host_value(ctx, node, ins[0], "M").reshape(-1)
    m_count = int(trips[0])
    if not 1 <= m_count <= _MAX_TRIPS:
        raise UnsupportedOpError(f"trip count M={m_count} (1..{_MAX_TRIPS} supported)")
    has_cond = len(ins) > 1 and ins[1] is not None  # without it, M bounds the loop alone
    if has_cond and not bool(host_value(ctx, node, ins[1], "cond").reshape(-1)[0]):
        raise UnsupportedOpError("the condition is false on entry (no iteration runs)")
    body: onnx.GraphProto = at["body"]
    env: dict[str, Any] = {t.name: numpy_helper.to_array(t) for t in body.initializer}
    env[body.input[0].name] = _Batched(np.arange(m_count, dtype=np.int64))
    env[body.input[1].name] = np.asarray(True)
    view = ChainMap(env, ctx.values)
    outer = ctx.node_name
    for pos, bn in enumerate(body.node):
        where = f"body node #{pos} '{node_label(bn)}' ({bn.op_type})"
        b_ins, caps = node_inputs(bn, view, where)
        with located(where):
            if any(isinstance(v, _Batched | _Ragged) for v in b_ins):
                ctx.node_name = node_label(bn)
                outs = _vectorised(ctx, bn, b_ins, attrs_of(bn), m_count)
            else:
                outs = convert_node(ctx, bn, b_ins, caps)
        env.update((o, v) for o, v in zip(bn.output, outs, strict=False) if o)
    ctx.node_name = outer
    cond = view[body.output[0].name]
    if has_cond and (not isinstance(cond, np.ndarray) or not bool(np.all(cond))):
        raise UnsupportedOpError(
            "the body's condition output is not a constant true (a loop that may stop early)"
        )
    return [_stacked(ctx, view[o.name], m_count) for o in body.output[1:]]


def _stacked(ctx: Ctx, v: Any, m_count: int) -> Value:
    """A scan output: the per-iteration values stacked along a new leading axis."""
    if isinstance(v, _Batched):
        return v.v
    if isinstance(v, np.ndarray):
        return np.ascontiguousarray(np.broadcast_to(v, (m_count, *v.shape)))
    return ctx.compute((m_count, *v.shape), lambda m, *i: v[i], "loop_scan")


def _tensor(v: Any) -> Value:
    return v.v if isinstance(v, _Batched) else v


def _vectorised(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], m_count: int
) -> list[Any]:
    """The outputs of a body node that reads per-iteration values."""
    op = node.op_type
    if any(isinstance(v, _Ragged) for v in ins):
        return [_ragged(ctx, node, ins, at, m_count)]
    x = ins[0]
    if op in ("Shape", "Size"):  # per-iteration shapes are uniform: host constants
        s = np.asarray(x.shape, dtype=np.int64)
        if op == "Size":
            return [np.asarray(math.prod(x.shape), dtype=np.int64)]
        return [s[at.get("start", 0) : at.get("end")]]
    if op in _ELEMENTWISE:
        rank = max(len(v.shape) for v in ins if v is not None)
        padded = [_pad_rank(ctx, v, rank) if isinstance(v, _Batched) else v for v in ins]
        return [_Batched(o) for o in HANDLERS[op](ctx, node, padded, at)]
    if op == "Gather":
        return [_gather(ctx, node, ins, at, m_count)]
    if op == "Slice":
        return [_slice(ctx, node, ins, at)]
    if not isinstance(x, _Batched):
        raise UnsupportedOpError(f"{op} with a per-iteration value as its second input")
    r = len(x.shape)
    if op == "Unsqueeze":
        axes = _host_axes(ctx, node, ins, at) or []
        shifted = [a % (r + len(axes)) + 1 for a in axes]
        return [_Batched(HANDLERS[op](ctx, node, [x.v, np.asarray(shifted)], {})[0])]
    if op == "Squeeze":
        axes = _host_axes(ctx, node, ins, at)
        axes = [d for d, s in enumerate(x.shape) if s == 1] if axes is None else axes
        if not axes:
            return [x]
        shifted = [a % r + 1 for a in axes]
        return [_Batched(HANDLERS[op](ctx, node, [x.v, np.asarray(shifted)], {})[0])]
    if op == "Reshape":
        return [_Batched(reshape_to(ctx, x.v, (m_count, *_reshape_dims(ctx, node, ins, at))))]
    if op == "Flatten":
        ax = int(at.get("axis", 1))
        ax = ax + r if ax < 0 else ax
        dims = (m_count, math.prod(x.shape[:ax]), math.prod(x.shape[ax:]))
        return [_Batched(reshape_to(ctx, x.v, dims))]
    if op == "Transpose":
        perm = at.get("perm") or list(range(r))[::-1]
        t = ctx.tensor(x.v)
        y = ops.transpose(t, [0, *[int(p) + 1 for p in perm]], name=ctx.fresh("transpose"))
        return [_Batched(y)]
    if op in REDUCE_OPS:
        return [reduce_op(ctx, node, x, ins, at)]
    if op == "Concat":
        ax = int(at["axis"]) % r
        parts = [
            _tensor(v) if isinstance(v, _Batched) else _stacked(ctx, v, m_count)
            for v in ins
            if v is not None
        ]
        return [_Batched(HANDLERS[op](ctx, node, parts, {"axis": ax + 1})[0])]
    raise UnsupportedOpError(f"{op} on a per-iteration value has no vectorised form")


def _pad_rank(ctx: Ctx, b: _Batched, rank: int) -> Value:
    """``b``'s stacked value with size-1 axes after the M axis up to per-iteration ``rank``
    (numpy broadcasting aligns shapes from the right; the M axis must stay in front)."""
    s = b.shape
    if len(s) >= rank:
        return b.v
    return reshape_to(ctx, b.v, (b.v.shape[0], *[1] * (rank - len(s)), *s))


def _host_axes(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[int] | None:
    if len(ins) > 1 and ins[1] is not None:
        if isinstance(ins[1], _Batched):
            raise UnsupportedOpError("axes that depend on the iteration")
        return ints_of(host_value(ctx, node, ins[1], "axes"))
    return None if "axes" not in at else [int(a) for a in at["axes"]]


def _reshape_dims(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[int]:
    x = ins[0]
    if len(ins) > 1 and isinstance(ins[1], _Batched):
        raise UnsupportedOpError("a reshape whose target shape depends on the iteration")
    shape = ints_of(host_value(ctx, node, ins[1], "shape")) if len(ins) > 1 else list(at["shape"])
    zero = int(at.get("allowzero", 0))
    dims = [x.shape[i] if (s == 0 and not zero) else s for i, s in enumerate(shape)]
    if -1 in dims:
        dims[dims.index(-1)] = math.prod(x.shape) // math.prod(v for v in dims if v != -1)
    return dims


def _gather(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], m_count: int
) -> _Batched:
    data, idx = ins[0], ins[1]
    r = len(data.shape)
    ax = int(at.get("axis", 0)) % r
    if isinstance(data, _Batched) and not isinstance(idx, _Batched):
        return _Batched(HANDLERS["Gather"](ctx, node, [data.v, idx], {"axis": ax + 1})[0])
    if not isinstance(data, _Batched):  # invariant data, per-iteration indices
        y = HANDLERS["Gather"](ctx, node, [data, idx.v], {"axis": ax})[0]
        if ax:
            y = ctx.tensor(y)
            q = y.ndim
            perm = [ax, *range(ax), *range(ax + 1, q)]
            y = ops.transpose(y, perm, name=ctx.fresh("gather_m"))
        return _Batched(y)
    xt, it = ctx.tensor(data.v), ctx.tensor(idx.v)  # both per-iteration
    q, n = len(idx.shape), data.shape[ax]

    def body(m: IterVar, *i: IterVar) -> Expr:
        v = it[(m, *i[ax : ax + q])]
        sub = te.data_index(te.where(v < 0, v + n, v))
        return xt[(m, *i[:ax], sub, *i[ax + q :])]

    shape = (m_count, *data.shape[:ax], *idx.shape, *data.shape[ax + 1 :])
    return _Batched(ctx.compute(shape, body, "gather"))


def _slice(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> Any:
    data = ins[0]
    if len(ins) < 3:
        raise UnsupportedOpError("Slice with starts/ends attributes on a per-iteration value")
    starts, ends = ins[1], ins[2]
    axes = ins[3] if len(ins) > 3 else None
    steps = ins[4] if len(ins) > 4 else None
    if any(isinstance(v, _Batched) for v in (axes, steps)):
        raise UnsupportedOpError("Slice axes or steps that depend on the iteration")
    if isinstance(data, _Batched):
        if isinstance(starts, _Batched) or isinstance(ends, _Batched):
            raise UnsupportedOpError(
                "a slice of a per-iteration value with per-iteration bounds (ragged twice)"
            )
        r = len(data.shape)
        ax = ints_of(host_value(ctx, node, axes, "axes")) if axes is not None else None
        ax = (
            list(range(len(ints_of(host_value(ctx, node, starts, "starts"))))) if ax is None else ax
        )
        shifted = np.asarray([a % r + 1 for a in ax])
        y = HANDLERS["Slice"](ctx, node, [data.v, starts, ends, shifted, steps], {})[0]
        return _Batched(y)
    src = ctx.tensor(data)
    n_axes = int(np.prod(starts.shape))  # starts / ends hold one bound per sliced axis
    ax = ints_of(host_value(ctx, node, axes, "axes")) if axes is not None else list(range(n_axes))
    st = ints_of(host_value(ctx, node, steps, "steps")) if steps is not None else [1] * len(ax)
    if len(ax) != 1 or ax[0] % src.ndim != 0 or st != [1]:
        raise UnsupportedOpError(
            "a slice whose bounds depend on the iteration must cut axis 0 with step 1 "
            f"(axes {ax}, steps {st})"
        )
    lo, hi = (ctx.tensor(_tensor(b)) for b in (starts, ends))
    batched = (isinstance(starts, _Batched), isinstance(ends, _Batched))
    return _Ragged(src.shape[0], src.shape[1:], lo, hi, lambda m, k, r: src[(k, *r)], batched)


def reduce_op(
    ctx: Ctx, node: onnx.NodeProto, x: _Batched, ins: list[Any], at: dict[str, Any]
) -> _Batched:
    r = len(x.shape)
    axes = _host_axes(ctx, node, ins, at)
    if not axes and not at.get("noop_with_empty_axes", 0):
        axes = list(range(r))  # every per-iteration axis (none for a scalar)
    shifted = np.asarray([a % r + 1 for a in axes or []], np.int64)
    # no axes left (a scalar, or noop_with_empty_axes): the handler's elementwise form
    kw = {"keepdims": int(at.get("keepdims", 1)), "noop_with_empty_axes": 1}
    return _Batched(HANDLERS[node.op_type](ctx, node, [x.v, shifted], kw)[0])


# --------------------------------------------------------------------------- ragged slices


def _ragged(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], m_count: int
) -> Any:
    op = node.op_type
    if op == "Identity":
        return ins[0]
    if op == "Gather" and isinstance(ins[1], _Ragged) and not isinstance(ins[0], _Batched):
        return _ragged_gather(ctx, ins[0], ins[1], int(at.get("axis", 0)))
    if op == "Unsqueeze" and isinstance(ins[0], _Ragged):
        return _ragged_unsqueeze(ins[0], _host_axes(ctx, node, ins, at) or [])
    if op in _RAGGED_REDUCE and isinstance(ins[0], _Ragged):
        return _ragged_reduce(ctx, node, ins, at, m_count)
    if op in _RAGGED_MAPS:
        return _ragged_map(ctx, node, ins, at)
    raise UnsupportedOpError(
        f"{op} reads a slice whose bounds depend on the iteration; only Gather (rows by it), "
        "Unsqueeze, elementwise ops and ReduceSum/Mean/Max/Min over its sliced axis may"
    )


def _ragged_gather(ctx: Ctx, data: Value, idx: _Ragged, axis: int) -> _Ragged:
    table = ctx.tensor(data)
    if axis % table.ndim != 0:
        raise UnsupportedOpError(f"Gather along axis {axis} by a ragged slice (axis 0 only)")
    n0, nr = table.shape[0], len(idx.rest)

    def elem(m: Expr, k: Expr, r: tuple[Expr, ...]) -> Expr:
        v = idx.elem(m, k, r[:nr])
        return table[(te.data_index(te.where(v < 0, v + n0, v)), *r[nr:])]

    return _Ragged(idx.n, (*idx.rest, *table.shape[1:]), idx.start, idx.end, elem, idx.batched)


def _ragged_unsqueeze(x: _Ragged, axes: Sequence[int]) -> _Ragged:
    out_rank = 1 + len(x.rest) + len(axes)
    pos = sorted(int(a) % out_rank for a in axes)
    if 0 in pos:
        raise UnsupportedOpError("Unsqueeze before the ragged axis of a slice")
    rest = list(x.rest)
    for p in pos:
        rest.insert(p - 1, 1)
    keep = [d for d in range(len(rest)) if d + 1 not in pos]

    def elem(m: Expr, k: Expr, r: tuple[Expr, ...]) -> Expr:
        return x.elem(m, k, tuple(r[d] for d in keep))

    return _Ragged(x.n, tuple(rest), x.start, x.end, elem, x.batched)


def _ragged_map(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> _Ragged:
    """An elementwise op on ragged slices of the same bounds and other values that broadcast
    over their non-ragged axes."""
    rg = [v for v in ins if isinstance(v, _Ragged)]
    first = rg[0]
    if not all(first.same_bounds(v) for v in rg):
        raise UnsupportedOpError("an elementwise op on slices with different bounds")
    shapes: list[tuple[int, ...]] = []
    for v in ins:
        if isinstance(v, _Ragged):
            shapes.append(v.rest)
            if len(v.rest) != len(first.rest):
                raise UnsupportedOpError("slices of different ranks in one elementwise op")
            continue
        s = tuple(v.shape)
        if len(s) > len(first.rest):  # would align with the ragged axis: only size 1 there
            if len(s) > len(first.rest) + 1 or s[0] != 1:
                raise UnsupportedOpError(
                    f"an operand of shape {s} does not broadcast over a slice of variable length"
                )
            s = s[1:]
        shapes.append(s)
    rest = bshape(*shapes)
    table = BINARY_OPS if node.op_type in BINARY_OPS else None
    if node.op_type == "Where":
        fn: Callable[..., Expr] = lambda c, a, b: te.where(as_bool(c), a, b)
    elif table is not None:
        fn = table[node.op_type]
    else:
        fn = unary_table(at)[node.op_type]
    terms: list[Callable[[Expr, Expr, tuple[Expr, ...]], Expr]] = []
    for v, s in zip(ins, shapes, strict=True):
        terms.append(_term(ctx, v, s))

    def elem(m: Expr, k: Expr, r: tuple[Expr, ...]) -> Expr:
        return as_expr(fn(*[t(m, k, bidx(s, r)) for t, s in zip(terms, shapes, strict=True)]))

    return _Ragged(first.n, rest, first.start, first.end, elem, first.batched)


def _term(ctx: Ctx, v: Any, s: tuple[int, ...]) -> Callable[[Expr, Expr, tuple[Expr, ...]], Expr]:
    """One operand of a ragged elementwise op as a function of (iteration, row, rest index)."""
    if isinstance(v, _Ragged):
        return v.elem
    c = scalar_of(v) if isinstance(v, np.ndarray) else None
    if c is not None:
        return lambda m, k, r: as_expr(c)
    if isinstance(v, _Batched):
        t = ctx.tensor(v.v)
        flat = reshape_to(ctx, t, (t.shape[0], *s))
        return lambda m, k, r: flat[(m, *r)]
    u = ctx.tensor(v)
    flat = reshape_to(ctx, u, s) if tuple(u.shape) != s else u
    return lambda m, k, r: flat[r]


def _identity(kind: str, dtype: str) -> float | int:
    """The start value of a ``kind`` reduction of ``dtype`` values (the dtype's extremes for
    an integer max/min, so integer bags stay integer and exact)."""
    if kind == "sum":
        return 0
    if dtypes.is_int(dtype):
        lim = np.iinfo(np.dtype(dtype))
        return int(lim.min if kind == "max" else lim.max)
    return -math.inf if kind == "max" else math.inf


def _ragged_reduce(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], m_count: int
) -> _Batched:
    """ReduceSum/Mean/Max/Min over the ragged axis: one masked reduction over all ``n`` rows
    (an empty slice gives 0 for a sum, NaN for a mean, -inf/+inf for a max/min)."""
    x: _Ragged = ins[0]
    axes = _host_axes(ctx, node, ins, at)
    rank = 1 + len(x.rest)
    if axes is None or sorted({a % rank for a in axes}) != [0]:
        raise UnsupportedOpError(
            f"{node.op_type} of a ragged slice over axes {axes} (only its sliced axis 0)"
        )
    keep = bool(at.get("keepdims", 1))
    kind = _RAGGED_REDUCE[node.op_type]
    red = {"sum": te.sum, "max": te.max, "min": te.min}[kind]
    shape = (m_count, *((1,) if keep else ()), *x.rest)
    k = te.reduce_axis(x.n, name="kb")

    def body(m: IterVar, *i: IterVar) -> Expr:
        r = tuple(i[1:] if keep else i)
        kf = iota64(k)
        inside = (kf >= x.lo(m)) & (kf < x.hi(m))
        v = x.elem(m, k, r)
        return red(te.where(inside, v, _identity(kind, v.dtype)), axis=k)

    y = ctx.compute(shape, body, "loop_bag")
    if node.op_type == "ReduceMean":
        count = ctx.compute((m_count,), lambda m: te.maximum(x.hi(m) - x.lo(m), 0), "bag_n")
        y = ctx.compute(shape, lambda m, *i: y[(m, *i)] / count[m], "loop_bag_mean")
    return _Batched(y)
