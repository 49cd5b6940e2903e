"""Tensor-core instructions in the CPU emulator: mma.sync and ldmatrix with the PTX ISA's
per-lane fragment layouts (issue 23 item 3).

Three independent descriptions of the layouts must agree: the CUDA test kernels below (which
pack fragments by hand, as the PTX ISA's figures say), the emulator's definitions
(``emulator/rt/pf_mma.h``) and the layout tables of :mod:`polyfuse.cuda.codegen.tensor_core` that a
tensorization pass will use. Products are checked against float64 numpy; the kernels also
compile with NVRTC for sm_80 and sm_90 through the prelude's inline PTX.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from polyfuse.cuda.codegen.tensor_core import (
    MMA_BF16,
    MMA_F16,
    MMA_INT8,
    MMA_TF32,
    PRELUDE,
    ldmatrix_layout,
)
from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.cuda.toolchain.sass.tools import find_disassembler
from polyfuse.errors import CompilerNotFound, EmulatorError

BF16 = ml_dtypes.bfloat16

HEAD = "#include <cuda_fp16.h>\n#include <cuda_bf16.h>\n" + PRELUDE

# One warp per 16x8 tile of D = A @ B (A M x K, B K x N, row-major): fragments packed from
# global memory by the PTX ISA's layout, then one mma per 16-deep k step.
_DIRECT = r"""
extern "C" __global__ void NAME(const T* __restrict__ A, const T* __restrict__ B,
                                float* __restrict__ D, int N, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int m0 = (tile / (N / 8)) * 16, n0 = (tile % (N / 8)) * 8;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    unsigned a[4], b[2];
    for (int r = 0; r < 4; ++r) {
      const int row = m0 + g + 8 * (r & 1), col = k0 + 2 * t + 8 * (r >> 1);
      a[r] = (unsigned)BITS(A[row * K + col]) | ((unsigned)BITS(A[row * K + col + 1]) << 16);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = k0 + 2 * t + 8 * r;
      b[r] = (unsigned)BITS(B[k * N + n0 + g]) | ((unsigned)BITS(B[(k + 1) * N + n0 + g]) << 16);
    }
    MMA(acc, a, b, acc);
  }
  for (int i = 0; i < 4; ++i) D[(m0 + g + 8 * (i >> 1)) * N + n0 + 2 * t + (i & 1)] = acc[i];
}
"""


def _direct(name: str, ctype: str, bits: str, mma: str) -> str:
    text = _DIRECT
    for key, value in (("NAME", name), ("BITS", bits), ("MMA", mma), ("T*", f"{ctype}*")):
        text = text.replace(key, value)
    return text


DIRECT = (
    _direct("mma_bf16", "__nv_bfloat16", "__bfloat16_as_ushort", MMA_BF16.name)
    + _direct("mma_f16", "__half", "__half_as_ushort", MMA_F16.name)
    + r"""
// tf32: k steps of 8, one float per register, inputs rounded with cvt.rna.
extern "C" __global__ void mma_tf32(const float* __restrict__ A, const float* __restrict__ B,
                                    float* __restrict__ D, int N, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int m0 = (tile / (N / 8)) * 16, n0 = (tile % (N / 8)) * 8;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < K; k0 += 8) {
    unsigned a[4], b[2];
    for (int r = 0; r < 4; ++r)
      a[r] = pf_cvt_tf32(A[(m0 + g + 8 * (r & 1)) * K + k0 + t + 4 * (r >> 1)]);
    for (int r = 0; r < 2; ++r) b[r] = pf_cvt_tf32(B[(k0 + t + 4 * r) * N + n0 + g]);
    pf_mma_m16n8k8_f32_tf32(acc, a, b, acc);
  }
  for (int i = 0; i < 4; ++i) D[(m0 + g + 8 * (i >> 1)) * N + n0 + 2 * t + (i & 1)] = acc[i];
}

// The same product through shared memory: A's 16x16 tile by ldmatrix.x4, B's 16x8 tile
// (row-major, k by n) by ldmatrix.x2.trans. One warp per block.
extern "C" __global__ void mma_bf16_ldmatrix(const __nv_bfloat16* __restrict__ A,
                                             const __nv_bfloat16* __restrict__ B,
                                             float* __restrict__ D, int N, int K) {
  __shared__ __align__(16) __nv_bfloat16 sA[16 * 16];
  __shared__ __align__(16) __nv_bfloat16 sB[16 * 8];
  const int lane = threadIdx.x, g = lane >> 2, t = lane & 3;
  const int m0 = (blockIdx.x / (N / 8)) * 16, n0 = (blockIdx.x % (N / 8)) * 8;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int k0 = 0; k0 < K; k0 += 16) {
    for (int i = lane; i < 256; i += 32) sA[i] = A[(m0 + i / 16) * K + k0 + i % 16];
    for (int i = lane; i < 128; i += 32) sB[i] = B[(k0 + i / 8) * N + n0 + i % 8];
    __syncthreads();
    unsigned a[4], b[2];
    pf_ldmatrix_x4(a, &sA[(lane % 16) * 16 + (lane / 16) * 8]);
    pf_ldmatrix_x2_trans(b, &sB[(lane % 16) * 8]);
    pf_mma_m16n8k16_f32_bf16(acc, a, b, acc);
    __syncthreads();
  }
  for (int i = 0; i < 4; ++i) D[(m0 + g + 8 * (i >> 1)) * N + n0 + 2 * t + (i & 1)] = acc[i];
}

