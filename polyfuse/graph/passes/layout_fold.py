"""Layout folding: a primitive that only moves data is not a kernel.

A *move* is a primitive whose body only reads: one read ``m[i] = x[f(i)]`` (a transpose,
permute, reshape — its ``//`` and ``%`` are isl quasi-affine —, expand, slice) or an
index-only ``where`` choosing between moves (a concat). It folds into one of its two sides:

- **into the consumers' loads** (``m`` is not a graph output): every reader of ``m`` reads
  ``x`` through the composed access relation instead (``c[j] = ... m[g(j)] ...`` becomes
  ``... x[f(g(j))] ...``), and ``m`` goes. isl decides legality: every read of ``m`` must be
  affine (a function of the reader's loop variables; a gather ``m[idx[j]]`` is not), and the
  reads of ``x`` of the rewritten reader must be exactly the composition of its old reads of
  ``m`` with ``m``'s own relation (checked on the isl maps). A concat folds only into readers
  that are neither contractions nor moves (a ``where`` inside a GEMM operand would stop the
  GEMM from being one);
- **into the producer's store** (``m`` is a graph output, so something must write it): when
  ``x`` is a computation read only by ``m``, ``x`` computes directly in ``m``'s layout (its
  body with its loop variables replaced by ``f(i)``: the producer stores through ``f⁻¹``) and
  ``x`` goes. Legal only when ``f`` is a bijection onto ``x`` (isl: injective, and its range
  is all of ``x``) — a non-injective ``f`` (an expand) would compute and store one element of
  ``x`` several times; a partial one (a slice) would drop the rest of ``x``.

When ``m`` is not an output both sides remove the same bytes (one write and one read of
``m``); the load side is chosen because it leaves the producer (often a GEMM with its
epilogue) unchanged and lets the consumer's shared-memory promotion do the gather.

Only moves that would be kernels of their own fold: an opaque move (a layout access), or one
read by an opaque reader (a contraction; no partition rule fuses a producer into it). An
aligned slice or reshape read by elementwise ops already fuses with them by the partition
rules. A fold into an elementwise, broadcast or reduction reader is refused when the reader
would turn opaque and lose a fusion a partition or stitching rule makes, unless the move
itself could not fuse with that reader anyway (rule 4 takes the reader into a reduction
first). A fold may make a contraction read one tensor through two different relations
(``q @ transpose(q)`` folded is ``sum_k q[i, k] * q[j, k]``): the GEMM promotion stages one
shared tile per access relation (:func:`polyfuse.poly.gemm_shape.access_groups`), and the
tensor-core path stages operand B's tile as the array's further access where A reads the same
array, so the contraction stays a tiled GEMM.
Every fold and refusal is recorded with the relation or the rule that decided it.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.base.errors import ExpressionError
from polyfuse.graph.access import relation_text
from polyfuse.graph.expr import (
    DataIndex,
    Expr,
    ExprMutator,
    ExprVisitor,
    Read,
    Select,
    Tensor,
    substitute,
    walk,
)
from polyfuse.graph.graph import Graph, Primitive, primitive
from polyfuse.graph.kinds import OpKind
from polyfuse.graph.partition import PARTITION_RULES, STITCH_RULES
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, with_body

NAME = "layout_fold"
_MEMO = "graph.passes"  # the passes' entry in Graph.isl_memo (rewrite.py)


class _MovesOnly(ExprVisitor[bool]):
    """Whether an expression only moves data: a read, or an index-only ``where`` of such."""

    def visit_default(self, e: Expr, *args: object) -> bool:
        return False

    def visit_Read(self, e: Read) -> bool:
        return True

    def visit_Select(self, e: Select) -> bool:
        index_only = not any(isinstance(n, Read) for n in walk(e.cond))
        return index_only and self.visit(e.a) and self.visit(e.b)


def is_move(t: Tensor) -> bool:
    """Whether compute ``t`` only moves data (module doc), in its own dtype."""
    assert t.op is not None
    body = t.op.body
    return (
        t.op.reduce is None
        and _MovesOnly().visit(body)
        and all(r.tensor.dtype == t.dtype for r in t.op.reads())
    )


def _reads(e: Expr) -> list[Read]:
    return [n for n in walk(e) if isinstance(n, Read)]


def _is_concat(t: Tensor) -> bool:
    assert t.op is not None
    return isinstance(t.op.body, Select)


class _Expand(ExprMutator):
    """Replaces every read of a folded move by the move's (expanded) body at its subscripts."""

    def __init__(self, folded: dict[int, Tensor]) -> None:
        self.folded = folded

    def visit_Read(self, e: Read) -> Expr:
        kids = tuple(self.visit(i) for i in e.indices)
        m = self.folded.get(e.tensor.uid)
        if m is None:
            return self.rebuild(e, kids)
        assert m.op is not None
        body = substitute(m.op.body, {a.uid: s for a, s in zip(m.op.axes, kids, strict=True)})
        return self.visit(body)


