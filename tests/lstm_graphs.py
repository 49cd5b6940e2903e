"""LSTM graphs written step by step with the te API, and their float64 reference.

Two ways to project the input: per step (``x[t] @ W_x``, as the zoo's LSTM writes it:
``graph/passes/stack_siblings`` stacks the steps' products into one GEMM) or hoisted (one GEMM
``P[t, b, j]`` over every step, as cuDNN computes it; the gates read ``P[t]``).
"""

from __future__ import annotations

import numpy as np

from polyfuse import te


def lstm(steps: int, batch: int, n_in: int, hidden: int, dtype: str = "float32",
         hoisted: bool = False):  # fmt: skip
    """(inputs ``[x, wx, wh, bias]``, outputs ``[h, c]``) of one LSTM layer from zero state."""
    x = te.placeholder((steps, batch, n_in), dtype, name="x")
    wx = te.placeholder((n_in, 4 * hidden), dtype, name="wx")
    wh = te.placeholder((hidden, 4 * hidden), dtype, name="wh")
    bias = te.placeholder((4 * hidden,), dtype, name="bias")
    cols = (batch, 4 * hidden)
    if hoisted:
        k = te.reduce_axis(n_in, "k")
        p = te.compute(
            (steps, *cols), lambda t, b, j: te.sum(x[t, b, k] * wx[k, j], axis=k), name="p"
        )
    h = c = None
    for t in range(steps):
        if hoisted:
            g = te.compute(cols, lambda b, j, t=t: p[t, b, j] + bias[j], name=f"g{t}")
        else:
            k = te.reduce_axis(n_in, "k")
            pt = te.compute(cols, lambda b, j, t=t, k=k: te.sum(x[t, b, k] * wx[k, j], axis=k))
            g = te.compute(cols, lambda b, j, pt=pt: pt[b, j] + bias[j])
        if h is not None:
            r = te.reduce_axis(hidden, "r")
            hw = te.compute(cols, lambda b, j, h=h, r=r: te.sum(h[b, r] * wh[r, j], axis=r))
            g = te.compute(cols, lambda b, j, g=g, hw=hw: g[b, j] + hw[b, j])

        def gate(q: int, g=g):
            return lambda b, j: g[b, q * hidden + j]

        i_, f_, gg, o_ = (te.compute((batch, hidden), gate(q)) for q in range(4))
        new = te.compute(
            (batch, hidden), lambda b, j, i_=i_, gg=gg: te.sigmoid(i_[b, j]) * te.tanh(gg[b, j])
        )
        c = new if c is None else te.compute(
            (batch, hidden),
            lambda b, j, f_=f_, c=c, new=new: te.sigmoid(f_[b, j]) * c[b, j] + new[b, j],
        )  # fmt: skip
        h = te.compute(
            (batch, hidden), lambda b, j, o_=o_, c=c: te.sigmoid(o_[b, j]) * te.tanh(c[b, j])
        )
    return [x, wx, wh, bias], [h, c]


def lstm_reference(arrays, steps: int, hidden: int):
    """``(h, c)`` in float64 for the arrays of :func:`lstm`'s inputs."""
    x, wx, wh, bias = (a.astype(np.float64) for a in arrays)
    sig = lambda v: 1 / (1 + np.exp(-v))  # noqa: E731
    h = c = None
    for t in range(steps):
        g = x[t] @ wx + bias + (h @ wh if h is not None else 0)
        i, f, gg, o = (g[:, q * hidden : (q + 1) * hidden] for q in range(4))
        new = sig(i) * np.tanh(gg)
        c = new if c is None else sig(f) * c + new
        h = sig(o) * np.tanh(c)
    return h, c
