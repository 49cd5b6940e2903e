"""The race-check emulator's shared-memory bank counter (issue 23 item 1: "the emulator counts
bank conflicts per shared access"): hand-written kernels whose conflict degree is known from
the bank arithmetic (32 banks of 4-byte words; phases of a warp, a half-warp or a quarter-warp
for 4-, 8- and 16-byte accesses), ldmatrix from a plain and an XOR-swizzled tile, cp.async."""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse.cuda.codegen.tensor_core import PRELUDE
from polyfuse.cuda.emulator import Emulator
from polyfuse.cuda.runtime.launch import Launch
from polyfuse.errors import CallError

SRC = r"""
#include <cuda_fp16.h>
__global__ void strided(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[32 * 33];
  const int t = threadIdx.x;
  for (int i = t; i < 32 * 33; i += 32) s[i] = x[i];
  __syncthreads();
  float a = s[t];            // line 8: conflict-free
  float b = s[2 * t];        // line 9: 2-way
  float c = s[32 * t];       // line 10: 32-way (a column of a 32-wide tile)
  float d = s[33 * t];       // line 11: the padded column: conflict-free
  float e = s[0];            // line 12: broadcast
  y[t] = a + b + c + d + e;
}
__global__ void vectors(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ __align__(16) float s[32 * 8];
  const int t = threadIdx.x;
  for (int i = t; i < 32 * 8; i += 32) s[i] = x[i];
  __syncthreads();
  float4 a = reinterpret_cast<const float4*>(s)[t];          // line 20: 4 quarter-warp phases
  float2 b = reinterpret_cast<const float2*>(s)[t];          // line 21: 2 half-warp phases
  float4 c = reinterpret_cast<const float4*>(s)[(t % 8) * 8]; // line 22: 8 lanes on 4 banks
  y[t] = (a.x + a.y + a.z + a.w) * (b.x - b.y) + (c.x + c.y) * (c.z - c.w);
}
__global__ void copies(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ __align__(16) float s[32 * 4];
  const int t = threadIdx.x;
  __pipeline_memcpy_async(&s[4 * t], &x[4 * t], 16);  // line 28: conflict-free
  __pipeline_commit();
  __pipeline_wait_prior(0);
  __syncthreads();
  y[t] = s[t];
}
// 8 rows of 64 bytes (32 halves) per 8x8 matrix: row r's 16 bytes start at word 16r, so rows
// 0, 2, 4, 6 share banks 0-3 (4-way); XOR-ing the 16-byte chunk with (r / 2) % 4 spreads them.
__global__ void ldm(const unsigned short* __restrict__ x, unsigned* __restrict__ y, int swz) {
  __shared__ __align__(16) unsigned short s[32 * 32];
  const int t = threadIdx.x;
  for (int i = t; i < 32 * 32; i += 32) s[i] = x[i];
  __syncthreads();
  const int row = t, chunk = swz ? ((row >> 1) & 3) : 0;
  unsigned r[4];
  pf_ldmatrix_x4(r, &s[row * 32 + chunk * 8]);  // line 43
  for (int i = 0; i < 4; ++i) y[4 * t + i] = r[i];
}
"""


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    emu = Emulator(cache_dir=tmp_path_factory.mktemp("emu"), workers=1)
    return emu.load(PRELUDE + SRC, racecheck=True)


def _line(src: str, marker: str) -> int:
    """The 1-based line of ``marker`` in the module's source (the prelude comes first)."""
    text = PRELUDE + src
    return text[: text.index(marker)].count("\n") + 1


def _sites(module, kernel: str, x: np.ndarray, y: np.ndarray, *scalars) -> dict:
    from polyfuse.cuda.runtime.launch import ScalarArg

    args = ["x", "y", *(ScalarArg(v, "int") for v in scalars)]
    (t,) = module.run([Launch(kernel, (1, 1, 1), (32, 1, 1), args)], {"x": x, "y": y}, banks=True)
    return {(b.line, b.access, b.width): b for b in t.shared_banks}


def test_scalar_reads_cost_their_conflict_degree(module):
    x = np.arange(32 * 33, dtype=np.float32)
    y = np.zeros(32, np.float32)
    sites = _sites(module, "strided", x, y)
    t = np.arange(32)
    np.testing.assert_array_equal(y, x[t] + x[2 * t] + x[32 * t] + x[33 * t] + x[0])
    by_line = {line: sites[(line, "read", 4)] for line in range(
        _line(SRC, "float a ="), _line(SRC, "float e =") + 1)}  # fmt: skip
    a, b, c, d, e = by_line.values()
    assert (a.requests, a.wavefronts, a.conflicts) == (1, 1, 0)
    assert (b.wavefronts, b.degree) == (2, 2.0)
    assert (c.wavefronts, c.degree) == (32, 32.0)
    assert (d.wavefronts, d.conflicts) == (1, 0)
    assert (e.wavefronts, e.conflicts) == (1, 0)  # one word: a broadcast
    # the fill loop: 33 conflict-free warp-wide writes
    (fill,) = [s for (_, acc, _), s in sites.items() if acc == "write"]
    assert (fill.requests, fill.wavefronts, fill.conflicts) == (33, 33, 0)


