"""Layer normalisation with a learned scale and shift, checked against numpy.

    python examples/layer_norm.py

ops.layer_norm(x, gamma, beta) normalises every row of x over its last dim:
(x - mean) / sqrt(var + eps) * gamma + beta.
"""

import numpy as np

import polyfuse
from polyfuse import ops, te

ROWS, FEATURES, EPS = 12, 72, 1e-5


def main() -> int:
    """Compile, print the plan, run on the CPU emulator and compare with numpy."""
    x = te.placeholder((ROWS, FEATURES), name="x")
    gamma = te.placeholder((FEATURES,), name="gamma")
    beta = te.placeholder((FEATURES,), name="beta")
    y = ops.layer_norm(x, gamma, beta, eps=EPS, name="layer_norm")

    fn = polyfuse.compile(inputs=[x, gamma, beta], outputs=[y], arch="sm_80")
    print(fn.plan)

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    g_np = rng.standard_normal(FEATURES).astype(np.float32)
    b_np = rng.standard_normal(FEATURES).astype(np.float32)
    got = fn(x_np, g_np, b_np, device="emulate")

    x64 = x_np.astype(np.float64)
    mean = x64.mean(axis=-1, keepdims=True)
    var = x64.var(axis=-1, keepdims=True)
    want = (x64 - mean) / np.sqrt(var + EPS) * g_np + b_np
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(f"\nmax |error| vs numpy: {np.abs(got - want).max():.3g} -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