def _layout_map(p: Primitive) -> isl.Map:
    """``{ m[i] -> x[f(i)] }`` of a single-read move ``p`` (its reads after its write)."""
    rels = p.relations
    return rels.write.reverse().apply_range(rels.reads[0][1])


def _chain_map(graph: Graph, p: Primitive, folded: dict[int, Tensor]) -> isl.Map:
    """``p``'s layout map composed down through the single-read moves it reads that fold
    too: the relation its readers end up reading through."""
    rel = _layout_map(p)
    r = p.relations.reads[0][0]
    while r.tensor.uid in folded:
        q = graph.prims[graph.ident(r.tensor)]
        if len(q.relations.reads) != 1:
            break
        rel = rel.apply_range(_layout_map(q))
        r = q.relations.reads[0][0]
    return rel


def _injective(rel: isl.Map) -> str:
    return "injective" if rel.is_injective() else "not injective: a broadcast read"


def _short(m: isl.Map | isl.UnionMap) -> str:
    return str(m.coalesce()).replace("{ ", "{").replace(" }", "}")


def _read_map(t: Tensor, graph: Graph, of: int) -> isl.UnionMap:
    """The union of compute ``t``'s read relations of tensor uid ``of`` (statement tuple
    ``S``, tensor tuple ``X``), built from isl text for a body that is not in the graph."""
    text, reads = relation_text(t)
    dom = isl.Set(text.domain, context=graph.ctx)
    out = isl.UnionMap("{}", context=graph.ctx)
    for (m_s, _), r in zip(text.reads, reads, strict=True):
        if r.tensor.uid == of:
            out = out.union(isl.UnionMap(isl.Map(m_s, context=graph.ctx).intersect_domain(dom)))
    return out


def _anon(m: isl.Map, tensor_name: str = "X") -> isl.Map:
    return m.set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, tensor_name)


