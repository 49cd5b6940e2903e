"""Sibling contractions on one input merge into one contraction over concatenated weights.

Attention's Q, K and V projections are three matmuls of the same activation ``x`` with
different constant weights: three kernels that each stage ``x`` in shared memory (Layer 3
cannot pack them for that reason). Two or more reductions (``c_i = sum_k x[.., k] * W_i[k, j]``)
are *siblings* when

1. their expression trees are equal up to which tensors they read (same operators, constants,
   reduction op and accumulator, dtype; loop variables by position),
2. at every read position where they read the same tensor, its isl access relation is the
   same (``{ S[i, j, k] -> x[i, k] }``, compared with the concatenated axis projected out), and
   their iteration domains (the reduction domain included) are equal but for that axis,
3. at every position where they read different tensors, those are graph constants read with
   the same subscripts, one of which is a plain data axis ``j`` of the compute (the
   *concatenated axis*) that nothing else in the body uses, and the constants' shapes differ
   in that dimension only.

They become one compute over ``j`` in ``[0, sum of the extents)`` reading
``W = concat(W_1, W_2, ...)`` along ``j``'s dimension — a new constant made now, exactly (a
concatenation rounds nothing; each output element sums the same products in the same order,
so values are bit-identical to the separate contractions). A *per-column epilogue* chain that
every sibling has in the same form (each step the single reader of the one before, reading
it at its own index, its other operands constants indexed by ``j`` alone: the bias add
``y = c + b[j]``) merges along, its constants concatenated too (``b = concat(b_1, b_2, ...)``),
so the merged GEMM's epilogue reads the accumulator where it is computed. The last step of
each sibling's chain (or the sibling itself) becomes the slice ``merged[.., j + offset_i]``,
which ``layout_fold`` folds into the loads of the contractions that read it (through moves:
attention's head split). So the pass runs after ``batchnorm_fold`` (a scale folds into a
weight before the weight is concatenated; a slice has no weight to fold into) and before
``layout_fold`` (the slices fold in the same round).

Refused, and recorded: a sibling whose differing operands are not constants (the merged weight
must exist at compile time), siblings reading the shared input through different accesses,
weights whose shapes differ in a dimension other than the concatenated one, a sibling that is
a graph output (it would become a slice of the merged result, which no store fold can write:
a slice is not onto the merged tensor, so a copy kernel would remain), a sibling whose slice
would be read by anything but contractions (an elementwise or reduction reader would take it
as an epilogue of the merged GEMM reading the accumulator at an offset, which the GEMM path in
poly/ does not tile: tiled GEMMs would become a plain loop nest).

A contraction that reads two siblings (attention's scores ``q @ k^T``) reads, once the slices
fold, the merged tensor through two access relations: the GEMM promotion stages one shared
tile per access relation (:func:`polyfuse.poly.gemm_shape.access_groups`; isl computes
each its own footprint box; on tensor cores operand B's tile is the array's further access),
so it stays a tiled GEMM and attention merges Q, K and V into one projection. The merge record
names such readers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import islpy as isl
import numpy as np

from polyfuse.base.decision import DecisionKind, Refusal, refused
from polyfuse.graph.access import affine_str
from polyfuse.graph.expr import (
    ComputeOp,
    DataIndex,
    Expr,
    ExprMutator,
    IterVar,
    Read,
    Tensor,
    walk,
)
from polyfuse.graph.graph import Graph, Primitive
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.passes.layout_fold import is_move
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, is_identity_read, reads_of, with_body
from polyfuse.graph.structure import compute_text

FORM_MISMATCH = DecisionKind.FORM_MISMATCH  # why two siblings do not merge

NAME = "merge_siblings"


def sibling_form(t: Tensor) -> str:
    """The expression tree of ``t`` with every read's tensor and subscripts left out and the
    loop ranges left out: siblings have equal forms."""
    assert t.op is not None
    text = compute_text(t, lambda _: "")
    body = text.split("=", 1)[1]
    return f"{t.dtype}:{len(t.op.axes)}:{_strip_subscripts(body)}"


def _strip_subscripts(text: str) -> str:
    """Key text with the subscripts of every read removed (``T[a0,k0]`` -> ``T[]``)."""
    out, depth = [], 0
    for ch in text:
        if ch == "[":
            if depth == 0:
                out.append("[")
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth == 0:
                out.append("]")
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _anon(m: isl.Map) -> isl.Map:
    return m.set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, "X")


def _drop_axis(m: isl.Map | isl.Set, t: Tensor, k: int) -> isl.Map | isl.Set:
    """``m`` (over compute ``t``'s statement) with data axis ``k`` projected out. Axes of
    extent 1 are no isl dimension (:func:`polyfuse.graph.access.loop_names`): the axis' isl
    position counts the longer axes before it, and an axis of extent 1 has nothing to drop."""
    assert t.op is not None
    if t.op.axes[k].extent == 1:
        return m
    pos = sum(1 for a in t.op.axes[:k] if a.extent > 1)
    kind = isl.dim_type.in_ if isinstance(m, isl.Map) else isl.dim_type.set
    return m.project_out(kind, pos, 1)


@dataclass(frozen=True)
class _Match:
    """How sibling ``b`` lines up with the anchor: the concatenated axis (its position among
    the data axes) and, per read position of a weight indexed by it, the weight dimension."""

    axis: int
    cat_dims: dict[int, int]  # read position -> dimension of the weight along the axis


def _cat_positions(graph: Graph, t: Tensor, reads: list[Read], k: int) -> dict[int, int] | None:
    """The reads of compute ``t`` that use data axis ``k`` (read position -> subscript
    position), when each is a constant read with the axis as one plain subscript and the axis
    appears nowhere else in the body; None otherwise."""
    assert t.op is not None
    v = t.op.axes[k]
    out: dict[int, int] = {}
    for i, r in enumerate(reads):
        uses = [n for s in r.indices for n in walk(s) if n is v]
        if not uses:
            continue
        plain = [d for d, s in enumerate(r.indices) if s is v]
        if not graph.is_constant(r.tensor) or len(uses) != 1 or len(plain) != 1:
            return None
        out[i] = plain[0]
    if sum(1 for n in walk(t.op.body) if n is v) != len(out):
        return None
    return out


def _match(graph: Graph, a: Primitive, b: Primitive) -> _Match | Refusal | None:
    """``b`` as a sibling of anchor ``a``: a match, a refusal (FORM_MISMATCH, about ``a`` and
    ``b``, with its reason), or None when the two are not siblings at all (no shared
    non-constant read at the same position, or nothing differs)."""
    ta, tb = a.tensor, b.tensor
    assert ta.op is not None and tb.op is not None
    ra, rb = reads_of(ta.op.body), reads_of(tb.op.body)
    if len(ra) != len(rb) or any(
        [r for r, _ in p.relations.reads] != rs for p, rs in ((a, ra), (b, rb))
    ):
        return None  # reads[i] of the relations is read i of the body (both in body order)
    same = [i for i, (x, y) in enumerate(zip(ra, rb, strict=True)) if x.tensor.uid == y.tensor.uid]
    shared = [i for i in same if not graph.is_constant(ra[i].tensor)]
    differ = [i for i in range(len(ra)) if i not in same]
    if not shared or not differ:
        return None  # nothing in common, or the same computation (CSE's business)
    an, bn = a.name, b.name
    subject = (an, bn)
    xs = ", ".join(dict.fromkeys(graph.ident(ra[i].tensor) for i in shared))
    runtime = [
        graph.ident(t)
        for i in differ
        for t in (ra[i].tensor, rb[i].tensor)
        if not graph.is_constant(t)
    ]
    if runtime:
        return refused(
            FORM_MISMATCH,
            (
                f"{an} and {bn} (both reading {xs}) differ in operands that are not constants "
                f"({', '.join(runtime)}): a merged weight must be computed at compile time"
            ),
            *subject,
        )
    # 1. the concatenated axis: indexes every differing weight, no non-constant read
    axis = None
    for k in range(len(ta.op.axes)):
        pa, pb = _cat_positions(graph, ta, ra, k), _cat_positions(graph, tb, rb, k)
        if pa is not None and pa == pb and set(differ) <= set(pa):
            axis = k
    if axis is None:
        return refused(
            FORM_MISMATCH,
            (
                f"{an} and {bn} (both reading {xs}) read different constants "
                f"({', '.join(graph.ident(rb[i].tensor) for i in differ)}) but no data axis "
                "indexes only constants, as a plain subscript: nothing to concatenate along"
            ),
            *subject,
        )
    # 2. equal loop ranges but for the axis (then the isl tuples have equal dimensions)
    ranges = [
        [(v.lo, v.hi) for k, v in enumerate(t.op.axes + t.op.reduce_axes) if k != axis]
        for t in (ta, tb)
    ]
    if ranges[0] != ranges[1]:
        return refused(
            FORM_MISMATCH,
            (
                f"{an} {list(ta.shape)} and {bn} {list(tb.shape)} (both reading {xs}) differ in "
                f"a dimension other than the concatenated axis {axis}: shapes not compatible"
            ),
            *subject,
        )
    # 3. isl: every shared tensor is read through the same access, over the same iteration
    # domain (the reduction domain included), the axis projected out (the extents along it
    # may differ; the shared reads do not use it)
    da = _drop_axis(a.relations.domain.set_tuple_name("S"), ta, axis)
    db = _drop_axis(b.relations.domain.set_tuple_name("S"), tb, axis)
    if not da.is_equal(db):  # pragma: no cover - equal ranges give equal boxes
        return refused(
            FORM_MISMATCH,
            f"{an} and {bn} (both reading {xs}): different iteration domains",
            *subject,
        )
    for i in shared:
        ma = _anon(_drop_axis(a.relations.reads[i][1], ta, axis))
        mb = _anon(_drop_axis(b.relations.reads[i][1], tb, axis))
        if not ma.is_equal(mb):
            return refused(
                FORM_MISMATCH,
                (
                    f"{an} and {bn} read {graph.ident(ra[i].tensor)} through different "
                    f"accesses: {_short(ma)} vs {_short(mb)}"
                ),
                *subject,
            )
    # 4. the weights: the same subscripts, shapes equal but along the axis, read whole
    cat = _cat_positions(graph, ta, ra, axis)
    assert cat is not None
    va, vb = ta.op.axes[axis], tb.op.axes[axis]
    for i, d in cat.items():
        wa, wb = ra[i].tensor, rb[i].tensor
        fits = (
            wa.dtype == wb.dtype
            and wa.ndim == wb.ndim
            and all(
                x == y for n, (x, y) in enumerate(zip(wa.shape, wb.shape, strict=True)) if n != d
            )
            and (va.lo, va.hi, vb.lo, vb.hi) == (0, wa.shape[d], 0, wb.shape[d])
            and positional_subscripts(ta, ra[i]) == positional_subscripts(tb, rb[i])
        )
        if not fits:
            return refused(
                FORM_MISMATCH,
                (
                    f"{an} and {bn}: weights {graph.ident(wa)} {list(wa.shape)} and "
                    f"{graph.ident(wb)} {list(wb.shape)} differ in a dimension other than the "
                    f"concatenated one ({d}), or are not read whole along it: shapes not compatible"
                ),
                *subject,
            )
    return _Match(axis, cat)


def positional_subscripts(t: Tensor, r: Read) -> list[str]:
    """Read ``r``'s subscripts with compute ``t``'s loop variables named by position."""
    assert t.op is not None
    names = {a.uid: f"d{k}" for k, a in enumerate(t.op.axes)}
    names.update({a.uid: f"r{k}" for k, a in enumerate(t.op.reduce_axes)})
    return [affine_str(s, names) for s in r.indices]


def _short(m: isl.Map) -> str:
    return str(m.coalesce()).replace("{ ", "{").replace(" }", "}")


def _readers(graph: Graph, name: str) -> tuple[set[str], list[str]]:
    """The contractions that read ``name`` directly or through moves only (``layout_fold``
    folds the slice into their loads), and the other readers so reached: those would take
    the slice as an epilogue of the merged contraction, reading it at an offset — the GEMM
    path (poly/) tiles only epilogues that read the accumulator where it is computed, so
    such a merge would turn tiled GEMMs into a plain loop nest."""
    out: set[str] = set()
    other: list[str] = []
    todo, seen = [name], {name}
    while todo:
        for c in graph.consumers(todo.pop()):
            q = graph.prims[c]
            if is_move(q.tensor):
                if c not in seen:
                    seen.add(c)
                    todo.append(c)
            elif q.is_reduction and q.kind == OpKind.OPAQUE:
                out.add(c)
            else:
                other.append(c)
    return out, other


def _step_reads(graph: Graph, q: Tensor, prev: Tensor, axis: int) -> dict[int, int] | None:
    """Whether ``q`` is a per-column epilogue step of ``prev`` along data axis ``axis``: the
    same shape, no reduction, one read of ``prev`` at ``q``'s own index, every other read a
    constant that uses the axis (if at all) once, as a plain subscript (a bias ``b[j]``).
    Returns those constant reads (read position -> subscript position), or None."""
    assert q.op is not None
    if q.op.reduce is not None or q.shape != prev.shape:
        return None
    reads = reads_of(q.op.body)
    mine = [r for r in reads if r.tensor.uid == prev.uid]
    if len(mine) != 1 or not is_identity_read(mine[0], q):
        return None
    v = q.op.axes[axis]
    cat: dict[int, int] = {}
    for i, r in enumerate(reads):
        if r is mine[0]:
            continue
        if not graph.is_constant(r.tensor):
            return None
        uses = [n for s in r.indices for n in walk(s) if n is v]
        plain = [d for d, s in enumerate(r.indices) if s is v]
        if uses and (len(uses) != 1 or len(plain) != 1):
            return None
        if uses:
            cat[i] = plain[0]
    if sum(1 for n in walk(q.op.body) if n is v) != len(cat) + 1:
        return None
    return cat


def epilogue_chain(
    graph: Graph, p: Primitive, is_step: Callable[[Tensor, Tensor], bool]
) -> list[Primitive]:
    """The chain of steps after ``p``: each the single reader of the one before (which is
    no graph output) and a step of it by ``is_step(step, previous)``."""
    chain: list[Primitive] = []
    cur = p
    while not graph.is_output(cur.tensor) and len(graph.consumers(cur.name)) == 1:
        q = graph.prims[graph.consumers(cur.name)[0]]
        if not is_step(q.tensor, cur.tensor):
            break
        chain.append(q)
        cur = q
    return chain


def same_read(ta: Tensor, x: Read, tb: Tensor, y: Read) -> bool:
    """Whether read ``x`` of ``ta`` and read ``y`` of ``tb`` read the same tensor through
    the same subscripts (positionally, loop variables by position)."""
    return x.tensor.uid == y.tensor.uid and positional_subscripts(ta, x) == positional_subscripts(
        tb, y
    )


def _steps_agree(graph: Graph, a: Primitive, b: Primitive, axis: int) -> bool:
    """Whether epilogue steps ``a`` and ``b`` (of two siblings) are the same computation but
    for the constants they concatenate: equal forms, the same shared constants."""
    ta, tb = a.tensor, b.tensor
    if sibling_form(ta) != sibling_form(tb):
        return False
    ra, rb = reads_of(ta.op.body), reads_of(tb.op.body)  # type: ignore[union-attr]
    if len(ra) != len(rb):
        return False
    prev_a = [i for i, r in enumerate(ra) if not graph.is_constant(r.tensor)]
    prev_b = [i for i, r in enumerate(rb) if not graph.is_constant(r.tensor)]
    cat_a = _step_reads(graph, ta, ra[prev_a[0]].tensor, axis) if len(prev_a) == 1 else None
    cat_b = _step_reads(graph, tb, rb[prev_b[0]].tensor, axis) if len(prev_b) == 1 else None
    if cat_a is None or cat_a != cat_b or prev_a != prev_b:
        return False
    for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
        if i in prev_a:
            continue
        if i not in cat_a:
            if not same_read(ta, x, tb, y):
                return False
            continue
        d = cat_a[i]
        wa, wb = x.tensor, y.tensor
        va, vb = ta.op.axes[axis], tb.op.axes[axis]  # type: ignore[union-attr]
        if not (
            wa.dtype == wb.dtype
            and wa.ndim == wb.ndim
            and all(
                m == n for k, (m, n) in enumerate(zip(wa.shape, wb.shape, strict=True)) if k != d
            )
            and (va.lo, va.hi, vb.lo, vb.hi) == (0, wa.shape[d], 0, wb.shape[d])
            and positional_subscripts(ta, x) == positional_subscripts(tb, y)
        ):
            return False
    return True


class _Replace(ExprMutator):
    """Replaces reads by their position in pre-order (``walk``) and loop variables by uid."""

    def __init__(self, reads: dict[int, Read], env: dict[int, Expr]) -> None:
        self.reads, self.env, self.n = reads, env, 0

    def visit_IterVar(self, e: IterVar) -> Expr:
        return self.env.get(e.uid, e)

    def visit_Read(self, e: Read) -> Expr:
        pos = self.n
        self.n += 1
        kids = tuple(self.visit(i) for i in e.indices)
        new = self.reads.get(pos)
        return Read(new.tensor, kids) if new is not None else self.rebuild(e, kids)


def _merged_step(
    graph: Graph,
    rw: Rewriter,
    steps: list[Tensor],
    axis: int,
    cat: dict[int, int],
    prev: tuple[int, Tensor] | None,
    made: list[str],
) -> Tensor:
    """One compute over the concatenated axis doing what ``steps`` (one per sibling, in
    order) do: the first's body with the axis spanning all, each read in ``cat`` reading the
    concatenation of the siblings' constants, and read ``prev`` (position, tensor) reading
    the merged step before."""
    t0 = steps[0]
    assert t0.op is not None
    v0 = t0.op.axes[axis]
    v = IterVar(v0.name, 0, sum(t.op.axes[axis].extent for t in steps), v0.kind)  # type: ignore[union-attr]
    axes = tuple(v if k == axis else a for k, a in enumerate(t0.op.axes))
    reads0 = reads_of(t0.op.body)
    new_reads: dict[int, Read] = {}
    for i, d in cat.items():
        ws = [reads_of(t.op.body)[i].tensor for t in steps]  # type: ignore[union-attr]
        value = np.concatenate([graph.constants[w.uid] for w in ws], axis=d)
        c = rw.constant(f"{graph.ident(ws[0])}_cat", value, ws[0].dtype)
        new_reads[i] = Read(c, reads0[i].indices)
        names = ", ".join(graph.ident(w) for w in ws)
        made.append(f"{c.name} {list(value.shape)} = concat({names}, dim {d})")
    if prev is not None:
        new_reads[prev[0]] = Read(prev[1], reads0[prev[0]].indices)
    body = _Replace(new_reads, {v0.uid: v}).visit(t0.op.body)
    shape = tuple(v.extent if k == axis else s for k, s in enumerate(t0.shape))
    out = Tensor(shape, t0.dtype, f"{graph.ident(t0)}_merged")
    out.op = ComputeOp(axes, body, t0.op.tag)
    return out


def _merge(
    graph: Graph,
    rw: Rewriter,
    group: list[Primitive],
    m: _Match,
    chains: dict[str, list[Primitive]],
    length: int,
    both: dict[str, list[str]],
) -> None:
    """Merge ``group`` (with ``length`` steps of its epilogue chains) into one contraction;
    ``both``: the contractions that read several members (and which), named in the record."""
    axis = m.axis
    order = graph.topo_order()
    first = min(group, key=lambda g: order.index(g.name))
    made: list[str] = []
    cur = _merged_step(graph, rw, [g.tensor for g in group], axis, m.cat_dims, None, made)
    rw.add(cur, first.tensor)
    merged_name = cur.name
    for k in range(length):
        steps = [chains[g.name][k].tensor for g in group]
        prevs = [chains[g.name][k - 1].tensor if k else g.tensor for g in group]
        ra = reads_of(steps[0].op.body)  # type: ignore[union-attr]
        pos = next(i for i, r in enumerate(ra) if r.tensor.uid == prevs[0].uid)
        cat = _step_reads(graph, steps[0], prevs[0], axis)
        assert cat is not None
        cur = _merged_step(graph, rw, steps, axis, cat, (pos, cur), made)
        rw.add(cur, first.tensor)
    offset = 0
    parts = []
    for g in group:
        tail = chains[g.name][length - 1] if length else g
        t = tail.tensor
        assert t.op is not None
        for q in [g, *chains[g.name][: max(length - 1, 0)]]:
            if q is not tail:
                rw.remove(q.tensor)
        a = t.op.axes[axis]
        sub = a if offset == 0 else a + offset
        idx = tuple(sub if k == axis else x for k, x in enumerate(t.op.axes))
        rw.define(with_body(t, Read(cur, idx), tag="slice"))
        parts.append(f"{tail.name} = [{offset}, {offset + a.extent})")
        offset += a.extent
    names = ", ".join(g.name for g in group)
    epi = ""
    if length:
        steps = ", ".join(q.name for g in group for q in chains[g.name][:length])
        epi = f" with their per-column epilogues ({steps}) as {cur.name}"
    rw.record(
        PassAction.MERGED,
        tuple(g.name for g in group),
        f"{names} read {_shared_name(graph, group[0], group[1])} through the same access: one "
        f"contraction {merged_name}{epi} over {'; '.join(made)}; each is a slice along axis "
        f"{axis} ({', '.join(parts)})"
        + "".join(
            f"; {c} reads {' and '.join(gs)}: folded, it reads {cur.name} through "
            f"{len(gs)} access relations, one shared tile each"
            for c, gs in sorted(both.items())
        ),
    )


def _shared_name(graph: Graph, a: Primitive, b: Primitive) -> str:
    ra = reads_of(a.tensor.op.body)  # type: ignore[union-attr]
    rb = reads_of(b.tensor.op.body)  # type: ignore[union-attr]
    names = [
        graph.ident(x.tensor)
        for x, y in zip(ra, rb, strict=True)
        if x.tensor.uid == y.tensor.uid and not graph.is_constant(x.tensor)
    ]
    return ", ".join(dict.fromkeys(names))


def _candidate(t: Tensor) -> bool:
    assert t.op is not None
    return t.op.reduce is not None and not any(isinstance(n, DataIndex) for n in walk(t.op.body))


def merge_siblings(graph: Graph) -> Graph:
    """``graph`` with sibling contractions of one input merged into one over concatenated
    constant weights, each sibling a slice of the merged result (module doc)."""
    rw = Rewriter(graph, NAME)
    order = graph.topo_order()
    forms: dict[str, list[Primitive]] = {}
    for name in order:
        p = graph.prims[name]
        if _candidate(p.tensor):
            forms.setdefault(sibling_form(p.tensor), []).append(p)
    for members in forms.values():
        todo = list(members)
        while len(todo) > 1:
            anchor, rest = todo[0], todo[1:]
            group, matches, later = [anchor], {}, []
            for b in rest:
                got = _match(graph, anchor, b)
                if got is None:
                    later.append(b)
                elif isinstance(got, Refusal):
                    rw.record(PassAction.REFUSED, (anchor.name, b.name), got.reason)
                elif matches and got.axis != next(iter(matches.values())).axis:
                    later.append(b)
                else:
                    group.append(b)
                    matches[b.name] = got
            todo = later
            if len(group) > 1:
                _take(graph, rw, group, matches)
    return rw.result()


def _take(graph: Graph, rw: Rewriter, group: list[Primitive], matches: dict[str, _Match]) -> None:
    """Find the epilogue chain the members share, drop the members that must not merge
    (recorded), then merge the rest."""
    axis = next(iter(matches.values())).axis
    chains = {
        g.name: epilogue_chain(
            graph, g, lambda q, prev: _step_reads(graph, q, prev, axis) is not None
        )
        for g in group
    }
    length = min(len(c) for c in chains.values())
    for k in range(length):
        s0 = chains[group[0].name][k]
        if not all(_steps_agree(graph, s0, chains[g.name][k], axis) for g in group[1:]):
            length = k
            break
    kept: list[Primitive] = []
    reached: dict[str, list[str]] = {}  # contraction -> the kept siblings it reads
    for g in group:
        tail = chains[g.name][length - 1] if length else g
        readers, other = _readers(graph, tail.name)
        why = ""
        if graph.is_output(tail.tensor):
            why = (
                f"{tail.name} is a graph output: merged, it would be a slice of the merged "
                "result, a strided store no fold can write (a copy kernel would remain)"
            )
        elif other:
            why = (
                f"{g.name} not merged: {other[0]} would read its slice of the merged result "
                "at an offset, as an epilogue of the merged contraction, which the GEMM path "
                "does not tile (tiled GEMMs would become one plain loop nest)"
            )
        if why:
            rw.record(PassAction.REFUSED, (g.name, tail.name), why)
            continue
        kept.append(g)
        for c in sorted(readers):
            reached.setdefault(c, []).append(g.name)
    if len(kept) > 1:
        m = matches.get(kept[1].name) if kept[0] is group[0] else _match(graph, kept[0], kept[1])
        assert isinstance(m, _Match)
        both = {c: gs for c, gs in reached.items() if len(gs) > 1}
        _merge(graph, rw, kept, m, chains, length, both)
