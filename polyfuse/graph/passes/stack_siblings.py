"""Sibling contractions that apply one computation to constant offsets of one input stack.

An RNN written step by step projects every step's input with the same weight:
``p_t[b, j] = sum_k x[t, b, k] * W[k, j]`` for ``t = 0, 1, ..., T - 1`` — ``T`` small GEMMs (32
rows each in a batch-32 LSTM), each a launch that fills a few SMs, where cuDNN computes every
step's input projection as one GEMM before the recurrence. Two or more contractions (sums of
products whose operands each miss an output axis: matmuls, convolutions) are *stackable* when

1. their expression trees are equal up to subscripts (:func:`merge_siblings.sibling_form`),
   and so are their loop ranges (the reduction's included);
2. at every read position they read the same tensor through the same subscripts (loop
   variables named by position), but for one subscript of one read (the *stacked subscript*,
   ``t`` above), which is an integer constant in each, a different one in each;
3. those constants, sorted, are an arithmetic progression ``c0 + s * u`` (``u`` from 0).

They become one contraction over a new leading axis ``u`` of ``n`` (the members) that reads the
stacked subscript as ``c0 + s * u``; each member becomes the slice ``stacked[u_i, ...]``, which
``layout_fold`` folds into its readers. A *per-element epilogue* chain that every member has in
the same form — each step the single reader of the one before, reading it at its own index, its
other reads constants, equal across the members (the bias add ``g_t = p_t + bias[j]``) — stacks
along, so the bias is added where the stacked GEMM computes its accumulator. Each element sums
the same products in the same order: values are bit-identical to the separate reductions.

Refused, and recorded: members whose stacked constants are no arithmetic progression (the
stacked tensor would hold rows nothing reads), a member (or the last step of its chain) that is
a graph output (it would become a slice of the stacked result: a copy kernel would remain).
"""

from __future__ import annotations

from dataclasses import dataclass

from polyfuse.graph.expr import (
    Binary,
    ComputeOp,
    Const,
    Expr,
    ExprMutator,
    ExprVisitor,
    IterVar,
    Read,
    Tensor,
    Unary,
)
from polyfuse.graph.graph import Graph, Primitive
from polyfuse.graph.kinds import is_contraction
from polyfuse.graph.passes.merge_siblings import (
    epilogue_chain,
    positional_subscripts,
    same_read,
    sibling_form,
)
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, is_identity_read, reads_of, with_body

NAME = "stack_siblings"

_INT_OPS = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "floordiv": lambda a, b: a // b if b else None,
    "mod": lambda a, b: a % b if b else None,
}


class _IntValue(ExprVisitor["int | None"]):
    """The integer value of a subscript without loop variables, else None."""

    def visit_default(self, e: Expr) -> int | None:
        return None

    def visit_Const(self, e: Const) -> int | None:
        v = e.value
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    def visit_Unary(self, e: Unary) -> int | None:
        a = self.visit(e.a) if e.op == "neg" else None
        return None if a is None else -a

    def visit_Binary(self, e: Binary) -> int | None:
        a, b = self.visit(e.a), self.visit(e.b)
        if a is None or b is None or e.op not in _INT_OPS:
            return None
        return _INT_OPS[e.op](a, b)


def int_value(e: Expr) -> int | None:
    """The value of subscript ``e`` when it is an integer constant expression (no loop
    variable: ``0 + 1`` as a layout fold leaves it), else None."""
    return _IntValue().visit(e)


@dataclass(frozen=True)
class _Key:
    """What stackable members share: the form, and per read its tensor and subscripts with
    the stacked one left out."""

    form: str
    reads: tuple[tuple[int, tuple[str, ...]], ...]
    at: tuple[int, int]  # (read position, subscript position) of the stacked subscript


def _ranges(t: Tensor) -> tuple[tuple[int, int], ...]:
    assert t.op is not None
    return tuple((v.lo, v.hi) for v in (*t.op.axes, *t.op.reduce_axes))


def _keys(t: Tensor) -> list[tuple[_Key, int]]:
    """Every way ``t`` can be stacked: per constant subscript, the key and the constant."""
    assert t.op is not None
    reads = reads_of(t.op.body)
    subs = [tuple(positional_subscripts(t, r)) for r in reads]
    form = f"{sibling_form(t)}|{_ranges(t)}"
    out = []
    for i, r in enumerate(reads):
        for d, s in enumerate(r.indices):
            c = int_value(s)
            if c is None:
                continue
            rest = tuple(
                (x.tensor.uid, tuple("*" if (j, e) == (i, d) else z for e, z in enumerate(sub)))
                for j, (x, sub) in enumerate(zip(reads, subs, strict=True))
            )
            out.append((_Key(form, rest, (i, d)), c))
    return out


