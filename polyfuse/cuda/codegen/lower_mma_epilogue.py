"""The epilogue of a tensorized GEMM kernel: its statements per accumulator element, and the
stores of adjacent columns paired into one access.

Accumulator element ``x`` of lane ``l`` in fragment ``(i, j)`` is at row
``m0 + wm + 16 i + l/4 + 8 (x/2)``, column ``n0 + wn + 8 j + 2 (l%4) + x%2``: elements ``2h``
and ``2h + 1`` are two adjacent columns of one row. The epilogue statements (the final store,
bias, activation, ...) are :class:`KStmt` nodes whose stores come from
:class:`polyfuse.cuda.codegen.lower_accesses.Accesses`, the accumulator element in the
reduction's register, under the guard that the element lies inside the result.

**Paired stores.** Stored one element at a time, a 16-bit result takes one 2-byte store per
element (a warp's store covers 8 rows x 4 scattered 2-byte columns). Where the pair of
columns is proven to be two consecutive, aligned elements of every tensor the epilogue
stores to global memory, the two elements run as a vector group of width 2
(:class:`KVector`): their statements compute into lane registers and each tensor is stored
once per pair — a 32-bit word (``__nv_bfloat162`` / ``__half2``, rounded to nearest even
as the scalar path rounds each element) or a ``float2`` — half the store instructions and
half the guards. The proof, on the epilogue's subscripts:

- the result's column is the stored tensors' innermost subscript, and no other subscript
  depends on it — or, where a conv folds its output rows into the columns (``col / W``,
  ``col % W``), the rows are ``W`` long with ``W`` even, so a pair never straddles two — so
  the two columns are consecutive elements;
- the first column is even (the columns start at an even bound; blocks, warps and fragments
  step by multiples of 8) and every row of each stored tensor has an even number of
  elements, so the pair starts at an even element (the word is aligned);
- the result has an even number of columns, so the guard of the first column is the guard
  of both;
- every stored tensor is float32, float16 or bfloat16 in global memory, or the whole-row
  tile of floats :mod:`polyfuse.stitch.mma_rows` keeps in shared memory, whose rows start at
  even elements (an even stride, an even first column): a ``float2`` per pair, which its
  padding (:func:`polyfuse.stitch.mma_rows.row_pad`) makes bank-conflict free.

A kernel input the statements read at the pair's two columns (a bias ``b[col]``, a residual
``r[row, col]``) is loaded as one word as well (:func:`paired_reads`).

Otherwise the epilogue stores element by element; either way the kernel notes say why. The
guard tests only the extents the block tiles do not cover exactly (none where both do: the
FFN's 8192 x 3072 result in 128 x 256 tiles runs its epilogue untested).
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl

from polyfuse.base.decision import DecisionKind, DecisionNote, noted
from polyfuse.cuda.codegen.kernel_arith import add, all_of, band, cmp, div, mod, mul, shr
from polyfuse.cuda.codegen.kernel_ast import (
    KAssign,
    KernelIR,
    KExpr,
    KFor,
    KIf,
    KInt,
    KLaneAccess,
    KLet,
    KNode,
    KRef,
    KStmt,
    KVar,
    KVector,
    substitute,
)
from polyfuse.cuda.codegen.kernel_walk import variables
from polyfuse.cuda.codegen.lower_accesses import Accesses
from polyfuse.cuda.codegen.namer import Namer
from polyfuse.graph import expr as ex
from polyfuse.poly.model import Statement
from polyfuse.poly.placement import Placement
from polyfuse.poly.tensorize import MMA_M, MMA_N, TensorCoreKernel

#: the dtypes whose pair of adjacent elements is stored as one access
PAIRED_DTYPES = ("float32", "float16", "bfloat16")


def unrolled_loop(var: str, trips: int, body: list[KNode]) -> KFor:
    """``#pragma unroll`` ``for (var = 0; var < trips; var++)`` over ``body`` (the
    accumulator fragments' loops)."""
    return KFor(var, KInt(0), cmp("<", var, trips), 1, tuple(body), unroll=True)


def _per_fragment(tk: TensorCoreKernel, inner: KNode) -> KFor:
    """``inner`` in every accumulator fragment ``(pf_i, pf_j)`` of a warp's tile."""
    t = tk.tiling
    return unrolled_loop("pf_i", t.tiles_m, [unrolled_loop("pf_j", t.tiles_n, [inner])])


