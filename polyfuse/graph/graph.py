"""The graph of primitive ops, built backwards from the outputs.

Nodes of the networkx DiGraph are primitive names (one per compute tensor); an edge
``p -> c`` carries the tensor ``p`` produces and ``c`` reads. Each node holds a
:class:`Primitive`: its tensor, its isl relations, the kind of each read access and the op kind
derived from them, and the composite op it came from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import islpy as isl
import networkx as nx
import numpy as np

from polyfuse.base.errors import ExpressionError
from polyfuse.graph.access import PrimitiveRelations, isl_ident, primitive_relations
from polyfuse.graph.expr import Tensor
from polyfuse.graph.kinds import AccessKind, OpKind, access_kind, op_kind

if TYPE_CHECKING:
    from polyfuse.graph.passes.record import PassRecord


@dataclass(eq=False)
class Primitive:
    """One compute tensor as a graph node."""

    name: str
    tensor: Tensor
    relations: PrimitiveRelations
    access_kinds: list[AccessKind]
    kind: OpKind
    composite: str = ""

    @property
    def is_reduction(self) -> bool:
        return self.tensor.op is not None and self.tensor.op.reduce is not None

    def __str__(self) -> str:
        t = self.tensor
        reads = ", ".join(
            f"{r.tensor.name}:{k.value}"
            for (r, _), k in zip(self.relations.reads, self.access_kinds, strict=True)
        )
        tag = f" [{self.composite}]" if self.composite else ""
        head = f"{self.name}{list(t.shape)}{self._dtype_note()}"
        return f"{head} {self.kind.value}{tag} <- {reads or '-'}"

    def _dtype_note(self) -> str:
        """`` float16 (accumulate float32)``: the dtype when not float32, and a reduction's
        accumulator when it differs from the result's dtype or was given (``accumulate=``)."""
        t = self.tensor
        note = f" {t.dtype}" if t.dtype != "float32" else ""
        red = t.op.reduce if t.op is not None else None
        if red is not None and (red.accumulate is not None or red.accumulate_dtype != red.dtype):
            note += f" (accumulate {red.accumulate_dtype})"
        return note


@dataclass(eq=False)
class Graph:
    """Primitive ops between graph inputs and outputs."""

    inputs: list[Tensor]
    outputs: list[Tensor]
    prims: dict[str, Primitive]
    dag: nx.DiGraph
    idents: dict[int, str]  # tensor uid -> unique identifier
    ctx: isl.Context = field(repr=False, default=None)  # type: ignore[assignment]
    #: Parsed isl templates shared by the stages of one compile (identical layers parse once).
    isl_memo: dict = field(repr=False, default_factory=dict)
    #: Placeholders bound to fixed arrays (weights), by tensor uid; they are among ``inputs``.
    constants: dict[int, np.ndarray] = field(repr=False, default_factory=dict)
    #: What the graph passes (graph/passes/) did to this graph, in order.
    pass_records: list[PassRecord] = field(repr=False, default_factory=list)

    def ident(self, t: Tensor) -> str:
        return self.idents[t.uid]

    def topo_order(self) -> list[str]:
        return list(nx.lexicographical_topological_sort(self.dag, key=self._order_key))

    def _order_key(self, n: str) -> int:
        return self.prims[n].tensor.uid

    def consumers(self, name: str) -> list[str]:
        return list(self.dag.successors(name))

    def is_output(self, t: Tensor) -> bool:
        return any(o.uid == t.uid for o in self.outputs)

    def is_constant(self, t: Tensor) -> bool:
        """Whether ``t`` is a placeholder bound to a fixed array (``compile(constants=)``)."""
        return t.uid in self.constants

    def add(self, tensor: Tensor) -> str:
        """Add a new compute primitive (its inputs must be in the graph); returns its name."""
        base = isl_ident(tensor.name)
        name, n = base, 1
        while name in set(self.idents.values()):
            name, n = f"{base}_{n}", n + 1
        self.idents[tensor.uid] = name
        self.dag.add_node(name)
        self.replace(name, tensor)
        return name

    def replace(self, name: str, tensor: Tensor) -> None:
        """Swap primitive ``name`` for ``tensor`` (same uid/identifier, e.g. after inlining);
        its relations, kinds and incoming edges are rebuilt."""
        self.prims[name] = primitive(tensor, self.idents, self.ctx)
        for src in list(self.dag.predecessors(name)) if name in self.dag else []:
            self.dag.remove_edge(src, name)
        assert tensor.op is not None
        for src in tensor.op.inputs():
            if not src.is_placeholder:
                self.dag.add_edge(self.idents[src.uid], name, tensor=self.idents[src.uid])

    def replaced(self, changes: dict[str, Tensor]) -> Graph:
        """A new graph in which the primitives named in ``changes`` are swapped for their
        tensors (as :meth:`replace` does); this graph is left unchanged. Identifiers, inputs,
        outputs and the isl context are shared."""
        out = dataclasses.replace(self, prims=dict(self.prims), dag=self.dag.copy())
        for name, tensor in changes.items():
            out.replace(name, tensor)
        return out

    def __str__(self) -> str:
        lines = [f"Graph: {len(self.prims)} primitives"]
        lines += [f"  {self.prims[n]}" for n in self.topo_order()]
        return "\n".join(lines)


