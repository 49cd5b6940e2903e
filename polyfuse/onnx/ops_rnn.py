"""ONNX recurrent layers (LSTM, GRU, RNN), unrolled over the static sequence length."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import onnx

from polyfuse import ops, te
from polyfuse.errors import UnsupportedOpError
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import (
    Ctx,
    Value,
    host_value,
    ints_of,
    register_op,
)

_ACT: dict[str, Callable[[Expr], Expr]] = {
    "sigmoid": te.sigmoid,
    "tanh": te.tanh,
    "relu": lambda v: te.maximum(v, 0.0),
}


def _rnn_acts(at: dict[str, Any], defaults: list[str], ndir: int) -> list[Callable[[Expr], Expr]]:
    names = [a.decode() if isinstance(a, bytes) else a for a in at.get("activations", [])]
    names = names or defaults * ndir
    out = []
    for nm in names:
        if nm.lower() not in _ACT:
            raise UnsupportedOpError(f"recurrent activation '{nm}' (Sigmoid, Tanh, Relu only)")
        out.append(_ACT[nm.lower()])
    return out


def _rnn_common(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any], ngates: int
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, int, int, int, int, list[int]]:
    if int(at.get("layout", 0)):
        x = ops.transpose(ctx.tensor(ins[0]), (1, 0, 2), name=ctx.fresh("rnn_x"))
    else:
        x = ctx.tensor(ins[0])
    w, r = ctx.tensor(ins[1]), ctx.tensor(ins[2])
    b = ctx.tensor(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    seq, batch, _ = x.shape
    hidden = r.shape[-1]
    if len(ins) > 4 and ins[4] is not None:
        lens = ints_of(host_value(ctx, node, ins[4], "sequence_lens"))
        if any(v != seq for v in lens):
            raise UnsupportedOpError("sequence_lens shorter than the sequence (padded batches)")
    if at.get("clip") is not None:
        raise UnsupportedOpError("recurrent clip attribute")
    d = at.get("direction", b"forward")
    d = d.decode() if isinstance(d, bytes) else d
    dirs = {"forward": [0], "reverse": [1], "bidirectional": [0, 1]}[d]
    return x, w, r, b, seq, batch, hidden, ngates, dirs


def _gate_inputs(
    ctx: Ctx, x: Tensor, w: Tensor, b: Tensor | None, di: int, ngh: int, hint: str
) -> Tensor:
    """``X_t W^T + Wb + Rb`` for every step at once: (seq, batch, gates*hidden)."""
    seq, batch, nin = x.shape
    k = te.reduce_axis(nin, name="kx")
    xw = ctx.compute(
        (seq, batch, ngh), lambda t, i, g: te.sum(x[t, i, k] * w[di, g, k], axis=k), hint
    )
    if b is None:
        return xw
    return ctx.compute(
        (seq, batch, ngh), lambda t, i, g: xw[t, i, g] + b[di, g] + b[di, g + ngh], hint + "_b"
    )


def _recur(ctx: Ctx, h: Tensor | None, r: Tensor, di: int, ngh: int, hint: str) -> Tensor | None:
    """``H_{t-1} R^T``: (batch, gates*hidden), or None at t=0 without an initial state."""
    if h is None:
        return None
    batch, hid = h.shape
    k = te.reduce_axis(hid, name="kh")
    return ctx.compute((batch, ngh), lambda i, g: te.sum(h[i, k] * r[di, g, k], axis=k), hint)


def _state0(ctx: Ctx, ins: list[Any], pos: int, di: int, batch: int, hid: int) -> Tensor | None:
    if len(ins) > pos and ins[pos] is not None:
        s = ctx.tensor(ins[pos])
        return ctx.compute((batch, hid), lambda i, j: s[di, i, j], "rnn_init")
    return None


def _rnn_outputs(
    ctx: Ctx, at: dict[str, Any], hs: list[list[Tensor]], finals: list[list[Tensor]]
) -> list[Value]:
    """Y (seq, dirs, batch, hidden) (layout 1: batch, seq, dirs, hidden) and the final states."""
    seq = len(hs[0])
    batch, hid = hs[0][0].shape
    nd = len(hs)
    layout = int(at.get("layout", 0))
    steps = [h for d in range(nd) for h in hs[d]]

    def ybody(t: IterVar, dd: IterVar, i: IterVar, j: IterVar) -> Expr:
        v: Expr = as_expr(0.0)
        for n, h in enumerate(steps):  # a select over the (static) step and direction
            hit = te.equal(t, n % seq) & te.equal(dd, n // seq)
            v = te.where(hit, h[i, j], v) if n else h[i, j]
        return v

    y = ctx.compute((seq, nd, batch, hid), ybody, "rnn_y")
    if layout:
        y = ops.transpose(y, (2, 0, 1, 3), name=ctx.fresh("rnn_y"))
    outs: list[Value] = [y]
    for k in range(len(finals[0])):
        st = _stack_dirs(ctx, [f[k] for f in finals])
        outs.append(ops.transpose(st, (1, 0, 2), name=ctx.fresh("rnn_st")) if layout else st)
    return outs


def _stack_dirs(ctx: Ctx, parts: list[Tensor]) -> Tensor:
    """(batch, hidden) states of each direction -> (dirs, batch, hidden)."""

    def body(dd: IterVar, i: IterVar, j: IterVar) -> Expr:
        v: Expr = parts[0][i, j]
        for n, p in enumerate(parts[1:], 1):
            v = te.where(te.equal(dd, n), p[i, j], v)
        return v

    return ctx.compute((len(parts), *parts[0].shape), body, "rnn_state")


@dataclass
class _Cell:
    """One direction of a recurrent layer: its weights, activations and gate-input tensor."""

    xw: Tensor  # X_t W^T (+ biases) for every step: (seq, batch, gates*hidden)
    r: Tensor  # (dirs, gates*hidden, hidden)
    b: Tensor | None  # (dirs, 2*gates*hidden)
    p: Tensor | None  # LSTM peepholes (dirs, 3*hidden)
    dw: int  # direction index into the weights
    hid: int
    acts: list[Callable[[Expr], Expr]]


def _lstm_step(
    ctx: Ctx, cl: _Cell, t: int, h: Tensor | None, c: Tensor | None
) -> tuple[Tensor, Tensor]:
    """One LSTM step (gates i, o, f, c): the new cell state, then the new hidden state."""
    hid, (f, g, hact) = cl.hid, cl.acts
    batch = cl.xw.shape[1]
    hr = _recur(ctx, h, cl.r, cl.dw, 4 * hid, "lstm_hr")

    def pre(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = cl.xw[t, i, gate * hid + j]
        return v + hr[i, gate * hid + j] if hr is not None else v

    def peep(k: int, cc: Tensor | None, i: IterVar, j: IterVar) -> Expr:
        if cl.p is None or cc is None:
            return as_expr(0.0)
        return cl.p[cl.dw, k * hid + j] * cc[i, j]

    def cbody(i: IterVar, j: IterVar) -> Expr:
        it = f(pre(i, j, 0) + peep(0, c, i, j))
        ft = f(pre(i, j, 2) + peep(2, c, i, j))
        ct = g(pre(i, j, 3))
        return ft * c[i, j] + it * ct if c is not None else it * ct

    c2 = ctx.compute((batch, hid), cbody, "lstm_c")

    def hbody(i: IterVar, j: IterVar) -> Expr:
        return f(pre(i, j, 1) + peep(1, c2, i, j)) * hact(c2[i, j])

    return ctx.compute((batch, hid), hbody, "lstm_h"), c2


@register_op("LSTM")
def _lstm(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w, r, b, seq, batch, hid, _, dirs = _rnn_common(ctx, node, ins, at, 4)
    if int(at.get("input_forget", 0)):
        raise UnsupportedOpError("LSTM input_forget=1")
    acts = _rnn_acts(at, ["Sigmoid", "Tanh", "Tanh"], len(dirs))
    p = ctx.tensor(ins[7]) if len(ins) > 7 and ins[7] is not None else None
    hs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for n, di in enumerate(dirs):
        dw = n
        cl = _Cell(
            _gate_inputs(ctx, x, w, b, dw, 4 * hid, "lstm_xw"),
            r,
            b,
            p,
            dw,
            hid,
            acts[3 * n : 3 * n + 3],
        )
        h = _state0(ctx, ins, 5, dw, batch, hid)
        c = _state0(ctx, ins, 6, dw, batch, hid)
        out: dict[int, Tensor] = {}
        for t in range(seq) if di == 0 else range(seq - 1, -1, -1):
            h, c = _lstm_step(ctx, cl, t, h, c)
            out[t] = h
        hs.append([out[t] for t in range(seq)])
        finals.append([h, c])  # type: ignore[list-item]
    return _rnn_outputs(ctx, at, hs, finals)


def _gru_step(ctx: Ctx, cl: _Cell, t: int, h: Tensor | None, lbr: bool) -> Tensor:
    """One GRU step (gates z, r, h); ``lbr``: linear_before_reset."""
    hid, (f, g) = cl.hid, cl.acts
    batch = cl.xw.shape[1]
    b, dw = cl.b, cl.dw
    hr = _recur(ctx, h, cl.r, dw, 3 * hid, "gru_hr")

    def wb(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = cl.xw[t, i, gate * hid + j]
        return v + b[dw, gate * hid + j] if b is not None else v

    def rpart(i: IterVar, j: IterVar, gate: int) -> Expr:
        v = hr[i, gate * hid + j] if hr is not None else as_expr(0.0)
        return v + b[dw, 3 * hid + gate * hid + j] if b is not None else v

    hr2: Tensor | None = None
    if not lbr and h is not None:  # (r_t * H_{t-1}) R_h^T: a reduction after the reset gate
        rt = ctx.compute(
            (batch, hid), lambda i, j: f(wb(i, j, 1) + rpart(i, j, 1)) * h[i, j], "gru_rh"
        )
        k = te.reduce_axis(hid, name="kr")
        hr2 = ctx.compute(
            (batch, hid),
            lambda i, j: te.sum(rt[i, k] * cl.r[dw, 2 * hid + j, k], axis=k),
            "gru_rhr",
        )

    def hbody(i: IterVar, j: IterVar) -> Expr:
        zt = f(wb(i, j, 0) + rpart(i, j, 0))
        if lbr:
            ht = g(wb(i, j, 2) + f(wb(i, j, 1) + rpart(i, j, 1)) * rpart(i, j, 2))
        else:
            rec = hr2[i, j] if hr2 is not None else as_expr(0.0)
            rec = rec + b[dw, 5 * hid + j] if b is not None else rec
            ht = g(wb(i, j, 2) + rec)
        prev = h[i, j] if h is not None else as_expr(0.0)
        return (1.0 - zt) * ht + zt * prev

    return ctx.compute((batch, hid), hbody, "gru_h")


@register_op("GRU")
def _gru(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    x, w, r, b, seq, batch, hid, _, dirs = _rnn_common(ctx, node, ins, at, 3)
    acts = _rnn_acts(at, ["Sigmoid", "Tanh"], len(dirs))
    lbr = bool(int(at.get("linear_before_reset", 0)))
    hs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for n, di in enumerate(dirs):
        dw = n
        # the W-side gate inputs without bias: the recurrent bias Rb_h sits inside the reset
        cl = _Cell(
            _gate_inputs(ctx, x, w, None, dw, 3 * hid, "gru_xw"),
            r,
            b,
            None,
            dw,
            hid,
            acts[2 * n : 2 * n + 2],
        )
        h = _state0(ctx, ins, 5, dw, batch, hid)
        out: dict[int, Tensor] = {}
        for t in range(seq) if di == 0 else range(seq - 1, -1, -1):
            h = _gru_step(ctx, cl, t, h, lbr)
            out[t] = h
        hs.append([out[t] for t in range(seq)])
        finals.append([h])  # type: ignore[list-item]
    return _rnn_outputs(ctx, at, hs, finals)


def _rnn_step(
    ctx: Ctx, xw: Tensor, r: Tensor, dw: int, t: int, h: Tensor | None, f: Callable[[Expr], Expr]
) -> Tensor:
    """One simple-RNN step: ``f(X_t W^T + biases + H_{t-1} R^T)``."""
    batch, hid = xw.shape[1], r.shape[-1]
    hr = _recur(ctx, h, r, dw, hid, "rnn_hr")

    def body(i: IterVar, j: IterVar) -> Expr:
        v = xw[t, i, j]
        return f(v + hr[i, j] if hr is not None else v)

    return ctx.compute((batch, hid), body, "rnn_h")


@register_op("RNN")
def _rnn(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """The simple recurrence ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)`` (f: Tanh unless
    ``activations`` says otherwise), per direction."""
    x, w, r, b, seq, batch, hid, _, dirs = _rnn_common(ctx, node, ins, at, 1)
    acts = _rnn_acts(at, ["Tanh"], len(dirs))
    hs: list[list[Tensor]] = []
    finals: list[list[Tensor]] = []
    for n, di in enumerate(dirs):
        xw = _gate_inputs(ctx, x, w, b, n, hid, "rnn_xw")
        f = acts[n]
        h = _state0(ctx, ins, 5, n, batch, hid)
        out: dict[int, Tensor] = {}
        for t in range(seq) if di == 0 else range(seq - 1, -1, -1):
            h = _rnn_step(ctx, xw, r, n, t, h, f)
            out[t] = h
        hs.append([out[t] for t in range(seq)])
        finals.append([h])  # type: ignore[list-item]
    return _rnn_outputs(ctx, at, hs, finals)