def layout_fold(graph: Graph) -> Graph:
    """``graph`` with its moves folded into their consumers' loads or producers' stores."""
    rw = Rewriter(graph, NAME)
    folded: dict[int, Tensor] = {}  # uid -> move folded into its readers' loads
    order = graph.topo_order()
    for name in order:
        p = graph.prims[name]
        t = p.tensor
        if not is_move(t) or graph.is_output(t) or not _needs_fold(graph, p):
            continue
        why = _refuse_loads(graph, p) or _beyond_budget(graph, p, folded)
        if why:
            rw.record(PassAction.REFUSED, (name,), f"{name} stays a kernel: {why}")
            continue
        folded[t.uid] = t
    expand = _Expand(folded)
    for name in order:
        p = graph.prims[name]
        t = p.tensor
        assert t.op is not None
        if t.uid in folded:
            rw.remove(t)
            continue
        if not any(r.tensor.uid in folded for r in t.op.reads()):
            continue
        new = with_body(t, expand.visit(t.op.body))
        err = _check_composed(graph, p, new, folded)
        if err:  # a bug in the substitution, not a property of the graph: fail loudly
            raise AssertionError(f"layout_fold: {name}: {err}")
        rw.define(new)
    for m in folded.values():
        p = graph.prims[graph.ident(m)]
        readers = ", ".join(graph.consumers(p.name))
        if len(p.relations.reads) == 1:
            rel = _chain_map(graph, p, folded)
            src = rel.get_tuple_name(isl.dim_type.out)
            how = f"{src} through {_short(rel)} ({_injective(rel)})"
        else:
            srcs = dict.fromkeys(graph.ident(r.tensor) for r in m.op.reads())  # type: ignore[union-attr]
            how = f"{', '.join(srcs)} through a concat"
        rw.record(
            PassAction.FOLDED,
            (p.name, *graph.consumers(p.name)),
            f"{p.name} folded into the loads of {readers} (consumer side): they read {how}",
        )
    for o in graph.outputs:
        if o.uid in rw.touched or o.is_placeholder or not is_move(o):
            continue
        _fold_store(graph, rw, graph.prims[graph.ident(o)], folded)
    return rw.result()


def _needs_fold(graph: Graph, p: Primitive) -> bool:
    """Whether move ``p`` would otherwise be a kernel of its own: its access is a layout one
    (the op is opaque: a transpose, a reshape's div/mod, a strided slice), or a reader is
    opaque (a contraction: no partition rule fuses a producer into it). An aligned move (a
    slice at an offset, a reshape that only adds or drops size-1 dims) or a broadcast read
    by elementwise, broadcast or reduction ops fuses with them by the partition rules."""
    if p.kind == OpKind.OPAQUE:
        return True
    return any(graph.prims[c].kind == OpKind.OPAQUE for c in graph.consumers(p.name))


def _refuse_loads(graph: Graph, p: Primitive) -> str | None:
    """Why move ``p`` cannot fold into its readers' loads (None: it can)."""
    for c in graph.consumers(p.name):
        q = graph.prims[c]
        for r, m in q.relations.reads:
            if r.tensor.uid == p.tensor.uid and not m.is_single_valued():
                return f"{c} reads it at a data-dependent index (not an affine access)"
        if _is_concat(p.tensor) and (q.is_reduction or is_move(q.tensor)):
            what = "a contraction" if q.is_reduction else "a move"
            return f"a concat stays out of {what}'s operand ({c})"
        if q.kind != OpKind.OPAQUE:
            assert q.tensor.op is not None
            new = with_body(q.tensor, _Expand({p.tensor.uid: p.tensor}).visit(q.tensor.op.body))
            memo = graph.isl_memo.setdefault(_MEMO, {})
            kind = primitive(new, graph.idents, graph.ctx, memo).kind
            lost = _lost_fusions(graph, p, q, kind)
            if lost and _would_fuse(graph, q):
                return (
                    f"folded, {c} would read it through a layout access and turn "
                    f"{kind.value}: no partition rule would fuse {lost} any more"
                )
    return None


#: isl operations a fold's composed access may take to prove injective. Chains of reshapes,
#: depth-to-space and space-to-depth compose to quasi-affine relations isl cannot simplify
#: (fuzz seed 2075: a space-to-depth of a reshaped depth-to-space); every later isl call on
#: them (the float4 proof, the footprint count) then runs for hours. Folds of the tests and
#: models take at most a few thousand.
FOLD_OPERATIONS = 20_000


