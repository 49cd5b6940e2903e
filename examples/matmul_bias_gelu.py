"""A dense layer, gelu(a @ w + bias), checked against numpy; also compiled with NVRTC.

    python examples/matmul_bias_gelu.py

The matmul, the bias add and the GELU are three primitives; the plan shows whether they end up
in one kernel. When NVRTC or nvcc is installed, the kernels are compiled for sm_80 and their
register counts are printed.
"""

import math

import numpy as np

import polyfuse
from polyfuse import ops, te

M, K, N = 33, 40, 50


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact GELU, x * Phi(x), in numpy."""
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def main() -> int:
    """Compile, print the plan, run on the CPU emulator, compare with numpy, compile the CUDA."""
    a = te.placeholder((M, K), name="a")
    w = te.placeholder((K, N), name="w")
    bias = te.placeholder((N,), name="bias")
    y = ops.gelu(ops.add(ops.matmul(a, w), bias))

    fn = polyfuse.compile(inputs=[a, w, bias], outputs=[y], arch="sm_80")
    print(fn.plan)

    rng = np.random.default_rng(0)
    a_np = rng.standard_normal((M, K)).astype(np.float32)
    w_np = rng.standard_normal((K, N)).astype(np.float32)
    b_np = rng.standard_normal(N).astype(np.float32)
    got = fn(a_np, w_np, b_np, device="emulate")

    want = gelu(a_np.astype(np.float64) @ w_np + b_np)
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(f"\nmax |error| vs numpy: {np.abs(got - want).max():.3g} -> {'PASS' if ok else 'FAIL'}")

    try:
        binary = fn.check_cuda("sm_80")
    except polyfuse.PolyfuseError as e:  # no NVRTC/nvcc installed
        print(f"CUDA not compiled: {e}")
    else:
        print(f"\ncompiled with {binary.compiler} for {binary.arch}:")
        for resources in binary.resources.values():
            print(f"  {resources}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
