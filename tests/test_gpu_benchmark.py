"""benchmarks/gpu.py without a GPU: the peers compute what polyfuse computes, and the
prepared artifacts run through the runtime (fake driver, kernels in the emulator).

What the lent GPU machine will run is exactly this path with the real driver: the manifest's
launches and buffers, :func:`gpu.case_program`, :func:`gpu.draw_inputs`, and the peers as the
float64 reference.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fake_cuda import FakeBindings, FakeGPU

from polyfuse import examples
from polyfuse.cuda.runtime import Device
from polyfuse.cuda.runtime.bindings_driver import BindingsDriver

torch = pytest.importorskip("torch")

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import gpu  # noqa: E402
import suite  # noqa: E402

SCALE = 512  # rows / 512: the numpy references take milliseconds


def _peer64(name: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
    ops = gpu.Ops("torch")
    with torch.no_grad():
        out = gpu.PEERS[name](ops, *[torch.from_numpy(a).double() for a in arrays])
    return [o.numpy() for o in gpu._peer_outputs(out)]


@pytest.mark.parametrize("name", gpu.SUITE)
def test_suite_peers_match_the_suite_references(name):
    inputs, outputs, reference = suite.build(name, SCALE)
    arrays = suite.random_inputs(name, inputs, seed=1)
    got = _peer64(name, arrays)
    want = reference(*arrays)
    assert len(got) == len(want) == len(outputs)
    for g, w in zip(got, want, strict=True):
        assert gpu.rel_err(g, w) < 1e-6, name


@pytest.mark.parametrize("name", list(gpu.COMPUTE))
def test_compute_peers_match_the_example_references(name):
    example, _ = gpu.COMPUTE[name]
    small = {"matmul_bias_gelu": {}, "conv2d_relu": {}, "attention": {}}[example]
    inputs, outputs, reference = getattr(examples, example)(**small)
    arrays = examples.random_inputs(inputs, seed=2)
    (got,) = _peer64(name, arrays)
    (want,) = reference(*arrays)
    assert gpu.rel_err(got, want) < 1e-12


def test_prepared_cases_run_through_the_runtime(tmp_path):
    cases = ["batchnorm_train_relu", "adam3", "attention_s128"]
    manifest = gpu.prepare(tmp_path, cases, "sm_90", scale=SCALE)
    assert (tmp_path / gpu.MANIFEST).exists() and "overhead" in manifest
    loaded = gpu.load_manifest(tmp_path)
    assert [c["name"] for c in loaded["cases"]] == cases
    assert len(loaded["overhead"]["kernels"]) == 4, "the overhead graph has 4 kernels"
    for c in loaded["cases"]:
        assert (tmp_path / c["cubin"]).read_bytes()[:4] == b"\x7fELF"
        assert all(k.spill_bytes == 0 for k in c["kernels"])
    assert {k.kind for k in loaded["cases"][2]["kernels"]} >= {"gemm"}
    assert loaded["cases"][0]["kernels"][0].kind in ("reduction", "stitched")
    assert {k.kind for k in loaded["cases"][1]["kernels"]} == {"elementwise"}
    device = Device(driver=BindingsDriver(FakeBindings(FakeGPU())))
    for case in loaded["cases"]:
        prog = gpu.case_program(device, tmp_path, case, image="source")
        arrays = gpu.draw_inputs(case, seed=3)
        if case["name"] == "adam3":
            v = [a for n, a in zip(case["input_names"], arrays, strict=True) if n[0] == "v"]
            assert all((a >= 0).all() for a in v)
        got = prog(dict(zip(case["inputs"], arrays, strict=True)))
        want = _peer64(case["name"], arrays)
        for g, w in zip(got, want, strict=True):
            assert gpu.rel_err(g, w) < 1e-5, case["name"]


def test_runner_imports_without_the_compiler(tmp_path):
    """On the GPU machine there is no islpy: the runtime must import without it."""
    # An editable install's import hook finds every subpackage by name, which hid a runtime
    # import of polyfuse.poly from this test; drop it so the test sees what a wheel install sees.
    code = (
        "import sys; sys.meta_path[:] = [f for f in sys.meta_path "
        "if '__editable__' not in getattr(f, '__module__', '')]; "
        f"sys.modules['islpy'] = None; sys.path.insert(0, {str(BENCH)!r}); import gpu; "
        "rt = gpu.import_runtime(); rt.DeviceProgram; "
        "assert 'polyfuse.driver' not in sys.modules and 'polyfuse.graph' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