def _beyond_budget(graph: Graph, p: Primitive, folded: dict[int, Tensor]) -> str | None:
    """Why ``p`` stays a kernel when a relation its readers would read through (their reads
    of ``p`` composed with ``p``'s, down the moves folded before it) is beyond isl's
    operation budget."""
    if len(p.relations.reads) != 1:
        return None  # a concat: its pieces read each source through its own relation
    rel = _chain_map(graph, p, folded)
    for c in graph.consumers(p.name):
        for r, m in graph.prims[c].relations.reads:
            if r.tensor.uid == p.tensor.uid and _over_budget(m.apply_range(rel)):
                return (
                    f"{c}'s reads composed down to {rel.get_tuple_name(isl.dim_type.out)} are "
                    f"beyond isl's budget ({FOLD_OPERATIONS} operations to tell whether they "
                    "are injective)"
                )
    return None


def _over_budget(rel: isl.Map | isl.UnionMap) -> bool:
    """Whether isl needs more than :data:`FOLD_OPERATIONS` to tell if ``rel`` is injective."""
    ctx = rel.get_ctx()
    ctx.set_max_operations(FOLD_OPERATIONS)
    ctx.reset_operations()
    try:
        rel.is_injective()
    except isl.Error:
        return True
    finally:
        ctx.set_max_operations(0)
    return False


def _fuses(p: OpKind, c: OpKind) -> bool:
    return any(r.matches(p, c) for r in (*PARTITION_RULES, *STITCH_RULES))


def _would_fuse(graph: Graph, q: Primitive) -> bool:
    """Whether an opaque move would fuse with its reader ``q`` (rule 5: opaque ->
    elementwise/broadcast) if left alone: ``q`` is elementwise or broadcast and no chain of
    elementwise/broadcast readers from it reaches a reduction — rule 4 (elementwise/broadcast
    -> reduction) has priority and would make ``q``'s micrograph a reduction first, leaving
    the move a kernel of its own (then folding it costs no fusion)."""
    eb = (OpKind.ELEMENTWISE, OpKind.BROADCAST)
    if q.kind not in eb:
        return False
    seen, todo = {q.name}, [q.name]
    while todo:
        for c in graph.consumers(todo.pop()):
            k = graph.prims[c].kind
            if k == OpKind.REDUCTION:
                return False
            if k in eb and c not in seen:
                seen.add(c)
                todo.append(c)
    return True


def _lost_fusions(graph: Graph, move: Primitive, q: Primitive, kind: OpKind) -> str:
    """The producer→consumer edges at reader ``q`` that a partition (or stitching) rule fuses
    with ``q``'s kind but not with ``kind`` (``q``'s kind after the fold), as text ('' if
    none). Edges from moves are left out: a move read by an opaque reader folds next round."""
    lost = []
    for src in graph.dag.predecessors(q.name):
        a = graph.prims[src]
        if src == move.name or is_move(a.tensor):
            continue
        if _fuses(a.kind, q.kind) and not _fuses(a.kind, kind):
            lost.append(f"{src} -> {q.name}")
    for dst in graph.consumers(q.name):
        b = graph.prims[dst]
        if _fuses(q.kind, b.kind) and not _fuses(kind, b.kind):
            lost.append(f"{q.name} -> {dst}")
    return ", ".join(lost)


def _gather_tables(body: Expr) -> set[int]:
    """uids of the tensors ``body`` reads only inside data indices (gather tables)."""
    inside: set[int] = set()
    outside: set[int] = set()

    def visit(e: Expr, index: bool) -> None:
        if isinstance(e, Read):
            (inside if index else outside).add(e.tensor.uid)
        for c in e.children():
            visit(c, index or isinstance(e, DataIndex))

    visit(body, False)
    return inside - outside


