"""How a graph pass builds the graph it returns.

A pass never edits the graph it is given. It tells a :class:`Rewriter` what changes — a
primitive's new definition (same tensor, new body), a primitive *forwarded* to another tensor
of equal value (its readers read that tensor instead and the primitive goes), a new constant,
a removal — and :meth:`Rewriter.result` builds the new :class:`Graph` in one walk in
topological order: every read is re-pointed at the current version of the tensor it reads, so
the new graph's tensors form a consistent te graph again (``polyfuse.reference.evaluate`` of
its outputs computes what the compiler compiles). Primitives whose tensor did not change keep
their isl relations; changed ones are rebuilt, sharing parsed isl text through the graph's
memo (identical layers parse once).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import networkx as nx
import numpy as np

from polyfuse.graph.access import isl_ident
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import (
    ComputeOp,
    Const,
    Expr,
    ExprMutator,
    IterVar,
    Read,
    Tensor,
    walk,
)
from polyfuse.graph.graph import Graph, Primitive, primitive
from polyfuse.graph.passes.record import PassAction, PassRecord

#: ``evaluate(tensor, feeds) -> array``: the value of a compute whose reads are all
#: placeholders in ``feeds``, with ``polyfuse.reference`` semantics (float64 inside one body,
#: float32 results). The driver passes ``polyfuse.reference.evaluate``; graph/ cannot import it.
Evaluator = Callable[[Tensor, Mapping[Tensor, np.ndarray]], np.ndarray]

_MEMO = "graph.passes"  # this package's entry in Graph.isl_memo


def with_body(t: Tensor, body: Expr, tag: str | None = None) -> Tensor:
    """A new version of compute ``t`` (same uid, name, shape, axes) defined by ``body``."""
    assert t.op is not None
    out = Tensor(t.shape, t.dtype, t.name, uid=t.uid)
    out.op = ComputeOp(t.op.axes, body, t.op.tag if tag is None else tag)
    return out


class _Repoint(ExprMutator):
    """Rebuilds reads whose tensor ``resolve`` maps to another object (same subscripts).
    ``moved`` maps ``id(old read)`` to its rebuilt read; ``same_tensors`` says whether every
    read still names a tensor of the same uid (then the isl relations are unchanged)."""

    def __init__(self, resolve: Callable[[Tensor], Tensor]) -> None:
        self.resolve = resolve
        self.moved: dict[int, Read] = {}
        self.same_tensors = True

    def visit_Read(self, e: Read) -> Expr:
        kids = tuple(self.visit(i) for i in e.indices)
        t = self.resolve(e.tensor)
        out = self.rebuild(e, kids) if t is e.tensor else Read(t, kids)
        if out is not e:
            self.moved[id(e)] = out  # type: ignore[assignment]
            self.same_tensors &= t.uid == e.tensor.uid
        return out


def repointed(t: Tensor, resolve: Callable[[Tensor], Tensor]) -> Tensor:
    """``t`` with each read of tensor ``x`` reading ``resolve(x)`` (``t`` itself if none moves)."""
    assert t.op is not None
    body = _Repoint(resolve).visit(t.op.body)
    return t if body is t.op.body else with_body(t, body)


def reads_of(e: Expr) -> list[Read]:
    return [n for n in walk(e) if isinstance(n, Read)]


def loop_vars(e: Expr) -> set[int]:
    """The uids of the loop variables ``e`` uses (subscripts included)."""
    return {n.uid for n in walk(e) if isinstance(n, IterVar)}


def is_identity_read(r: Read, t: Tensor) -> bool:
    """Whether ``r`` reads, at every point of compute ``t``, the element of the same index of a
    tensor of ``t``'s shape (``x[i, j]`` inside ``t[i, j]``; a size-1 dimension may be read
    as ``x[0, j]``, as broadcasting ops write it)."""
    assert t.op is not None
    return r.tensor.shape == t.shape and all(
        s is a or (a.hi - a.lo == 1 and isinstance(s, Const) and s.value == a.lo)
        for s, a in zip(r.indices, t.op.axes, strict=True)
    )


class Rewriter:
    """The changes one pass makes to ``graph``; :meth:`result` builds the new graph."""

    def __init__(self, graph: Graph, pass_name: str) -> None:
        self.graph = graph
        self.pass_name = pass_name
        self.records: list[PassRecord] = []
        self.touched: set[int] = set()  # uids a change of this pass already involves
        self._defs: dict[int, Tensor] = {}
        self._forward: dict[int, Tensor] = {}
        self._removed: set[int] = set()
        self._new_constants: list[tuple[Tensor, np.ndarray]] = []
        self._new_prims: dict[int, list[Tensor]] = {}  # uid of a primitive -> added before it
        self._dropped: set[int] = set()

    # ------------------------------------------------------------------ changes
    def define(self, new: Tensor) -> None:
        """Primitive ``new.uid`` is now computed by ``new`` (its reads name tensors of the old
        graph or new constants; they are re-pointed when the graph is built)."""
        assert self.graph.idents.get(new.uid) in self.graph.prims, new
        self._defs[new.uid] = new
        self.touched.add(new.uid)

    def current(self, t: Tensor) -> Tensor:
        """Primitive ``t`` as this pass defines it so far (``t`` itself where unchanged)."""
        return self._defs.get(t.uid, t)

    def forward(self, old: Tensor, to: Tensor) -> None:
        """``old`` equals ``to`` element for element: its readers read ``to``; ``old`` goes."""
        assert old.shape == to.shape and not self.graph.is_output(old), (old, to)
        self._forward[old.uid] = to
        self.touched.update((old.uid, to.uid))

    def remove(self, t: Tensor) -> None:
        """Drop primitive ``t`` (nothing that stays may read it)."""
        self._removed.add(t.uid)
        self.touched.add(t.uid)

    def add(self, new: Tensor, before: Tensor) -> None:
        """A new compute primitive ``new`` placed before primitive ``before`` (its reads name
        tensors of the old graph, new constants or earlier added primitives)."""
        assert new.op is not None and self.graph.idents.get(before.uid) in self.graph.prims
        self._new_prims.setdefault(before.uid, []).append(new)
        self.touched.add(new.uid)

    def constant(self, name: str, value: np.ndarray, dtype: str = "float32") -> Tensor:
        """A new constant placeholder bound to ``value`` (stored as ``dtype``, float32 unless
        told: a concatenation of weights keeps theirs)."""
        a = np.asarray(value, dtype=numpy_dtype(dtype), order="C")  # a 0-d value stays 0-d
        t = Tensor(tuple(a.shape), dtype, name)
        self._new_constants.append((t, a))
        return t

    def drop_constant(self, t: Tensor) -> None:
        """Unbind constant ``t`` and remove it from the graph's inputs (nothing reads it)."""
        assert self.graph.is_constant(t)
        self._dropped.add(t.uid)

    def record(self, action: PassAction, prims: tuple[str, ...] | list[str], reason: str) -> None:
        self.records.append(PassRecord(self.pass_name, action, tuple(prims), reason))

    @property
    def changed(self) -> bool:
        return bool(
            self._defs
            or self._forward
            or self._removed
            or self._new_constants
            or self._new_prims
            or self._dropped
        )

    # ------------------------------------------------------------------ result
    def result(self) -> Graph:
        """The graph with every change applied (``graph`` itself, records added, if none)."""
        g = self.graph
        records = [*g.pass_records, *self.records]
        if not self.changed:
            return replace(g, pass_records=records)
        cur: dict[int, Tensor] = {}
        computes = {p.tensor.uid for p in g.prims.values()}
        added = [t for ts in self._new_prims.values() for t in ts]
        computes.update(t.uid for t in added)

        def resolve(t: Tensor) -> Tensor:
            while t.uid in self._forward:
                t = self._forward[t.uid]
            if t.uid in computes:
                if t.uid not in cur:
                    raise AssertionError(f"{self.pass_name}: '{t.name}' is read but not kept")
                return cur[t.uid]
            return t

        memo = g.isl_memo.setdefault(_MEMO, {})
        idents = dict(g.idents)
        used = set(idents.values())
        for t in [*(c for c, _ in self._new_constants), *added]:
            base = ident = isl_ident(t.name)
            n = 1
            while ident in used:
                ident, n = f"{base}_{n}", n + 1
            used.add(ident)
            idents[t.uid] = ident

        prims: dict[str, Primitive] = {}
        for name in g.topo_order():
            old = g.prims[name]
            t = old.tensor
            for a in self._new_prims.get(t.uid, []):
                assert a.op is not None
                body = _Repoint(resolve).visit(a.op.body)
                cur[a.uid] = new = a if body is a.op.body else with_body(a, body)
                prims[idents[a.uid]] = primitive(new, idents, g.ctx, memo)
            if t.uid in self._forward or t.uid in self._removed:
                continue
            base = self._defs.get(t.uid, t)
            assert base.op is not None
            rp = _Repoint(resolve)
            body = rp.visit(base.op.body)
            new = base if body is base.op.body else with_body(base, body)
            cur[t.uid] = new
            if new is t:
                prims[name] = old
            elif base is t and rp.same_tensors:  # only re-pointed: same relations, new reads
                reads = [(rp.moved.get(id(r), r), m) for r, m in old.relations.reads]
                prims[name] = replace(
                    old, tensor=new, relations=replace(old.relations, reads=reads)
                )
            else:
                prims[name] = primitive(new, idents, g.ctx, memo)

        dag = nx.DiGraph()
        dag.add_nodes_from(prims)
        for name, p in prims.items():
            assert p.tensor.op is not None
            for src in p.tensor.op.inputs():
                if not src.is_placeholder:
                    dag.add_edge(idents[src.uid], name, tensor=idents[src.uid])
        inputs = [t for t in g.inputs if t.uid not in self._dropped]
        inputs += [t for t, _ in self._new_constants]
        constants = {u: a for u, a in g.constants.items() if u not in self._dropped}
        constants.update({t.uid: a for t, a in self._new_constants})
        outputs = [cur[o.uid] for o in g.outputs]
        return replace(
            g,
            inputs=inputs,
            outputs=outputs,
            prims=prims,
            dag=dag,
            idents=idents,
            constants=constants,
            pass_records=records,
        )
