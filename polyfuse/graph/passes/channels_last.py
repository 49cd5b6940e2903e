"""Channels-last operands for 16-bit and byte convolutions on tensor cores (issue 23).

A 16-bit convolution ``out[b, o, y, x] += where(pad, in[b, c, s*y + kh - p, s*x + kw - p], 0)
* w[o, c, kh, kw]`` runs on tensor cores as an implicit GEMM (:mod:`polyfuse.poly.tensorize`)
whose shared tiles are filled per k-tile. In NCHW the input's innermost subscript moves with
``kw``: its rows start at ``x + kw - p``, so no 16-byte chunk is aligned for ``kw != p`` and the
im2col tile is copied element by element (a load, a byte permute and a shared store each), and
the OIHW weight is contiguous along ``k`` only in the order ``(c, kh, kw)`` that makes the input
carry per element. With the channel innermost (NHWC input, OHWI weight) and the reduction
flattened as ``(kh, kw, c)``, every run of 8 consecutive ``k`` is 8 consecutive channels at one
``(kh, kw)``: one 16-byte ``cp.async`` (the padding test once per chunk), and the weight's
``k`` runs are contiguous, so both tiles take chunks and the k-tile loop is pipelined.

:func:`channels_last` makes that layout decision on the graph, once, after the other passes (the
layout fold would fold the copies back into the convolution's loads): for each such convolution
on a target with ``mma.sync`` (sm_80 and later) whose input channels are a multiple of 8
(16-byte chunks; 16 for bytes) and whose input is read through a window along its innermost dim
(a 1x1 conv's rows are already aligned; not a byte one's), the input and the weight are read
through permuted copies with the channel dim innermost: a constant weight is permuted at compile
time; an operand computed by a primitive without reduction that only the convolution reads (an
activation of a graph input) is computed channels-last by that primitive itself (its loop nest
permuted: no copy); another operand gets a transposing primitive (a kernel of its own, one read
and one write of the tensor; parallel stitching may pack two side by side). Not done: a producer
that is itself a contraction (a conv chain's previous conv) keeps its NCHW store and the copy
follows it. The record gives the reason: the copy's bytes against the fill instructions saved
(modelled per copied element: ~4 for a scalar gather, ~10 per 8-element chunk).

A byte convolution (``int32(x) * int32(w)`` of int8/uint8, ``m16n8k32``) takes the same layout
with 16 channels a chunk, and needs it even where no window slides along the innermost dim
(a 1x1 conv): ``ldmatrix`` has no ``.trans`` of 8-bit elements, so an NCHW input, whose
columns are the GEMM's ``n``, would be transposed by its fill byte by byte.
"""

from __future__ import annotations

import numpy as np

from polyfuse.graph.dtypes import info
from polyfuse.graph.expr import BYTE_DTYPES, Binary, IterVar, Read, Reduce, Tensor, zero_padded_read
from polyfuse.graph.graph import Graph
from polyfuse.graph.passes.record import PassAction
from polyfuse.graph.passes.relayout import (
    Permute,
    has_mma,
    innermost,
    permuted,
    plain_dims,
    relaid,
)
from polyfuse.graph.passes.rewrite import Rewriter, is_identity_read, loop_vars, with_body

HALF = ("float16", "bfloat16")
#: modelled SASS instructions per copied element of a scalar gather fill, and per 16-byte
#: chunk of a channels-last gathered fill (address, padding test, cp.async)
SCALAR_PER_ELEMENT, CHUNK_COST = 4.0, 10.0


def conv_operands(t: Tensor) -> tuple[Read, Read, IterVar] | str | None:
    """``(input read, weight read, channel axis)`` of a 16-bit or byte convolution worth a
    channels-last layout (see the module doc), why such a convolution is not, or None where
    ``t`` is no 16-bit (or widened byte) sum of products over several reduction dims."""
    red = t.op.reduce if t.op is not None else None
    if red is None or red.op != "sum" or len(red.axes) < 2:
        return None
    body = red.body
    if not (isinstance(body, Binary) and body.op == "mul"):
        return None
    reads = [zero_padded_read(body.a), zero_padded_read(body.b)]
    if None in reads:
        return None
    dts = {r.tensor.dtype for r in reads}  # type: ignore[union-attr]
    byte = dts <= set(BYTE_DTYPES)
    if not (byte or dts <= set(HALF)) or (byte and len(red.axes) < 2):
        return None
    chunk = 16 // info(next(iter(dts))).itemsize
    for x, w in (reads, reads[::-1]):
        assert x is not None and w is not None
        if not x.indices:  # a 0-d input (a scalar read as a map): no channels to move
            continue
        inner = loop_vars(x.indices[-1])
        for c in red.axes:
            dx, dw = plain_dims(x, c), plain_dims(w, c)
            if len(dx) != 1 or len(dw) != 1 or dx[0] == x.tensor.ndim - 1:
                continue
            # a window: the innermost subscript slides with an output dim and a reduction dim
            window = [a for a in red.axes if a.uid != c.uid and a.uid in inner and a.extent > 1]
            slides = window and any(a.uid in inner for a in t.op.axes)
            if not (slides or byte):  # bytes: ldmatrix needs k innermost, a 1x1 conv too
                continue
            if x.tensor.shape[dx[0]] % chunk:
                return (f"{x.tensor.name}'s {x.tensor.shape[dx[0]]} channels are not a multiple "
                        f"of {chunk} (no aligned 16-byte chunk of channels)")  # fmt: skip
            if c.lo or c.extent != x.tensor.shape[dx[0]]:
                return f"the reduction reads part of {x.tensor.name}'s channels"
            return x, w, c
    return None  # no channel dim read plainly by both beside a window (a 1x1 or grouped conv)