def primitive(
    t: Tensor, idents: dict[int, str], ctx: isl.Context, memo: dict | None = None
) -> Primitive:
    """The primitive computing ``t``. ``memo`` (one per graph build) lets the repeated ops of
    identical layers reuse parsed relations and access kinds, which depend only on the
    relations up to tuple names and on the shapes."""
    assert t.op is not None
    rel = primitive_relations(t, idents, ctx, memo)
    kinds = []
    for r, m in rel.reads:
        key = ("kind", _anonymous(m), _anonymous(rel.write), r.tensor.shape, t.shape)
        kind = memo.get(key) if memo is not None else None
        if kind is None:
            kind = access_kind(m, rel.write, r.tensor.shape, t.shape)
            if memo is not None:
                memo[key] = kind
        kinds.append(kind)
    return Primitive(idents[t.uid], t, rel, kinds, op_kind(kinds), t.op.tag)


def _anonymous(m: isl.Map) -> str:
    return str(m.set_tuple_name(isl.dim_type.in_, "S").set_tuple_name(isl.dim_type.out, "X"))


def build_graph(
    inputs: list[Tensor],
    outputs: list[Tensor],
    ctx: isl.Context | None = None,
    constants: dict[Tensor, np.ndarray] | None = None,
) -> Graph:
    """Collect the primitives that ``outputs`` depend on and classify each by isl.

    ``constants``: placeholders among ``inputs`` bound to fixed arrays (weights); the graph
    passes may fold computations on them."""
    ctx = ctx or isl.Context()
    if not outputs:
        raise ExpressionError("compile: give at least one output tensor")
    for t in list(inputs) + list(outputs):
        if not isinstance(t, Tensor):
            raise ExpressionError(f"compile: {t!r} is not a te tensor")
    for t in inputs:
        if not t.is_placeholder:
            raise ExpressionError(f"compile: input '{t.name}' is a compute, not a te.placeholder")
    for t in outputs:
        if t.is_placeholder:
            raise ExpressionError(
                f"compile: output '{t.name}' is a placeholder; nothing computes it"
            )
    input_ids = {t.uid for t in inputs}
    if len(input_ids) != len(inputs):
        raise ExpressionError("compile: an input tensor is listed twice")

    # Walk back from the outputs.
    computes: dict[int, Tensor] = {}
    stack = list(outputs)
    while stack:
        t = stack.pop()
        if t.uid in computes:
            continue
        computes[t.uid] = t
        assert t.op is not None
        for src in t.op.inputs():
            if src.is_placeholder:
                if src.uid not in input_ids:
                    raise ExpressionError(
                        f"compute '{t.name}' reads placeholder '{src.name}', which is not listed "
                        "in inputs="
                    )
            else:
                stack.append(src)

    idents: dict[int, str] = {}
    used: set[str] = set()
    tried: dict[str, int] = {}  # base -> next suffix to try (names only get used, never freed)
    for t in list(inputs) + sorted(computes.values(), key=lambda t: t.uid):
        base = isl_ident(t.name)
        n = tried.get(base, 0)
        name = base if n == 0 else f"{base}_{n}"
        n = max(n, 1)
        while name in used:
            name, n = f"{base}_{n}", n + 1
        tried[base] = n
        used.add(name)
        idents[t.uid] = name

    dag = nx.DiGraph()
    prims: dict[str, Primitive] = {}
    memo: dict = {}
    for t in sorted(computes.values(), key=lambda t: t.uid):
        prims[idents[t.uid]] = primitive(t, idents, ctx, memo)
        dag.add_node(idents[t.uid])
    for name, p in prims.items():
        assert p.tensor.op is not None
        for src in p.tensor.op.inputs():
            if not src.is_placeholder:
                dag.add_edge(idents[src.uid], name, tensor=idents[src.uid])
    bound = {t.uid: a for t, a in (constants or {}).items()}
    if not set(bound) <= input_ids:
        raise ExpressionError("compile: every constant must also be listed in inputs")
    return Graph(list(inputs), list(outputs), prims, dag, idents, ctx, constants=bound)
