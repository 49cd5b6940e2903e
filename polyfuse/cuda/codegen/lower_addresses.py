"""Lowering pass: strength-reduced global addresses of the copies in a k-tile loop.

A copy into a shared tile reads ``src[i_0 * s_0 + ... + i_n]``, each ``i_d`` an affine
expression of the k-tile, the copy's own loops and the block and thread coordinates. Printed
as such, the compiler recomputes the 64-bit address from the coordinates every k-tile (under
register pressure it rematerialises them rather than keep them live). The pass splits each
copy's linear offset into

- the part over variables bound outside the loop (block, thread coordinates) plus the loop
  variable's term at the loop's first iteration: a pointer's start, declared before the loop
  (:class:`KStream`),
- the loop variable's coefficient: the pointer's advance after every iteration,
- the part over variables bound inside the loop (the copy's own, unrolled, loops): the
  offset the copy reads at from the pointer (constants once unrolled).

Copies of one array whose outer part and advance agree share a pointer. A copy whose offset is
not affine (a floor division, a ``%``) keeps its address. The guard of a copy (zeros outside
the array) still tests its coordinates.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from polyfuse.cuda.codegen.kernel_ast import (
    KCopy,
    KDef,
    KernelIR,
    KExpr,
    KFor,
    KInt,
    KMutator,
    KNode,
    KOp,
    KStream,
    KVar,
    KVisitor,
    map_children,
)
from polyfuse.cuda.codegen.namer import Namer

Linear = dict[str, int]  # variable -> coefficient; "" -> the constant


class _Linear(KVisitor["Linear | None"]):
    """An integer expression as an affine form (None when it is not affine)."""

    def visit_KInt(self, e: KInt) -> Linear | None:
        return {"": e.value}

    def visit_KVar(self, e: KVar) -> Linear | None:
        return {e.name: 1}

    def visit_KOp(self, e: KOp) -> Linear | None:
        parts = [self.visit(a) for a in e.args]
        if any(p is None for p in parts):
            return None
        ps: list[Linear] = parts  # type: ignore[assignment]
        if e.op == "+":
            return _sum(ps)
        if e.op == "-" and len(ps) == 2:
            return _sum([ps[0], _scale(ps[1], -1)])
        if e.op == "neg":
            return _scale(ps[0], -1)
        if e.op == "*" and len(ps) == 2:
            a, b = ps
            if set(a) <= {""}:
                return _scale(b, a.get("", 0))
            if set(b) <= {""}:
                return _scale(a, b.get("", 0))
        return None

    def visit_default(self, e: KExpr) -> Linear | None:
        return None


def linear(e: KExpr) -> Linear | None:
    """``e`` as an affine form over its variables, or None when it is not affine."""
    return _Linear().visit(e)


def _sum(parts: Iterable[Linear]) -> Linear:
    out: Linear = {}
    for p in parts:
        for v, c in p.items():
            out[v] = out.get(v, 0) + c
    return {v: c for v, c in out.items() if c or v == ""}


def _scale(p: Linear, k: int) -> Linear:
    return {v: c * k for v, c in p.items()}


def expr(p: Linear) -> KExpr:
    """The affine form as a kernel-AST expression (terms in the form's order)."""
    terms: list[KExpr] = []
    for v, c in p.items():
        if v == "" or c == 0:
            continue
        terms.append(KVar(v) if c == 1 else KOp("*", (KInt(c), KVar(v))))
    if p.get("", 0) or not terms:
        terms.append(KInt(p.get("", 0)))
    return terms[0] if len(terms) == 1 else KOp("+", tuple(terms))


def offset(index: tuple[KExpr, ...], shape: tuple[int, ...]) -> Linear | None:
    """The row-major linear offset of ``index`` in an array of ``shape`` (affine or None)."""
    parts: list[Linear] = []
    stride = 1
    for e, n in zip(reversed(index), reversed(shape), strict=True):
        p = linear(e)
        if p is None:
            return None
        parts.append(_scale(p, stride))
        stride *= n
    return _sum(parts)


def _bound(nodes: Iterable[KNode]) -> set[str]:
    """Variables bound by the loops and definitions in ``nodes`` (at any depth)."""
    out: set[str] = set()
    for n in nodes:
        if isinstance(n, (KFor, KDef)):
            out.add(n.var)
        for c in ("body", "then", "orelse"):
            out |= _bound(getattr(n, c, []))
    return out


def _streamed(loop: KFor, taken: set[str], arrays: frozenset[str]) -> KFor:
    """``loop`` with its copies' addresses in the global ``arrays`` on pointers it advances."""
    assert isinstance(loop.init, KInt)
    inner = _bound(loop.body) | {loop.var}
    streams: dict[tuple, KStream] = {}

    def name_for(array: str) -> str:
        k = 0
        while Namer.address_stream(array, k) in taken:
            k += 1
        taken.add(Namer.address_stream(array, k))
        return Namer.address_stream(array, k)

    def walk(nodes: list[KNode]) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, KCopy) and n.src in arrays and not n.stream:
                out.append(stream(n))
            else:
                out.append(map_children(n, walk))
        return out

    def stream(n: KCopy) -> KCopy:
        off = offset(n.src_index, n.src_shape)
        if off is None:
            return n
        step = off.get(loop.var, 0)
        outer = {v: c for v, c in off.items() if v not in inner}
        rel = {v: c for v, c in off.items() if v in inner and v != loop.var}
        start = _sum([outer, {"": step * loop.init.value}])
        key = (n.src, tuple(sorted(start.items())), step)
        if key not in streams:
            streams[key] = KStream(name_for(n.src), n.src, expr(start), step)
        return replace(n, stream=streams[key].name, stream_offset=expr(rel))

    body = walk(loop.body)
    return replace(loop, body=body, streams=loop.streams + tuple(streams.values()))


def strength_reduce(ir: KernelIR, loops: Iterable[str]) -> KernelIR:
    """A new IR whose loops over ``loops`` (constant first iteration) read their copies'
    global sources through pointers advanced per iteration (:class:`KStream`)."""
    names = frozenset(loops)
    if not names:
        return ir
    taken = {a.name for a in ir.allocs} | {p.name for p in ir.params}
    arrays = frozenset(p.name for p in ir.params if p.tensor is not None)

    class Walk(KMutator):
        def visit_KFor(self, n: KFor) -> KNode:
            n = replace(n, body=self.body(n.body))
            if n.var in names and isinstance(n.init, KInt):
                return _streamed(n, taken, arrays)
            return n

    return ir.with_(body=tuple(Walk().body(ir.body)))
