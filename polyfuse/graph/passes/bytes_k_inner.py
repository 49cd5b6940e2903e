"""k-innermost byte operands for integer GEMMs on tensor cores.

An integer GEMM of byte operands, ``sum_k int32(a[.., m, k]) * int32(b[.., k, n])``, runs on
``mma.sync.m16n8k32`` (:mod:`polyfuse.poly.tensorize`), whose fragments hold four consecutive
``k`` of a row or column per register: ``ldmatrix`` loads them from a k-innermost shared tile
and has no ``.trans`` of 8-bit elements. An operand stored with ``k`` outside (``x @ W`` with
``W`` of ``[K, N]``, the layout of ONNX MatMulInteger's weights) is therefore transposed by its
tile's fill, element by element: a byte load and a byte store each, and no ``cp.async``.

:func:`bytes_k_inner` moves ``k`` innermost on the graph, for a target with ``mma.sync``
(sm_80 and later): a constant operand is permuted at compile time; an operand computed by a
primitive without reduction that only the GEMM reads (a quantization of an activation) is
computed k-innermost by that primitive itself (its loop nest permuted: no copy); any other
operand is read through a transposing primitive (one read and one write of its bytes, against
a fill whose scalar byte copies cost an instruction pair each, took the k-tile loop out of the
cp.async pipeline and took NVRTC 83 s to compile at 2048 x 2048 x 4096 against 13 s). The
fill's transposition stays for graphs compiled without the pass.
"""

from __future__ import annotations

from polyfuse.graph.expr import Binary, IterVar, Read, Tensor, widened_byte_read
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.relayout import Permute, has_mma, innermost, plain_dims, relaid
from polyfuse.graph.passes.rewrite import Rewriter, with_body


def byte_gemm_operands(t: Tensor) -> tuple[list[Read], IterVar] | None:
    """The byte reads of ``t``'s integer GEMM that hold ``k`` in a dim other than their
    innermost, and ``k``; None where ``t`` is no sum over one ``k`` of two widened byte
    reads."""
    red = t.op.reduce if t.op is not None else None
    if red is None or red.op != "sum" or len(red.axes) != 1:
        return None
    body = red.body
    if not (isinstance(body, Binary) and body.op == "mul"):
        return None
    reads = [widened_byte_read(body.a), widened_byte_read(body.b)]
    if any(r is None for r in reads):
        return None
    (k,) = red.axes
    outside = [
        r
        for r in reads
        if r is not None and len(dims := plain_dims(r, k)) == 1 and dims[0] != r.tensor.ndim - 1
    ]
    return outside, k


def bytes_k_inner(graph: Graph, arch: str) -> Graph:
    """``graph`` with each byte GEMM's operands stored k-innermost (see the module doc), each
    change recorded with how."""
    rw = Rewriter(graph, "bytes_k_inner")
    if not has_mma(arch):
        return graph
    made: dict[int, Tensor] = {}  # an operand's k-innermost tensor, shared by its readers
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        got = byte_gemm_operands(t)
        if not got or not got[0]:
            continue
        reads, k = got
        perms: dict[int, tuple[Tensor, list[int]]] = {}
        moved: list[str] = []
        for r in reads:
            src = r.tensor
            (d,) = plain_dims(r, k)
            p = innermost(src.ndim, d)
            if src.uid not in made:
                made[src.uid], how, _ = relaid(graph, rw, src, p, t, ("kt", "k-innermost"))
                moved.append(how)
            perms[src.uid] = (made[src.uid], p)
        assert t.op is not None and t.op.reduce is not None
        rw.define(with_body(t, Permute(perms).visit(t.op.body)))
        rw.record(
            PassAction.SIMPLIFIED,
            [name],
            f"{name} reads {', '.join(moved)} with {k.name} innermost: its tiles fill by "
            "16-byte cp.async chunks and load by ldmatrix (no .trans of bytes), instead of a "
            "transposing byte-by-byte fill",
        )
    return rw.result()
