"""Layout simplification: a transpose of a transpose, a reshape of a reshape.

A *move* is a primitive whose body is one read and nothing else (``out[i] = x[f(i)]``).
Two kinds of moves compose into one move of the first one's input:

- a **permutation** reads ``x[i_p0, i_p1, ...]`` with its own loop variables, each once (a
  transpose); two compose into one permutation, and into nothing when the composition is the
  identity (``transpose(transpose(x, p), inverse(p))`` is ``x``: its readers read ``x``);
- a **row-major reshape** reads the element with the same row-major flat index; isl decides
  this by comparing the primitive's read relation with ``{ out[y] -> x[x'] : flat(y) =
  flat(x') }`` (so a reshape is recognised by what it accesses, not by the op that built it).
  Two compose into one reshape of the first input (its subscripts built like ``ops.reshape``
  builds them: plain where dims are unchanged, ``//`` and ``%`` where they merge or split),
  and into nothing when the shapes agree.

The inner move stays when something else reads it; dead-code elimination removes it otherwise.
"""

from __future__ import annotations

import islpy as isl

from polyfuse.graph.access import loop_names
from polyfuse.graph.expr import Expr, IterVar, Read, Tensor, as_expr, substitute
from polyfuse.graph.graph import Graph, Primitive
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, is_identity_read, with_body


def _move(t: Tensor) -> Read | None:
    """The single read that is ``t``'s whole body, if ``t`` is a move."""
    assert t.op is not None
    body = t.op.body
    return body if isinstance(body, Read) and body.tensor.dtype == t.dtype else None


def _is_permutation(t: Tensor, r: Read) -> bool:
    assert t.op is not None
    axes = {a.uid for a in t.op.axes}
    subs = [s for s in r.indices if isinstance(s, IterVar) and s.uid in axes]
    return len(subs) == len(r.indices) == len(axes) and len({s.uid for s in subs}) == len(axes)


def _strides(shape: tuple[int, ...]) -> list[int]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s)
        s *= n
    return out[::-1]


def _is_row_major(p: Primitive, r: Read, graph: Graph) -> bool:
    """Whether primitive ``p`` (a move reading ``r``) reads the element of equal row-major
    flat index: its isl read relation equals the reshape relation."""
    t, x = p.tensor, r.tensor
    if t.size != x.size or len(p.relations.reads) != 1:
        return False
    rel = p.relations.reads[0][1]
    dn, _ = loop_names(t)
    ys = iter(dn)
    flat_y = [f"{st}*{next(ys)}" for n, st in zip(t.shape, _strides(t.shape), strict=True) if n > 1]
    xs = [f"x{k}" for k in range(x.ndim)]
    flat_x = [f"{st}*x{k}" for k, st in enumerate(_strides(x.shape))]
    cons = [f"0 <= {d} < {n}" for d, n in zip(dn, (n for n in t.shape if n > 1), strict=True)]
    cons += [f"0 <= x{k} < {n}" for k, n in enumerate(x.shape)]
    cons.append(f"{' + '.join(flat_y) or '0'} = {' + '.join(flat_x) or '0'}")
    stmt = rel.get_tuple_name(isl.dim_type.in_)
    target = rel.get_tuple_name(isl.dim_type.out)
    text = f"{{ {stmt}[{', '.join(dn)}] -> {target}[{', '.join(xs)}] : {' and '.join(cons)} }}"
    return rel.is_equal(isl.Map(text, context=graph.ctx))


def _groups(src: tuple[int, ...], dst: tuple[int, ...]) -> list[tuple[list[int], list[int]]]:
    """Runs of non-unit dims of ``src`` and ``dst`` whose sizes multiply to the same product."""
    si = [d for d, s in enumerate(src) if s != 1]
    di = [d for d, s in enumerate(dst) if s != 1]
    groups, i, j = [], 0, 0
    while i < len(si):
        gi, gj = [si[i]], [di[j]]
        pi, pj = src[si[i]], dst[di[j]]
        i, j = i + 1, j + 1
        while pi != pj:
            if pi < pj:
                gi.append(si[i])
                pi *= src[si[i]]
                i += 1
            else:
                gj.append(di[j])
                pj *= dst[di[j]]
                j += 1
        groups.append((gi, gj))
    return groups


def reshape_subscripts(
    src: tuple[int, ...], axes: tuple[IterVar, ...], dst: tuple[int, ...]
) -> tuple[Expr, ...]:
    """The subscripts into a ``src``-shaped tensor of the element a row-major reshape to
    ``dst`` (loop variables ``axes``) reads: per group of dims with equal products, the
    group's flat index split with ``//`` and ``%`` (a dim alone in its group reads plainly)."""
    subs: list[Expr] = [as_expr(0)] * len(src)
    for gi, gj in _groups(src, dst):
        if len(gi) == 1 and len(gj) == 1:
            subs[gi[0]] = axes[gj[0]]
            continue
        flat: Expr | None = None
        stride = 1
        for d in reversed(gj):
            term: Expr = axes[d] if stride == 1 else axes[d] * stride
            flat = term if flat is None else term + flat
            stride *= dst[d]
        assert flat is not None
        stride = 1
        for pos, d in enumerate(reversed(gi)):
            e = flat if stride == 1 else flat // stride
            if pos != len(gi) - 1:  # the outermost dim of the group needs no wrap
                e = e % src[d]
            subs[d] = e
            stride *= src[d]
    return tuple(subs)


def compose_moves(graph: Graph, rw: Rewriter, pass_name: str) -> None:
    """Tell ``rw`` to compose every move of a move that is a transpose of a transpose or a
    reshape of a reshape (primitives another change of this pass involves are left for the
    next round)."""
    for name in graph.topo_order():
        p = graph.prims[name]
        t = p.tensor
        r = _move(t)
        if r is None or r.tensor.is_placeholder or {t.uid, r.tensor.uid} & rw.touched:
            continue
        q = graph.prims[graph.ident(r.tensor)]
        inner = _move(q.tensor)
        if inner is None or inner.tensor.uid in rw.touched:
            continue
        x = inner.tensor
        assert t.op is not None and q.tensor.op is not None
        if _is_permutation(t, r) and _is_permutation(q.tensor, inner):
            env = {a.uid: s for a, s in zip(q.tensor.op.axes, r.indices, strict=True)}
            body = substitute(inner, env)
            what = "transpose of a transpose"
        elif _is_row_major(p, r, graph) and _is_row_major(q, inner, graph):
            body = Read(x, reshape_subscripts(x.shape, t.op.axes, t.shape))
            what = "reshape of a reshape"
        else:
            continue
        assert isinstance(body, Read)
        xname = graph.ident(x)
        identity = is_identity_read(body, t)
        if identity and not graph.is_output(t):
            rw.forward(t, x)
            rw.record(
                PassAction.FORWARDED,
                (name, graph.ident(q.tensor)),
                f"{name} is a {what} ({graph.ident(q.tensor)}) that restores {xname}: "
                f"its readers read {xname}",
            )
        else:
            rw.define(with_body(t, body))
            rw.touched.add(q.tensor.uid)
            rw.record(
                PassAction.SIMPLIFIED,
                (name, graph.ident(q.tensor)),
                f"{name} is a {what} ({graph.ident(q.tensor)}): one move, reading {xname}",
            )
