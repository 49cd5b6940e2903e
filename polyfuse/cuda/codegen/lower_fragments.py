"""Lowering pass: register fragments of promoted GEMM operands (PPCG's register promotion).

An operand fragment (:mod:`polyfuse.poly.fragments`) arrives as an :class:`OperandFragment`:
the micro-tile loop variables indexing it, their extents and the global element the read
touches at each of them (kernel-AST expressions over loop variables and block/thread
coordinates). The pass declares the register array ``r_<tensor>_frag`` (one dimension,
indexed row-major by those variables), loads it from the operand's shared tile
(:class:`KTile`: buffer, lower bounds, pipeline stage) right before every micro-tile loop nest
that reads the operand (before the reading statement itself where a 1x1 micro-tile leaves no
loop around it) — one unrolled :class:`KCopy` per element — and records a
:class:`KFragment` so that those reads print as the register. A k-invariant fragment
(``s[i]`` in ``sum_k a[i, k] * b[k, j] * s[i]``) is loaded from the global array instead,
once, before the outermost loop around its readers (zeros outside the array).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from polyfuse.cuda.codegen.kernel_ast import (
    KAlloc,
    KCopy,
    KernelIR,
    KExpr,
    KFor,
    KFragment,
    KInt,
    KNode,
    KOp,
    KStmt,
    KTile,
    KVar,
    MemSpace,
    map_children,
)


@dataclass(frozen=True)
class OperandFragment:
    """One operand's register fragment as the pass needs it."""

    tensor: str
    index_vars: tuple[str, ...]  # micro-tile loop variables indexing the fragment
    shape: tuple[int, ...]  # their extents (constant trip counts, loops from 0)
    element: tuple[KExpr, ...]  # global coordinates read, over loop variables
    readers: frozenset[str]  # statements whose reads of ``tensor`` use the fragment
    #: a k-invariant fragment: loaded from the global array of this shape once, before the
    #: outermost loop around its readers (empty: from the shared tile, per micro-tile nest)
    global_shape: tuple[int, ...] = ()
    #: per dim of a global load: whether the element never falls below 0 / past the end
    inside: tuple[tuple[bool, bool], ...] = ()

    @property
    def hoisted(self) -> bool:
        return bool(self.global_shape)


def _linear(index_vars: Sequence[str], shape: Sequence[int]) -> KExpr:
    """Row-major index of ``index_vars`` in an array of ``shape`` (0 without variables)."""
    out: KExpr | None = None
    for v, n in zip(index_vars, shape, strict=True):
        out = KVar(v) if out is None else KOp("+", (KOp("*", (out, KInt(n))), KVar(v)))
    return out if out is not None else KInt(0)


def _combine(element: Sequence[KExpr], coef: Sequence[int]) -> KExpr:
    """``sum_d coef_d * element_d`` (a tile dim of a merged view)."""
    pairs = zip(element, coef, strict=True)
    terms = [e if c == 1 else KOp("*", (e, KInt(c))) for e, c in pairs if c]
    return terms[0] if len(terms) == 1 else KOp("+", tuple(terms))


def _reads(nodes: Sequence[KNode], stmts: frozenset[str]) -> bool:
    for n in nodes:
        if isinstance(n, KStmt) and n.stmt in stmts:
            return True
        if any(_reads(getattr(n, c, []), stmts) for c in ("body", "then", "orelse")):
            return True
    return False


def lower_fragments(
    ir: KernelIR, fragments: Sequence[OperandFragment], micro_tile: Sequence[str]
) -> KernelIR:
    """A new IR in which each fragment is a register array loaded from its shared tile before
    the outermost loop over a ``micro_tile`` variable that contains one of its readers."""
    if not fragments:
        return ir
    tiles: dict[str, KTile] = {t.tensor: t for t in ir.tiles}
    shapes = {a.name: a.shape for a in ir.allocs}
    missing = [f.tensor for f in fragments if f.tensor not in tiles and not f.hoisted]
    assert not missing, f"register fragments of operands without a shared tile: {missing}"
    micro = frozenset(micro_tile)
    fragment_name = ir.namer.fragment  # r_<name>_frag
    per_step = [f for f in fragments if not f.hoisted]
    readers = frozenset().union(*(f.readers for f in per_step))

    def load(f: OperandFragment) -> KNode:
        dst = (_linear(f.index_vars, f.shape),)
        if f.hoisted:  # from global memory; zeros outside the array (padded tiles)
            conds: list[KExpr] = []
            for e, n, (above, below) in zip(f.element, f.global_shape, f.inside, strict=True):
                conds += [KOp(">=", (e, KInt(0)))] if not above else []
                conds += [KOp("<", (e, KInt(n)))] if not below else []
            guard = None if not conds else conds[0] if len(conds) == 1 else KOp("&&", tuple(conds))
            node: KNode = KCopy(
                fragment_name(f.tensor),
                dst,
                ir.namer.tensor(f.tensor),
                f.element,
                guard,
                0.0,
                f.global_shape,
            )
        else:
            t = tiles[f.tensor]
            element = f.element
            if t.merge:  # the tile views contiguous dims of the tensor as one
                element = tuple(_combine(f.element, row) for row in t.merge)
            src = tuple(KOp("-", (e, lo)) for e, lo in zip(element, t.lo, strict=True))
            if t.stage is not None:  # a multi-stage tile: the stage is its first dimension
                src = (t.stage,) + src
            node = KCopy(fragment_name(f.tensor), dst, t.buffer, src, None, 0.0, shapes[t.buffer])
        for v, n in reversed(list(zip(f.index_vars, f.shape, strict=True))):
            cond = KOp("<=", (KVar(v), KInt(n - 1)))
            node = KFor(v, KInt(0), cond, 1, [node], unroll=True)
        return node

    def hoist(nodes) -> list[KNode]:
        """Hoisted loads before the outermost loop (or statement) that holds a reader."""
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, (KFor, KStmt)):
                out += [load(f) for f in fragments if f.hoisted and _reads([n], f.readers)]
                out.append(n)
            else:
                out.append(map_children(n, hoist))
        return out

    def walk(nodes) -> list[KNode]:
        out: list[KNode] = []
        for n in nodes:
            if isinstance(n, KFor) and n.var in micro and _reads([n], readers):
                out += [load(f) for f in per_step if _reads([n], f.readers)]
                out.append(n)
            elif isinstance(n, KStmt) and n.stmt in readers:
                # no micro-tile loop around it (a 1x1 micro-tile reading the operand twice,
                # where(x > 0, x, 0) * w): its fragments load right before it, each step
                out += [load(f) for f in per_step if n.stmt in f.readers]
                out.append(n)
            else:
                out.append(map_children(n, walk))
        return out

    regs = tuple(
        KAlloc(fragment_name(f.tensor), MemSpace.REGISTER, "", (math.prod(f.shape),))
        for f in fragments
    )
    records = tuple(
        KFragment(f.tensor, fragment_name(f.tensor), _linear(f.index_vars, f.shape), f.readers)
        for f in fragments
    )
    return ir.with_(
        allocs=ir.allocs + regs,
        fragments=ir.fragments + records,
        body=tuple(walk(hoist(ir.body)) if per_step else hoist(ir.body)),
    )
