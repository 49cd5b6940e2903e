"""relu(conv2d(x, w) + bias) on an NCHW image, checked against numpy.

    python examples/conv2d_relu.py

Stride 1 and zero padding 1: the padding is a guard on the loop variables (te.where), so every
subscript stays affine and isl can model the convolution exactly.
"""

import numpy as np

import polyfuse
from polyfuse import ops, te

BATCH, CHANNELS, SIZE, FILTERS, KERNEL, PAD = 1, 3, 14, 8, 3, 1


def conv2d(x: np.ndarray, w: np.ndarray, pad: int) -> np.ndarray:
    """Stride-1 cross-correlation with zero padding, in numpy (float64)."""
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh, ow = h + 2 * pad - kh + 1, wd + 2 * pad - kw + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(kh):
        for j in range(kw):
            out += np.einsum("nchw,oc->nohw", xp[:, :, i : i + oh, j : j + ow], w[:, :, i, j])
    return out


def main() -> int:
    """Compile, print the plan, run on the CPU emulator and compare with numpy."""
    x = te.placeholder((BATCH, CHANNELS, SIZE, SIZE), name="x")
    w = te.placeholder((FILTERS, CHANNELS, KERNEL, KERNEL), name="w")
    bias = te.placeholder((FILTERS,), name="bias")
    y = ops.relu(ops.conv2d(x, w, bias, stride=1, padding=PAD))

    fn = polyfuse.compile(inputs=[x, w, bias], outputs=[y], arch="sm_80")
    print(fn.plan)

    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(x.shape).astype(np.float32)
    w_np = rng.standard_normal(w.shape).astype(np.float32)
    b_np = rng.standard_normal(bias.shape).astype(np.float32)
    got = fn(x_np, w_np, b_np, device="emulate")

    want = np.maximum(conv2d(x_np, w_np, PAD) + b_np[None, :, None, None], 0.0)
    ok = np.allclose(got, want, rtol=1e-4, atol=1e-5)
    print(f"\nmax |error| vs numpy: {np.abs(got - want).max():.3g} -> {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
