"""Softmax over the rows of a matrix, compiled by polyfuse and checked against numpy.

    python examples/softmax.py

ops.softmax is five primitives (row max, subtract, exp, row sum, divide); the plan shows how
polyfuse groups them into micrographs and kernels. The CUDA source is printed at the end.
"""

import numpy as np

import polyfuse
from polyfuse import ops, te

ROWS, COLS = 10, 100  # 100 is not a multiple of 32: the kernels handle partial tiles


def main() -> int:
    """Compile, print the plan, run on the CPU emulator and compare with numpy."""
    x = te.placeholder((ROWS, COLS), name="x")
    y = ops.softmax(x, axis=-1, name="softmax")

    fn = polyfuse.compile(inputs=[x], outputs=[y], arch="sm_80")
    print(fn.plan)

    x_np = np.random.default_rng(0).standard_normal((ROWS, COLS)).astype(np.float32)
    got = fn(x_np, device="emulate")

    e = np.exp(x_np - x_np.max(axis=-1, keepdims=True))
    want = e / e.sum(axis=-1, keepdims=True)
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(f"\nmax |error| vs numpy: {np.abs(got - want).max():.3g} -> {'PASS' if ok else 'FAIL'}")

    print(f"\n{len(fn.kernels)} kernels; the CUDA translation unit:\n")
    print(fn.cuda_source)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
