"""Reduction axes read through ``k // D`` and ``k % D`` split into two affine axes.

A transformer's attention output projection reads the heads' results merged back into the
hidden dim: ``ctx[b, s, k] = pv[b, k // D, s, k % D]`` (a transpose and a reshape), which the
layout fold composes into the GEMM ``out[b, s, n] = sum_k pv[b, k // D, s, k % D] * W[k, n]``.
Its subscripts are quasi-affine, so neither the tensor-core match (affine access relations)
nor the CUDA-core GEMM tiles take it well: in bfloat16 it ran one element per thread.

:func:`split_reduction` rewrites such a reduction axis ``k`` of extent ``E`` (from 0), read
as ``k // D`` and ``k % D`` for one ``D`` dividing ``E``, and elsewhere only affinely, as two
axes ``kh`` (``E / D``) and ``kd`` (``D``) in that order: ``k // D`` becomes ``kh``, ``k % D``
``kd``, and every other ``k`` ``kh * D + kd``. The sum runs over the same terms in the same
order, so the result is the same bit for bit; the GEMM then has two reduction dims, flattened
into its ``k`` as a convolution's are (the operand ``pv`` gathered by 16-byte chunks of ``kd``,
``W`` read linearly in the flattened ``k``). For 16-bit and byte operands, the tensor cores'
(:func:`_tensor_core_operands`), always; for float32 ones where ``D`` is no multiple of
:data:`CUDA_CORE_KTILE`: the CUDA-core tiles read the merged axis through their fills while a
k-tile stays inside one run of ``D`` (BERT-base's ``D = 64``: its split tiles fit worse), and
otherwise find no fixed-size box for the operand's tile and run one element per thread
(DeepFM's embeddings, 39 fields of 10: GEMM-tiled once split).
"""

from __future__ import annotations

from polyfuse.graph.dtypes import HALF_DTYPES
from polyfuse.graph.expr import (
    BYTE_DTYPES,
    Binary,
    Const,
    Expr,
    IterVar,
    Read,
    Reduce,
    rewrite,
    walk,
)
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.rewrite import Rewriter, with_body

NAME = "split_reduction"
#: the smallest k-tile of the CUDA-core GEMM tiles: a merged axis ``k // D`` with ``D`` a
#: multiple of it keeps every k-tile inside one ``D`` run (a box; BERT-base's output
#: projection), other ``D`` are split for float32 too (DeepFM's 39 fields of 10)
CUDA_CORE_KTILE = 8
#: the operand dtypes whose GEMMs the split is for (tensor cores)
TENSOR_CORE_DTYPES = (*HALF_DTYPES, *BYTE_DTYPES)


def _divisor(e: Expr, k: IterVar) -> int | None:
    """``D`` where ``e`` is ``k // D`` or ``k % D`` with a constant integer ``D > 1``."""
    if (
        isinstance(e, Binary)
        and e.op in ("floordiv", "mod")
        and isinstance(e.a, IterVar)
        and e.a.uid == k.uid
        and isinstance(e.b, Const)
        and isinstance(e.b.value, int)
        and not isinstance(e.b.value, bool)
        and e.b.value > 1
    ):
        return e.b.value
    return None


def _split_of(body: Expr, k: IterVar) -> int | None:
    """The ``D`` to split ``k`` by (see the module doc), or None: every ``k // D`` and
    ``k % D`` of ``body`` share one ``D`` dividing ``k``'s extent, and ``k`` appears in no
    other division or modulo."""
    ds: set[int] = set()
    for e in walk(body):
        if isinstance(e, Binary) and e.op in ("floordiv", "mod"):
            d = _divisor(e, k)
            if d is not None:
                ds.add(d)
            elif any(isinstance(n, IterVar) and n.uid == k.uid for n in walk(e)):
                return None
    if len(ds) != 1 or k.lo != 0:
        return None
    (d,) = ds
    return d if k.extent % d == 0 and k.extent > d else None


def _tensor_core_operands(red: Reduce) -> bool:
    """Whether the reduction sums products of 16-bit or (widened) byte reads, the operands
    of the tensor-core match. float32 GEMMs keep a merged axis whose runs hold whole k-tiles:
    the CUDA-core tiles read the quasi-affine subscripts through their fills, and split, BERT-
    base's output projection (12 heads of 64) fit no tile with two reduction dims."""
    reads = [r for r in walk(red.body) if isinstance(r, Read)]
    return bool(reads) and all(r.tensor.dtype in TENSOR_CORE_DTYPES for r in reads)


def split_reduction(graph: Graph) -> Graph:
    """``graph`` with each reduction axis read through ``// D`` and ``% D`` split in two (see
    the module doc), each change recorded."""
    rw = Rewriter(graph, NAME)
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        red = t.op.reduce if t.op is not None else None
        if red is None:
            continue
        tensor_cores = _tensor_core_operands(red)
        body, axes, notes = red.body, list(red.axes), []
        for k in red.axes:
            d = _split_of(body, k)
            if d is None or (not tensor_cores and d % CUDA_CORE_KTILE == 0):
                continue
            hi = IterVar(f"{k.name}_hi", 0, k.extent // d, "reduce")
            lo = IterVar(f"{k.name}_lo", 0, d, "reduce")

            def swap(e: Expr, kids: tuple[Expr, ...], k=k, d=d, hi=hi, lo=lo) -> Expr | None:
                if _divisor(e, k) == d:
                    return hi if e.op == "floordiv" else lo  # type: ignore[attr-defined]
                if isinstance(e, IterVar) and e.uid == k.uid:
                    return hi * d + lo
                return None

            body = rewrite(body, swap)
            i = axes.index(k)
            axes[i : i + 1] = [hi, lo]
            what = f"{hi.name} x {lo.name} ({k.extent // d} x {d})"
            notes.append(f"{k.name} (extent {k.extent}) as {what}")
        if not notes:
            continue
        rw.define(with_body(t, Reduce(red.op, body, tuple(axes), red.accumulate)))
        rw.record(
            PassAction.SIMPLIFIED,
            [name],
            f"{name}: reduction axis {', '.join(notes)}: its reads by k // D and k % D become "
            "affine (a merged-heads GEMM matches tensor cores and GEMM tiles), the same sum "
            "in the same order",
        )
    return rw.result()
