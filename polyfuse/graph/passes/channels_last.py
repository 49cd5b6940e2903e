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
and one write of the tensor; parallel stitching may pack two side by side). The record gives the
reason: the copy's bytes against the fill instructions saved (modelled per copied element: ~4
for a scalar gather, ~10 per 8-element chunk).

Conv chains: where the input is the end of a chain of primitives without reduction (bias or
batch norm, activation, residual add, requantization), each read only by the next through the
same index, or of a pool or depthwise convolution whose window keeps the channels (a max
pool, MobileNetV2's depthwise 3x3 convs: :func:`_window_source`),
that starts at convolutions this pass already reads channels-last or refused (a stem conv of 3
channels reads NCHW but may store its output channels-last), the convolutions and the chain
are computed channels-last themselves (their loop nests permuted,
:func:`_with_producers`): every epilogue stays on its convolution's fragments and no copy
follows it; the input's other readers (the next residual add) read it permuted. The GEMM of a
convolution stored channels-last takes the output channels as rows and the width, with the
height folded in, as columns (:func:`polyfuse.poly.tensorize.match_mma`). A 16-bit 1x1 conv,
whose NCHW rows are aligned, is read channels-last only when its input comes so at no copy,
which links the bottleneck blocks of a ResNet into one chain.

A byte convolution (``int32(x) * int32(w)`` of int8/uint8, ``m16n8k32``) takes the same layout
with 16 channels a chunk, and needs it even where no window slides along the innermost dim
(a 1x1 conv): ``ldmatrix`` has no ``.trans`` of 8-bit elements, so an NCHW input, whose
columns are the GEMM's ``n``, would be transposed by its fill byte by byte.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from polyfuse.graph.dtypes import HALF_DTYPES, info
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

#: modelled SASS instructions per copied element of a scalar gather fill, and per 16-byte
#: chunk of a channels-last gathered fill (address, padding test, cp.async)
SCALAR_PER_ELEMENT, CHUNK_COST = 4.0, 10.0


def _channels_inner(r: Read, c: IterVar) -> bool:
    """Whether ``r`` reads channel axis ``c`` in its array's innermost dim (trailing dims of
    extent 1 skipped: a 1x1 conv's OIHW weight): already channels-last."""
    (d,) = plain_dims(r, c)
    shape = r.tensor.shape
    last = max((i for i, e in enumerate(shape) if e > 1), default=len(shape) - 1)
    return d == last


def conv_operands(t: Tensor) -> tuple[Read, Read, IterVar, bool] | str | None:
    """``(input read, weight read, channel axis, window)`` of a 16-bit or byte convolution
    (``window``: the input is read through a window sliding with an output dim, not a 1x1
    conv), why such a convolution cannot be read channels-last, or None where ``t`` is no
    16-bit (or widened byte) sum of products over several reduction dims with a channel dim
    read plainly by both factors."""
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
    if not (byte or dts <= set(HALF_DTYPES)):
        return None
    chunk = 16 // info(next(iter(dts))).itemsize
    outs = {a.uid for a in t.op.axes}
    for x, w in (reads, reads[::-1]):
        assert x is not None and w is not None
        if not x.indices:  # a 0-d input (a scalar read as a map): no channels to move
            continue
        x_outs = {u for s in x.indices for u in loop_vars(s) if u in outs}
        w_outs = {u for s in w.indices for u in loop_vars(s) if u in outs}
        if len(x_outs) <= len(w_outs):  # the input reads the batch and the spatial dims
            continue
        for c in red.axes:
            dx, dw = plain_dims(x, c), plain_dims(w, c)
            if len(dx) != 1 or len(dw) != 1:
                continue
            # a window: a subscript slides with an output dim and another reduction dim
            window = any(
                any(u in outs for u in vs)
                and any(a.uid in vs for a in red.axes if a.uid != c.uid and a.extent > 1)
                for vs in map(loop_vars, x.indices)
            )
            if _channels_inner(x, c):
                return x, w, c, window
            if not (window or byte) and x.tensor.shape[dx[0]] % chunk:
                return None  # a 16-bit 1x1 conv's rows are aligned as they are
            if x.tensor.shape[dx[0]] % chunk:
                return (f"{x.tensor.name}'s {x.tensor.shape[dx[0]]} channels are not a multiple "
                        f"of {chunk} (no aligned 16-byte chunk of channels)")  # fmt: skip
            if c.lo or c.extent != x.tensor.shape[dx[0]]:
                return f"the reduction reads part of {x.tensor.name}'s channels"
            return x, w, c, window
    return None  # no channel dim read plainly by both (a grouped conv)


def _window_source(t: Tensor, keep: int, computed: Callable[[Tensor], bool]) -> Tensor | None:
    """The one computed tensor (``computed``: a graph primitive's) a reduction that is no
    convolution reads — a max or average pool, or a depthwise convolution, whose filter (a
    graph input or constant) is read as it is stored — where it keeps dim ``keep`` (the
    channels): every read of it has ``t``'s rank and reads dim ``keep`` through ``t``'s own
    axis ``keep``, so both permute alike; else None."""
    assert t.op is not None
    reads = [r for r in t.op.reads() if computed(r.tensor)]
    if not reads or len({r.tensor.uid for r in reads}) != 1:
        return None
    axis = t.op.axes[keep]
    for r in reads:
        s = r.indices[keep] if r.tensor.ndim == t.ndim else None
        if not _is_axis(s, axis):
            return None
    return reads[0].tensor


def _is_axis(s: object, axis: IterVar) -> bool:
    """Whether subscript ``s`` is ``axis`` itself, or ``axis`` plus a reduction axis of one
    trip from 0 (a depthwise convolution's input channel ``oc + rc``, ``rc`` the one
    channel of its group)."""
    if isinstance(s, IterVar):
        return s.uid == axis.uid
    if isinstance(s, Binary) and s.op == "add":
        for a, b in ((s.a, s.b), (s.b, s.a)):
            if _is_axis(a, axis) and isinstance(b, IterVar) and (b.lo, b.hi) == (0, 1):
                return True
    return False


def _producer_chain(
    graph: Graph,
    rw: Rewriter,
    t: Tensor,
    consumer: str,
    convs: set[int],
    keep: int,
    first: bool = False,
) -> list[Tensor] | None:
    """The primitives from ``t``'s producer up to convolutions of ``convs`` (as ``rw`` defines
    them so far; producers before their readers), each read only by the one after it
    (``consumer`` reads ``t``; ``first``: ``t`` may have other readers) through the same
    index, or a pool's window keeping the channels (dim ``keep``); None where there is no
    such chain. A primitive reading several computed tensors alike (a residual add)
    continues along each that leads to such a convolution; the others are read as they are
    stored."""
    name = graph.idents.get(t.uid)
    if name not in graph.prims or graph.is_output(t):
        return None
    if not first and graph.consumers(name) != [consumer]:
        return None
    cur = rw.current(t)
    assert cur.op is not None
    if cur.op.reduce is not None:
        if t.uid in convs:
            return [cur]
        src = _window_source(cur, keep, lambda x: graph.idents.get(x.uid) in graph.prims)
        up = _producer_chain(graph, rw, src, name, convs, keep) if src is not None else None
        return [*up, cur] if up else None
    prims = {q.tensor.uid for q in graph.prims.values()}
    ups = {r.tensor.uid: r.tensor for r in cur.op.reads()
           if r.tensor.uid in prims and is_identity_read(r, cur)}  # fmt: skip
    chains = [c for u in ups.values() if (c := _producer_chain(graph, rw, u, name, convs, keep))]
    return [*(p for c in chains for p in c), cur] if chains else None


def _with_producers(
    graph: Graph, rw: Rewriter, src: Tensor, p: list[int], reader: Tensor, convs: set[int]
) -> tuple[Tensor, str] | None:
    """``src`` stored channels-last by its producers, where it is the end of a chain of
    primitives without reduction (bias, activation, residual add, requantization) that starts
    at convolutions already read channels-last (:func:`_producer_chain`): the convolutions and
    the chain computed in the permuted layout ``p`` (their loop nests permuted), so each
    epilogue stays on its convolution's fragments and no copy follows it; ``src``'s other
    readers read it permuted. With the record's words; None where ``src`` has no such
    chain."""
    reader_name = graph.idents[reader.uid]
    chain = _producer_chain(graph, rw, src, reader_name, convs, p[-1], first=True)
    if chain is None:
        return None
    done: dict[int, tuple[Tensor, list[int]]] = {}
    for cur in chain:  # producers first
        new = permuted(cur, p)
        assert new.op is not None
        new = with_body(new, Permute(done).visit(new.op.body))
        rw.define(new)
        done[cur.uid] = (new, p)
    new = done[src.uid][0]
    for other in graph.consumers(graph.idents[src.uid]):
        if other != graph.idents[reader.uid]:
            cur = rw.current(graph.prims[other].tensor)
            assert cur.op is not None
            rw.define(with_body(cur, Permute({src.uid: (new, p)}).visit(cur.op.body)))
    names = ", ".join(graph.idents[c.uid] for c in reversed(chain))
    return new, f"{src.name} (its producers {names} store it channels-last, no copy)"


def channels_last(graph: Graph, arch: str) -> Graph:
    """``graph`` with each 16-bit convolution's input and weight read channels-last where
    ``arch`` has tensor cores (see the module doc); each change recorded with its reason."""
    rw = Rewriter(graph, "channels_last")
    if not has_mma(arch):
        return graph
    made: dict[int, Tensor] = {}  # an operand's channels-last copy, shared by its readers
    # the convolutions a chain may start at: read channels-last, or refused (read NCHW, their
    # output may still be stored channels-last)
    convs: set[int] = set()
    for name in graph.topo_order():
        t = rw.current(graph.prims[name].tensor)  # its reads re-pointed by earlier changes
        got = conv_operands(t)
        if isinstance(got, str):
            rw.record(PassAction.REFUSED, [name], f"{name} stays NCHW: {got}")
            convs.add(t.uid)  # read NCHW, it may still store its output channels-last
        if got is None or isinstance(got, str):
            continue
        x, w, c, window = got
        assert t.op is not None and isinstance(t.op.body, Reduce)
        todo = [r for r in (x, w) if not _channels_inner(r, c)]
        byte = x.tensor.dtype in BYTE_DTYPES
        if todo and not (window or byte) and x in todo and x.tensor.uid not in made:
            # a 16-bit 1x1 conv: channels-last only where its producers store it so for free
            (d,) = plain_dims(x, c)
            if _producer_chain(graph, rw, x.tensor, name, convs, d, first=True) is None:
                continue
        perms: dict[int, tuple[Tensor, list[int]]] = {}
        moved, copied = [], 0
        for r in todo:
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
        convs.add(t.uid)
        if not todo:
            continue
        rw.define(with_body(t, Permute(perms).visit(t.op.body)))
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
