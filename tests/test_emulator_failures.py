"""Tests of polyfuse.cuda.emulator (continued from test_emulator.py): failure modes raise
EmulatorError while this process survives; traffic counts, the compile cache and the CUDA
dialect the emulator accepts.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from test_emulator import GENERATED, NEIGHBOUR, rand

from polyfuse.cuda.emulator import Emulator, prepass
from polyfuse.cuda.runtime.launch import Launch, ScalarArg
from polyfuse.errors import EmulatorError

FAILURES = r"""
extern "C" __global__ void divergent(float* __restrict__ y) {
  if (threadIdx.x < 16) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void early_exit(float* __restrict__ y) {
  if (threadIdx.x >= 16) return;
  __syncthreads();
  y[threadIdx.x] = 1.0f;
}
extern "C" __global__ void shuffle_deadlock(float* __restrict__ y) {
  float v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_sync(0xffffffffu, v, 0);
  else __syncthreads();
  y[threadIdx.x] = v;
}
extern "C" __global__ void off_by_one(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i + 1];
}
extern "C" __global__ void wild_pointer(float* __restrict__ y) {
  float* p = (float*)(16 + 0 * threadIdx.x);
  p[threadIdx.x] = y[threadIdx.x];
}
extern "C" __global__ void spin(int* __restrict__ flag) {
  while (atomicAdd(&flag[0], 0) == 0) {}
}
extern "C" __global__ void big_frame(float* __restrict__ y, int n) {
  volatile float local[100000];
  for (int i = 0; i < n; ++i) local[i] = i;
  y[0] = local[n - 1];
}
"""


@pytest.fixture(scope="module")
def emu(tmp_path_factory) -> Emulator:
    return Emulator(cache_dir=tmp_path_factory.mktemp("emucache"), workers=2)


@pytest.mark.parametrize(
    "kernel, args, pattern",
    [
        (
            "divergent",
            ("y",),
            r"kernel divergent: divergent __syncthreads in block \(0,0,0\).*line",
        ),
        ("early_exit", ("y",), r"kernel early_exit: divergent __syncthreads.*exited"),
        (
            "shuffle_deadlock",
            ("y",),
            r"kernel shuffle_deadlock: deadlock .*__shfl_sync.*__syncthreads",
        ),
        (
            "off_by_one",
            ("x", "y", ScalarArg(64)),
            r"kernel off_by_one: out-of-bounds read of buffer 'x' at index 64 \(it has 64 "
            r"elements\) in thread \(31,0,0\) of block \(1,0,0\)",
        ),
        ("wild_pointer", ("y",), r"kernel wild_pointer: segmentation fault"),
        ("big_frame", ("y", ScalarArg(100000)), r"kernel big_frame: stack overflow"),
    ],
)
def test_failures_raise_and_caller_survives(emu, kernel, args, pattern):
    mod = emu.load(FAILURES)
    x, y = rand(64), np.zeros(64, np.float32)
    before = y.copy()
    block = 32
    grid = 2 if kernel == "off_by_one" else 1
    with pytest.raises(EmulatorError, match=pattern) as info:
        mod.run([Launch(kernel, (grid, 1, 1), (block, 1, 1), args)], {"x": x, "y": y})
    assert "\n" not in str(info.value)
    np.testing.assert_array_equal(y, before)  # buffers untouched on failure
    assert os.getpid() > 0  # still here


def test_shared_region_grows_while_a_failure_is_held(emu):
    mod = emu.load(GENERATED)
    with pytest.raises(EmulatorError) as info:  # keeps the failing frame (and its views) alive
        mod.run(
            [
                Launch(
                    "axpy",
                    (1, 1, 1),
                    (64, 1, 1),
                    ("y", "x", ScalarArg(1.0, "float"), ScalarArg(64)),
                )
            ],
            {"y": np.zeros(8, np.float32), "x": np.zeros(8, np.float32)},
        )
    assert "out-of-bounds" in str(info.value)
    n = 3 << 20  # needs a larger shared region than any test before
    x, y = rand(n), np.ones(n, np.float32)
    launch = Launch(
        "axpy", (n // 256, 1, 1), (256, 1, 1), ("y", "x", ScalarArg(2.0, "float"), ScalarArg(n))
    )
    mod.run([launch], {"y": y, "x": x})
    np.testing.assert_allclose(y, 2 * x + 1, rtol=1e-6)


def test_hung_kernel_times_out(emu):
    mod = emu.load(FAILURES)
    flag = np.zeros(1, np.int32)
    t0 = time.monotonic()
    with pytest.raises(EmulatorError, match="kernel spin: timed out"):
        mod.run([Launch("spin", (1, 1, 1), (1, 1, 1), ("f",))], {"f": flag}, timeout=0.5)
    assert time.monotonic() - t0 < 5


# --------------------------------------------------------------------------------------------
# Traffic and cache
# --------------------------------------------------------------------------------------------

TRAFFIC = r"""
extern "C" __global__ void square_plus(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * x[i] + x[i];
}
extern "C" __global__ void evens(const float* __restrict__ x, float* __restrict__ y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n / 2) y[i] = x[2 * i];
}
extern "C" __global__ void accumulate(float* __restrict__ y, const float* __restrict__ x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { y[i] += x[i]; y[i] *= 2.0f; }
}
"""


def test_traffic_counts_unique_elements(emu):
    mod = emu.load(TRAFFIC)
    n = 1000
    x, y, z = rand(n), np.zeros(n, np.float32), np.zeros(n, np.float32)
    grid = (4, 1, 1)
    launches = [
        Launch("square_plus", grid, (256, 1, 1), ("x", "y", ScalarArg(n))),
        Launch("evens", grid, (256, 1, 1), ("y", "z", ScalarArg(n))),
        Launch("accumulate", grid, (256, 1, 1), ("z", "x", ScalarArg(n // 4))),
    ]
    t1, t2, t3 = mod.run(launches, {"x": x, "y": y, "z": z})
    assert (t1.reads, t1.writes) == ({"x": 4 * n, "y": 0}, {"x": 0, "y": 4 * n})
    assert (t2.reads, t2.writes) == ({"y": 2 * n, "z": 0}, {"y": 0, "z": 2 * n})
    assert (t3.reads, t3.writes) == ({"z": n, "x": n}, {"z": n, "x": 0})
    assert t1.bytes_total == 8 * n and t3.bytes_total == 3 * n
    zz = (x * x + x)[::2]
    zz[: n // 4] = 2 * (zz[: n // 4] + x[: n // 4])
    np.testing.assert_allclose(z[: n // 2], zz, rtol=1e-6)


def test_cache_second_load_does_not_recompile(emu):
    src = TRAFFIC + f"\n// cache probe {time.time_ns()}\n"
    first = emu.load(src)
    assert not first.from_cache
    assert emu.load(src) is first  # in-process: the same module object
    t0 = time.perf_counter()
    second = Emulator(cache_dir=emu.cache_dir, workers=1).load(src)  # a fresh emulator
    assert second.from_cache and time.perf_counter() - t0 < 0.5
    assert second.path == first.path
    x, y = rand(8), np.zeros(8, np.float32)
    second.run(
        [Launch("square_plus", (1, 1, 1), (8, 1, 1), ("x", "y", ScalarArg(8)))], {"x": x, "y": y}
    )
    np.testing.assert_allclose(y, x * x + x, rtol=1e-6)


DIALECT = r"""
#include <cuda_runtime.h>
#include <cuda_pipeline_primitives.h>
#define KERNEL extern "C" __global__
#define N 64
/* __shared__ in a comment; "and __global__ in a string" */
__shared__ float file_scope_tile[N];
__constant__ float kScale[2] = {2.0f, 3.0f};

