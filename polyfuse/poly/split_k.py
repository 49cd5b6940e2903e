"""Split-K: a contraction whose output tiles cannot fill the SMs sums its reduction in parts.

A float32 GEMM with few output tiles and a long reduction — BERT-base's FFN down projection,
``M`` 1024 (8 sequences of 128 tokens), ``N`` 768, ``K`` 3072 — has no good tiling: tiles of
128 threads (8 × 8 outputs each, the loop ≥ 85 % FFMA) give 96 blocks for 132 SMs, and the
model's best, 384 blocks of 64 threads, spends more of its loop on shared-memory loads
(189 µs modelled on sm_90). Summing the reduction in ``S`` parts,

    part[p, i, j] = sum_{c < K / S} a[i, p * C + c] * b[p * C + c, j]      (C = K / S)
    out[i, j]     = sum_{p < S} part[p, i, j]

gives ``S`` times the tiles (``p`` is a batch dim of one GEMM: 384 blocks of 128 threads at
``S`` 4, 141 µs) and a memory-bound reduction over ``p``, which takes the GEMM's epilogue (9 µs).

Decision (the cost model, :mod:`polyfuse.poly.costs`): each variant is priced by the GEMM tile
ranking (:func:`polyfuse.poly.tiling.rank_gemm_tiles`) on the contraction alone — a
one-primitive graph over placeholders, scheduled by isl and matched by
:func:`polyfuse.poly.tiling.detect_gemm` as the compiler would — plus, for a split, the final
reduction as a stream of its bytes (:func:`polyfuse.poly.costs.stream.stream_desc`). A split is
taken when it is modelled at most :attr:`SplitKModel.gain` of one stage. Candidates: float32
contractions (the CUDA-core tiles; tensor-core GEMMs already keep more tiles in flight, and their
model gains nothing from a split), a reduction axis of at least :attr:`SplitKModel.min_k` that
``S`` divides into parts that are whole k-tiles, and a one-stage tiling of fewer blocks than
:attr:`SplitKModel.fill` waves. The sums are reassociated (``S`` partial sums added at the end):
results differ from one stage by float32 rounding only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import islpy as isl

from polyfuse.base.decision import Decided, DecisionNote, Refusal
from polyfuse.base.errors import ExpressionError, ScheduleError
from polyfuse.graph import dtypes as dt
from polyfuse.graph.expr import (
    Binary,
    ComputeOp,
    Const,
    Expr,
    ExprMutator,
    IterVar,
    Read,
    Reduce,
    Tensor,
    substitute,
)
from polyfuse.graph.graph import Graph, build_graph
from polyfuse.graph.kinds import OpKind, is_contraction
from polyfuse.graph.partition import Micrograph
from polyfuse.graph.structure import compute_text, structural_key
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.costs.stream import stream_desc
from polyfuse.poly.device import DeviceSpec
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.model import build_model
from polyfuse.poly.schedule import Feedback, compute_schedule
from polyfuse.poly.split import SplitDecision, combine_parts
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles


@dataclass(frozen=True)
class SplitKModel:
    """Thresholds of the split-K decision (one declared place)."""

    min_k: int = 1024  # reduction axes shorter than this stay whole
    min_part: int = 256  # elements of the split axis per part, at least
    ktile: int = 32  # parts are whole k-tiles of the CUDA-core tiles (their largest)
    parts: tuple[int, ...] = (2, 3, 4, 6, 8)  # S priced
    fill: float = 4.0  # one-stage tilings of at least this many waves of blocks stay
    gain: float = 0.9  # split only when modelled at most this fraction of one stage


def check_split_k(parts: int | None) -> None:
    """Refuse a ``MappingConfig.split_k`` that is no part count (None, or 1 and more)."""
    if parts is not None and (isinstance(parts, bool) or not isinstance(parts, int) or parts < 1):
        raise ExpressionError(
            f"MappingConfig.split_k={parts!r}: give a part count (1 = never split) or None for "
            "the cost model's choice"
        )


class _Reads(ExprMutator):
    """Reads re-pointed at placeholders (one per tensor read) and loop variables renamed."""

    def __init__(self, env: dict[int, Expr]) -> None:
        self.env: dict[int, Expr] = env
        self.inputs: dict[int, Tensor] = {}

    def visit_IterVar(self, e: IterVar) -> Expr:
        return self.env.get(e.uid, e)

    def visit_Read(self, e: Read) -> Expr:
        src = e.tensor
        t = self.inputs.setdefault(src.uid, Tensor(src.shape, src.dtype, f"in{len(self.inputs)}"))
        return Read(t, tuple(self.visit(i) for i in e.indices))


def _axis(t: Tensor, model: SplitKModel) -> IterVar | None:
    """The reduction axis a split cuts: the longest, when long enough."""
    assert t.op is not None and t.op.reduce is not None
    k = max(t.op.reduce.axes, key=lambda a: a.extent, default=None)
    return k if k is not None and k.extent >= model.min_k else None


def partial(t: Tensor, k: IterVar, parts: int, name: str) -> Tensor:
    """``t``'s contraction over ``parts`` parts of reduction axis ``k``: a leading data axis
    ``p`` and ``k = p * C + c`` (``C = extent / parts``), in the accumulator's dtype."""
    assert t.op is not None and t.op.reduce is not None
    red = t.op.reduce
    size = k.extent // parts
    p = IterVar("p", 0, parts, "data")
    c = IterVar(k.name, 0, size, "reduce")
    axes = tuple(IterVar(a.name, a.lo, a.hi, "data") for a in t.op.axes)
    env: dict[int, Expr] = {a.uid: b for a, b in zip(t.op.axes, axes, strict=True)}
    at: Expr = Binary("add", Binary("mul", p, Const(size, "int32", weak=False)), c)
    env[k.uid] = Binary("add", at, Const(k.lo, "int32", weak=False)) if k.lo else at
    body = substitute(red.body, env)
    acc = red.accumulate or dt.accumulate_dtype(red.op, red.body.dtype)
    others = tuple(c if a.uid == k.uid else a for a in red.axes)
    out = Tensor((parts, *t.shape), acc, name)
    out.op = ComputeOp((p, *axes), Reduce(red.op, body, others, acc), t.op.tag)
    return out


