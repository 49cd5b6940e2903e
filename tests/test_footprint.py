"""isl's exact global footprints equal the bytes the emulator counts."""

import numpy as np
import pytest
from cases import build_cases

import polyfuse
from polyfuse import ops, te

CASES = {c.name: c for c in build_cases()}


@pytest.mark.parametrize(
    "name",
    ["elementwise_chain", "softmax", "layer_norm", "conv2d_dilation", "slice", "two_outputs"],
)
def test_isl_footprint_equals_emulator_count(name):
    c = CASES[name]
    fn = polyfuse.compile(c.inputs, c.outputs)
    arrays = [np.ones(t.shape, np.float32) for t in c.inputs]
    fn(*arrays, device="emulate")
    assert len(fn.last_traffic) == len(fn.kernels)
    for k, t in zip(fn.kernels, fn.last_traffic, strict=True):
        assert t.kernel == k.name
        assert t.bytes_read == k.bytes_read, k.name
        assert t.bytes_written == k.bytes_written, k.name


def test_fused_chain_moves_compulsory_bytes_only():
    x = te.placeholder((64, 100), name="x")
    y = ops.tanh(ops.exp(ops.mul(ops.add(x, 1.0), 0.5)))
    fn = polyfuse.compile([x], [y])
    assert len(fn.kernels) == 1
    assert fn.global_bytes() == fn.compulsory_bytes() == 2 * 64 * 100 * 4
