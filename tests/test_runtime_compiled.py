"""Tests of polyfuse.cuda.runtime without a GPU (continued from test_runtime.py): a compiled
graph with device="cuda" on the fake driver (tests/fake_cuda.py) matches the emulator, its
errors, and misaligned device arrays.
"""

from __future__ import annotations

import numpy as np
import pytest
from fake_cuda import FakeBindings, FakeDeviceArray, FakeGPU
from test_runtime import N, fake_device, program, rand, source_binary

import polyfuse
import polyfuse.runner as runner_mod
from polyfuse import ops, te
from polyfuse.cuda.runtime import (
    DeviceArray,
)
from polyfuse.cuda.runtime import device as device_mod
from polyfuse.cuda.runtime import select as select_mod
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver
from polyfuse.errors import CallError


@pytest.fixture
def fake_cuda(monkeypatch):
    """Route device="cuda" to a fake GPU; the module image is the CUDA source."""
    gpu = FakeGPU()
    monkeypatch.setattr(select_mod, "_LOADED", {"cuda-bindings": BindingsDriver(FakeBindings(gpu))})
    monkeypatch.setattr(device_mod, "_DEVICES", {})
    monkeypatch.setenv("POLYFUSE_CUDA_RUNTIME", "cuda-bindings")
    monkeypatch.setattr(
        runner_mod, "compile_cuda", lambda source, arch, **kw: source_binary(source, arch)
    )
    return gpu


def _layer(rows: int = 6, cols: int = 40):
    x = te.placeholder((rows, cols), name="x")
    w = te.placeholder((cols,), name="w")
    h = ops.softmax(ops.mul(x, w))
    y = ops.add(h, ops.reduce_sum(x, axis=1, keepdims=True))
    wv = np.linspace(0.5, 1.5, cols).astype(np.float32)
    return polyfuse.compile([x], [y, h], constants={w: wv}, check_cuda=False)


def test_compiled_graph_on_the_fake_gpu_matches_the_emulator(fake_cuda):
    fn = _layer()
    x = np.random.default_rng(3).standard_normal((6, 40)).astype(np.float32)
    want = fn(x, device="emulate")
    got = fn(x, device="cuda")
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-7)
    dev = fn.device_program().device
    allocations = dev.stats.allocations
    for _ in range(3):
        fn(x, device="cuda")
    assert dev.stats.allocations == allocations and dev.stats.modules_loaded == 1
    # Device arrays in: outputs at new device addresses, inputs read in place.
    xd = FakeDeviceArray(fake_cuda, x)
    y = FakeDeviceArray(fake_cuda, np.zeros((6, 40), np.float32))
    got_y, got_h = fn(xd, device="cuda", out={fn.outputs[0].name: y})
    assert got_y is y and isinstance(got_h, DeviceArray)
    np.testing.assert_allclose(y.numpy(), want[0], rtol=1e-6, atol=1e-7)


def test_compiled_graph_errors(fake_cuda):
    fn = _layer()
    x = np.zeros((6, 40), np.float32)
    with pytest.raises(CallError, match="unknown device 'cuda:x'"):
        fn(x, device="cuda:x")
    with pytest.raises(CallError, match="race_check is an emulator mode"):
        fn(x, device="cuda", race_check=True)
    with pytest.raises(CallError, match=r"input 'x': expected shape \(6, 40\), got \(6, 4\)"):
        fn(np.zeros((6, 4), np.float32), device="cuda")
    # A device array where the emulator needs a host array.
    with pytest.raises(CallError) as info:
        fn(FakeDeviceArray(fake_cuda, x), device="emulate")
    assert str(info.value).startswith("input 'x' is a CUDA array (fake_cuda.FakeDeviceArray)")
    assert "use device='cuda'" in str(info.value)
    with pytest.raises(CallError, match="the graph has 2 outputs"):
        fn(x, device="emulate", out=np.zeros((6, 40), np.float32))
    y = np.zeros((6, 40), np.float32)
    got = fn(x, device="emulate", out={fn.outputs[0].name: y})
    assert got[0] is y and np.array_equal(y, fn(x)[0])
    with pytest.raises(CallError, match="out: unknown output 'nope'"):
        fn(x, device="emulate", out={"nope": y})


def test_misaligned_device_arrays_are_refused():
    """Kernels may use float4 accesses: a view 4 bytes into an allocation would fault."""
    dev, gpu = fake_device()
    prog = program(dev, graphs=False)
    x = FakeDeviceArray(gpu, np.concatenate([rand(), np.zeros(4, np.float32)]))
    x.shape = (N,)
    x.ptr += 4
    with pytest.raises(CallError, match="16-byte aligned"):
        prog({"x": x}, {})
