"""The cost model sees the reads a block's threads share, and the loops NVRTC unrolls unasked.

MobileNetV2's depthwise 3 x 3 convolutions run one output per thread: nine guarded loads of the
input window and nine of the filter, most of them words a neighbouring thread of the block
reads too, which the L1 serves once. Without the block's footprint the model priced every
thread's loads as L2 fetches (274 MB for N8 C144 56², 31 us of L2 time, the kernel L2-bound),
and it counted the taps' bounds tests per tap, where NVRTC unrolls the 3 x 3 loops (no
``#pragma`` asks it to) and folds them: 335 slots a thread against 101 in the SASS, 47.0 us
modelled. isl now counts the distinct bytes one interior block reads
(:func:`polyfuse.poly.footprint.block_read_bytes`: 6 rows of 56 words, 9 filter words and the
shift, 1,384 B), and the IR estimate counts a short loop of constant trips as unrolled:
81 slots, 16.1 us (the floor: 9.6 us).
"""

from __future__ import annotations

import numpy as np
from kernel_checks import require_sass_tools

import polyfuse
from polyfuse import ops, te
from polyfuse.cache import CompileCache
from polyfuse.cuda.codegen.kernel_cost import AUTO_UNROLL_SLOTS, describe_kernel
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import device_for_arch


def _depthwise(n: int = 8, c: int = 144, hw: int = 56):
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((c, 1, 3, 3), name="w")
    b = te.placeholder((c,), name="b")
    y = ops.relu(ops.conv2d(x, w, b, stride=1, padding=1, groups=c, name="dw"), name="relu")
    return [x, w, b], [y]


def test_block_footprint_of_a_depthwise_conv():
    """An interior block of whole rows reads its rows and one halo row on each side, the
    channel's 9 filter words and its shift."""
    ins, outs = _depthwise()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    assert k.block[0] % 56 == 0, k.block  # whole rows per block
    rows = k.block[0] // 56
    assert k.block_read_bytes == ((rows + 2) * 56 + 9 + 1) * 4
    per_thread = describe_kernel(k).mix.global_read_bytes
    assert k.block_read_bytes < k.block[0] * per_thread / 10


def test_gemm_tile_fills_carry_no_block_footprint():
    """A GEMM's loads are its tile fills, each thread its own words: no footprint needed."""
    a, b = te.placeholder((256, 256), name="a"), te.placeholder((256, 256), name="b")
    fn = polyfuse.compile([a, b], [ops.matmul(a, b, name="mm")], check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    assert k.block_read_bytes is None


def test_shared_reads_are_not_l2_traffic():
    """The depthwise conv is priced by its DRAM bytes and issue slots, not by every thread's
    loads fetched from L2 (31 us, L2-bound, 47.0 us in all before; the floor is 9.6 us)."""
    ins, outs = _depthwise()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    m = model_kernel(describe_kernel(fn.kernels[0]), device_for_arch("sm_90"))
    assert m.bounds_us["L2"] < 0.3 * m.bounds_us["DRAM"], m.bounds_us
    assert m.bound != "L2"
    assert m.us < 1.8 * 9.6, m


def test_short_constant_loops_count_as_unrolled():
    """The 3 x 3 taps: their bounds tests once for the nest, no loop overhead (281 integer
    slots of 335 before)."""
    ins, outs = _depthwise()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    mix = describe_kernel(fn.kernels[0]).mix
    assert mix.ffma == 9
    assert mix.slots < 100 and mix.ints < 40, mix


def test_long_loops_stay_rolled():
    """A thread's 256 serial steps of a column reduction's partial sums are a loop in the SASS
    too: its integer work and loop overhead counted per iteration."""
    x = te.placeholder((16384, 2048), name="x")
    y = ops.reduce_sum(x, axis=0, name="s")
    fn = polyfuse.compile([x], [y], check_cuda=False, arch="sm_90")
    k = fn.kernels[0]
    mix = describe_kernel(k).mix
    assert mix.fadd == 256 > AUTO_UNROLL_SLOTS / 3
    assert mix.slots >= 256 * 6, mix  # load, add, its address and the loop per step


def test_estimate_agrees_with_the_sass():
    require_sass_tools()
    from polyfuse.cuda.toolchain.sass import analyse

    ins, outs = _depthwise()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (ks,) = analyse(fn.cuda_source, ("sm_90",), kernels=fn.kernels).kernels
    ir, sass = describe_kernel(fn.kernels[0]).mix.slots, ks.per_thread.total
    assert 0.7 < ir / sass < 1.3, (ir, sass)  # 3.3x before


def test_footprint_survives_the_compile_cache(tmp_path):
    cold = polyfuse.compile(*_depthwise(2, 8, 20), cache=CompileCache(tmp_path))
    warm = polyfuse.compile(*_depthwise(2, 8, 20), cache=CompileCache(tmp_path))
    assert warm.cache_stats["misses"] == 0
    assert warm.kernels[0].block_read_bytes == cold.kernels[0].block_read_bytes > 0


def test_depthwise_conv_on_the_emulator():
    """The kernel the figures describe computes the conv (float64 reference)."""
    ins, outs = _depthwise(2, 8, 20)
    fn = polyfuse.compile(ins, outs)
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(t.shape).astype(np.float32) for t in ins)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((2, 8, 20, 20))
    for i in range(3):
        for j in range(3):
            want += xp[:, :, i : i + 20, j : j + 20] * w[None, :, 0, i, j, None, None]
    want = np.maximum(want + b[None, :, None, None], 0)
    for mode in (False, True):
        got = fn(x, w, b, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