def _alone(t: Tensor, ctx: isl.Context) -> tuple[Graph, str]:
    """A graph of ``t``'s computation alone, its reads re-pointed at placeholders."""
    assert t.op is not None
    mut = _Reads({})
    body = mut.visit(t.op.body)
    lone = Tensor(t.shape, t.dtype, "contraction")
    lone.op = ComputeOp(t.op.axes, body, t.op.tag)
    g = build_graph(list(mut.inputs.values()), [lone], ctx)
    (name,) = [n for n in g.topo_order() if g.prims[n].tensor.op is not None]
    return g, name


def _priced(t: Tensor, device: DeviceSpec, ctx: isl.Context) -> tuple[float, int] | None:
    """(modelled µs, blocks) of the best CUDA-core tiling of ``t`` alone, or None when it
    is no tiled GEMM."""
    g, name = _alone(t, ctx)
    try:
        sm = compute_schedule(build_model(g, Micrograph(0, [name], OpKind.OPAQUE), ctx))
    except (Feedback, ScheduleError):  # isl's budget: no estimate, the contraction stays
        return None
    shape = detect_gemm(sm)
    if isinstance(shape, Refusal):
        return None
    ranked = rank_gemm_tiles(shape, device, limit=1)
    if not ranked:
        return None
    best = ranked[0]
    assert best.estimate is not None
    return best.modelled_us, best.estimate.blocks


