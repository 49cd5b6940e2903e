"""Two-stage reductions: split a reduction whose threads would loop too long.

Policy. A reduction kernel gives every kept point a fixed group of lanes (the cost model's
strategy). When a thread would still combine more than ``ReductionConfig.max_serial``
elements — a huge all-reduce, a few very long rows, long columns — or when an all-reduce is
large enough that one block would leave the GPU idle, the reduced space is flattened to an
index ``q`` and cut into ``P`` chunks of ``C``: a *partial* reduction over
``[p, kept...]`` (``q = p*C + c``, guarded by ``q < R``) runs across many blocks, and the
original tensor becomes a small reduction over ``p``. Both stages are ordinary primitives,
so partitioning, scheduling and stitching treat them like any other.
"""

from __future__ import annotations

from polyfuse.graph.expr import (
    Binary,
    Compare,
    ComputeOp,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    Select,
    Tensor,
)
from polyfuse.graph.graph import Graph
from polyfuse.graph.inline import substitute
from polyfuse.poly.canonical import form_of
from polyfuse.poly.cost import ReductionConfig, choose_reduction_strategy
from polyfuse.poly.device import DeviceSpec

_IDENTITY = {"sum": 0.0, "max": float("-inf"), "min": float("inf")}


def needs_two_stages(t: Tensor, device: DeviceSpec, cfg: ReductionConfig) -> int:
    """Number of chunks ``P`` the reduction should be split into (1 = keep one stage)."""
    form = form_of(t)
    st = choose_reduction_strategy(form, device, cfg)
    if form.kind == "all" and form.reduced > cfg.all_single_block:
        return -(-form.reduced // cfg.chunk)
    if st.serial_per_thread() > cfg.max_serial:
        per_chunk = cfg.max_serial * st.lanes
        return -(-form.reduced // per_chunk)
    return 1


def two_stage(t: Tensor, chunks: int) -> tuple[Tensor, Tensor]:
    """(partial over [kept..., p], the final reduction over p) for reduction ``t``."""
    assert t.op is not None and t.op.reduce is not None
    red = t.op.reduce
    loops = [a for a in red.axes if a.extent > 1]
    total = 1
    for a in loops:
        total *= a.extent
    size = -(-total // chunks)
    axes = tuple(IterVar(a.name, a.lo, a.hi, "data") for a in t.op.axes)
    p = IterVar("p", 0, chunks, "data")
    c = IterVar("c", 0, size, "reduce")
    q: Expr = Binary("add", Binary("mul", p, Const(size, "int32")), c)
    env: dict[int, Expr] = {a.uid: n for a, n in zip(t.op.axes, axes, strict=True)}
    stride = total
    for a in loops:
        stride //= a.extent
        idx = Binary("mod", Binary("floordiv", q, Const(stride, "int32")), Const(a.extent, "int32"))
        env[a.uid] = Binary("add", idx, Const(a.lo, "int32")) if a.lo else idx
    for a in red.axes:
        env.setdefault(a.uid, Const(a.lo, "int32"))
    body = substitute(red.body, env)
    guarded = Select(Compare("lt", q, Const(total, "int32")), body, Const(_IDENTITY[red.op]))
    # p goes first so the innermost kept dimension (the contiguous one of an x-reduce) stays last
    partial = Tensor((chunks,) + t.shape, t.dtype, f"{t.name}_partial")
    partial.op = ComputeOp((p,) + axes, Reduce(red.op, guarded, (c,)), t.op.tag)
    k = IterVar("k", 0, chunks, "reduce")
    final_axes = tuple(IterVar(a.name, a.lo, a.hi, "data") for a in t.op.axes)
    final = Tensor(t.shape, t.dtype, t.name, uid=t.uid)
    final.op = ComputeOp(
        final_axes, Reduce(red.op, Read(partial, (k,) + final_axes), (k,)), t.op.tag
    )
    return partial, final


def split_long_reductions(graph: Graph, device: DeviceSpec, cfg: ReductionConfig) -> list[str]:
    """Rewrite every too-long reduction of ``graph`` into two stages; returns plan notes."""
    notes = []
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        if t.op is None or t.op.reduce is None:
            continue
        chunks = needs_two_stages(t, device, cfg)
        if chunks <= 1:
            continue
        partial, final = two_stage(t, chunks)
        graph.add(partial)
        graph.replace(name, final)
        notes.append(
            f"{name}: {form_of(t)} split into {chunks} partial reductions "
            f"({graph.ident(partial)}) and a final reduction over them"
        )
    return notes
