"""Tests of polyfuse.cuda.toolchain.compiler: NVRTC/nvcc compiles, the ptxas report, errors, the
cache.

Real compiles run with every compiler found here (NVRTC from the pip wheel, nvcc when a toolkit
is installed); an absent compiler is skipped, but in CI (``CI=true``) at least one must exist.
"""

from __future__ import annotations

import os
import time

import pytest

from polyfuse.cuda.toolchain import compiler as cc
from polyfuse.cuda.toolchain import toolkit
from polyfuse.cuda.toolchain.compiler import (
    COMPILERS,
    SUPPORTED_ARCHS,
    CudaBinary,
    KernelResources,
    available_compilers,
    compile_cuda,
    parse_ptxas_report,
)
from polyfuse.errors import CompilerNotFound, CudaCompileError

IN_CI = os.environ.get("CI", "").lower() == "true"

# Three kernels in one translation unit, with distinct static shared-memory sizes.
SMEM_REDUCE_BYTES = 256 * 4
CP_ASYNC_BYTES = 2 * 64 * 4
SOURCE = r"""
#include <cuda_pipeline.h>

extern "C" __global__ void smem_reduce(const float* __restrict__ x, float* __restrict__ y, int n)
{
    __shared__ float tile[256];
    int i = blockIdx.x * 256 + threadIdx.x;
    tile[threadIdx.x] = i < n ? x[i] : 0.0f;
    __syncthreads();
    for (int s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) tile[threadIdx.x] += tile[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) y[blockIdx.x] = tile[0];
}

extern "C" __global__ void warp_reduce(const float* __restrict__ x, float* __restrict__ y, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    float v = i < n ? x[i] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0) y[i >> 5] = v;
}

extern "C" __global__ void cp_async_reverse(const float* __restrict__ x, float* __restrict__ y)
{
    __shared__ __align__(16) float stage[2][64];
    int base = blockIdx.x * 128;
    int t = threadIdx.x;
    __pipeline_memcpy_async(&stage[t / 64][t % 64], &x[base + t], sizeof(float));
    __pipeline_commit();
    __pipeline_wait_prior(0);
    __syncthreads();
    int r = 127 - t;
    y[base + t] = stage[r / 64][r % 64];
}
"""

# Needs more registers than -maxrregcount=24 allows: ptxas spills.
SPILL_SOURCE = r"""
extern "C" __global__ void spiller(const float* __restrict__ x, float* __restrict__ y)
{
    float acc[48];
    #pragma unroll
    for (int k = 0; k < 48; ++k) acc[k] = x[threadIdx.x + k * 32];
    #pragma unroll
    for (int r = 0; r < 4; ++r)
        #pragma unroll
        for (int k = 0; k < 48; ++k) acc[k] = acc[k] * acc[(k + r + 1) % 48] + 1.0f;
    float s = 0.0f;
    #pragma unroll
    for (int k = 0; k < 48; ++k) s += acc[k] * (k + 1);
    y[threadIdx.x] = s;
}
"""

BROKEN_SOURCE = """extern "C" __global__ void fine(float* y) { y[0] = 1.0f; }

extern "C" __global__ void broken(float* y)
{
    int i = threadIdx.x
    y[i] = 2.0f;
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Every test gets its own empty compile cache."""
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "cuda"


def require(compiler: str) -> None:
    """Skip when ``compiler`` is absent; in CI, fail if no compiler at all is available."""
    avail = available_compilers()
    if IN_CI and not avail:
        pytest.fail(f"CI=true but no CUDA compiler is available: {cc._INSTALL_HINT}")
    if compiler not in avail:
        pytest.skip(f"{compiler} is not installed here")


def test_some_compiler_available_in_ci():
    avail = available_compilers()
    assert set(avail) <= set(COMPILERS)
    assert avail == [c for c in COMPILERS if c in avail], "preference order"
    if IN_CI:
        assert avail, f"CI=true but no CUDA compiler is available: {cc._INSTALL_HINT}"
    elif not avail:
        pytest.skip("no CUDA compiler here")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("compiler", COMPILERS)
def test_compile_three_kernels_and_parse_resources(compiler, arch):
    require(compiler)
    binary = compile_cuda(SOURCE, arch, compiler=compiler)
    assert isinstance(binary, CudaBinary)
    assert (binary.arch, binary.compiler, binary.output) == (arch, compiler, "cubin")
    assert binary.image[:4] == b"\x7fELF", "a cubin is an ELF image"
    assert not binary.cached and binary.seconds > 0
    assert set(binary.resources) == {"smem_reduce", "warp_reduce", "cp_async_reverse"}
    for name, res in binary.resources.items():
        assert res.kernel == name
        assert res.registers > 0
        assert res.spill_stores == 0 and res.spill_loads == 0
    r = binary.resources
    assert r["smem_reduce"].shared_bytes == SMEM_REDUCE_BYTES
    assert r["cp_async_reverse"].shared_bytes == CP_ASYNC_BYTES
    assert r["warp_reduce"].shared_bytes == 0
    assert r["smem_reduce"].barriers >= 1 and r["cp_async_reverse"].barriers >= 1
    assert r["warp_reduce"].barriers == 0
    assert "Compiling entry function 'smem_reduce'" in binary.log


