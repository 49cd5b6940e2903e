"""The kernel IR work estimate counts a padded convolution as it is lowered and compiled.

The update of a zero-padded conv reads ``where(in_bounds, x[..], 0)``; where isl proves the
shared tile's zeros stand in for the select (``KTile.select_free``) the lowering prints the
bare read and the update is one fused multiply-add. The estimate counted the te expression —
its bounds test (about 23 integer slots) and the select — per multiply-add: ResNet-50's
stage-2 3x3 conv at 89,122 slots per thread, 41 % FFMA, against 45,534 and 81 % in its SASS
(NVRTC 13.0, sm_90), 110.6 us modelled where the SASS gives 52.4. Counted as lowered: 51,890
slots, 81.5 us. The filter's taps then read the input window's words again from shared
memory, 72 loads per step of 3 x 3 taps over 2 x 4 outputs, where NVRTC loads the 24 distinct
words once and keeps them in registers (``_reused_loads``): 45,746 slots, 30,720 shared bytes a
thread (the SASS: 45,534 and 30,728), 65.7 us.
"""

from __future__ import annotations

from kernel_checks import require_sass_tools

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.codegen.kernel_cost import describe_kernel


def _conv3x3(n: int = 8, c: int = 128, o: int = 128, hw: int = 28):
    x = te.placeholder((n, c, hw, hw), name="x")
    w = te.placeholder((o, c, 3, 3), name="w")
    b = te.placeholder((o,), name="b")
    y = ops.relu(ops.conv2d(x, w, b, stride=1, padding=1, name="conv2d"), name="relu")
    return [x, w, b], [y]


def test_select_free_update_is_counted_as_one_fused_multiply_add():
    ins, outs = _conv3x3()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    assert any("dropped" in n and "select" in n for n in k.notes), k.notes
    mix = describe_kernel(k).mix
    assert mix.ffma == 32 * 72 * 16  # 32 accumulators x 1152 reduction steps
    # the FFMA, the fragments' shared loads and the tile copies; no bounds test per product
    assert mix.slots < 1.3 * mix.ffma, mix  # 2.4x before
    assert mix.ints < 0.05 * mix.ffma, mix


def test_window_words_are_loaded_once_per_step():
    """Per step of the 8 channels of a k-tile: the 4 x 6 input words the 3 x 3 taps of a
    thread's 2 x 4 outputs cover, and its 4 filter words per tap (36): 60 shared loads, not
    the 108 the unrolled nest lists (the SASS: 30,728 bytes a thread)."""
    ins, outs = _conv3x3()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    mix = describe_kernel(fn.kernels[0]).mix
    steps = 1152 // 9  # channel steps of the 3 x 3 taps per thread
    assert mix.lds == 4 * steps * (24 + 36), mix  # 55,296 before


def test_select_kept_where_the_tile_is_not_select_free():
    """A select around a read the tile does not stand in for (a masked value, not a padded
    read) stays counted."""
    x = te.placeholder((64, 256), name="x")
    w = te.placeholder((256, 64), name="w")
    r = te.reduce_axis(256, "r")
    y = te.compute(
        (64, 64),
        lambda i, j: te.sum(te.where(x[i, r] > 0.0, x[i, r], 0.0) * w[r, j], axis=r),
        name="y",
    )
    fn = polyfuse.compile([x, w], [y], check_cuda=False, arch="sm_90")
    mix = describe_kernel(fn.kernels[0]).mix
    assert mix.slots > mix.ffma + 0.5 * mix.ffma  # the compare and the select per product


def test_estimate_agrees_with_the_sass():
    require_sass_tools()
    from polyfuse.cuda.toolchain.sass import analyse

    ins, outs = _conv3x3()
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    (k,) = analyse(fn.cuda_source, ("sm_90",), kernels=fn.kernels).kernels
    ir = describe_kernel(fn.kernels[0]).mix.slots
    sass = k.per_thread.total
    assert 0.9 < ir / sass < 1.1, (ir, sass)  # 1.96 before


def test_reused_loads_of_a_hand_built_nest():
    """Two taps reading s[i + j] for i, j in 0..1 share the word at 1: one of four loads is
    reused; a barrier or a shared store inside the nest (the word may change) reuses none."""
    from polyfuse.cuda.codegen.kernel_ast import (
        KBarrier,
        KCopy,
        KFor,
        KInt,
        KOp,
        KVar,
        MemSpace,
        Scope,
    )
    from polyfuse.cuda.codegen.kernel_cost import _reused_loads

    buffers = {"s": MemSpace.SHARED, "r": MemSpace.REGISTER}
    load = KCopy("r", (KVar("j"),), "s", (KOp("+", (KVar("i"), KVar("j"))),), None, 0.0, (8,))

    def nest(*extra):
        inner = KFor("j", KInt(0), KOp("<=", (KVar("j"), KInt(1))), 1, (load, *extra), True)
        return KFor("i", KInt(0), KOp("<=", (KVar("i"), KInt(1))), 1, (inner,), True)

    assert _reused_loads(nest(), buffers).lds == 4
    assert _reused_loads(nest(KBarrier(Scope.BLOCK)), buffers).lds == 0
    store = KCopy("s", (KVar("j"),), "r", (KVar("j"),), None, 0.0, (2,))
    assert _reused_loads(nest(store), buffers).lds == 0