def _check_composed(
    graph: Graph, p: Primitive, new: Tensor, folded: dict[int, Tensor]
) -> str | None:
    """isl check of one rewritten reader: per tensor ``x`` it now reads, its reads of ``x``
    equal its old direct reads of ``x`` plus its old reads of folded moves composed with the
    moves' relations (down to ``x``). Returns what differs, or None."""
    want: dict[int, isl.UnionMap] = {}

    def add(x: int, m: isl.UnionMap) -> None:
        want[x] = want[x].union(m) if x in want else m

    def compose(rel: isl.UnionMap, t: Tensor) -> None:
        """``rel`` (reader → ``t``) down to the tensors ``t`` reads, if ``t`` is folded."""
        if t.uid not in folded:
            add(t.uid, rel)
            return
        q = graph.prims[graph.ident(t)]
        inv = isl.UnionMap(_anon(q.relations.write).reverse())
        for r, m in q.relations.reads:
            step = inv.apply_range(isl.UnionMap(_anon(m)))
            compose(rel.apply_range(step), r.tensor)

    for r, m in p.relations.reads:
        compose(isl.UnionMap(_anon(m)), r.tensor)
    got_uids = {r.tensor.uid for r in new.op.reads()}  # type: ignore[union-attr]
    assert p.tensor.op is not None
    # a gather table may go: a data index into a dimension of extent 1 is 0 (te.data_index:
    # a value outside the dimension is undefined), so the composed subscript drops it
    dropped = set(want) - got_uids
    if got_uids - set(want) or dropped - _gather_tables(p.tensor.op.body):
        return "it reads other tensors than the composition says"
    for uid, w in want.items():
        if uid in dropped:
            continue
        g = _read_map(new, graph, uid)
        if not g.is_equal(w):
            return f"its reads of uid {uid} are {g}, the composition says {w}"
    return None


def _fold_store(graph: Graph, rw: Rewriter, p: Primitive, folded: dict[int, Tensor]) -> None:
    """Fold output move ``p`` into its producer's store, or record why not."""
    t = p.tensor
    assert t.op is not None
    if _is_concat(t):
        return  # several producers: each would store part of the output; left as a kernel
    r = t.op.body
    assert isinstance(r, Read)
    x = r.tensor
    if x.is_placeholder or x.uid in folded or x.uid in rw.touched:
        return  # a copy of an input (or of a folded move): an output needs a kernel
    xname = graph.ident(x)
    f = _layout_map(p)
    why = None
    if graph.is_output(x) or graph.consumers(xname) != [p.name]:
        why = f"{xname} has other readers (it would be computed twice)"
    elif not f.is_single_valued():
        why = f"it reads {xname} at a data-dependent index (not an affine access)"
    elif not f.is_injective():
        why = f"{_short(f)} is not injective (an element of {xname} would be stored twice)"
    elif not f.range().is_equal(graph.prims[xname].relations.write.range()):
        why = f"{_short(f)} does not cover {xname} (part of it would not be computed)"
    if why:
        rw.record(PassAction.REFUSED, (p.name, xname), f"{p.name} stays a kernel: {why}")
        return
    assert x.op is not None
    env = {a.uid: s for a, s in zip(x.op.axes, r.indices, strict=True)}
    body = substitute(x.op.body, env)
    try:
        new = with_body(t, body, x.op.tag)
        relation_text(new)
    except ExpressionError as e:  # pragma: no cover - subscripts compose affinely
        rw.record(PassAction.REFUSED, (p.name, xname), f"{p.name} stays a kernel: {e}")
        return
    assert new.op is not None
    for src in {q.tensor.uid: q.tensor for q in new.op.reads()}.values():
        if _over_budget(_read_map(new, graph, src.uid)):
            why = (
                f"{xname}'s reads of {graph.ident(src)} composed with it are beyond isl's "
                f"budget ({FOLD_OPERATIONS} operations to tell whether they are injective)"
            )
            rw.record(PassAction.REFUSED, (p.name, xname), f"{p.name} stays a kernel: {why}")
            return
    rw.define(new)
    rw.remove(x)
    rw.record(
        PassAction.FOLDED,
        (p.name, xname),
        f"output {p.name} folded into the store of {xname} (producer side): {xname} stores "
        f"through the inverse of {_short(f)} (injective, onto {xname})",
    )