// Every lane's ldmatrix registers, for the layout tables: four 8x8 matrices of 16-bit
// elements numbered 0..255 in shared memory, lane 8i + r pointing at row r of matrix i.
extern "C" __global__ void dump(const unsigned short* __restrict__ src,
                                unsigned* __restrict__ out, int which) {
  __shared__ __align__(16) unsigned short s[256];
  for (int i = threadIdx.x; i < 256; i += 32) s[i] = src[i];
  __syncthreads();
  unsigned r[4] = {0u, 0u, 0u, 0u};
  const unsigned short* p = &s[(threadIdx.x / 8) * 64 + (threadIdx.x % 8) * 8];
  switch (which) {
    case 1: pf_ldmatrix_x1(r, p); break;
    case 2: pf_ldmatrix_x2(r, p); break;
    case 4: pf_ldmatrix_x4(r, p); break;
    case -1: pf_ldmatrix_x1_trans(r, p); break;
    case -2: pf_ldmatrix_x2_trans(r, p); break;
    default: pf_ldmatrix_x4_trans(r, p); break;
  }
  for (int i = 0; i < 4; ++i) out[threadIdx.x * 4 + i] = r[i];
}

// A warp where one lane has left: the mma is warp-collective and must say so.
extern "C" __global__ void mma_diverged(const unsigned* __restrict__ a, float* __restrict__ d) {
  if (threadIdx.x == 5) return;
  unsigned f[4] = {a[0], a[1], a[2], a[3]};
  float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  pf_mma_m16n8k16_f32_bf16(c, f, f, c);
  d[threadIdx.x] = c[0];
}
"""
)

# m16n8k32 on bytes: k steps of 32, four consecutive k of a row (A) or column (B) per register,
# the lowest k in the low byte (PTX ISA, "Matrix Fragments for mma.m16n8k32"); int32 sums.
_DIRECT_I8 = r"""
extern "C" __global__ void NAME(const TA* __restrict__ A, const TB* __restrict__ B,
                                int* __restrict__ D, int N, int K) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const int tile = blockIdx.x * (blockDim.x / 32) + (threadIdx.x >> 5);
  const int m0 = (tile / (N / 8)) * 16, n0 = (tile % (N / 8)) * 8;
  int acc[4] = {0, 0, 0, 0};
  for (int k0 = 0; k0 < K; k0 += 32) {
    unsigned a[4] = {0u, 0u, 0u, 0u}, b[2] = {0u, 0u};
    for (int r = 0; r < 4; ++r) {
      const int row = m0 + g + 8 * (r & 1), col = k0 + 4 * t + 16 * (r >> 1);
      for (int i = 0; i < 4; ++i)
        a[r] |= (unsigned)(unsigned char)A[row * K + col + i] << (8 * i);
    }
    for (int r = 0; r < 2; ++r) {
      const int k = k0 + 4 * t + 16 * r;
      for (int i = 0; i < 4; ++i)
        b[r] |= (unsigned)(unsigned char)B[(k + i) * N + n0 + g] << (8 * i);
    }
    MMA(acc, a, b, acc);
  }
  for (int i = 0; i < 4; ++i) D[(m0 + g + 8 * (i >> 1)) * N + n0 + 2 * t + (i & 1)] = acc[i];
}
"""
_C_BYTE = {"int8": "signed char", "uint8": "unsigned char"}


def _direct_i8(a: str, b: str) -> str:
    text = _DIRECT_I8.replace("NAME", f"mma_{a}_{b}").replace("MMA", MMA_INT8[a, b].name)
    return text.replace("TA*", f"{_C_BYTE[a]}*").replace("TB*", f"{_C_BYTE[b]}*")


SOURCE = HEAD + DIRECT + "".join(_direct_i8(a, b) for a, b in MMA_INT8)


@pytest.fixture(scope="module", params=[False, True], ids=["plain", "racecheck"])
def module(request):
    return Emulator().load(SOURCE, racecheck=request.param)


def _matmul(module, kernel: str, a: np.ndarray, b: np.ndarray, per_block: int,
            out=np.float32) -> np.ndarray:  # fmt: skip
    (m, k), n = a.shape, b.shape[1]
    d = np.zeros((m, n), out)
    tiles = (m // 16) * (n // 8)
    assert tiles % per_block == 0
    launch = Launch(
        kernel,
        (tiles // per_block, 1, 1),
        (32 * per_block, 1, 1),
        ("a", "b", "d", ScalarArg(n), ScalarArg(k)),
    )
    module.run([launch], {"a": a, "b": b, "d": d})
    return d


@pytest.mark.parametrize(
    ("kernel", "dtype", "per_block"),
    [("mma_bf16", BF16, 2), ("mma_f16", np.float16, 3), ("mma_bf16_ldmatrix", BF16, 1)],
)
def test_mma_m16n8k16_products_match_float64(module, kernel, dtype, per_block):
    rng = np.random.default_rng(11)
    m, n, k = 32, 24, 48
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    got = _matmul(module, kernel, a, b, per_block)
    want = a.astype(np.float64) @ b.astype(np.float64)  # products of 16-bit values are exact
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_mma_tf32_rounds_inputs_to_tf32(module):
    rng = np.random.default_rng(12)
    m, n, k = 16, 16, 32
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    got = _matmul(module, "mma_tf32", a, b, 2)

    def tf32(x: np.ndarray) -> np.ndarray:  # cvt.rna: 10 mantissa bits, ties away from 0
        u = x.view(np.uint32).astype(np.uint64)
        return ((u + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)

    want = tf32(a).astype(np.float64) @ tf32(b).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)
    full = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(got - full).max() > 1e-4  # tf32 is visibly coarser than float32


@pytest.mark.parametrize(("a_dtype", "b_dtype"), sorted(MMA_INT8))
def test_mma_m16n8k32_byte_products_sum_exactly_in_int32(module, a_dtype, b_dtype):
    """Every signedness pair of m16n8k32: the bytes as the PTX ISA lays them out, summed
    exactly (the extremes included: -128 * -128, 255 * 255)."""
    rng = np.random.default_rng(13)
    m, n, k = 32, 16, 96

    def draw(dtype, shape):
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
        x.flat[:3] = [info.min, info.max, info.min]
        return x

    a, b = draw(a_dtype, (m, k)), draw(b_dtype, (k, n))
    got = _matmul(module, f"mma_{a_dtype}_{b_dtype}", a, b, 2, np.int32)
    np.testing.assert_array_equal(got, a.astype(np.int64) @ b.astype(np.int64))


def test_the_layout_tables_pack_what_the_emulator_multiplies():
    """:mod:`polyfuse.cuda.codegen.tensor_core`'s per-lane tables rebuild every operand exactly
    once."""
    for mma in (MMA_BF16, MMA_F16, MMA_TF32, *MMA_INT8.values()):
        for layout, shape in (
            (mma.a_layout, (mma.m, mma.k)),
            (mma.b_layout, (mma.k, mma.n)),
            (mma.c_layout, (mma.m, mma.n)),
        ):
            seen = [rc for lane in range(32) for rc in layout(lane)]
            assert sorted(seen) == [(r, c) for r in range(shape[0]) for c in range(shape[1])]


@pytest.mark.parametrize("matrices", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix_gives_each_lane_the_tabled_elements(module, matrices, trans):
    src = np.arange(256, dtype=np.uint16)  # element (i, row, col) of the 8x8 matrices
    out = np.zeros(32 * 4, np.uint32)
    which = ScalarArg(-matrices if trans else matrices)
    launch = Launch("dump", (1, 1, 1), (32, 1, 1), ("src", "out", which))
    module.run([launch], {"src": src, "out": out})
    for lane in range(32):
        want = [i * 64 + r * 8 + c for i, r, c in ldmatrix_layout(lane, matrices, trans)]
        regs = out[lane * 4 : lane * 4 + matrices]
        got = [int(v) >> s & 0xFFFF for v in regs for s in (0, 16)]
        assert got == want, lane


def test_an_mma_without_the_whole_warp_is_reported(module):
    a = np.zeros(4, np.uint32)
    d = np.zeros(32, np.float32)
    launch = Launch("mma_diverged", (1, 1, 1), (32, 1, 1), ("a", "d"))
    with pytest.raises(EmulatorError, match="needs all 32 lanes"):
        module.run([launch], {"a": a, "d": d})


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_the_inline_ptx(arch):
    binary = compile_cuda(SOURCE, arch, compiler="nvrtc")
    assert {"mma_bf16", "mma_f16", "mma_tf32", "mma_bf16_ldmatrix"} <= set(binary.resources)
    assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    try:
        sass = find_disassembler().disassemble(binary.image)
    except CompilerNotFound:
        return  # the SASS check needs NVIDIA's disassembler (pip install polyfuse[sass])
    assert "HMMA.16816.F32.BF16" in sass and "HMMA.1688.F32.TF32" in sass
    assert "IMMA.16832.U8.S8" in sass and "IMMA.16832.S8.S8" in sass
    assert "LDSM.16.M88.4" in sass and "LDSM.16.MT88.2" in sass
