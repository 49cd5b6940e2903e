"""Two-stage reductions: split a reduction whose threads would loop too long.

Policy. A reduction kernel gives every kept point a fixed group of lanes (the cost model's
strategy). When a thread would still combine more than ``ReductionConfig.max_serial``
elements — a huge all-reduce, a few very long rows, long columns — or when an all-reduce is
large enough that one block would leave the GPU idle, the reduced space is flattened to an
index ``q`` and cut into ``P`` chunks of ``C``: a *partial* reduction over
``[p, kept...]`` (``q = p*C + c``, guarded by ``q < R``) runs across many blocks, and the
original tensor becomes a small reduction over ``p``. Both stages are ordinary primitives,
so partitioning, scheduling and stitching treat them like any other.

A second reason to split (:func:`choose_split`): the outer parallelism cannot fill the SMs —
a few long rows or columns give fewer blocks than ``fill × SMs``. Then the cost model
(:mod:`polyfuse.poly.costs`) compares the one-stage kernel (its few blocks keep only their
lanes' loads in flight: Little's law bounds what they stream) with the split (the partial
reductions across many blocks, then the final reduction over the partials: two launches), each
described as a stream of its launch shape and bytes
(:func:`polyfuse.poly.costs.stream.stream_desc`), using the device's measured bandwidth where
there is one. It never splits a reduction whose input another primitive also reads (the
one-stage kernel may keep the input on chip for those readers: layer/batch norm, softmax);
that refusal is recorded too. Every decision is a typed record
(:class:`polyfuse.base.decision.DecisionKind` ``SPLIT_REDUCTION``) with its reason.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from polyfuse.base.decision import Decided, DecisionKind, DecisionNote
from polyfuse.base.decision_data import SplitData
from polyfuse.graph import dtypes as dt
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
from polyfuse.graph.kinds import is_contraction
from polyfuse.poly.canonical import CanonicalForm, form_of
from polyfuse.poly.cost import ReductionConfig, ReductionStrategy, choose_reduction_strategy
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.costs.stream import stream_desc
from polyfuse.poly.device import DeviceSpec

_IDENTITY = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


def _identity(op: str, dtype: str) -> Const:
    """The neutral value of reduction ``op`` as a constant of the body's ``dtype``. (A weak
    float one turned an int32 sum's partials into float ones: their kernel did not compile,
    ``pf_allreduce_y`` got an int and a float scratch, and float partials of an int sum
    lose exactness past 2**24.)"""
    if dt.is_float(dtype):
        return Const(_IDENTITY[op], dtype, weak=False)
    if dtype == "bool":
        return Const(op in ("prod", "min"), "bool", weak=False)
    info = np.iinfo(dt.numpy_dtype(dtype))
    value = {"sum": 0, "prod": 1, "max": int(info.min), "min": int(info.max)}[op]
    return Const(value, dtype, weak=False)


@dataclass(frozen=True)
class SplitModel:
    """Thresholds of the split-across-blocks cost model (one declared place)."""

    fill: float = 0.5  # candidates: fewer blocks than fill x SMs
    min_elements: int = 1 << 20  # smaller reductions stay one stage (launch overhead dominates)
    min_chunk: int = 4096  # elements per partial reduction, at least
    target_waves: int = 2  # partial-reduction blocks, in multiples of the SM count
    gain: float = 0.9  # split only when modelled at most this fraction of one stage


@dataclass(frozen=True)
class SplitDecision:
    """Whether one reduction is split into partials across blocks, and why."""

    tensor: str
    form: str
    chunks: int  # 1: one stage
    reason: str
    modelled_us: tuple[float, float] | None = None  # (one stage, split), modelled

    @property
    def record(self) -> Decided:
        """This choice as the plan's decision record (made: split into chunks)."""
        kinds = (DecisionKind.COST_MODEL, DecisionKind.SPLIT_REDUCTION)
        data = SplitData(self.tensor, self.form, self.chunks, self.modelled_us)
        return Decided(kinds, self.reason, data, (self.tensor,), self.chunks > 1)

    decision = record  # the name poly's callers and tests use


