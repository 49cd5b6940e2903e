"""The polyhedral model of one micrograph: statements, domains, accesses, dependences.

A non-reduction primitive ``T`` is one statement ``S_T[d]``. A reduction is three:
``S_T_init[d]`` sets an accumulator ``T_acc[d]`` to the identity, ``S_T_update[d, r]``
combines one term into it, and ``S_T_final[d]`` stores it into ``T[d]``. The update's
self-dependence on ``T_acc`` is what keeps the reduced dimensions out of the coincident
(parallel) band members, so isl itself knows which loops are reductions.

Dependences come from isl's flow analysis over the original (sequential, topological) order:
flow dependences (read after write) drive proximity; flow, anti and output dependences
together are the validity constraints.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import islpy as isl

from polyfuse.graph.access import loop_names, out_index
from polyfuse.graph.dtypes import info as dtype_info
from polyfuse.graph.dtypes import register_dtype
from polyfuse.graph.expr import Read, Tensor
from polyfuse.graph.graph import Graph
from polyfuse.graph.partition import Micrograph


@dataclass(eq=False)
class Statement:
    """One isl statement: which primitive, which role, and its relations."""

    name: str
    prim: str
    role: str  # "compute" | "init" | "update" | "final"
    tensor: Tensor
    domain: isl.Set
    write: isl.Map  # the element written (tensor or accumulator)
    reads: list[tuple[Read | None, isl.Map]]  # None marks the accumulator read

    @property
    def dims(self) -> int:
        return self.domain.dim(isl.dim_type.set)


@dataclass(eq=False)
class TensorRole:
    """Where a tensor touched by the micrograph lives before placement decides."""

    ident: str
    shape: tuple[int, ...]
    role: str  # "input" | "output" | "internal" | "accumulator"
    tensor: Tensor | None = None

    @property
    def dtype(self) -> str:
        """The element type of its buffer (an accumulator holds the register dtype of its
        reduction's result: float32 partial results for 16-bit floats)."""
        if self.tensor is None:
            return "float32"
        if self.role == "accumulator":
            return register_dtype(self.tensor.dtype)
        return self.tensor.dtype

    @property
    def itemsize(self) -> int:
        return dtype_info(self.dtype).itemsize


@dataclass(eq=False)
class PolyModel:
    """Everything isl needs to schedule a micrograph (printable for bug reports)."""

    micrograph: Micrograph
    statements: list[Statement]
    tensors: dict[str, TensorRole]
    domain: isl.UnionSet
    writes: isl.UnionMap
    reads: isl.UnionMap
    original_order: isl.UnionMap
    ctx: isl.Context = field(repr=False, default=None)  # type: ignore[assignment]
    _deps: tuple[isl.UnionMap, isl.UnionMap] | None = field(repr=False, default=None)

    def _dependences(self) -> tuple[isl.UnionMap, isl.UnionMap]:
        """(flow, validity) from isl's flow analysis, computed on first use."""
        if self._deps is None:
            self._deps = dependences(self.reads, self.writes, self.original_order)
        return self._deps

    @property
    def flow(self) -> isl.UnionMap:
        """Read-after-write dependences."""
        return self._dependences()[0]

    @property
    def validity(self) -> isl.UnionMap:
        """Flow, anti and output dependences."""
        return self._dependences()[1]

    def accumulator_deps(self) -> isl.UnionMap:
        """update -> update dependences through a reduction's own accumulator."""
        ups = {s.name for s in self.statements if s.role == "update"}
        out = isl.UnionMap.empty(self.validity.get_space())
        lst = self.validity.get_map_list()
        for i in range(lst.n_map()):
            m = lst.get_at(i)
            a, b = m.get_tuple_name(isl.dim_type.in_), m.get_tuple_name(isl.dim_type.out)
            if a == b and a in ups:
                out = out.union(isl.UnionMap.from_map(m))
        return out

    def statement(self, name: str) -> Statement:
        return next(s for s in self.statements if s.name == name)

    def __str__(self) -> str:
        lines = [f"PolyModel {self.micrograph.name} ({self.micrograph.kind.value})"]
        lines.append(f"  domain:   {self.domain}")
        lines.append(f"  writes:   {self.writes}")
        lines.append(f"  reads:    {self.reads}")
        lines.append(f"  flow:     {self.flow}")
        lines.append(f"  validity: {self.validity}")
        roles = ", ".join(f"{t.ident}:{t.role}" for t in self.tensors.values())
        lines.append(f"  tensors:  {roles}")
        return "\n".join(lines)


def _statements_of(graph: Graph, prim: str) -> list[Statement]:
    p = graph.prims[prim]
    t = p.tensor
    rel = p.relations
    assert t.op is not None
    reads: list[tuple[Read | None, isl.Map]] = [(r, m) for r, m in rel.reads]
    if t.op.reduce is None:
        return [Statement(rel.stmt, prim, "compute", t, rel.domain, rel.write, reads)]
    dn, rn = loop_names(t)
    ctx = rel.domain.get_ctx()
    acc = f"{prim}_acc"
    data = rel.domain.project_out(isl.dim_type.set, len(dn), len(rn))
    d = ", ".join(dn)
    full = ", ".join(out_index(t))
    it = ", ".join(dn + rn)

    def mk(name: str, space: str, target: str, dom: isl.Set) -> isl.Map:
        tensor, _, index = target.partition("[")
        m = _parsed(graph, ctx, f"{{ S[{space}] -> X[{index} }}")
        m = m.set_tuple_name(isl.dim_type.in_, name).set_tuple_name(isl.dim_type.out, tensor)
        return m.intersect_domain(dom)

    init_n, upd_n, fin_n = f"{rel.stmt}_init", f"{rel.stmt}_update", f"{rel.stmt}_final"
    init_dom, fin_dom = data.set_tuple_name(init_n), data.set_tuple_name(fin_n)
    upd_dom = rel.domain.set_tuple_name(upd_n)
    upd_reads = [(r, m.set_tuple_name(isl.dim_type.in_, upd_n)) for r, m in reads]
    upd_reads.append((None, mk(upd_n, it, f"{acc}[{full}]", upd_dom)))
    return [
        Statement(init_n, prim, "init", t, init_dom, mk(init_n, d, f"{acc}[{full}]", init_dom), []),
        Statement(
            upd_n, prim, "update", t, upd_dom, mk(upd_n, it, f"{acc}[{full}]", upd_dom), upd_reads
        ),
        Statement(
            fin_n,
            prim,
            "final",
            t,
            fin_dom,
            mk(fin_n, d, f"{graph.ident(t)}[{full}]", fin_dom),
            [(None, mk(fin_n, d, f"{acc}[{full}]", fin_dom))],
        ),
    ]


def _parsed(graph: Graph, ctx: isl.Context, text: str) -> isl.Map:
    """``isl.Map(text)`` parsed once per graph and context: models of identical layers
    differ only in tuple names, which the callers set on the copy."""
    key = ("model", id(ctx), text)
    hit = graph.isl_memo.get(key)
    if hit is None or hit[0] is not ctx:
        hit = graph.isl_memo[key] = (ctx, isl.Map(text, context=ctx))
    return hit[1]


def build_model(graph: Graph, mg: Micrograph, ctx: isl.Context | None = None) -> PolyModel:
    """Build the isl model of micrograph ``mg`` of ``graph``."""
    ctx = ctx or graph.ctx
    stmts: list[Statement] = []
    for prim in mg.prims:
        stmts.extend(_statements_of(graph, prim))
    inside = set(mg.prims)

    tensors: dict[str, TensorRole] = {}
    for prim in mg.prims:
        t = graph.prims[prim].tensor
        external = graph.is_output(t) or any(c not in inside for c in graph.consumers(prim))
        tensors[prim] = TensorRole(prim, t.shape, "output" if external else "internal", t)
        if t.op is not None and t.op.reduce is not None:
            tensors[f"{prim}_acc"] = TensorRole(f"{prim}_acc", t.shape, "accumulator", t)
    for s in stmts:
        for r, _ in s.reads:
            if r is not None:
                ident = graph.ident(r.tensor)
                if ident not in tensors:
                    tensors[ident] = TensorRole(ident, r.tensor.shape, "input", r.tensor)

    domain = isl.UnionSet.empty(isl.Space.params_alloc(ctx, 0))
    writes = isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))
    reads = isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))
    order = isl.UnionMap.empty(isl.Space.params_alloc(ctx, 0))
    width = max(s.dims for s in stmts)
    for pos, s in enumerate(stmts):
        domain = domain.union(isl.UnionSet.from_set(s.domain))
        writes = writes.union(isl.UnionMap.from_map(s.write))
        for _, m in s.reads:
            reads = reads.union(isl.UnionMap.from_map(m))
        its = [f"i{k}" for k in range(s.dims)]
        pad = its + ["0"] * (width - s.dims)
        target = ", ".join([str(pos)] + pad)
        sched = _parsed(graph, ctx, f"{{ S[{', '.join(its)}] -> [{target}] }}")
        sched = sched.set_tuple_name(isl.dim_type.in_, s.name)
        order = order.union(isl.UnionMap.from_map(sched.intersect_domain(s.domain)))

    return PolyModel(mg, stmts, tensors, domain, writes, reads, order, ctx)


def dependences(
    reads: isl.UnionMap, writes: isl.UnionMap, order: isl.UnionMap
) -> tuple[isl.UnionMap, isl.UnionMap]:
    """(flow, validity) of accesses executed in ``order``, by isl's flow analysis."""
    flow = (
        isl.UnionAccessInfo.from_sink(reads)
        .set_must_source(writes)
        .set_schedule_map(order)
        .compute_flow()
        .get_may_dependence()
    )
    false_deps = (
        isl.UnionAccessInfo.from_sink(writes)
        .set_must_source(writes)
        .set_may_source(reads)
        .set_schedule_map(order)
        .compute_flow()
        .get_may_dependence()
    )
    return flow.coalesce(), flow.union(false_deps).coalesce()
