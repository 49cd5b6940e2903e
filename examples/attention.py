"""Scaled dot-product attention, softmax(Q·Kᵀ / sqrt(D)) · V, checked against numpy.

    python examples/attention.py

Q, K and V are [batch, heads, seq, dim]. Kᵀ is ops.transpose of the last two dims; the scores
go through ops.softmax and a second ops.matmul with V. The emulator also runs in race-check
mode (every block's threads in reverse order between barriers).
"""

import math

import numpy as np

import polyfuse
from polyfuse import ops, te

B, H, S, D = 1, 2, 16, 8


def main() -> int:
    """Compile, print the plan, run on the CPU emulator (twice) and compare with numpy."""
    q = te.placeholder((B, H, S, D), name="q")
    k = te.placeholder((B, H, S, D), name="k")
    v = te.placeholder((B, H, S, D), name="v")
    scale = 1.0 / math.sqrt(D)
    scores = ops.mul(ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))), scale)
    out = ops.matmul(ops.softmax(scores, axis=-1), v)

    fn = polyfuse.compile(inputs=[q, k, v], outputs=[out], arch="sm_80")
    print(fn.plan)

    rng = np.random.default_rng(0)
    q_np, k_np, v_np = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3))

    s = q_np.astype(np.float64) @ k_np.transpose(0, 1, 3, 2) * scale
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    want = p / p.sum(axis=-1, keepdims=True) @ v_np

    ok = True
    for race_check in (False, True):
        got = fn(q_np, k_np, v_np, device="emulate", race_check=race_check)
        good = np.allclose(got, want, rtol=1e-4, atol=1e-5)
        ok = ok and good
        mode = "reverse thread order" if race_check else "in order"
        err = np.abs(got - want).max()
        print(f"max |error| vs numpy ({mode}): {err:.3g} -> {'PASS' if good else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
