"""float16 and bfloat16 in the CPU emulator: the CUDA headers' types, conversions and operators.

The emulator must lose the same bits as the device: every conversion rounds to nearest even
(ties, subnormals, overflow to infinity, NaN), each operator rounds its exact result once to
the 16-bit type. The references are numpy's float16 (its float64 → float16 conversion is a
single correct rounding) and ml_dtypes' bfloat16. The same source compiles with NVRTC against
NVIDIA's ``cuda_fp16.h``/``cuda_bf16.h`` where they are installed.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import CallError, CudaCompileError

BF16 = ml_dtypes.bfloat16

SOURCE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>

extern "C" __global__ void convert(const float* __restrict__ x, __half* __restrict__ h,
                                   __nv_bfloat16* __restrict__ b, float* __restrict__ h_back,
                                   float* __restrict__ b_back, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    const __half v = __float2half_rn(x[i]);
    const __nv_bfloat16 w = __float2bfloat16_rn(x[i]);
    h[i] = v;
    b[i] = w;
    h_back[i] = __half2float(v);
    b_back[i] = __bfloat162float(w);
  }
}

extern "C" __global__ void half_ops(const __half* __restrict__ a, const __half* __restrict__ b,
                                    const __half* __restrict__ c, __half* __restrict__ add,
                                    __half* __restrict__ mul, __half* __restrict__ quo,
                                    __half* __restrict__ fma, __half* __restrict__ pair, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    add[i] = a[i] + b[i];
    mul[i] = a[i] * b[i];
    quo[i] = __hdiv(a[i], b[i]);
    fma[i] = __hfma(a[i], b[i], c[i]);
    const __half2 s = __hadd2(__halves2half2(a[i], b[i]), __halves2half2(c[i], c[i]));
    pair[i] = __hmul(__low2half(s), __high2half(s));
  }
}

extern "C" __global__ void bf16_ops(const __nv_bfloat16* __restrict__ a,
                                    const __nv_bfloat16* __restrict__ b,
                                    const __nv_bfloat16* __restrict__ c,
                                    __nv_bfloat16* __restrict__ add,
                                    __nv_bfloat16* __restrict__ mul,
                                    __nv_bfloat16* __restrict__ fma, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    add[i] = a[i] + b[i];
    mul[i] = a[i] * b[i];
    fma[i] = __hfma(a[i], b[i], c[i]);
  }
}
"""


def _hard_floats() -> np.ndarray:
    """float32 values where rounding to 16 bits is easy to get wrong."""
    h_ulp1 = np.float32(1 + 2.0**-10)  # float16 neighbours of 1: ties at 1 + 2^-11
    special = [
        0.0, -0.0, 1.0, -1.0, 1 + 2.0**-11, 1 + 3 * 2.0**-11, float(h_ulp1),
        65504.0, 65519.0, 65520.0, 65536.0, -65520.0, 1e30, -1e30,
        2.0**-14, 2.0**-24, 2.0**-25, 3 * 2.0**-26, 2.0**-26, 1.5 * 2.0**-24, 2.5 * 2.0**-24,
        6.1e-5, -3e-8, np.inf, -np.inf, np.nan,
        1 + 2.0**-8, 1 + 3 * 2.0**-8, 3.0e38, -3.4e38, 1.0e-40, 2.0**-126,
    ]  # fmt: skip
    rng = np.random.default_rng(7)
    wide = rng.standard_normal(2000) * np.exp2(rng.integers(-30, 20, 2000))
    bits = rng.integers(0, 2**32, 2000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        return np.concatenate([np.array(special, np.float64), wide, bits]).astype(np.float32)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "racecheck"])
def module(request):
    return Emulator().load(SOURCE, racecheck=request.param)


