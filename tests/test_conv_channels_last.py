"""Channels-last 16-bit convolutions on tensor cores (issue 23's HMMA share of the 3x3 conv).

The ``channels_last`` graph pass reads a 16-bit conv's input and weight through NHWC / OHWI
copies (a transposing primitive, or a constant permuted at compile time) where the target has
``mma.sync`` and the channels are a multiple of 8; the tensorization flattens the reduction
as ``(kh, kw, c)`` and fills the input's im2col tile by gathered 16-byte ``cp.async`` chunks
(8 channels at one ``(kh, kw)``: :func:`polyfuse.poly.tensorize_gather.chunked_k`), the
weight's by linear ones, pipelined. Checked against float64 numpy at odd spatial sizes in
every emulator mode; the NCHW path stays where the pass does not apply (recorded).
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hmma_loops import hmma_loop
from kernel_checks import site_text
from test_tensorize_conv import CASES, RNG, _banks, _conv, _np_conv, _run_all_modes

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.graph.passes import PassAction

#: batch, channels (a multiple of 8), out channels, height, width: the rest odd
SIZE = (2, 16, 21, 11, 9)


def _records(fn, action: PassAction) -> list[str]:
    return [r.reason for r in fn.plan.graph.pass_records
            if r.pass_name == "channels_last" and r.action == action]  # fmt: skip


@pytest.mark.parametrize(
    "dtype, case",
    [("bfloat16", "3x3_pad1"), ("float16", "3x3_stride2_pad1"), ("bfloat16", "3x3")],
)
def test_channels_last_conv_fills_by_gathered_chunks_and_matches_float64(dtype, case):
    """The input's im2col tile by gathered 16-byte cp.async chunks (each chunk's padding mask
    precomputed, one bit test per k-tile), the weight's by linear chunks, pipelined; the
    reduction flattened as (kh, kw, c).
    Before: NCHW, both tiles scalar 2-byte copies. Correct in every mode, no bank conflict on
    the chunks' writes and the ldmatrix reads."""
    kernel, stride, pad = CASES.get(case, (3, 1, 0))
    inputs, out, arrays, want = _conv(dtype, SIZE, kernel, stride, pad)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    # the two copies packed side by side in one kernel (parallel stitching), then the conv
    copies, k = fn.kernels
    assert k.name == "k2_conv_conv" and "x_cl[" in copies.source and "w_cl[" in copies.source
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    assert made.startswith(
        "conv_conv reads x (a transposing primitive, 12672 bytes moved), "
        "w (a transposing primitive, 12096 bytes moved) channels-last"
    ), made
    assert "tensor cores: reduction flattened in the order (1, 2, 0) of its dims" in " ".join(
        k.notes
    )
    assert any(n.startswith("tensor cores: the shared tiles are filled by 16-byte cp.async")
               for n in k.notes), k.notes  # fmt: skip
    assert "pf_scalar" not in k.source and "pf_v = " not in k.source  # no scalar copy left
    assert "const int pf_kp = " in k.source and "&x_cl[pf_off], (pf_in ? 16 : 0));" in k.source
    # per chunk its row offset and padding mask once (a bit per filter position, a loop
    # over the positions where padding is tested), then one bit test per chunk and k-tile
    assert "pf_pm_s_x_cl[pf_u] & pf_bit" in k.source and "pf_ro_s_x_cl[pf_u] + pf_kp" in k.source
    assert ("for (int pf_d0 = 0; (pf_d0 <= 2); pf_d0 += 1)" in k.source) == bool(pad)
    lines = fn.cuda_source.splitlines()
    sites = _banks(fn, arrays, want, dtype)
    copies = [s for s in sites if "pf_cp_async16(" in site_text(lines, s)]
    loads = [s for s in sites if "pf_ldmatrix" in site_text(lines, s)]
    assert len(copies) >= 2 and len(loads) >= 2
    assert [str(s) for s in copies + loads if s.conflicts] == []
    _run_all_modes(fn, dtype, arrays, want)


