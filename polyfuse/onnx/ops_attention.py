"""ONNX ``Attention`` (opsets 23-25): scaled dot-product attention with its masks and caches.

The operator becomes computes the compiler fuses like any other: the scores
``scale * Q K^T`` (a product of reads, so the GEMM path tiles it; optionally soft-capped), their
row maximum, the shifted exponentials, their row sum, and the product of the normalised
probabilities with ``V``; a row guard (the maximum of the additive bias) joins them when a
query row can be fully masked.
Nothing is materialised that is only an index pattern: the causal frontier, the sliding
window and the padding of ``nonpad_kv_seqlen`` are conditions on the loop variables (and on
one int64 per batch), and the attention mask is read where they allow it.

Semantics follow ``onnx.reference``'s ``Attention``:

- 3-D ``Q``/``K``/``V`` (``q_num_heads``, ``kv_num_heads``) are split into heads by indexing,
  and ``Y`` is merged back; grouped-query heads read key/value head ``h // (Hq / Hkv)``.
- ``past_key``/``past_value`` are concatenated in front of ``K``/``V`` (``present_*``).
- The bias is ``attn_mask`` (a boolean mask gives ``0``/``-inf``; a mask shorter than the key
  axis reads ``-inf`` beyond its end), ``-inf`` outside the causal frontier ``j <= i + offset``
  and the window ``p - left <= j <= p + right`` (``p = i + offset``), and ``-inf`` at keys from
  ``nonpad_kv_seqlen[b]`` on. ``offset`` is the past length, or ``nonpad_kv_seqlen[b] - Sq``
  for an external cache, else 0.
- Softmax subtracts the row maximum (0 for a row that is all ``-inf``), in float32 for 16-bit
  inputs, or in ``softmax_precision``; a row whose bias is all ``-inf`` gives zeros.
- ``qk_matmul_output``: mode 0 the raw scores, 1 after the soft cap, 2 with the bias, 3 the
  probabilities, in ``Q``'s dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from polyfuse import ops, te
from polyfuse.errors import ExpressionError, UnsupportedOpError
from polyfuse.graph import dtypes
from polyfuse.graph.expr import Expr, IterVar, Tensor, as_expr
from polyfuse.onnx.common import Ctx, Value, optional_input, register_op, storage_dtype, str_attr

_Index = tuple[Expr, Expr, Expr, Expr]


@dataclass(frozen=True)
class _Mask:
    """What may hide key ``j`` from query ``i`` of batch ``b``: the static conditions and the
    data the bias reads (the mask, ``nonpad_kv_seqlen``)."""

    sq: int
    total: int
    past: int
    causal: bool
    left: int
    right: int
    mask: Tensor | None
    nonpad: Tensor | None

    def offset(self, b: Expr) -> Expr:
        """How many keys precede the query block (per batch with an external cache)."""
        if self.nonpad is not None:
            return self.nonpad[b] - self.sq
        return as_expr(self.past)

    def allowed(self, b: Expr, i: Expr, j: Expr) -> Expr | None:
        """The conditions on ``(b, i, j)`` that let query ``i`` see key ``j`` (None: all)."""
        conds: list[Expr] = []
        windowed = self.left >= 0 or self.right >= 0
        if self.causal or windowed:
            if self.nonpad is None:
                p: Expr = i + self.past
            else:
                p = te.cast(i, "int64") + self.offset(b)
                j = te.cast(j, "int64")
            if self.causal:
                conds.append(j <= p)
            if self.left >= 0:
                conds.append(p - j <= self.left)
            if self.right >= 0:
                conds.append(j - p <= self.right)
        if self.nonpad is not None:
            conds.append(te.cast(j, "int64") < self.nonpad[b])
        out: Expr | None = None
        for c in conds:
            out = c if out is None else out & c
        return out

    def bias(self, idx: _Index, dtype: str) -> Expr | None:
        """The additive bias at ``idx = (b, h, i, j)`` in ``dtype`` (None: zero everywhere)."""
        b, _, i, j = idx
        ninf = te.const(-math.inf, dtype)
        value: Expr | None = None
        if self.mask is not None:
            m = self.mask
            sub = tuple(
                as_expr(0) if s == 1 and d < 3 else idx[d]
                for d, s in zip(range(4 - m.ndim, 4), m.shape, strict=True)
            )
            v = m[sub]
            value = te.where(v, te.const(0.0, dtype), ninf) if m.dtype == "bool" else v
        ok = self.allowed(b, i, j)
        if ok is not None:
            value = te.where(ok, value if value is not None else te.const(0.0, dtype), ninf)
        if self.mask is not None and self.mask.shape[-1] < self.total:
            # a short mask reads -inf past its end: a guard on j alone bounds the read
            value = te.where(j < self.mask.shape[-1], value, ninf)
        return value

    def can_empty_a_row(self) -> bool:
        """Can some query row have no key at all (then its probabilities are zeros)?"""
        if self.mask is not None or self.nonpad is not None:
            return True
        i = np.arange(self.sq)[:, None] + self.past
        j = np.arange(self.total)[None, :]
        ok = np.ones((self.sq, self.total), dtype=bool)
        if self.causal:
            ok &= j <= i
        if self.left >= 0:
            ok &= i - j <= self.left
        if self.right >= 0:
            ok &= j - i <= self.right
        return not bool(ok.any(axis=1).all())


def _heads(ctx: Ctx, x: Tensor, heads: int, what: str) -> Tensor:
    """A 3-D ``(B, S, H*D)`` input as ``(B, H, S, D)`` (a 4-D one as it is)."""
    if x.ndim == 4:
        return x
    b, s, hidden = x.shape
    if hidden % heads:
        raise ExpressionError(
            f"Attention: {what} hidden size {hidden} is not a multiple of its {heads} heads"
        )
    d = hidden // heads
    return ctx.compute(
        (b, heads, s, d), lambda bb, h, i, k: x[bb, i, h * d + k], f"attn_{what}_heads"
    )


def _int_attr(at: dict[str, Any], name: str, default: int) -> int:
    return int(at.get(name, default))


@register_op("Attention")
def _attention(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    q3, k3, v3 = (ctx.tensor(x) for x in ins[:3])
    if not (q3.ndim == k3.ndim == v3.ndim and q3.ndim in (3, 4)):
        raise ExpressionError(
            f"Attention: Q, K and V must all be 3-D or all 4-D (got {q3.ndim}, {k3.ndim}, "
            f"{v3.ndim})"
        )
    if q3.ndim == 3 and ("q_num_heads" not in at or "kv_num_heads" not in at):
        raise ExpressionError(
            "Attention: 3-D inputs need the q_num_heads and kv_num_heads attributes"
        )
    dt = q3.dtype
    if not dtypes.is_float(dt):
        raise UnsupportedOpError(f"Attention of {dt} tensors (floating point only)")
    q = _heads(ctx, q3, _int_attr(at, "q_num_heads", 0), "q")
    k = _heads(ctx, k3, _int_attr(at, "kv_num_heads", 0), "k")
    v = _heads(ctx, v3, _int_attr(at, "kv_num_heads", 0), "v")
    past_k, past_v = optional_input(ins, 4), optional_input(ins, 5)
    if (past_k is None) != (past_v is None):
        raise ExpressionError("Attention: past_key and past_value must be given together")
    nonpad = optional_input(ins, 6)
    if nonpad is not None and past_k is not None:
        raise ExpressionError("Attention: nonpad_kv_seqlen cannot be combined with past_key")
    past = 0
    if past_k is not None:
        past = int(past_k.shape[2])
        k = ops.concat([ctx.tensor(past_k), k], axis=2, name=ctx.fresh("present_key"))
        v = ops.concat([ctx.tensor(past_v), v], axis=2, name=ctx.fresh("present_value"))
    nb, hq, sq, dk = q.shape
    hkv, total, dv = k.shape[1], k.shape[2], v.shape[3]
    if hq % hkv or k.shape[1] != v.shape[1] or k.shape[3] != dk or v.shape[2] != total:
        raise ExpressionError(
            f"Attention: Q {q.shape}, K {k.shape} and V {v.shape} do not fit "
            "(heads of Q a multiple of those of K and V, equal head sizes of Q and K)"
        )
    reps = hq // hkv

    def kv_head(h: Expr) -> Expr:  # grouped-query: each key/value head serves `reps` heads
        return h // reps if reps > 1 else h

    mask_in = optional_input(ins, 3)
    mask = None
    if mask_in is not None:
        given = ctx.tensor(mask_in, like=dt)
        mask = given
        if given.dtype not in ("bool", dt):
            mask = ctx.compute(given.shape, lambda *i: te.cast(given[i], dt), "attn_mask")
        if mask.ndim > 4 or mask.shape[-1] > total:
            raise ExpressionError(
                f"Attention: attn_mask {mask.shape} does not fit the scores "
                f"({nb}, {hq}, {sq}, {total})"
            )
        want = (nb, hq, sq)
        for d, s in zip(range(4 - mask.ndim, 3), mask.shape[:-1], strict=True):
            if s not in (1, want[d]):
                raise ExpressionError(
                    f"Attention: attn_mask {mask.shape} does not broadcast to the scores "
                    f"({nb}, {hq}, {sq}, {total})"
                )
    nonpad_t = None
    if nonpad is not None:
        lengths = ctx.tensor(nonpad)
        nonpad_t = lengths
        if lengths.dtype != "int64":
            nonpad_t = ctx.compute(
                lengths.shape, lambda bb: te.cast(lengths[bb], "int64"), "attn_nonpad"
            )
    mk = _Mask(
        sq=sq,
        total=total,
        past=past,
        causal=bool(_int_attr(at, "is_causal", 0)),
        left=_int_attr(at, "left_window_size", -1),
        right=_int_attr(at, "right_window_size", -1),
        mask=mask,
        nonpad=nonpad_t,
    )
    scale = float(at["scale"]) if "scale" in at else 1.0 / math.sqrt(dk)
    softcap = float(at.get("softcap", 0.0))
    mode = _int_attr(at, "qk_matmul_output_mode", 0)
    prec = at.get("softmax_precision")
    if prec is not None:
        work = storage_dtype(helper.tensor_dtype_to_np_dtype(int(prec)))
    else:
        work = "float32" if dt in dtypes.HALF_DTYPES else dt

    kd = te.reduce_axis(dk, name="d")
    shape = (nb, hq, sq, total)
    # a product of reads (the GEMM path tiles it); the scale joins as its epilogue
    dot = ctx.compute(
        shape,
        lambda b, h, i, j: te.sum(q[b, h, i, kd] * k[b, kv_head(h), j, kd], axis=kd),
        "attn_qk",
    )
    raw = ctx.compute(shape, lambda *i: dot[i] * scale, "attn_qk_scaled")
    capped = raw
    if softcap > 0:
        capped = ctx.compute(
            shape, lambda *i: softcap * te.tanh(raw[i] * (1.0 / softcap)), "attn_softcap"
        )

    def biased(idx: _Index) -> Expr:
        bv = mk.bias(idx, dt)
        return capped[idx] if bv is None else capped[idx] + bv

    scores = ctx.compute(shape, lambda *i: biased(i), "attn_scores")
    probs = _softmax(ctx, scores, work, dt, mk)
    kj = te.reduce_axis(total, name="j")
    y = ctx.compute(
        (nb, hq, sq, dv),
        lambda b, h, i, d: te.sum(probs[b, h, i, kj] * v[b, kv_head(h), kj, d], axis=kj),
        "attn_y",
    )
    if q3.ndim == 3:
        y = ctx.compute(
            (nb, sq, hq * dv), lambda b, i, c: y[b, c // dv, i, c % dv], "attn_y_merged"
        )
    qk_out = {0: raw, 1: capped, 2: scores, 3: probs}.get(mode)
    if qk_out is None:
        raise UnsupportedOpError(f"Attention qk_matmul_output_mode={mode} (0 to 3 are defined)")
    return [y, k, v, qk_out]


def _softmax(ctx: Ctx, scores: Tensor, work: str, dt: str, mk: _Mask) -> Tensor:
    """Row softmax of ``scores`` computed in ``work`` and rounded to ``dt``: the maximum of a
    row that is all ``-inf`` counts as 0 (its exponentials are then 0, not NaN), and a row
    the bias fully masks is zeros."""
    nb, hq, sq, total = scores.shape
    rows = (nb, hq, sq, 1)

    def up(e: Expr) -> Expr:
        return te.cast(e, work) if work != dt else e

    j = te.reduce_axis(total, name="j")
    mx = ctx.compute(rows, lambda b, h, i, _: te.max(up(scores[b, h, i, j]), axis=j), "attn_max")
    ninf = te.const(-math.inf, work)

    def shifted(b: IterVar, h: IterVar, i: IterVar, jj: IterVar) -> Expr:
        m = mx[b, h, i, 0]
        safe = te.where(te.equal(m, ninf), te.const(0.0, work), m)
        return te.exp(up(scores[b, h, i, jj]) - safe)

    ex = ctx.compute(scores.shape, shifted, "attn_exp")
    j2 = te.reduce_axis(total, name="j")
    sm = ctx.compute(rows, lambda b, h, i, _: te.sum(ex[b, h, i, j2], axis=j2), "attn_sum")
    guard: Callable[[Expr, Expr, Expr], Expr] | None = None
    if mk.can_empty_a_row():
        j3 = te.reduce_axis(total, name="j")

        def row_bias(b: IterVar, h: IterVar, i: IterVar, _: IterVar) -> Expr:
            bv = mk.bias((b, h, i, j3), work)
            return te.max(bv if bv is not None else te.const(0.0, work), axis=j3)

        top = ctx.compute(rows, row_bias, "attn_row_bias")
        guard = lambda b, h, i: te.equal(top[b, h, i, 0], ninf)  # noqa: E731

    def prob(b: IterVar, h: IterVar, i: IterVar, jj: IterVar) -> Expr:
        s = sm[b, h, i, 0]
        p = ex[b, h, i, jj] / te.where(te.equal(s, te.const(0.0, work)), te.const(1.0, work), s)
        if guard is not None:
            p = te.where(guard(b, h, i), te.const(0.0, work), p)
        return te.cast(p, dt) if work != dt else p

    return ctx.compute(scores.shape, prob, "attn_probs")


@register_op("RotaryEmbedding")
def _rotary(ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]) -> list[Value]:
    """Rotary position embedding (opset 23): the first ``rotary_embedding_dim`` features of
    each head turn by the angles of ``cos_cache``/``sin_cache`` at the token's position
    (``position_ids``, a run-time gather, or the caches' own ``(B, S)`` rows); halves or,
    with ``interleaved``, even/odd pairs; the remaining features pass through."""
    x, cos, sin = (ctx.tensor(v) for v in ins[:3])
    pos = ctx.tensor(ins[3]) if optional_input(ins, 3) is not None else None
    if x.ndim == 4:
        nb, heads, seq, d = x.shape
    elif x.ndim == 3:
        heads = int(at.get("num_heads", 0))
        if heads <= 0 or x.shape[2] % heads:
            raise ExpressionError(
                f"RotaryEmbedding: a 3-D input {x.shape} needs num_heads dividing its last axis"
            )
        nb, seq, d = x.shape[0], x.shape[1], x.shape[2] // heads
    else:
        raise ExpressionError(f"RotaryEmbedding: input {x.shape} must be 3-D or 4-D")
    rd = int(at.get("rotary_embedding_dim", 0)) or d
    half = rd // 2
    want = (cos.shape[0], half) if pos is not None else (nb, seq, half)
    if rd % 2 or rd > d or cos.shape != sin.shape or tuple(cos.shape) != tuple(want):
        raise ExpressionError(
            f"RotaryEmbedding: caches {cos.shape} / {sin.shape} do not fit a rotation of "
            f"{rd} of {d} features (want {want})"
        )
    inter = bool(int(at.get("interleaved", 0)))

    def angle(t: Tensor, b: Expr, s: Expr, k: Expr) -> Expr:
        return t[te.data_index(pos[b, s]), k] if pos is not None else t[b, s, k]

    def rotated(read: Callable[[Expr], Expr], b: Expr, s: Expr, f: Expr) -> Expr:
        if inter:
            k, first = f // 2, te.equal(f % 2, 0)
            x1, x2 = read(k * 2), read(k * 2 + 1)
        else:
            k, first = f % half, f < half
            x1 = te.where(first, read(f), read(f - half))
            x2 = te.where(first, read(f + half), read(f))
        c, sn = angle(cos, b, s, k), angle(sin, b, s, k)
        v = te.where(first, c * x1 - sn * x2, sn * x1 + c * x2)
        return v if rd == d else te.where(f < rd, v, read(f))

    if x.ndim == 4:
        return [ctx.compute(x.shape, lambda b, h, s, f: rotated(
            lambda g: x[b, h, s, g], b, s, f), "rotary")]  # fmt: skip
    return [ctx.compute(x.shape, lambda b, s, c: rotated(
        lambda g: x[b, s, (c // d) * d + g], b, s, c % d), "rotary")]  # fmt: skip


#: the longest sequence ``LinearAttention`` unrolls (each step is a few small computes)
LINEAR_ATTENTION_MAX_STEPS = 64


@register_op("LinearAttention")
def _linear_attention(
    ctx: Ctx, node: onnx.NodeProto, ins: list[Any], at: dict[str, Any]
) -> list[Value]:
    """Linear attention with a recurrent state ``S`` (B, Hkv, dk, dv), unrolled over the
    (static) steps as the recurrent layers are: per step, ``S *= exp(decay)`` (gated rules),
    ``v <- beta * (v - S^T k)`` (delta rules), ``S += k v^T``, and the output
    ``scale * q^T S`` (grouped-query heads read head ``h // (Hq / Hkv)``); in float32, the
    output rounded to the query's dtype, the final state to ``past_state``'s."""
    q3, k3, v3 = (ctx.tensor(x) for x in ins[:3])
    past, decay, beta = (
        ctx.tensor(ins[j]) if optional_input(ins, j) is not None else None for j in (3, 4, 5)
    )
    rule = str_attr(at, "update_rule", "gated_delta")
    hq, hkv = int(at.get("q_num_heads", 0)), int(at.get("kv_num_heads", 0))
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if (
        rule not in ("linear", "gated", "delta", "gated_delta")
        or hq <= 0 or hkv <= 0 or hq % hkv
        or q3.ndim != 3 or k3.ndim != 3 or v3.ndim != 3
        or gating != (decay is not None) or delta != (beta is not None)
    ):  # fmt: skip
        raise ExpressionError(
            f"LinearAttention: update_rule {rule!r}, heads {hq}/{hkv} and inputs "
            f"{q3.shape}, {k3.shape}, {v3.shape} do not fit (3-D inputs; decay for gated "
            "rules, beta for delta rules)"
        )
    nb, steps, _ = q3.shape
    if steps > LINEAR_ATTENTION_MAX_STEPS:
        raise UnsupportedOpError(
            f"LinearAttention over {steps} steps (it is unrolled; up to "
            f"{LINEAR_ATTENTION_MAX_STEPS})"
        )
    dk, dv, grp = q3.shape[2] // hq, v3.shape[2] // hkv, hq // hkv
    scale = float(at.get("scale", 0.0)) or 1.0 / math.sqrt(dk)
    f32 = "float32"

    def up(e: Expr) -> Expr:
        return te.cast(e, f32) if e.dtype != f32 else e

    s_shape = (nb, hkv, dk, dv)
    if past is not None:
        state = ctx.compute(s_shape, lambda b, h, d, m: up(past[b, h, d, m]), "la_state0")
    else:
        state = None
    outs: list[Tensor] = []
    for t in range(steps):
        state, y = _linear_attention_step(
            ctx, t, state, (q3, k3, v3, decay, beta), (hq, hkv, dk, dv, grp), scale, up
        )
        outs.append(y)

    def merged(b: IterVar, t: IterVar, c: IterVar) -> Expr:
        v: Expr = outs[0][b, c]
        for n, y in enumerate(outs[1:], 1):
            v = te.where(te.equal(t, n), y[b, c], v)
        return te.cast(v, q3.dtype) if q3.dtype != f32 else v

    y_all = ctx.compute((nb, steps, hq * dv), merged, "la_out")
    dt_state = past.dtype if past is not None else q3.dtype
    assert state is not None
    final = state
    if dt_state != f32:
        final = ctx.compute(s_shape, lambda *i: te.cast(state[i], dt_state), "la_state")
    return [y_all, final]


def _linear_attention_step(
    ctx: Ctx,
    t: int,
    state: Tensor | None,
    data: tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None],
    dims: tuple[int, int, int, int, int],
    scale: float,
    up: Callable[[Expr], Expr],
) -> tuple[Tensor, Tensor]:
    """One step of :func:`_linear_attention`: the new state, and the output (B, Hq*dv)."""
    q3, k3, v3, decay, beta = data
    hq, hkv, dk, dv, grp = dims
    nb = q3.shape[0]
    s_shape = (nb, hkv, dk, dv)

    def key(b: Expr, h: Expr, d: Expr) -> Expr:
        return up(k3[b, t, h * dk + d])

    def value(b: Expr, h: Expr, m: Expr) -> Expr:
        return up(v3[b, t, h * dv + m])

    if state is not None and decay is not None:
        per_dk = decay.shape[2] == hkv * dk
        s_prev = state
        state = ctx.compute(
            s_shape,
            lambda b, h, d, m: (
                s_prev[b, h, d, m]
                * te.exp(up(decay[b, t, h * dk + d] if per_dk else decay[b, t, h]))
            ),
            "la_decay",
        )
    vt: Callable[[Expr, Expr, Expr], Expr] = value
    if beta is not None:
        one = beta.shape[2] == 1
        if state is not None:
            s_cur = state
            r = te.reduce_axis(dk, name="rd")
            got = ctx.compute(
                (nb, hkv, dv),
                lambda b, h, m: te.sum(s_cur[b, h, r, m] * key(b, h, r), axis=r),
                "la_retrieved",
            )
        else:
            got = None

        def vt(b: Expr, h: Expr, m: Expr) -> Expr:  # noqa: F811
            bt = up(beta[b, t, 0] if one else beta[b, t, h])
            return bt * (value(b, h, m) - got[b, h, m]) if got is not None else bt * value(b, h, m)

    s_old = state
    state = ctx.compute(
        s_shape,
        lambda b, h, d, m: (
            (s_old[b, h, d, m] if s_old is not None else 0.0) + key(b, h, d) * vt(b, h, m)
        ),
        "la_state",
    )
    s_new = state
    r2 = te.reduce_axis(dk, name="rq")
    y = ctx.compute(
        (nb, hq * dv),
        lambda b, c: (
            te.sum(
                up(q3[b, t, (c // dv) * dk + r2]) * s_new[b, (c // dv) // grp, r2, c % dv], axis=r2
            )
            * scale
        ),
        "la_y",
    )
    return state, y