def epilogue(
    tk: TensorCoreKernel,
    batch: list[KExpr],
    placements: dict[str, Placement],
    idents: dict[int, str],
    namer: Namer,
    hm: int,
    hn: int,
) -> tuple[KNode, DecisionNote]:
    """The epilogue loop nest over every accumulator element (see the module doc), and the
    note that says whether its stores are paired and why (not)."""
    shape = tk.shape
    assert shape is not None
    accesses = Accesses(
        KernelIR("", (), (), (), (), namer=namer), list(shape.epilogue), placements, idents
    )
    row, col = KVar("pf_row"), KVar("pf_col")
    args = list(batch)
    args[tk.m_dim], args[tk.n_dim] = row, col
    if tk.fold is not None:
        ln, hn_ = shape.data[tk.n_dim]
        width = hn_ - ln + 1
        args[tk.fold], args[tk.n_dim] = div(col, width), mod(col, width)
    if tk.split:  # the micrograph's dim d is og * group + row in the group
        d, og = tk.split
        args[d : d + 2] = [add(mul(args[d], og), args[d + 1])]
    acc = namer.register(f"{shape.update.prim}_acc")
    i, j, lane = KVar("pf_i"), KVar("pf_j"), KVar("pf_lane")
    first = add("pf_n0", "pf_wn", mul(MMA_N, j), mul(2, band(lane, 3)))
    why = _unpaired(tk, args, placements, hn, namer)
    # the result's extents where the block tiles do not cover them exactly (else no test)
    lm, ln = shape.data[tk.m_dim][0], 0 if tk.fold is not None else shape.data[tk.n_dim][0]
    t = tk.tiling
    edges = [(hm - lm + 1) % t.block_m != 0, (hn - ln + 1) % t.block_n != 0]

    def inside(c: KExpr, body: tuple[KNode, ...]) -> list[KNode]:
        tests = [cmp("<=", x, hi) for x, hi, edge in ((row, hm, edges[0]), (c, hn, edges[1]))
                 if edge]  # fmt: skip
        return [KIf(all_of(*tests), body)] if tests else list(body)

    if why is not None:
        x = KVar("pf_x")
        stmts = [KStmt(s.name, tuple(args), stores=accesses.statement(s, args))
                 for s in shape.epilogue]  # fmt: skip
        element = [
            KLet("pf_row", add("pf_m0", "pf_wm", mul(MMA_M, i), shr(lane, 2), mul(8, shr(x, 1)))),
            KLet("pf_col", add(first, band(x, 1))),
            *inside(col, (KAssign(KRef(acc), KRef("pf_acc", (i, j, x))), *stmts)),
        ]
        nest = _per_fragment(tk, unrolled_loop("pf_x", 4, element))
        return nest, noted(
            DecisionKind.TENSOR_CORES, f"epilogue: element stores ({why})", made=False
        )
    h, v = KVar("pf_h"), KVar("pf_v")
    at_first = tuple(substitute(a, "pf_col", KVar("pf_c0")) for a in args)  # the first
    stored = [s for s in shape.epilogue if placements[s.prim].space in ("global", "shared")]
    inputs = {n: p for n, p in placements.items()
              if n not in {e.prim for e in shape.epilogue} | {shape.update.prim}}  # fmt: skip
    loads = [KLaneAccess(t, s.name, at_first) for s in shape.epilogue
             for t in paired_reads(s, len(args), inputs, idents)]  # fmt: skip
    group = KVector("pf_v", 2, (), tuple(loads),
                    tuple(KLaneAccess(s.prim, s.name, at_first) for s in stored))  # fmt: skip
    group, lanes = accesses.vector(group)
    stmts = []
    for s in shape.epilogue:
        accesses.r.lanes = lanes.get(s.name, {})
        stmts.append(KStmt(s.name, tuple(args), stores=accesses.statement(s, args)))
    accesses.r.lanes = {}
    body = (
        KLet("pf_col", add("pf_c0", v)),
        KAssign(KRef(acc), KRef("pf_acc", (i, j, add(mul(2, h), v)))),
        *stmts,
    )
    pair = [
        KLet("pf_row", add("pf_m0", "pf_wm", mul(MMA_M, i), shr(lane, 2), mul(8, h))),
        KLet("pf_c0", first),
        *inside(KVar("pf_c0"), (replace(group, body=body),)),
    ]
    nest = _per_fragment(tk, unrolled_loop("pf_h", 2, pair))
    names = [  # canonical slots in a canonical kernel; a shared row tile by its array's name
        namer.shared(s.prim) if placements[s.prim].space == "shared" else namer.tensor(s.prim)
        for s in stored
    ]
    read = sorted({namer.tensor(a.tensor) for a in loads})
    also = f"; {', '.join(read)} read likewise" if read else ""
    return nest, noted(
        DecisionKind.TENSOR_CORES,
        f"epilogue: {', '.join(names)} stored a pair of adjacent columns per access{also}",
        *names,
    )