def test_a_constant_weight_is_permuted_at_compile_time():
    """A constant OIHW weight becomes an OHWI constant (no kernel); the input still gets its
    transposing kernel, and the conv matches float64."""
    dtype = "float16"
    inputs, out, arrays, want = _conv(dtype, SIZE, *CASES["3x3_pad1"])
    x, w, bias = inputs
    fn = polyfuse.compile([x, bias], [out], constants={w: arrays[1]}, check_cuda=False)
    assert [k.name for k in fn.kernels] == ["k0_x_cl", "k1_conv_conv"]
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    assert "w (constant, permuted at compile time)" in made
    got = fn(arrays[0], arrays[2], device="emulate", race_check=True)
    assert tolerance(dtype).allclose(got, want.astype(numpy_dtype(dtype)))


def test_convs_the_pass_leaves_alone_keep_their_layout():
    """Not applied: channels that are no multiple of 8 (recorded with the reason), a float32
    conv (the CUDA-core path), a target without mma.sync, a 1x1 conv (its rows already
    aligned); the pass deselected keeps the NCHW fills."""
    inputs, out, _, _ = _conv("bfloat16", (2, 13, 21, 11, 9), *CASES["3x3_pad1"])
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    assert len(fn.kernels) == 1
    assert _records(fn, PassAction.REFUSED) == [
        "conv_conv stays NCHW: x's 13 channels are not a multiple of 8 (no aligned 16-byte "
        "chunk of channels)"
    ]
    for dtype, kernel, arch in (("float32", 3, "sm_80"), ("float16", 3, "sm_75"),
                                ("float16", 1, "sm_80")):  # fmt: skip
        inputs, out, _, _ = _conv(dtype, SIZE, kernel, 1, kernel // 2)
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
        assert len(fn.kernels) == 1 and not _records(fn, PassAction.SIMPLIFIED), (dtype, arch)
    inputs, out, _, _ = _conv("float16", SIZE, *CASES["3x3_pad1"])
    off = tuple(p for p in polyfuse.graph.passes.DEFAULT_PASSES if p != "channels_last")
    fn = polyfuse.compile(inputs, [out], check_cuda=False, passes=off)
    assert len(fn.kernels) == 1 and "pf_cp_async16(&s_x" not in fn.kernels[0].source


def test_two_convs_of_one_input_share_its_channels_last_copy():
    """Two 3x3 convs of one input (different weights): one transposing kernel of the input."""
    dtype = "bfloat16"
    n, c, o, h, wd = SIZE
    nd = numpy_dtype(dtype)
    x = te.placeholder((n, c, h, wd), dtype, name="x")
    w1 = te.placeholder((o, c, 3, 3), dtype, name="w1")
    w2 = te.placeholder((o, c, 3, 3), dtype, name="w2")
    y = ops.add(ops.conv2d(x, w1, padding=1, name="c1"), ops.conv2d(x, w2, padding=1, name="c2"),
                name="y")  # fmt: skip
    fn = polyfuse.compile([x, w1, w2], [y], check_cuda=False)
    names = [k.name for k in fn.kernels]
    assert sum("x_cl" in k for k in names) == 1, names
    shapes = ((n, c, h, wd), (o, c, 3, 3), (o, c, 3, 3))
    arrays = [RNG.standard_normal(s).astype(nd) for s in shapes]
    # each conv's result is rounded to bfloat16 before the add
    c1, c2 = (_np_conv(arrays[0], a, 1, 1).astype(nd).astype(np.float64) for a in arrays[1:])
    got = fn(*arrays, device="emulate", race_check=True)
    assert tolerance(dtype).allclose(got, (c1 + c2).astype(nd))


def test_an_elementwise_producer_computes_the_input_channels_last():
    """``conv(relu(x))``: relu, read only by the conv, computes NHWC itself (its loop nest
    permuted, no transposing copy of its result); correct in every mode."""
    dtype = "bfloat16"
    n, c, o, h, wd = SIZE
    nd = numpy_dtype(dtype)
    x = te.placeholder((n, c, h, wd), dtype, name="x")
    w = te.placeholder((o, c, 3, 3), dtype, name="w")
    y = ops.conv2d(ops.relu(x, name="a"), w, padding=1, name="conv")
    fn = polyfuse.compile([x, w], [y], check_cuda=False)
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    head = "conv reads a (its producer a stores it channels-last, no copy), w ("
    assert made.startswith(head), made
    assert "for 12096 bytes of copies" in made  # the weight's only
    assert fn.plan.graph.prims["a"].tensor.shape == (n, h, wd, c)
    xs = RNG.standard_normal((n, c, h, wd)).astype(nd)
    ws = RNG.standard_normal((o, c, 3, 3)).astype(nd)
    want = _np_conv(np.maximum(xs.astype(np.float64), 0.0), ws, 1, 1)
    _run_all_modes(fn, dtype, [xs, ws], want)


@pytest.mark.parametrize("kernel, pad, masked", [(5, 2, True), (7, 3, False)])
def test_padding_masks_cover_the_filter_positions_that_fit_one_word(kernel, pad, masked):
    """A chunk's padding mask holds one bit per filter position (``MASK_BITS`` = 31): a 5x5
    filter's 25 positions take the mask; a 7x7's 49 do not, and its chunks test each guarded
    subscript per k-tile as before. Both match float64 with the race checker on."""
    dtype = "bfloat16"
    inputs, out, arrays, want = _conv(dtype, (1, 8, 9, 13, 11), kernel, 1, pad)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    k = fn.kernels[-1]
    assert "&x_cl[pf_off], (pf_in ? 16 : 0));" in k.source
    assert ("pf_pm_s_x_cl[pf_u] & pf_bit" in k.source) == masked
    assert ("const int pf_e1 = " in k.source) == (not masked)
    if masked:  # the bit of (kh, kw) = (pf_d0, pf_d1)
        assert "(1 << (pf_d1 + (pf_d0 * 5)))" in k.source
    got = fn(*arrays, device="emulate", race_check=True)
    assert tolerance(dtype).allclose(got, want.astype(numpy_dtype(dtype)))


def _chain(dtype: str, residual: bool = False):
    """(inputs, output, constants, x array): three 3x3 convs with bias and ReLU, each reading
    the last one's activation (with ``residual``, the third's bias output plus the first
    activation before its ReLU: a ResNet basic block); constant weights."""
    n, c, h, wd = 2, 16, 9, 11
    nd = numpy_dtype(dtype)
    x = te.placeholder((n, c, h, wd), dtype, name="x")
    consts, act = {}, x
    first = None
    for i in range(3):
        w = te.placeholder((c, c, 3, 3), dtype, name=f"w{i}")
        b = te.placeholder((c,), dtype, name=f"b{i}")
        consts[w] = (RNG.standard_normal((c, c, 3, 3)) / 12).astype(nd)
        consts[b] = RNG.standard_normal(c).astype(nd)
        y = ops.conv2d(act, w, b, padding=1, name=f"c{i}")
        if residual and i == 2:
            y = ops.add(y, first, name="res")
        act = ops.relu(y, name=f"r{i}")
        first = first or act
    return x, act, consts, RNG.standard_normal((n, c, h, wd)).astype(nd)


@pytest.mark.parametrize("residual", [False, True])
def test_a_conv_chain_stores_each_activation_channels_last_from_its_epilogue(residual):
    """``relu(conv(x) + b)`` read only by the next conv: the conv, its bias add and its ReLU
    compute channels-last (loop nests permuted; the conv's GEMM has the output channels as
    rows and width x height as columns), so each epilogue stays in its conv's kernel and no
    copy follows it: the input's copy and three convs (the weights permuted at compile time).
    Before: each activation was a kernel of its own between two convs. A residual add
    continues the chain along its conv; an activation read by a conv and by a residual add
    is stored channels-last for both. Matches the reference evaluator in both thread
    orders."""
    dtype = "bfloat16"
    x, y, consts, xs = _chain(dtype, residual)
    fn = polyfuse.compile([x], [y], constants=consts, check_cuda=False)
    made = _records(fn, PassAction.SIMPLIFIED)
    assert made[2].startswith("c2_conv reads r1 (its producers r1_, c1_, c1_conv store it "
                              "channels-last, no copy)"), made  # fmt: skip
    assert made[1].startswith("c1_conv reads r0 (its producers r0_, c0_, c0_conv store it "
                              "channels-last, no copy)"), made  # fmt: skip
    # residual: r0 is read by c1 and by the add, which reads it channels-last too; the add
    # (into the NCHW output) is then a kernel of its own (it was c2's epilogue, after r0's copy)
    names = ["k0_x_cl", "k1_c0_conv", "k2_c1_conv", "k3_c2_conv"] + ["k4_res"] * residual
    assert [k.name for k in fn.kernels] == names
    assert fn.plan.graph.prims["r0_"].tensor.shape == (2, 9, 11, 16)
    for k in fn.kernels[1:3]:  # the convs stored NHWC
        assert "tensor cores: the GEMM's rows are data dim 3, its columns data dim 2, " \
            "the other data dims a batch (one block tile per batch point)" in k.notes
        assert any("data dim 1 folded into the columns" in n for n in k.notes), k.notes
    want = polyfuse.reference.evaluate([y], {x: xs, **consts})[0]
    for race in (False, True):
        got = fn(xs, device="emulate", race_check=race)
        assert tolerance(dtype).allclose(got, want)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.usefixtures("main_tilings")
def test_nvrtc_compiles_a_conv_stored_channels_last_without_spills(arch):
    """A 3x3, 1x1, 3x3 chain at a ResNet stage's size (64 channels, 28x28, batch 4): the
    convs storing channels-last (rows: channels; columns: width x height folded, a gathered
    fill by chunks) compile without spills, HMMA in the k-tile loop."""
    n, c, h, wd = 4, 64, 28, 28
    x = te.placeholder((n, c, h, wd), "bfloat16", name="x")
    act, consts = x, {}
    for i, kernel in enumerate((3, 1, 3)):  # a 1x1 conv between: channels-last for free
        w = te.placeholder((c, c, kernel, kernel), "bfloat16", name=f"w{i}")
        act = ops.relu(ops.conv2d(act, w, padding=kernel // 2, name=f"c{i}"), name=f"r{i}")
        consts[w] = RNG.standard_normal(w.shape).astype(numpy_dtype("bfloat16"))
    fn = polyfuse.compile([x], [act], constants=consts, arch=arch, check_cuda=False)
    nhwc = fn.kernels[1:3]  # the first two convs, their ReLUs stored NHWC for the next
    for k in nhwc:
        assert "tensor cores: the GEMM's rows are data dim 3, its columns data dim 2, the " \
            "other data dims a batch (one block tile per batch point)" in k.notes  # fmt: skip
        assert any("data dim 1 folded into the columns" in n for n in k.notes), k.notes
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    hmma, ldsm, _, _ = hmma_loop(binary, arch, nhwc[0].function)  # the 1x1's 2 k-tiles unroll
    assert hmma > 0 and ldsm > 0


def test_bottleneck_blocks_keep_their_activations_channels_last():
    """A small ResNet-50 in bfloat16 (the zoo's definition: 16-channel stem, two stages of two
    bottleneck blocks, 8 and 16 wide): each block's 1x1, 3x3 and 1x1 convs read the previous
    activation as their producers store it (conv, batch norm, ReLU, the residual add) and the
    block's output is read channels-last by the next block's conv and residual add alike. The
    stem conv reads its 3 channels NCHW but stores its output channels-last, and so does the
    max pool after it (a window keeping the channels), so the first block reads it so too: all
    12 convs read channels-last take no copy, 17 kernels. Before: 19 (the first block's 1x1
    conv and its ReLU NCHW, its residual add a kernel of its own), 20 before that (the 1x1
    convs stayed NCHW, the 3x3 convs' inputs a ReLU kernel of their own). Matches the float64
    reference on the same weights in both thread orders."""
    from polyfuse.zoo import cnn
    from polyfuse.zoo.backend import NumpyBackend, TeBackend

    cfg = dict(batch=2, image=12, stem=16, blocks=(2, 2), widths=(8, 16), classes=10, tiny=True)
    tb = TeBackend(seed=0, dtype="bfloat16")
    (out,) = cnn.resnet50_model(tb, cfg)
    fn = polyfuse.compile(tb.inputs, [out], constants=tb.constants, check_cuda=False)
    made = _records(fn, PassAction.SIMPLIFIED)
    assert len(made) == 12 and sum("store it channels-last, no copy" in r for r in made) == 12
    stem = (r"conv2d\d+ reads max_pool2d\d+ \(its producers max_pool2d\d+, relu\d+, "
            r"batch_norm\d+, conv2d\d+ store it")  # fmt: skip
    assert any(re.match(stem, r) for r in made), made
    assert len(fn.kernels) == 17
    assert len([k for k in fn.kernels if "pf_mma_m16n8k16" in k.source]) == 14
    x = RNG.standard_normal(tb.inputs[0].shape).astype(numpy_dtype("bfloat16"))
    (want,) = cnn.resnet50_model(NumpyBackend({"image": x}, tb.params), cfg)
    for race in (False, True):
        got = fn(x, device="emulate", race_check=race)
        np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=1e-2)


@pytest.mark.usefixtures("main_tilings")
def test_a_conv_written_channels_last_folds_its_rows_into_the_columns():
    """A bf16 3x3 conv written NHWC in te with the channels reduced innermost: its input is
    gathered by 16-byte chunks from the start, and the narrow output width (14) now takes the
    height folded in as the columns (196 per image: 8 block tiles in all; before, the fold
    waited for a scalar fill: 28 block tiles of 14 useful columns each). Matches the
    reference in both thread orders."""
    n, h, wd, c, o = 2, 14, 14, 32, 32
    x = te.placeholder((n, h, wd, c), "bfloat16", name="x")
    w = te.placeholder((o, 3, 3, c), "bfloat16", name="w")
    rh, rw, rc = (te.reduce_axis(e, name=nm) for e, nm in ((3, "rh"), (3, "rw"), (c, "rc")))

    def body(b, y, xx, oc):
        ih, iw = y + rh - 1, xx + rw - 1
        inside = (ih >= 0) & (ih < h) & (iw >= 0) & (iw < wd)
        return te.sum(te.where(inside, x[b, ih, iw, rc], 0.0) * w[oc, rh, rw, rc],
                      axis=[rh, rw, rc])  # fmt: skip

    out = te.compute((n, h, wd, o), body, name="cv")
    fn = polyfuse.compile([x, w], [out], check_cuda=False)
    (k,) = fn.kernels
    assert any(nt.startswith("tensor cores: data dim 1 folded into the columns with data dim 2 "
                             "(14 x 14 = 196 columns") for nt in k.notes), k.notes  # fmt: skip
    assert k.grid[0] * k.grid[1] * k.grid[2] == 8
    nd = numpy_dtype("bfloat16")
    xs = RNG.standard_normal(x.shape).astype(nd)
    ws = (RNG.standard_normal(w.shape) / 10).astype(nd)
    want = polyfuse.reference.evaluate([out], {x: xs, w: ws})[0]
    for race in (False, True):
        assert tolerance("bfloat16").allclose(fn(xs, ws, device="emulate", race_check=race), want)


def test_a_chain_crosses_a_pool_only_where_it_keeps_the_channels():
    """The chain from a conv's input back to the convs storing it channels-last crosses a
    max pool (its window slides over height and width; the channels stay its own axis) but
    not a mean over the channels (it reads every channel for one output: no permutation of
    its output gives its input's)."""
    from polyfuse.graph.graph import build_graph
    from polyfuse.graph.passes.channels_last import _window_source

    x = te.placeholder((2, 16, 8, 8), "bfloat16", name="x")
    pool = ops.max_pool2d(ops.relu(x, name="act"), 3, 2, 1, name="pool")
    mean = ops.reduce_mean(ops.relu(x, name="act2"), axis=1, keepdims=True, name="cmean")
    g = build_graph([x], [pool, mean])
    p, m = g.prims["pool"].tensor, g.prims["cmean"].tensor

    def computed(t):
        return g.idents.get(t.uid) in g.prims

    assert _window_source(p, 1, computed) is g.prims["act"].tensor
    assert _window_source(m, 1, computed) is None


def test_a_chain_crosses_a_depthwise_conv():
    """An inverted residual block (MobileNetV2): a 3x3 conv read channels-last, its ReLU6, a
    depthwise 3x3 conv (groups = channels: its input channel ``oc + rc``, ``rc`` of one
    trip) and its ReLU, then a 1x1 projection. The chain from the projection's input
    crosses the depthwise conv (its window keeps the channels; its filter is read as
    stored): the depthwise conv computes channels-last and the projection reads its output
    with no copy, by 16-byte chunks. Before: the projection read NCHW, its columns' rows
    of 99 elements unaligned, element by element. Matches the reference evaluator in both
    thread orders."""
    dtype, n, c, h, wd = "bfloat16", 2, 16, 9, 11
    nd = numpy_dtype(dtype)
    x = te.placeholder((n, c, h, wd), dtype, name="x")
    w0 = te.placeholder((c, c, 3, 3), dtype, name="w0")
    dw = te.placeholder((c, 1, 3, 3), dtype, name="dw")
    pw = te.placeholder((24, c, 1, 1), dtype, name="pw")
    consts = {w0: (RNG.standard_normal((c, c, 3, 3)) / 12).astype(nd),
              dw: (RNG.standard_normal((c, 1, 3, 3)) / 3).astype(nd),
              pw: (RNG.standard_normal((24, c, 1, 1)) / 4).astype(nd)}  # fmt: skip
    a = ops.minimum(ops.relu(ops.conv2d(x, w0, None, padding=1, name="c0"), name="r0"), 6.0,
                    name="a0")
    d = ops.relu(ops.conv2d(a, dw, None, padding=1, groups=c, name="dwc"), name="a1")
    y = ops.conv2d(d, pw, None, name="proj")
    fn = polyfuse.compile([x], [y], constants=consts, check_cuda=False)
    made = _records(fn, PassAction.SIMPLIFIED)
    assert made[1].startswith("proj reads a1 (its producers a1, dwc, a0, r0_, c0_ store it "
                              "channels-last, no copy)"), made  # fmt: skip
    assert [k.name for k in fn.kernels] == ["k0_x_cl", "k1_c0_", "k2_dwc", "k3_proj"]
    proj = fn.kernels[-1]
    assert "pf_cp_async16(" in proj.source and "pf_mma_" in proj.source
    g = fn.plan.graph
    assert g.prims["a1"].tensor.shape == (2, 9, 11, 16)
    xs = RNG.standard_normal((n, c, h, wd)).astype(nd)
    want = polyfuse.reference.evaluate([y], {x: xs, **consts})[0]
    for race in (False, True):
        assert tolerance(dtype).allclose(fn(xs, device="emulate", race_check=race), want)