def _readers_of_input(graph: Graph, name: str, t: Tensor) -> list[str]:
    """Other primitives reading the largest tensor ``t`` reduces."""
    assert t.op is not None
    big = max(t.op.inputs(), key=lambda s: s.size, default=None)
    if big is None:
        return []
    return [
        n
        for n, p in graph.prims.items()
        if n != name
        and p.tensor.op is not None
        and any(s.uid == big.uid for s in p.tensor.op.inputs())
    ]


def choose_split(
    graph: Graph,
    name: str,
    device: DeviceSpec,
    cfg: ReductionConfig,
    model: SplitModel | None = None,
) -> SplitDecision:
    """How many partial reductions reduction ``name`` becomes (1: one stage), with the reason."""
    model = model or SplitModel()
    t = graph.prims[name].tensor
    form = form_of(t)
    if is_contraction(t):
        why = (
            "one stage: a contraction (a product of reads, two reused across outputs): the GEMM "
            "path tiles its reduction (poly/tiling.py)"
        )
        return SplitDecision(name, str(form), 1, f"{name}: {form}: {why}")
    chunks = needs_two_stages(t, device, cfg)
    if chunks > 1:
        why = (
            f"all-reduce over {form.reduced} > {cfg.all_single_block} elements"
            if form.kind == "all" and form.reduced > cfg.all_single_block
            else f"a thread would combine more than {cfg.max_serial} elements"
        )
        return SplitDecision(name, str(form), chunks, f"{name}: {form}: split, {why}")
    st = choose_reduction_strategy(form, device, cfg)
    blocks = -(-form.kept_extent // max(1, st.kept_tile))  # a partial last tile is a block
    if blocks >= model.fill * device.sms:
        why = f"one stage: {blocks} blocks fill {device.sms} SMs ({blocks / device.sms:.1f} waves)"
        return SplitDecision(name, str(form), 1, f"{name}: {form}: {why}")
    readers = _readers_of_input(graph, name, t)
    if readers:
        why = (
            f"one stage although {blocks} blocks leave SMs of {device.sms} idle: its input is "
            f"also read by {', '.join(sorted(readers))}, which a split would read again"
        )
        return SplitDecision(name, str(form), 1, f"{name}: {form}: {why}")
    total = form.kept_extent * form.reduced
    if total < model.min_elements:
        why = f"one stage: {total} elements < {model.min_elements}, a second launch would dominate"
        return SplitDecision(name, str(form), 1, f"{name}: {form}: {why}")
    chunks = min(
        -(-model.target_waves * device.sms // blocks), max(1, form.reduced // model.min_chunk)
    )
    if chunks <= 1:
        why = f"one stage: {form.reduced} reduced elements are too few to cut into chunks"
        return SplitDecision(name, str(form), 1, f"{name}: {form}: {why}")
    one, two = _modelled(form, st, blocks, chunks, device, cfg)
    us = (round(one, 3), round(two, 3))
    src = "measured" if device.measured else "datasheet"
    head = (
        f"{blocks} blocks for {device.sms} SMs: modelled {one:.2f} us in one stage, "
        f"{two:.2f} us as {chunks} partial reductions + a final one ({src} figures)"
    )
    if two <= model.gain * one:
        return SplitDecision(name, str(form), chunks, f"{name}: {form}: split, {head}", us)
    return SplitDecision(name, str(form), 1, f"{name}: {form}: one stage, {head}", us)


def _modelled(
    form: CanonicalForm,
    st: ReductionStrategy,
    blocks: int,
    chunks: int,
    device: DeviceSpec,
    cfg: ReductionConfig,
) -> tuple[float, float]:
    """Modelled times (µs) of the reduction in one stage and split into ``chunks`` partial
    reductions plus a final one (the cost model, :mod:`polyfuse.poly.costs`)."""
    kept, total = form.kept_extent, form.kept_extent * form.reduced
    one = stream_desc(
        "one stage",
        blocks,
        st.threads,
        4 * total,
        4 * kept,
        serial=st.serial_per_thread(),
        combine_lanes=st.lanes,
    )
    # the partials reduce rows of one chunk each; the final stage reduces across the chunks
    partial_form = replace(
        form,
        kind="y" if form.kind == "all" else form.kind,
        kept=(chunks, *form.kept),
        reduced=-(-form.reduced // chunks),
    )
    sp = choose_reduction_strategy(partial_form, device, cfg)
    partial_blocks = max(1, partial_form.kept_extent // max(1, sp.kept_tile))
    partial = stream_desc(
        "partials",
        partial_blocks,
        sp.threads,
        4 * total,
        4 * kept * chunks,
        serial=sp.serial_per_thread(),
        combine_lanes=sp.lanes,
    )
    final_form = replace(form, kind="x" if form.kept else "all", reduced=chunks)
    sf = choose_reduction_strategy(final_form, device, cfg)
    final = stream_desc(
        "final",
        max(1, kept // max(1, sf.kept_tile)),
        sf.threads,
        4 * kept * chunks,
        4 * kept,
        serial=sf.serial_per_thread(),
        combine_lanes=sf.lanes,
    )
    t_one = model_kernel(one, device).us
    t_two = model_kernel(partial, device).us + model_kernel(final, device).us
    return t_one, t_two


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
    guarded = Select(Compare("lt", q, Const(total, "int32")), body, _identity(red.op, body.dtype))
    # p goes first so the innermost kept dimension (the contiguous one of an x-reduce) stays last
    partial = Tensor((chunks,) + t.shape, t.dtype, f"{t.name}_partial")
    partial.op = ComputeOp((p,) + axes, Reduce(red.op, guarded, (c,), red.accumulate), t.op.tag)
    return partial, combine_parts(t, partial, red.accumulate)


def combine_parts(t: Tensor, part: Tensor, accumulate: str | None) -> Tensor:
    """``t`` (same uid, name and dtype) as its reduction operator applied to ``part`` over
    ``part``'s leading axis: the final stage of a two-stage reduction or of split-K."""
    assert t.op is not None and t.op.reduce is not None
    k = IterVar("k", 0, part.shape[0], "reduce")
    axes = tuple(IterVar(a.name, a.lo, a.hi, "data") for a in t.op.axes)
    out = Tensor(t.shape, t.dtype, t.name, uid=t.uid)
    out.op = ComputeOp(
        axes, Reduce(t.op.reduce.op, Read(part, (k, *axes)), (k,), accumulate), t.op.tag
    )
    return out


def split_long_reductions(
    graph: Graph,
    device: DeviceSpec,
    cfg: ReductionConfig,
    decisions: list[Decided] | None = None,
) -> list[str]:
    """Rewrite every reduction of ``graph`` that :func:`choose_split` splits into two stages;
    returns the plan's rewrite notes, one split's record each (and appends every decision,
    split or not, to ``decisions``)."""
    notes: list[str] = []
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        if t.op is None or t.op.reduce is None:
            continue
        choice = choose_split(graph, name, device, cfg)
        if decisions is not None:
            decisions.append(choice.record)
        chunks = choice.chunks
        if chunks <= 1:
            continue
        partial, final = two_stage(t, chunks)
        graph.add(partial)
        graph.replace(name, final)
        why = (
            f"{name}: {form_of(t)} split into {chunks} partial reductions "
            f"({graph.ident(partial)}) and a final reduction over them"
        )
        rec = choice.record
        subject = (*rec.subject, graph.ident(partial))
        notes.append(DecisionNote(replace(rec, reason=why, subject=subject)))
    return notes