def paired_reads(
    s: Statement, ndims: int, placements: dict[str, Placement], idents: dict[int, str]
) -> list[str]:
    """The global tensors epilogue statement ``s`` reads whose pair of elements at two
    adjacent columns is one aligned word: every read of the tensor in ``s`` has the column
    axis as its innermost subscript and nowhere else (a bias ``b[col]``, a residual
    ``r[row, col]``), its rows have an even length and its dtype pairs. ``placements``: the
    kernel's inputs only (a tensor the kernel computes is read from its register)."""
    t = s.tensor
    assert t.op is not None
    dims = [a for a in t.op.axes if a.extent > 1]
    if s.role != "compute" or len(dims) != ndims:  # a final store reads no operand; the
        return []  # column must be the statement's last domain dim
    col = dims[-1].uid
    reads: dict[str, list[ex.Read]] = {}
    for r in t.op.reads():
        reads.setdefault(idents.get(r.tensor.uid, r.tensor.name), []).append(r)
    out = []
    for name, rs in reads.items():
        p = placements.get(name)
        x = rs[0].tensor
        if p is None or p.space != "global" or x.dtype not in PAIRED_DTYPES or x.shape[-1] % 2:
            continue
        first = [_key(i) for i in rs[0].indices]
        if any([_key(i) for i in r.indices] != first for r in rs[1:]):
            continue
        *outer, last = rs[0].indices
        if not (isinstance(last, ex.IterVar) and last.uid == col):
            continue
        if any(isinstance(n, ex.IterVar) and n.uid == col for i in outer for n in ex.walk(i)):
            continue
        out.append(name)
    return out


def _unpaired(
    tk: TensorCoreKernel,
    args: list[KExpr],
    placements: dict[str, Placement],
    hn: int,
    namer: Namer,
) -> str | None:
    """Why the epilogue's pairs of columns cannot be stored as one access each (None: they
    can; the conditions are the module doc's)."""
    shape = tk.shape
    assert shape is not None
    col = KVar("pf_col")
    ln, width = shape.data[tk.n_dim][0], shape.data[tk.n_dim][1] - shape.data[tk.n_dim][0] + 1
    inner = col  # the innermost subscript: the column, or its place in a folded row
    if tk.fold is not None:
        ln, inner = 0, mod(col, width)
        if width % 2:
            return f"folded rows of {width} columns: a pair may straddle two"
    outer = [a for i, a in enumerate(args[:-1]) if i != tk.fold or tk.fold is None]
    if args[-1] != inner or any("pf_col" in variables(a) for a in outer):
        return "the columns are not the stored tensors' innermost subscript"
    if ln % 2 or (hn - ln + 1) % 2:
        return f"columns {ln}..{hn}: an odd bound"
    stored = []
    for s in shape.epilogue:
        p = placements[s.prim]
        name = namer.tensor(s.prim)
        if p.space == "shared":  # a whole-row tile of floats: float2 pairs
            (lo, _), stride = p.box[-1], p.box[-1][1]
            if stride % 2 or not _even(lo):
                return f"{name}'s shared rows do not start at even elements"
            stored.append(s)
            continue
        if p.space != "global":
            continue
        t = s.tensor
        if t.dtype not in PAIRED_DTYPES:
            return f"{name} is {t.dtype}"
        if t.shape[-1] % 2:
            return f"{name}'s rows have an odd length ({t.shape[-1]})"
        stored.append(s)
    if not stored:
        return "nothing stored to memory"
    return None


def _even(bound: isl.PwAff) -> bool:
    """Whether an affine bound (of the block coordinates) is even wherever it is defined: its
    constant and every coefficient even, piece by piece."""
    for _, aff in bound.get_pieces():
        vals = [aff.get_constant_val()]
        for kind in (isl.dim_type.param, isl.dim_type.in_):
            vals += [aff.get_coefficient_val(kind, i) for i in range(aff.dim(kind))]
        if any(not v.is_int() or v.to_python() % 2 for v in vals):
            return False
    return True


def _key(e: ex.Expr) -> tuple:
    """A structural key of a subscript (its nodes, loop variables by identity)."""
    return tuple((type(n).__name__, getattr(n, "uid", None), repr(n)) for n in ex.walk(e))