@pytest.mark.parametrize("compiler", COMPILERS)
def test_spills_are_parsed(compiler):
    require(compiler)
    binary = compile_cuda(SPILL_SOURCE, "sm_80", compiler=compiler, options=("-maxrregcount=24",))
    res = binary.resources["spiller"]
    assert res.registers <= 24
    assert res.spill_stores > 0 and res.spill_loads > 0
    assert res.stack_frame > 0
    # Without the register cap the same kernel does not spill.
    free = compile_cuda(SPILL_SOURCE, "sm_80", compiler=compiler).resources["spiller"]
    assert free.spill_stores == 0 and free.registers > 24


@pytest.mark.parametrize("compiler", COMPILERS)
def test_ptx_output(compiler):
    require(compiler)
    binary = compile_cuda(SOURCE, "sm_80", compiler=compiler, output="ptx")
    assert binary.output == "ptx" and binary.resources == {}
    assert binary.ptx is not None and ".entry smem_reduce" in binary.ptx
    assert binary.image.endswith(b"\0") and binary.image[:-1].decode() == binary.ptx


def test_nvrtc_cubin_also_carries_ptx():
    require("nvrtc")
    binary = compile_cuda(SOURCE, "sm_80", compiler="nvrtc")
    assert binary.ptx is not None and ".entry warp_reduce" in binary.ptx


@pytest.mark.parametrize("compiler", COMPILERS)
def test_syntax_error_gives_one_line_message(compiler):
    require(compiler)
    with pytest.raises(CudaCompileError) as info:
        compile_cuda(BROKEN_SOURCE, "sm_80", compiler=compiler)
    err = info.value
    msg = str(err)
    assert "\n" not in msg
    assert "error" in msg and "broken" in msg and compiler in msg and "sm_80" in msg
    assert err.kernel == "broken"
    assert err.log.count("\n") > 1 and "error" in err.log


def test_error_summary_names_kernel_from_ptxas_error():
    log = (
        "ptxas error   : Entry function 'big' uses too much shared data "
        "(0x10000 bytes, 0xc000 max)\n"
    )
    msg, kernel = cc._error_summary(log, "", "nvrtc", "sm_80")
    assert kernel == "big" and "too much shared data" in msg and "\n" not in msg


def test_missing_header_hint():
    require("nvrtc")
    with pytest.raises(CudaCompileError, match="cannot open source file"):
        compile_cuda('#include "no_such_header.h"\n', "sm_80", compiler="nvrtc")


def test_no_compiler_gives_install_hint(monkeypatch):
    monkeypatch.setattr(toolkit, "nvrtc_search_paths", lambda: [])
    monkeypatch.setattr(toolkit, "nvcc_search_paths", lambda: [])
    assert available_compilers() == []
    with pytest.raises(CompilerNotFound) as info:
        compile_cuda(SOURCE, "sm_80")
    msg = str(info.value)
    assert "pip install 'polyfuse[nvrtc]'" in msg and "nvcc on PATH" in msg
    assert "\n" not in msg
    with pytest.raises(CompilerNotFound, match=r"'nvcc' was requested.*PATH"):
        compile_cuda(SOURCE, "sm_80", compiler="nvcc")
    with pytest.raises(CompilerNotFound, match=r"pip install 'polyfuse\[nvrtc\]'"):
        compile_cuda(SOURCE, "sm_80", compiler="nvrtc")


def test_unloadable_library_is_skipped(monkeypatch, tmp_path):
    bogus = tmp_path / "libnvrtc.so.13"
    bogus.write_bytes(b"not a shared library")
    monkeypatch.setattr(toolkit, "nvrtc_search_paths", lambda: [str(bogus), "/nonexistent/x.so"])
    monkeypatch.setattr(toolkit, "nvcc_search_paths", lambda: [str(tmp_path / "nvcc")])
    assert available_compilers() == []


def test_search_paths_find_the_pip_wheel():
    require("nvrtc")
    paths = toolkit.nvrtc_search_paths()
    lib = toolkit.find_nvrtc()
    assert lib is not None and lib.path in paths
    assert lib.major >= 11
    if "site-packages" in lib.path:  # the pip wheel also ships the headers we pass with -I
        assert lib.include_dirs, "nvidia-cuda-runtime headers not found"


