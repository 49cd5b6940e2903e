"""On a real GPU (skipped without one): the runtime gives the emulator's results.

Run on a lent machine with ``python -m pytest -q tests/test_gpu.py`` (islpy and a C++
compiler are needed for compiling and emulating; torch, CuPy and JAX are used when present).
For numpy, torch, CuPy and JAX arguments, every example and every suite subgraph (at a
reduced scale, so the emulator stays quick) gives the emulator's outputs on the GPU; a CUDA
graph replay equals the direct launches; device arrays are read and written in place; calls
on a framework stream are ordered on it. Timings are not asserted here: the per-call host
overhead is a figure of ``python benchmarks/gpu.py --overhead DIR``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import examples
from polyfuse.cuda.runtime import gpu_available
from polyfuse.errors import CallError, CompilerNotFound

pytestmark = [
    pytest.mark.skipif(not gpu_available(), reason="no GPU (cuda-bindings or pycuda)"),
    pytest.mark.extra,  # the peers need PyTorch (CI's extras step)
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402

SUITE_SCALE = 64
TOL = 1e-5  # relative L2: GPU and CPU differ in FMA contraction and libm, not in algorithm


def rel(got, want) -> float:
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert g.shape == w.shape and np.all(np.isfinite(g))
    return float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))


def _cases():
    for name in examples.EXAMPLES:
        yield pytest.param(("example", name), id=f"example-{name}")
    for name in suite.NAMES:
        yield pytest.param(("suite", name), id=f"suite-{name}")


def _build(case):
    kind, name = case
    if kind == "example":
        inputs, outputs, ref = examples.EXAMPLES[name].build()
        arrays = examples.random_inputs(inputs, seed=5)
    else:
        inputs, outputs, ref = suite.build(name, SUITE_SCALE)
        arrays = suite.random_inputs(name, inputs, seed=5)
    return polyfuse.compile(inputs, outputs), arrays, ref


def _tuple(x):
    return x if isinstance(x, tuple) else (x,)


@pytest.mark.parametrize("case", list(_cases()))
def test_frameworks_give_the_emulators_results(case):
    fn, arrays, ref = _build(case)
    try:
        want = _tuple(fn(*arrays, device="emulate"))
    except CompilerNotFound:
        want = _tuple(ref(*arrays))  # no C++ compiler for the emulator here: the reference
    got = _tuple(fn(*arrays, device="cuda"))
    assert all(isinstance(g, np.ndarray) for g in got)
    for g, w in zip(got, want, strict=True):
        assert rel(g, w) < TOL
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        xs = [torch.from_numpy(a).cuda() for a in arrays]
        got = _tuple(fn(*xs, device="cuda"))
        for g, w in zip(got, want, strict=True):
            assert isinstance(g, torch.Tensor) and g.is_cuda and g.dtype == torch.float32
            assert rel(g.cpu().numpy(), w) < TOL
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        got = _tuple(fn(*[cupy.asarray(a) for a in arrays], device="cuda"))
        for g, w in zip(got, want, strict=True):
            assert isinstance(g, cupy.ndarray)
            assert rel(cupy.asnumpy(g), w) < TOL


def test_jax_arrays():
    jax = pytest.importorskip("jax")
    inputs, outputs, ref = examples.layer_norm()
    fn = polyfuse.compile(inputs, outputs)
    arrays = examples.random_inputs(inputs, seed=6)
    got = fn(*[jax.device_put(a) for a in arrays], device="cuda")
    assert isinstance(got, jax.Array)
    assert rel(np.asarray(got), ref(*arrays)[0]) < TOL


def test_device_arrays_in_place_and_buffers_kept():
    torch = pytest.importorskip("torch")
    inputs, outputs, _ = examples.attention()
    fn = polyfuse.compile(inputs, outputs)
    xs = [torch.from_numpy(a).cuda() for a in examples.random_inputs(inputs, seed=7)]
    out = torch.full(outputs[0].shape, float("nan"), device="cuda")
    y = fn(*xs, device="cuda", out=out)
    assert y is out and y.data_ptr() == out.data_ptr()
    prog = fn.device_program("cuda")
    stats = prog.device.stats
    allocations, copies = stats.allocations, (stats.copies_htod, stats.copies_dtoh)
    for _ in range(5):
        fn(*xs, device="cuda", out=out)
    assert stats.allocations == allocations, "no allocation per call"
    assert (stats.copies_htod, stats.copies_dtoh) == copies, "no copy per call"
    assert prog.graphs and stats.graph_launches >= 4, "4 kernels replayed as a CUDA graph"


def test_cuda_graph_replay_equals_direct_launches():
    torch = pytest.importorskip("torch")
    inputs, outputs, _ = examples.attention()
    fn = polyfuse.compile(inputs, outputs)
    arrays = examples.random_inputs(inputs, seed=8)
    xs = [torch.from_numpy(a).cuda() for a in arrays]
    direct = fn.device_program("cuda")
    direct.graphs = False
    want = fn(*xs, device="cuda").cpu().numpy()
    direct.graphs = True
    replays = [fn(*xs, device="cuda").cpu().numpy() for _ in range(4)]
    assert direct.device.stats.graph_launches >= 2
    for r in replays:
        np.testing.assert_array_equal(r, want)


def test_framework_stream_and_errors():
    torch = pytest.importorskip("torch")
    inputs, outputs, ref = examples.softmax()
    fn = polyfuse.compile(inputs, outputs)
    (x,) = examples.random_inputs(inputs, seed=9)
    xd = torch.from_numpy(x).cuda()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        y = fn(xd, device="cuda")
    side.synchronize()
    assert rel(y.cpu().numpy(), ref(x)[0]) < TOL
    y2 = fn(xd, device="cuda", stream=side)
    side.synchronize()
    np.testing.assert_array_equal(y2.cpu().numpy(), y.cpu().numpy())
    with pytest.raises(CallError, match="out 'softmax' is a numpy array"):
        fn(xd, device="cuda", out=np.empty(outputs[0].shape, np.float32))
    with pytest.raises(CallError, match="is a CUDA array"):
        fn(xd, device="emulate")
    with pytest.raises(CallError, match="not C-contiguous"):
        fn(torch.from_numpy(np.ascontiguousarray(x.T)).cuda().T, device="cuda")


def test_torch_compile_backend_on_the_gpu():
    torch = pytest.importorskip("torch")
    from polyfuse.torch import polyfuse_backend  # the object: works without an installed
    # entry point (a source checkout on PYTHONPATH); installed, backend="polyfuse" does too

    torch._dynamo.reset()
    model = (
        torch.nn.Sequential(
            torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)
        )
        .cuda()
        .eval()
    )
    x = torch.randn(16, 32, device="cuda")
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend=polyfuse_backend)(x)
    assert got.is_cuda
    assert rel(got.cpu().numpy(), want.cpu().numpy()) < 1e-4  # eager may use TF32


def test_saved_artifact_runs_its_cubin_on_the_gpu(tmp_path):
    """fn.save → polyfuse.load: the GPU loads the saved cubin for its arch and gives the
    compiled graph's results; a process without islpy does the same."""
    import subprocess

    from polyfuse.cuda.runtime import open_device

    arch = open_device(0).arch
    inputs, outputs, _ = examples.attention()
    fn = polyfuse.compile(inputs, outputs, arch=arch)
    arrays = examples.random_inputs(inputs, seed=9)
    want = fn(*arrays, device="cuda")
    path = fn.save(tmp_path / "attention.pfa")
    g = polyfuse.load(path)
    np.testing.assert_array_equal(g(*arrays, device="cuda"), want)
    assert g.device_program("cuda").module.binary.image == g.binaries[arch].image
    np.savez(tmp_path / "in.npz", *arrays)
    code = (
        "import sys; sys.modules['islpy'] = None\n"
        "import numpy as np, polyfuse\n"
        f"d = np.load({str(tmp_path / 'in.npz')!r}); g = polyfuse.load({str(path)!r})\n"
        "y = g(*[d[f'arr_{i}'] for i in range(len(d))], device='cuda')\n"
        f"np.save({str(tmp_path / 'y.npy')!r}, y)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)  # the installed package
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)
