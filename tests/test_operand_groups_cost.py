"""The GEMM tile estimate sees every operand tile the kernel copies, and the L2 traffic of the
fills that bypass the L1.

``q @ k^T`` of a merged ``qkv`` reads one array through two access functions: the kernel copies
two shared tiles (``qkv`` and ``qkv__1``), but the tile estimate kept one operand per array, so
it priced BERT's attention scores without the key tile every block streams. Its whole-row
stitch with the softmax took 4-row tiles: 3,072 blocks, each copying all 128 keys of its head
into shared memory for 4 rows (19.0 us modelled from the kernel IR; 15.2 us issue-bound from
its SASS). Counted, 32-row tiles win: 384 blocks, 9.6 us (6.2 us from the SASS).

16-byte ``cp.async`` fills (``LDGSTS.E.BYPASS.128``) bypass the L1, so the cost model no longer
lets one block reuse another's fills from there.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
from polyfuse import te
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.costs import KernelDesc, Mix, model_kernel
from polyfuse.poly.device import H100
from polyfuse.poly.gemm_shape import GemmShape
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")


def _scores(b: int, h: int, s: int, d: int, softmax: bool = True):
    """Attention scores (and their softmax) from one merged ``qkv`` array: the query and the
    key are the same tensor at two offsets."""
    qkv = te.placeholder((b, s, 3, h, d), name="qkv")
    r = te.reduce_axis(d, "r")
    sc = te.compute(
        (b, h, s, s),
        lambda n, a, i, j: te.sum(qkv[n, i, 0, a, r] * qkv[n, j, 1, a, r], axis=r),
        name="sc",
    )
    if not softmax:
        return [qkv], [sc]
    j2 = te.reduce_axis(s, "j2")
    mx = te.compute((b, h, s), lambda n, a, i: te.max(sc[n, a, i, j2], axis=j2), name="mx")
    ex = te.compute(
        (b, h, s, s), lambda n, a, i, j: te.exp(sc[n, a, i, j] - mx[n, a, i]), name="ex"
    )
    j3 = te.reduce_axis(s, "j3")
    sm = te.compute((b, h, s), lambda n, a, i: te.sum(ex[n, a, i, j3], axis=j3), name="sm")
    out = te.compute((b, h, s, s), lambda n, a, i, j: ex[n, a, i, j] / sm[n, a, i], name="out")
    return [qkv], [out]


def test_both_access_groups_of_one_array_are_priced():
    ins, outs = _scores(8, 12, 128, 64, softmax=False)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    shape = detect_gemm(fn.plan.scheduled[0])
    assert isinstance(shape, GemmShape)
    (t,) = rank_gemm_tiles(shape, H100, forced=(32, 128, 8, 8, 32), limit=1, stages=2)
    assert t.code is not None and t.estimate is not None
    tiles = {c.tensor: c.size for c in t.code.tiles}
    assert set(tiles) == {"qkv", "qkv__1"}, tiles
    # a block reads its 32 query rows and all 128 keys of its head, 64 floats each
    assert t.estimate.block_read_bytes == 4 * (32 + 128) * 64
    # float4 tiles of a pipelined loop: every byte is a 16-byte cp.async (cp.async.cg)
    assert t.estimate.block_bypass_bytes == t.estimate.block_read_bytes


def test_bypassing_fills_are_fetched_from_l2_by_every_block():
    """A block footprint that would fit the L1 beside the shared tiles is still fetched from
    L2 by every block when cp.async.cg fills it; fills through the L1 are reused."""
    common = dict(
        name="k",
        source="test",
        blocks=4096,
        threads=128,
        registers=64,
        shared_bytes=8192,
        mix=Mix(slots=100.0, ffma=50.0, ldgsts=64.0),
        bytes_read=1 << 20,
        bytes_written=1 << 20,
        block_read_bytes=32768,
    )
    cached = model_kernel(KernelDesc(**common), H100).bounds_us["L2"]
    bypass = model_kernel(KernelDesc(**common, block_bypass_bytes=32768), H100).bounds_us["L2"]
    want = 4096 * 32768 / (H100.l2_gbps * 1e9) * 1e6
    assert bypass == pytest.approx(want, rel=1e-6)
    assert cached < bypass / 50  # the distinct megabyte, shared through the L1


def test_bert_scores_row_stitch_takes_tall_row_tiles():
    ins, outs = _scores(8, 12, 128, 64)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    (rows,) = [n for n in k.notes if n.startswith("whole-row tile for the row reduction")]
    bm = int(rows.split("=(")[1].split(",")[0])
    assert bm >= 16, rows  # 4 before: 3072 blocks re-reading every key tile
    assert k.grid[0] * k.grid[1] * k.grid[2] <= 768
    assert model_kernel(describe_kernel(k), H100).us < 12.0  # 19.0 us modelled before


def test_merged_qkv_scores_softmax_on_the_emulator():
    ins, outs = _scores(2, 4, 128, 64)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    assert len(fn.kernels) == 1  # stitched: scores + softmax in one kernel
    rng = np.random.default_rng(3)
    x = rng.standard_normal(ins[0].shape).astype(np.float32) * 0.3
    (want,) = evaluate(outs, {ins[0]: x.astype(np.float64)})
    for mode in MODES:
        got = fn(x, device="emulate", race_check=mode)
        np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=1e-4, atol=1e-6)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="needs NVRTC")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_tall_row_tile_compiles_without_spills(arch):
    ins, outs = _scores(8, 12, 128, 64)
    fn = polyfuse.compile(ins, outs, arch, check_cuda=False)
    compiles_without_spills(fn, arch)