def _progression(values: list[int]) -> int | None:
    """The step ``s > 0`` when sorted ``values`` are ``c0 + s * u``, else None."""
    vs = sorted(values)
    s = vs[1] - vs[0]
    ok = s > 0 and all(b - a == s for a, b in zip(vs, vs[1:], strict=False))
    return s if ok else None


def _chain_step(graph: Graph, q: Tensor, prev: Tensor) -> bool:
    """Whether ``q`` is a per-element epilogue step of ``prev``: no graph output (the last
    step stacked becomes a slice), the same shape, no reduction, one read of ``prev`` at
    ``q``'s own index, every other read a constant."""
    assert q.op is not None
    if (
        graph.is_output(q)
        or q.op.reduce is not None
        or q.shape != prev.shape
        or q.dtype != prev.dtype
    ):
        return False
    reads = reads_of(q.op.body)
    mine = [r for r in reads if r.tensor.uid == prev.uid]
    return (
        len(mine) == 1
        and is_identity_read(mine[0], q)
        and all(r is mine[0] or graph.is_constant(r.tensor) for r in reads)
    )


def _agree(a: Tensor, b: Tensor, prev_a: Tensor, prev_b: Tensor) -> bool:
    """Whether chain steps ``a`` and ``b`` (of two members) compute the same of their
    previous steps: equal forms, the same constants through the same subscripts."""
    if sibling_form(a) != sibling_form(b):
        return False
    ra, rb = reads_of(a.op.body), reads_of(b.op.body)  # type: ignore[union-attr]
    if len(ra) != len(rb):
        return False
    for x, y in zip(ra, rb, strict=True):
        if (x.tensor.uid, y.tensor.uid) == (prev_a.uid, prev_b.uid):
            continue
        if not same_read(a, x, b, y):
            return False
    return True


class _Stacked(ExprMutator):
    """A member's body over the stacked axes: loop variables renamed by uid, the read at
    pre-order position ``at[0]`` with subscript ``at[1]`` replaced, and reads of tensor
    ``prev`` (uid) read from the stacked previous step at the stacked index."""

    def __init__(
        self,
        env: dict[int, Expr],
        at: tuple[int, int] | None,
        sub: Expr | None,
        prev: tuple[int, Read] | None,
    ) -> None:
        self.env, self.at, self.sub, self.prev, self.n = env, at, sub, prev, 0

    def visit_IterVar(self, e: IterVar) -> Expr:
        return self.env.get(e.uid, e)

    def visit_Read(self, e: Read) -> Expr:
        pos = self.n
        self.n += 1
        if self.prev is not None and e.tensor.uid == self.prev[0]:
            return self.prev[1]
        kids = [self.visit(i) for i in e.indices]
        if self.at is not None and pos == self.at[0]:
            assert self.sub is not None
            kids[self.at[1]] = self.sub
        return Read(e.tensor, tuple(kids))


def _stack_one(
    t: Tensor,
    n: int,
    at: tuple[int, int] | None,
    sub_of: tuple[int, int] | None,
    prev: tuple[Tensor, Tensor] | None,
    name: str,
) -> Tensor:
    """Compute ``t`` over a new leading axis ``u`` of ``n``: the stacked subscript at ``at``
    becomes ``c0 + s * u`` (``sub_of`` = (c0, s)), or (an epilogue step; ``prev``: the
    member's previous step and its stacked version) the previous step is read stacked at
    ``[u, ...]``."""
    assert t.op is not None
    u = IterVar("u", 0, n, "data")
    axes = tuple(IterVar(a.name, a.lo, a.hi, a.kind) for a in t.op.axes)
    env: dict[int, Expr] = {a.uid: b for a, b in zip(t.op.axes, axes, strict=True)}
    sub: Expr | None = None
    if sub_of is not None:
        c0, s = sub_of
        sub = u if s == 1 else Binary("mul", u, Const(s, "int32", weak=False))
        if c0:
            sub = Binary("add", sub, Const(c0, "int32", weak=False))
    prev_read = None if prev is None else (prev[0].uid, Read(prev[1], (u, *axes)))
    body = _Stacked(env, at, sub, prev_read).visit(t.op.body)
    out = Tensor((n, *t.shape), t.dtype, name)
    out.op = ComputeOp((u, *axes), body, t.op.tag)
    return out