def _final_us(t: Tensor, parts: int, device: DeviceSpec) -> float:
    """The final reduction over ``parts`` partials as a stream: every partial read once,
    the result (and its epilogue) written once, one output per thread."""
    n = 1
    for s in t.shape:
        n *= s
    threads = 256
    desc = stream_desc(
        "final", max(1, -(-n // threads)), threads, 4 * parts * n,
        dt.numpy_dtype(t.dtype).itemsize * n, serial=parts,
    )  # fmt: skip
    return model_kernel(desc, device).us


def choose_split_k(
    graph: Graph,
    name: str,
    device: DeviceSpec,
    cfg: MappingConfig | None = None,
    model: SplitKModel | None = None,
) -> SplitDecision | None:
    """How many parts contraction ``name`` is summed in (module doc; ``cfg.split_k`` forces
    it), or None when it is no candidate (not a float32 contraction of a long reduction, or a
    forced tiling: ``gemm_tile`` tiles the one-stage GEMM)."""
    model = model or SplitKModel()
    cfg = cfg or MappingConfig()
    t = graph.prims[name].tensor
    if t.op is None or t.op.reduce is None or not is_contraction(t) or not cfg.gemm:
        return None
    if cfg.allow_tf32 or t.dtype != "float32" or any(s.dtype != "float32" for s in t.op.inputs()):
        return None
    forced = cfg.split_k
    if forced is None and (cfg.gemm_tile is not None or cfg.mma_tile is not None):
        return None  # a tiling the user forced is one stage's
    k = _axis(t, replace(model, min_k=1) if forced else model)
    if k is None or forced == 1:
        return None
    form = f"contraction over {k.name} ({k.extent})"
    if forced:
        if k.extent % forced:
            why = f"one stage: MappingConfig.split_k={forced} does not divide {k.extent}"
            return SplitDecision(name, form, 1, f"{name}: {form}: {why}")
        why = f"split-K in {forced} parts, forced by MappingConfig.split_k"
        return SplitDecision(name, form, forced, f"{name}: {form}: {why}")
    one = _priced(t, device, graph.ctx)
    if one is None:
        return None
    us1, blocks = one
    if blocks >= model.fill * device.sms:
        why = f"one stage: {blocks} blocks of its best tiling fill {device.sms} SMs"
        return SplitDecision(name, form, 1, f"{name}: {form}: {why}")
    best: tuple[float, int, float, int] | None = None
    for s in model.parts:
        size = k.extent // s
        if k.extent % s or size % model.ktile or size < model.min_part:
            continue
        got = _priced(partial(t, k, s, "part"), device, graph.ctx)
        if got is None:
            continue
        us_p, blocks_p = got
        total = us_p + _final_us(t, s, device)
        if best is None or total < best[0]:
            best = (total, s, us_p, blocks_p)
    if best is None:
        why = f"one stage: no part count divides {k.extent} into whole k-tiles"
        return SplitDecision(name, form, 1, f"{name}: {form}: {why}")
    total, s, us_p, blocks_p = best
    us = (round(us1, 3), round(total, 3))
    src = "measured" if device.measured else "datasheet"
    head = (
        f"{blocks} blocks for {device.sms} SMs: modelled {us1:.1f} us in one stage, "
        f"{total:.1f} us in {s} parts ({blocks_p} blocks, {us_p:.1f} us) + a final sum "
        f"over them ({src} figures)"
    )
    if total <= model.gain * us1:
        return SplitDecision(name, form, s, f"{name}: {form}: split-K, {head}", us)
    return SplitDecision(name, form, 1, f"{name}: {form}: one stage, {head}", us)


#: What the compile cache keeps of a decision (``chunks`` 0: no candidate); the reason
#: without the primitive's name, which another compile of the structure spells otherwise
SPLIT_K_FIELDS = (("chunks", "form", "why", "us"),)


class DecisionStore(Protocol):
    """Where decisions are kept across compiles (:class:`polyfuse.cache.CompileCache`)."""

    def get(self, key: str, fields: Sequence[Sequence[str]] | None = None) -> Any: ...
    def put(self, key: str, value: Any) -> None: ...


def _decided(
    graph: Graph,
    name: str,
    device: DeviceSpec,
    cfg: MappingConfig | None,
    store: DecisionStore | None,
    salt: str,
) -> SplitDecision | None:
    """:func:`choose_split_k`, kept in ``store`` under the primitive's structural key."""
    if store is None:
        return choose_split_k(graph, name, device, cfg)
    key = structural_key(graph, [name], f"{salt}|split_k").digest
    entry = store.get(key, SPLIT_K_FIELDS)
    if entry is not None:
        if not entry["chunks"]:
            return None
        us = tuple(entry["us"]) if entry["us"] else None
        why = f"{name}: {entry['why']}"
        return SplitDecision(name, entry["form"], entry["chunks"], why, us)  # type: ignore[arg-type]
    choice = choose_split_k(graph, name, device, cfg)
    if choice is None:
        store.put(key, {"chunks": 0, "form": "", "why": "", "us": None})
    else:
        why = choice.reason.removeprefix(f"{name}: ")
        us = list(choice.modelled_us) if choice.modelled_us else None
        store.put(key, {"chunks": choice.chunks, "form": choice.form, "why": why, "us": us})
    return choice


def split_contractions(
    graph: Graph,
    device: DeviceSpec,
    cfg: MappingConfig | None = None,
    decisions: list[Decided] | None = None,
    store: DecisionStore | None = None,
    salt: str = "",
) -> list[DecisionNote]:
    """Rewrite every contraction :func:`choose_split_k` splits into a partial contraction
    and a final sum; returns one plan note per split (and appends every decision made about a
    candidate to ``decisions``). Contractions of one structure are priced once, and, with a
    ``store`` (the compile cache; ``salt`` its context), once across compiles."""
    notes: list[DecisionNote] = []
    memo: dict[str, SplitDecision | None] = {}
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        if t.op is None or t.op.reduce is None:
            continue
        key = f"{[s.shape for s in t.op.inputs()]}|{compute_text(t, lambda _: '')}"
        if key not in memo:
            memo[key] = _decided(graph, name, device, cfg, store, salt)
        choice = memo[key]
        if choice is None:
            continue
        reason = choice.reason.replace(f"{choice.tensor}: ", f"{name}: ", 1)
        choice = replace(choice, tensor=name, reason=reason)
        if decisions is not None:
            decisions.append(choice.record)
        if choice.chunks <= 1:
            continue
        k = _axis(t, SplitKModel(min_k=1))
        assert k is not None
        part = partial(t, k, choice.chunks, f"{t.name}_part")
        graph.add(part)
        graph.replace(name, combine_parts(t, part, part.dtype))
        rec = choice.record
        why = (
            f"{name}: {choice.form} summed in {choice.chunks} parts "
            f"({graph.ident(part)}) and a final sum over them"
        )
        subject = (*rec.subject, graph.ident(part))
        notes.append(DecisionNote(replace(rec, reason=why, subject=subject)))
    return notes