def test_vector_reads_are_served_in_quarter_and_half_warps(module):
    x = np.arange(32 * 8, dtype=np.float32)
    y = np.zeros(32, np.float32)
    sites = _sites(module, "vectors", x, y)
    a = sites[(_line(SRC, "float4 a ="), "read", 16)]
    b = sites[(_line(SRC, "float2 b ="), "read", 8)]
    c = sites[(_line(SRC, "float4 c ="), "read", 16)]
    assert (a.wavefronts, a.ideal, a.conflicts) == (4, 4, 0)
    assert (b.wavefronts, b.ideal, b.conflicts) == (2, 2, 0)
    # float4 8(t % 8) starts at word 32(t % 8): a quarter-warp's eight all on banks 0-3
    assert (c.ideal, c.wavefronts, c.degree) == (4, 32, 8.0)


def test_cp_async_writes_are_counted(module):
    x = np.arange(32 * 4, dtype=np.float32)
    y = np.zeros(32, np.float32)
    sites = _sites(module, "copies", x, y)
    np.testing.assert_array_equal(y, x[:32])
    cp = sites[(_line(SRC, "__pipeline_memcpy_async(&s"), "write", 16)]
    assert (cp.requests, cp.wavefronts, cp.ideal) == (1, 4, 4)


@pytest.mark.parametrize("swizzle, degree", [(0, 4.0), (1, 1.0)])
def test_ldmatrix_rows_conflict_unless_swizzled(module, swizzle, degree):
    x = np.arange(32 * 32, dtype=np.uint16)
    y = np.zeros(128, np.uint32)
    sites = _sites(module, "ldm", x, y, swizzle)
    (ld,) = [s for (line, acc, w), s in sites.items() if acc == "read" and w == 16]
    assert ld.line == _line(SRC, "pf_ldmatrix_x4(r")
    assert (ld.requests, ld.ideal, ld.degree) == (1, 4, degree)
    # and the fragments are right: lane L of matrix i holds row L / 4, halves 2(L % 4), +1
    lane = np.arange(32)
    for i in range(4):
        rows = 8 * i + lane // 4
        chunk = ((rows >> 1) & 3) if swizzle else 0
        col = chunk * 8 + 2 * (lane % 4)
        lo, hi = x[rows * 32 + col].astype(np.uint32), x[rows * 32 + col + 1].astype(np.uint32)
        np.testing.assert_array_equal(y[4 * lane + i], lo | (hi << 16))


def test_banks_need_a_race_check_module(tmp_path):
    emu = Emulator(cache_dir=tmp_path, workers=1)
    mod = emu.load(PRELUDE + SRC)
    x, y = np.zeros(32 * 33, np.float32), np.zeros(32, np.float32)
    with pytest.raises(CallError, match="race-check module"):
        mod.run([Launch("strided", (1, 1, 1), (32, 1, 1), ["x", "y"])], {"x": x, "y": y},
                banks=True)  # fmt: skip
    # without banks the report stays empty
    (t,) = mod.run([Launch("strided", (1, 1, 1), (32, 1, 1), ["x", "y"])], {"x": x, "y": y})
    assert t.shared_banks == []


def test_compiled_graphs_report_their_shared_accesses():
    """``race_check="banks"`` on a compiled graph: the GEMM's cp.async tile copies (16 bytes
    per lane) and fragment reads, and the softmax's float4 row buffer and warp scratch, are
    all conflict-free (the GEMM tiles' rows are padded, the row buffer is read along rows)."""
    import polyfuse
    from polyfuse import ops, te

    a = te.placeholder((256, 128), name="a")
    b = te.placeholder((128, 256), name="b")
    x = te.placeholder((64, 1000), name="x")
    rng = np.random.default_rng(0)
    av, bv = rng.random((256, 128), np.float32), rng.random((128, 256), np.float32)
    xv = rng.random((64, 1000), np.float32)
    cases = [
        ([a, b], [ops.matmul(a, b)], (av, bv), av @ bv),
        ([x], [ops.softmax(x)], (xv,), np.exp(xv) / np.exp(xv).sum(1, keepdims=True)),
    ]
    for ins, outs, args, want in cases:
        fn = polyfuse.compile(ins, outs)
        np.testing.assert_allclose(fn(*args, race_check="banks"), want, rtol=1e-4, atol=1e-5)
        sites = [s for t in fn.last_traffic for s in t.shared_banks]
        assert sites and all(s.line for s in sites)
        assert [str(s) for s in sites if s.conflicts] == []
        assert any(s.width == 16 for s in sites)  # the vector accesses are seen whole
        lines = fn.cuda_source.splitlines()
        copies = [s for s in sites if "__pipeline_memcpy_async" in lines[s.line - 1]]
        assert bool(copies) == (ins[0] is a)  # the GEMM's tile copies