def _producer_chain(
    graph: Graph, rw: Rewriter, t: Tensor, consumer: str, convs: set[int]
) -> list[Tensor] | None:
    """The primitives from ``t``'s producer up to a convolution of ``convs`` (as ``rw``
    defines them so far), each read only by the one before it (``consumer`` reads ``t``)
    through the same index; None where there is no such chain. A primitive reading several
    computed tensors alike (a residual add) continues along the one that leads to such a
    convolution; the others are read as they are stored."""
    name = graph.idents.get(t.uid)
    if name not in graph.prims or graph.is_output(t) or graph.consumers(name) != [consumer]:
        return None
    cur = rw.current(t)
    assert cur.op is not None
    if cur.op.reduce is not None:
        return [cur] if t.uid in convs else None
    prims = {q.tensor.uid for q in graph.prims.values()}
    ups = {r.tensor.uid: r.tensor for r in cur.op.reads()
           if r.tensor.uid in prims and is_identity_read(r, cur)}  # fmt: skip
    chains = [c for u in ups.values() if (c := _producer_chain(graph, rw, u, name, convs))]
    return [cur, *chains[0]] if len(chains) == 1 else None


def _with_producers(
    graph: Graph, rw: Rewriter, src: Tensor, p: list[int], reader: Tensor, convs: set[int]
) -> tuple[Tensor, str] | None:
    """``src`` stored channels-last by its producers, where it is the end of a chain of
    primitives without reduction (bias, activation, residual add, requantization) that starts
    at a convolution already read channels-last (:func:`_producer_chain`): the convolution and
    the chain computed in the permuted layout ``p`` (their loop nests permuted), so the
    epilogue stays on the convolution's fragments and no copy follows it. With the record's
    words; None where ``src`` has no such chain."""
    chain = _producer_chain(graph, rw, src, graph.idents[reader.uid], convs)
    if chain is None:
        return None
    prev: dict[int, tuple[Tensor, list[int]]] = {}
    for cur in reversed(chain):  # the convolution first, then each reader
        new = permuted(cur, p)
        assert new.op is not None
        new = with_body(new, Permute(prev).visit(new.op.body))
        rw.define(new)
        prev = {cur.uid: (new, p)}
    names = ", ".join(graph.idents[c.uid] for c in chain)
    return new, f"{src.name} (its producers {names} store it channels-last, no copy)"


def channels_last(graph: Graph, arch: str) -> Graph:
    """``graph`` with each 16-bit convolution's input and weight read channels-last where
    ``arch`` has tensor cores (see the module doc); each change recorded with its reason."""
    rw = Rewriter(graph, "channels_last")
    if not has_mma(arch):
        return graph
    made: dict[int, Tensor] = {}  # an operand's channels-last copy, shared by its readers
    convs: set[int] = set()  # the convolutions read channels-last so far
    for name in graph.topo_order():
        t = graph.prims[name].tensor
        got = conv_operands(t)
        if isinstance(got, str):
            rw.record(PassAction.REFUSED, [name], f"{name} stays NCHW: {got}")
        if got is None or isinstance(got, str):
            continue
        x, w, c = got
        assert t.op is not None and isinstance(t.op.body, Reduce)
        perms: dict[int, tuple[Tensor, list[int]]] = {}
        moved, copied = [], 0
        for r in (x, w):
            (d,) = plain_dims(r, c)
            p = innermost(r.tensor.ndim, d)
            src = r.tensor
            if src.uid not in made and (up := _with_producers(graph, rw, src, p, t, convs)):
                made[src.uid], how = up
                moved.append(how)
            elif src.uid not in made:
                made[src.uid], how, bytes_ = relaid(graph, rw, src, p, t, ("cl", "channels-last"))
                moved.append(how)
                copied += bytes_
            perms[r.tensor.uid] = (made[src.uid], p)
        rw.define(with_body(t, Permute(perms).visit(t.op.body)))
        convs.add(t.uid)
        ext = [a.extent for a in t.op.reduce_axes]
        k = int(np.prod(ext))
        out = int(np.prod(t.shape)) // w.tensor.shape[0]  # the GEMM's columns
        chunk = 16 // info(x.tensor.dtype).itemsize  # elements of a 16-byte chunk
        saved = out * k * (SCALAR_PER_ELEMENT - CHUNK_COST / chunk)
        why = (
            "k innermost for ldmatrix (no .trans of 8-bit elements) and "
            if chunk == 16
            else ""
        )
        rw.record(
            PassAction.SIMPLIFIED,
            [name],
            f"{name} reads {', '.join(moved)} channels-last: the reduction's {c.name} innermost "
            f"gives {why}16-byte cp.async chunks of {chunk} channels for the im2col fill (its "
            f"NCHW rows start at the window's offset, unaligned), ~{saved:.3g} fill "
            f"instructions saved (modelled: {SCALAR_PER_ELEMENT:g} per gathered element "
            f"against {CHUNK_COST:g} per chunk) for {copied} bytes of copies (one read and one "
            "write each)",
        )
    return rw.result()