def test_unknown_arch_and_compiler():
    with pytest.raises(ValueError, match="bad CUDA arch"):
        compile_cuda(SOURCE, "ampere")
    with pytest.raises(ValueError, match="unknown CUDA compiler"):
        compile_cuda(SOURCE, "sm_80", compiler="clang")
    with pytest.raises(ValueError, match="output"):
        compile_cuda(SOURCE, "sm_80", output="fatbin")


def test_arch_the_compilers_do_not_support():
    avail = available_compilers()
    if not avail:
        pytest.skip("no CUDA compiler here")
    try:
        compile_cuda(SOURCE, "sm_70")
    except CompilerNotFound as e:  # CUDA 13 dropped Volta
        assert "sm_70" in str(e) and "cu12" in str(e)
    else:
        pass  # a CUDA 12 compiler supports it
    assert set(SUPPORTED_ARCHS) >= {"sm_80", "sm_90"}


def test_cache_hit_is_fast_and_identical(private_cache):
    compiler = (available_compilers() or [None])[0]
    if compiler is None:
        require("nvrtc")
    cold = compile_cuda(SOURCE, "sm_80", compiler=compiler)
    assert not cold.cached
    assert len(list(private_cache.glob("*.bin"))) == 1
    t = time.perf_counter()
    warm = compile_cuda(SOURCE, "sm_80", compiler=compiler)
    elapsed = time.perf_counter() - t
    assert warm.cached and warm.image == cold.image and warm.ptx == cold.ptx
    assert warm.resources == cold.resources and warm.log == cold.log
    assert elapsed < 0.1 and elapsed < cold.seconds
    # Other arch / options / output are other entries.
    assert not compile_cuda(SOURCE, "sm_90", compiler=compiler).cached
    assert not compile_cuda(SOURCE, "sm_80", compiler=compiler, options=("-lineinfo",)).cached
    assert not compile_cuda(SOURCE, "sm_80", compiler=compiler, cache=False).cached
    # A damaged entry is recompiled, not trusted.
    for f in private_cache.glob("*.bin"):
        f.write_bytes(b"garbage")
    again = compile_cuda(SOURCE, "sm_80", compiler=compiler)
    assert not again.cached and again.image == cold.image
    # So is damaged metadata (an empty dict, a truncated file), and the entry is healed.
    for bad in (b"{}", b""):
        for f in private_cache.glob("*.json"):
            f.write_bytes(bad)
        again = compile_cuda(SOURCE, "sm_80", compiler=compiler)
        assert not again.cached and again.image == cold.image
        assert compile_cuda(SOURCE, "sm_80", compiler=compiler).cached


def test_cache_can_be_disabled(monkeypatch, tmp_path):
    monkeypatch.setenv("POLYFUSE_CACHE", "off")
    assert cc.cache_dir() is None
    monkeypatch.setenv("POLYFUSE_CACHE", str(tmp_path))
    assert cc.cache_dir() == tmp_path / "cuda"
    monkeypatch.delenv("POLYFUSE_CACHE")
    assert str(cc.cache_dir()).endswith(os.path.join(".cache", "polyfuse", "cuda"))


# ---- the ptxas report parser on canned logs -------------------------------------------------

NVRTC_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for helper_fn
ptxas         .     16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Compiling entry function 'k1' for 'sm_80'
ptxas info    : Function properties for k1
ptxas         .     480 bytes stack frame, 800 bytes spill stores, 824 bytes spill loads
ptxas info    : Used 24 registers, used 1 barriers, 4096 bytes smem, 372 bytes cmem[0], \
8 bytes cmem[2]
ptxas info    : Compile time = 3.694 ms
ptxas info    : Compiling entry function '_Z2k2Pf' for 'sm_90'
ptxas info    : Function properties for _Z2k2Pf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers
"""


def test_parse_ptxas_report():
    r = parse_ptxas_report(NVRTC_LOG)
    assert list(r) == ["k1", "_Z2k2Pf"]
    assert r["k1"] == KernelResources(
        kernel="k1",
        registers=24,
        shared_bytes=4096,
        spill_stores=800,
        spill_loads=824,
        barriers=1,
        stack_frame=480,
        cmem=380,
    )
    assert r["_Z2k2Pf"] == KernelResources(kernel="_Z2k2Pf", registers=10)
    assert "helper_fn" not in r
    assert parse_ptxas_report("") == {}
    assert "24 regs" in str(r["k1"])


def test_fallback_to_nvcc_when_nvrtc_is_missing(monkeypatch):
    require("nvcc")
    monkeypatch.setattr(toolkit, "nvrtc_search_paths", lambda: [])
    assert available_compilers() == ["nvcc"]
    binary = compile_cuda(SOURCE, "sm_80")
    assert binary.compiler == "nvcc" and binary.resources["smem_reduce"].registers > 0


def test_nvrtc_preferred_when_both_exist():
    require("nvrtc")
    require("nvcc")
    assert compile_cuda(SOURCE, "sm_80").compiler == "nvrtc"