extern "C" __device__ float load_sum(const float* __restrict__ p, int n) {
  float s = 0.0f;
  for (int i = 0; i < n; ++i) s += __ldg(p + i);
  return s;
}
__device__ __forceinline__ void store_pair(float* out, int i, float a, float b) {
  out[2 * i] = a;
  out[2 * i + 1] = b;
}

KERNEL void __launch_bounds__(64, 2) dialect(const float* __restrict__ x, float* __restrict__ y,
                                             float4* __restrict__ v, long long n) {
  __shared__ float a[N], b[N];
  __shared__ __align__(16) int counter;
  int t = threadIdx.x;
  if (t == 0) counter = 0;
  const float* row = x + t * 4;
  a[t] = load_sum(row, 4);
  b[t] = a[t] * kScale[0];
  file_scope_tile[t] = b[t];
  __syncthreads();
  atomicAdd(&counter, 1);
  float4 q = reinterpret_cast<const float4*>(x)[t];
  v[t] = make_float4(q.w, q.z, q.y, q.x);
  __syncthreads();
  float& out = y[t];
  out = file_scope_tile[(t + 1) % N] + (float)counter + (float)n;
  store_pair(y + N, t, a[t], (float)counter);
  if (t == 0) y[3 * N] = sizeof(x[0]) + sizeof(*v) + sizeof *x + sizeof(a[0]);
}
"""


def test_dialect_constructs(emu):
    mod = emu.load(DIALECT)
    x = rand(64 * 4)
    y = np.zeros(3 * 64 + 1, np.float32)
    v = np.zeros((64, 4), np.float32)
    args = ("x", "y", "v", ScalarArg(5, "long long"))
    (t,) = mod.run([Launch("dialect", (1, 1, 1), (64, 1, 1), args)], {"x": x, "y": y, "v": v})
    sums = x.reshape(64, 4).sum(axis=1)
    np.testing.assert_allclose(y[:64], 2 * np.roll(sums, -1) + 64 + 5, rtol=1e-5)
    np.testing.assert_allclose(
        y[64:-1].reshape(64, 2), np.stack([sums, np.full(64, 64.0)], 1), rtol=1e-5
    )
    np.testing.assert_array_equal(v, x.reshape(64, 4)[:, ::-1])
    assert y[-1] == 4 + 16 + 4 + 4
    assert t.reads["x"] == x.nbytes and t.writes["v"] == v.nbytes and t.writes["y"] == y.nbytes


def test_prepass_keeps_lines_and_rewrites_pointers():
    pre = prepass(NEIGHBOUR.replace("SYNC", "__syncthreads()"))
    assert pre.kernels == ("shift",)
    body = pre.source.split("// ---- emulator registration")[0]
    src_lines = NEIGHBOUR.splitlines()
    assert body.splitlines()[: len(src_lines)][-3:] == [
        ln.replace("SYNC", "__syncthreads()") for ln in src_lines[-3:]
    ]
    assert "pf_gptr<const float> x" in body and "pf_gptr<float> y" in body
    assert "__shared__" not in body and "pf_shared(0" in body


MISTYPED = r"""
extern "C" __global__ void mistyped(const signed char* __restrict__ x, int* __restrict__ y) {
  __shared__ signed char s[64];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  const unsigned char* p = s;
  const unsigned char* q = x;
  y[threadIdx.x] = p[threadIdx.x] + q[0];
}
"""


@pytest.mark.parametrize("line", ["p = s", "q = x"])
def test_a_local_pointer_of_another_pointee_type_fails_the_build(emu, line):
    """``const unsigned char* p = s`` with ``s`` signed char: NVRTC refuses the conversion;
    the pre-pass made the declaration ``auto`` (the initialiser may be an instrumented
    pointer), so the emulator compiled it and read the bytes as signed. Its declared type is
    kept as a ``static_assert``, on a shared array and on an instrumented global pointer."""
    other = "p = s" if line == "q = x" else "q = x"
    src = MISTYPED.replace(f"const unsigned char* {other}", f"const signed char* {other}")
    with pytest.raises(EmulatorError, match=rf"const unsigned char\* {line[0]}: its initialiser "
                       "points to another type"):  # fmt: skip
        emu.load(src)
    fixed = MISTYPED.replace("const unsigned char*", "const signed char*")
    x = np.arange(-32, 32, dtype=np.int8)
    y = np.zeros(64, np.int32)
    emu.load(fixed).run([Launch("mistyped", (1, 1, 1), (64, 1, 1), ("x", "y"))], {"x": x, "y": y})
    np.testing.assert_array_equal(y, x.astype(np.int32) - 32)