def _run(module, name: str, bufs: dict[str, np.ndarray], args: list, n: int) -> None:
    grid = (-(-n // 128), 1, 1)
    module.run([Launch(name, grid, (128, 1, 1), (*args, ScalarArg(n)))], bufs)


def _same_bits(got: np.ndarray, want: np.ndarray) -> None:
    """Equal 16-bit patterns, any NaN matching any NaN."""
    g, w = got.astype(np.float32), want.astype(np.float32)
    nan = np.isnan(w)
    np.testing.assert_array_equal(np.isnan(g), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])


def test_conversions_round_to_nearest_even(module):
    x = _hard_floats()
    n = x.size
    bufs = {
        "x": x,
        "h": np.zeros(n, np.float16),
        "b": np.zeros(n, BF16),
        "hb": np.zeros(n, np.float32),
        "bb": np.zeros(n, np.float32),
    }
    _run(module, "convert", bufs, ["x", "h", "b", "hb", "bb"], n)
    with np.errstate(over="ignore"):  # overflow to infinity is the point
        h16, b16 = x.astype(np.float16), x.astype(BF16)
    _same_bits(bufs["h"], h16)
    _same_bits(bufs["b"], b16)
    np.testing.assert_array_equal(bufs["hb"], h16.astype(np.float32))
    np.testing.assert_array_equal(bufs["bb"], b16.astype(np.float32))
    # the cases the reference agrees on by construction are the ones that matter:
    assert bufs["h"][4] == np.float16(1.0)  # 1 + 2^-11: a tie, to even
    assert bufs["h"][5] == np.float16(1 + 2.0**-9)  # 1 + 3 * 2^-11: a tie, to even (up)
    assert np.isinf(bufs["h"][9]) and bufs["h"][8] == np.float16(65504)  # 65520 overflows
    assert bufs["h"][16] == 0 and bufs["h"][19] == np.float16(2.0**-23)  # subnormal ties


def test_half_operators_round_once(module):
    rng = np.random.default_rng(3)
    n = 4096
    a = (rng.standard_normal(n) * 8).astype(np.float16)
    b = (rng.standard_normal(n) * 8).astype(np.float16)
    c = (rng.standard_normal(n) * 8).astype(np.float16)
    a[:4], b[:4] = [60000, 1e-7, 2048, 1], [60000, 1e-7, 1, 2.0**-11]  # overflow, underflow
    out = {k: np.zeros(n, np.float16) for k in ("add", "mul", "quo", "fma", "pair")}
    bufs = {"a": a, "b": b, "c": c, **out}
    _run(module, "half_ops", bufs, ["a", "b", "c", *out], n)
    f64 = [v.astype(np.float64) for v in (a, b, c)]
    with np.errstate(all="ignore"):
        _same_bits(bufs["add"], (f64[0] + f64[1]).astype(np.float16))
        _same_bits(bufs["mul"], (f64[0] * f64[1]).astype(np.float16))
        _same_bits(bufs["quo"], (f64[0] / f64[1]).astype(np.float16))
        _same_bits(bufs["fma"], (f64[0] * f64[1] + f64[2]).astype(np.float16))
        s_lo, s_hi = (a + c), (b + c)  # numpy's float16 + rounds once as well
        _same_bits(bufs["pair"], (s_lo.astype(np.float64) * s_hi).astype(np.float16))
    assert np.isinf(bufs["mul"][0]) and bufs["mul"][1] == 0


def test_bfloat16_operators_round_once(module):
    rng = np.random.default_rng(4)
    n = 4096
    a, b, c = ((rng.standard_normal(n) * 100).astype(BF16) for _ in range(3))
    out = {k: np.zeros(n, BF16) for k in ("add", "mul", "fma")}
    bufs = {"a": a, "b": b, "c": c, **out}
    _run(module, "bf16_ops", bufs, ["a", "b", "c", *out], n)
    f64 = [v.astype(np.float64) for v in (a, b, c)]
    # a*b+c of these magnitudes is exact in float64, so one conversion rounds it once
    _same_bits(bufs["add"], (f64[0] + f64[1]).astype(np.float32).astype(BF16))
    _same_bits(bufs["mul"], (f64[0] * f64[1]).astype(np.float32).astype(BF16))
    exact = f64[0] * f64[1] + f64[2]
    want = exact.astype(BF16)
    _same_bits(bufs["fma"], want)
    # a sum in bfloat16 loses what float32 keeps: the emulator loses it too
    assert np.any(bufs["add"].astype(np.float64) != f64[0] + f64[1])


def test_a_bfloat16_buffer_is_not_a_half_buffer(module):
    n = 8
    bufs = {k: np.zeros(n, np.float16) for k in ("a", "b", "c", "add", "mul", "fma")}
    with pytest.raises(CallError, match="dtype float16"):
        _run(module, "bf16_ops", bufs, ["a", "b", "c", "add", "mul", "fma"], n)


def test_mixed_half_and_float_is_ambiguous_as_in_cuda():
    """``h + 1.0f`` does not compile with NVIDIA's headers (two conversions compete); the
    emulator refuses it too, so code that only the emulator accepts cannot slip through."""
    src = (
        "#include <cuda_fp16.h>\n"
        'extern "C" __global__ void k(__half* h) { __half a = h[0]; float f = a + 1.0f; }\n'
    )
    with pytest.raises(Exception, match="ambiguous"):
        Emulator().load(src)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_the_same_source(arch):
    try:
        binary = compile_cuda(SOURCE, arch, compiler="nvrtc")
    except CudaCompileError as e:  # the headers come with nvidia-cuda-runtime
        if "cuda_fp16.h" in str(e) or "cuda_bf16.h" in str(e):
            pytest.skip("cuda_fp16.h/cuda_bf16.h not installed (pip nvidia-cuda-runtime)")
        raise
    assert {"convert", "half_ops", "bf16_ops"} <= set(binary.resources)
    assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
