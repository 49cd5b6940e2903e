"""An LSTM unrolled over time: ``T`` copies of the cell, weights shared across steps."""

from __future__ import annotations

from typing import Any

__all__ = ["LSTM", "lstm_model"]

LSTM = {
    "full": dict(steps=16, batch=32, input=512, hidden=512),
    "tiny": dict(steps=4, batch=2, input=8, hidden=8),
}


def lstm_model(b: Any, cfg: dict) -> list[Any]:
    """One LSTM layer over ``x: (T, B, I)`` from ``h0 = c0 = 0``; returns ``h_T`` and ``c_T``.

    Gates ``[i, f, g, o] = x_t @ W_x + h @ W_h + bias`` (one ``(B, 4H)`` product each),
    ``c = sigmoid(f) * c + sigmoid(i) * tanh(g)``, ``h = sigmoid(o) * tanh(c)``.
    """
    t_steps, bs, n_in, h = cfg["steps"], cfg["batch"], cfg["input"], cfg["hidden"]
    x = b.input("x", (t_steps, bs, n_in))
    wx = b.param("w_x", (n_in, 4 * h))
    wh = b.param("w_h", (h, 4 * h))
    bias = b.param("bias", (4 * h,), "zero")
    hs = cs = None
    for t in range(t_steps):
        xt = b.reshape(b.slice(x, [t], [t + 1], [0]), (bs, n_in))
        gates = b.add(b.matmul(xt, wx), bias)
        if hs is not None:
            gates = b.add(gates, b.matmul(hs, wh))

        def gate(k: int, g: Any = gates) -> Any:
            return b.slice(g, [k * h], [(k + 1) * h], [1])

        i, f, g, o = (gate(k) for k in range(4))
        new_c = b.mul(b.sigmoid(i), b.tanh(g))
        cs = new_c if cs is None else b.add(b.mul(b.sigmoid(f), cs), new_c)
        hs = b.mul(b.sigmoid(o), b.tanh(cs))
    return [hs, cs]
