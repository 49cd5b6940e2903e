"""Every test graph: emulator result equals numpy (also in race-check mode), and every kernel
compiles with NVRTC/nvcc for sm_80 and sm_90."""

import os

import numpy as np
import pytest
from cases import build_cases

import polyfuse
from polyfuse.cuda.toolchain.compiler import available_compilers

CASES = {c.name: c for c in build_cases()}
_compiled: dict[str, polyfuse.CompiledGraph] = {}


def compiled(name: str) -> polyfuse.CompiledGraph:
    if name not in _compiled:
        c = CASES[name]
        _compiled[name] = polyfuse.compile(c.inputs, c.outputs, name=name)
    return _compiled[name]


def run_case(name: str, race_check) -> None:
    c = CASES[name]
    fn = compiled(name)
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in c.inputs]
    got = fn(*arrays, device="emulate", race_check=race_check)
    got = got if isinstance(got, tuple) else (got,)
    want = c.reference(*[a.astype(np.float64) for a in arrays])
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulator_matches_numpy(name):
    run_case(name, race_check=False)


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulator_matches_numpy_race_check(name):
    run_case(name, race_check=True)


def _need_compiler():
    if not available_compilers():
        if os.environ.get("CI"):
            pytest.fail("CI must have NVRTC or nvcc (pip install 'polyfuse[nvrtc]')")
        pytest.skip("no CUDA compiler installed")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_kernels_compile_for_arch(name, arch):
    _need_compiler()
    fn = compiled(name)
    binary = fn.check_cuda(arch)
    for k in fn.kernels:
        res = binary.resources[k.function]  # structurally identical kernels share it
        assert res.registers > 0
        assert res.spill_stores == 0


def test_resources_exposed_on_kernels():
    _need_compiler()
    fn = compiled("softmax")
    for k, kp in zip(fn.kernels, fn.plan.kernel_plans, strict=True):
        assert k.registers is not None and k.registers > 0
        tensors = sum(p.smem_floats for p in kp.placements.values()) * 4
        scratch = 4 * k.block[0] if f"pf_scratch[{k.block[0]}]" in k.source else 0
        assert k.static_shared_bytes == tensors + scratch
        assert "__global__" in k.source and k.function in fn.cuda_source
    assert all(k.grid[0] >= 1 and k.block[0] >= 1 for k in fn.kernels)