def _candidate(t: Tensor) -> bool:
    """A contraction (:func:`polyfuse.graph.kinds.is_contraction`): the GEMM path tiles it
    stacked. A memory-bound reduction (a layer norm's mean) stays: each is stitched with its
    readers into one kernel, which stacking would split into two."""
    return t.op is not None and t.op.reduce is not None and is_contraction(t)


def stack_siblings(graph: Graph) -> Graph:
    """``graph`` with stackable reductions (module doc) computed as one over a new leading
    axis, each member a slice of the stacked result."""
    rw = Rewriter(graph, NAME)
    groups: dict[_Key, list[tuple[Primitive, int]]] = {}
    for name in graph.topo_order():
        p = graph.prims[name]
        if _candidate(p.tensor):
            for key, c in _keys(p.tensor):
                groups.setdefault(key, []).append((p, c))
    used: set[str] = set()
    for key, members in groups.items():
        members = [(p, c) for p, c in members if p.name not in used]
        if len({c for _, c in members}) != len(members) or len(members) < 2:
            continue  # a repeated constant is the same computation (CSE's business)
        kept = []
        for p, c in members:
            if graph.is_output(p.tensor):
                rw.record(
                    PassAction.REFUSED,
                    (p.name,),
                    f"{p.name} not stacked: a graph output would become a slice of the stacked "
                    "result, a strided store no fold can write (a copy kernel would remain)",
                )
                continue
            kept.append(
                (p, c, epilogue_chain(graph, p, lambda q, prev: _chain_step(graph, q, prev)))
            )
        if len(kept) < 2:
            continue
        step = _progression([c for _, c, _ in kept])
        if step is None:
            names = ", ".join(p.name for p, _, _ in kept)
            rw.record(
                PassAction.REFUSED,
                tuple(p.name for p, _, _ in kept),
                f"{names} not stacked: their constant subscripts "
                f"{sorted(c for _, c, _ in kept)} are no arithmetic progression",
            )
            continue
        _stack(graph, rw, key, kept, step)
        used.update(p.name for p, _, _ in kept)
    return rw.result()


def _stack(
    graph: Graph,
    rw: Rewriter,
    key: _Key,
    kept: list[tuple[Primitive, int, list[Primitive]]],
    step: int,
) -> None:
    """Stack ``kept`` (member, its constant, its epilogue chain) into one reduction with the
    epilogue steps all members share; each member's last stacked step becomes a slice."""
    kept = sorted(kept, key=lambda m: m[1])
    n, c0 = len(kept), kept[0][1]
    length = min(len(ch) for _, _, ch in kept)
    for k in range(length):
        a = kept[0][2][k].tensor
        pa = kept[0][2][k - 1].tensor if k else kept[0][0].tensor
        if not all(
            _agree(a, ch[k].tensor, pa, ch[k - 1].tensor if k else p.tensor)
            for p, _, ch in kept[1:]
        ):
            length = k
            break
    order = graph.topo_order()
    first = min((p for p, _, _ in kept), key=lambda p: order.index(p.name))
    p0 = kept[0][0]
    cur = _stack_one(p0.tensor, n, key.at, (c0, step), None, f"{graph.ident(p0.tensor)}_stacked")
    rw.add(cur, first.tensor)
    stacked = [cur.name]
    for k in range(length):
        t = kept[0][2][k].tensor
        before = kept[0][2][k - 1].tensor if k else p0.tensor
        cur = _stack_one(t, n, None, None, (before, cur), f"{graph.ident(t)}_stacked")
        rw.add(cur, first.tensor)
        stacked.append(cur.name)
    parts = []
    for u, (p, _c, ch) in enumerate(kept):
        tail = ch[length - 1] if length else p
        for q in [p, *ch[: max(length - 1, 0)]]:
            if q is not tail:
                rw.remove(q.tensor)
        t = tail.tensor
        assert t.op is not None
        idx = (Const(u, "int32", weak=False), *t.op.axes)
        rw.define(with_body(t, Read(cur, idx), tag="slice"))
        parts.append(f"{tail.name} = [{u}]")
    names = ", ".join(p.name for p, _, _ in kept)
    epi = f" with their epilogue ({', '.join(stacked[1:])})" if length else ""
    i, d = key.at
    read = reads_of(p0.tensor.op.body)[i]  # type: ignore[union-attr]
    rw.record(
        PassAction.MERGED,
        tuple(p.name for p, _, _ in kept),
        f"{names} apply one computation to {graph.ident(read.tensor)} at subscript {d} = "
        f"{c0} + {step}·u (u < {n}): one reduction {stacked[0]}{epi} over a new leading axis u; "
        f"each is a slice of it ({', '.join(parts)})",
    )
