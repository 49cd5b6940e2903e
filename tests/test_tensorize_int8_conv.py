"""Integer convolutions on tensor cores: ``sum(where(pad, int32(x), 0) * int32(w))`` of
int8/uint8 operands as an implicit GEMM on ``mma.sync.m16n8k32`` (``ops.conv2d(...,
dtype="int32")``), the input and weight stored channels-last by the ``channels_last`` pass
(``ldmatrix`` has no ``.trans`` of bytes, so ``k`` must be innermost: a 1x1 conv too).
Exact against numpy's int64 sums wrapped to int32, in both thread orders, at odd sizes;
strided, dilated, grouped, 1x1 and channel counts no multiple of 16 (the fill transposes
those byte by byte); 0 bank conflicts; NVRTC sm_80/sm_90 without spills, IMMA in the loop.
ONNX ``ConvInteger`` / ``QLinearConv`` compute the raw bytes' convolution less the zero
points' window sums (:func:`polyfuse.onnx.ops_quant._integer_conv`), exact against ONNX's
reference.
"""

from __future__ import annotations

import numpy as np
import pytest
from hmma_loops import hmma_loop
from kernel_checks import exact_without_bank_conflicts

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import ExpressionError

RNG = np.random.default_rng(23)


def _ints(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    x.flat[:2] = [info.min, info.max]
    return x


def _conv_ref(x, w, stride=(1, 1), pads=(0, 0, 0, 0), dilation=(1, 1), groups=1):
    """numpy's int64 convolution (pads: top, left, bottom, right) wrapped to int32."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    oh = (h + pads[0] + pads[2] - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pads[1] + pads[3] - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg : (g + 1) * cg]
        ws = w[g * og : (g + 1) * og].astype(np.int64)
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation[0], j * dilation[1]
                patch = xs[:, :, r0 : r0 + stride[0] * oh : stride[0],
                           c0 : c0 + stride[1] * ow : stride[1]]  # fmt: skip
                out[:, g * og : (g + 1) * og] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out.astype(np.int32)


#: name -> (x shape, w shape, conv2d keywords): odd output sizes everywhere
CONVS = {
    "3x3": ((2, 32, 9, 11), (24, 32, 3, 3), {"padding": 1}),
    "3x3_s2": ((2, 32, 13, 11), (24, 32, 3, 3), {"padding": 1, "stride": 2}),
    "1x1": ((2, 48, 7, 9), (40, 48, 1, 1), {}),
    "dilated": ((1, 16, 11, 9), (20, 16, 3, 3), {"padding": 2, "dilation": 2}),
    "groups": ((1, 32, 7, 9), (24, 16, 3, 3), {"padding": 1, "groups": 2}),
    "c24": ((2, 24, 9, 7), (24, 24, 3, 3), {"padding": 1}),  # no 16-channel chunk
}


def _compile_conv(case: str, x_dtype="uint8", w_dtype="int8", **kw):
    xs, ws, args = CONVS[case]
    x = te.placeholder(xs, x_dtype, name="x")
    w = te.placeholder(ws, w_dtype, name="w")
    y = ops.conv2d(x, w, name="y", dtype="int32", **args)
    xa, wa = _ints(x_dtype, xs), _ints(w_dtype, ws)
    s, p, d = (args.get(k, v) for k, v in (("stride", 1), ("padding", 0), ("dilation", 1)))
    want = _conv_ref(xa, wa, (s, s), (p,) * 4, (d, d), args.get("groups", 1))
    fn = polyfuse.compile([x, w], [y], check_cuda=False, **kw)
    return fn, [xa, wa], want


def _tensor_core_notes(fn, kind: str = "int8 x uint8") -> list[str]:
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    head = f"tensor cores: mma.sync.m16n8k32 {kind} -> int32 accumulators"
    assert any(n.startswith(head) for n in k.notes), k.notes
    assert "_trans(" not in k.source  # bytes: no ldmatrix.trans
    return k.notes


@pytest.mark.parametrize("case", sorted(CONVS))
def test_byte_convs_run_on_m16n8k32_and_are_exact(case):
    """Every case on tensor cores and exact in both thread orders; channels-last operands
    where the input's channels make 16-byte chunks (a 1x1 conv too), else the fill transposes
    the NCHW input byte by byte."""
    fn, arrays, want = _compile_conv(case)
    notes = _tensor_core_notes(fn)
    for race in (False, True):
        np.testing.assert_array_equal(fn(*arrays, device="emulate", race_check=race), want)
    records = [r.reason for r in fn.plan.graph.pass_records if r.pass_name == "channels_last"]
    by_element = [n for n in notes if "filled element by element k-innermost" in n]
    if case in ("c24", "groups"):
        assert by_element, notes
        if case == "c24":
            assert any("24 channels are not a multiple of 16" in r for r in records), records
        return
    assert not by_element, notes
    assert any(r.startswith("y reads x (") and "ldmatrix (no .trans" in r for r in records), records
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    assert k.facts is not None and k.facts.async_copies  # both tiles by cp.async chunks


def test_a_signed_input_and_unsigned_weight_take_their_own_form():
    fn, arrays, want = _compile_conv("3x3", "int8", "uint8")
    _tensor_core_notes(fn, "uint8 x int8")
    np.testing.assert_array_equal(fn(*arrays, device="emulate"), want)


def test_a_byte_conv_without_widening_stays_off_tensor_cores():
    """``conv2d`` of bytes without ``dtype`` sums in the operands' dtype (wrapping at 8 bits,
    as numpy's would): refused with the reason, still exact; an unknown dtype is a one-line
    error naming the operation."""
    x = te.placeholder((1, 16, 5, 5), "int8", name="x")
    w = te.placeholder((8, 16, 3, 3), "int8", name="w")
    y = ops.conv2d(x, w, padding=1, name="y")
    assert y.dtype == "int8"
    fn = polyfuse.compile([x, w], [y], check_cuda=False)
    assert all("pf_mma_" not in k.source for k in fn.kernels)
    xa, wa = _ints("int8", x.shape), _ints("int8", w.shape)
    with np.errstate(over="ignore"):
        want = _conv_ref(xa, wa, pads=(1, 1, 1, 1)).astype(np.int8)
    np.testing.assert_array_equal(fn(xa, wa, device="emulate"), want)
    with pytest.raises(ExpressionError, match="conv2d 'z': unknown dtype 'int33'"):
        ops.conv2d(x, w, name="z", dtype="int33")
    with pytest.raises(ExpressionError, match="conv 'z': unknown dtype 'int33'"):
        ops.conv(x, w, name="z", dtype="int33")


def test_byte_conv_tiles_are_written_and_read_without_bank_conflicts():
    fn, arrays, want = _compile_conv("3x3")
    exact_without_bank_conflicts(fn, arrays, want)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.usefixtures("main_tilings")
def test_nvrtc_compiles_byte_convs_without_spills_and_imma_fills_the_loop(arch):
    """A ResNet 3x3 stage conv (64 -> 64 channels, 28x28, batch 4): no spills, IMMA and
    ldmatrix in the k-tile loop."""
    x = te.placeholder((4, 64, 28, 28), "uint8", name="x")
    w = te.placeholder((64, 64, 3, 3), "int8", name="w")
    y = ops.conv2d(x, w, padding=1, name="y", dtype="int32")
    fn = polyfuse.compile([x, w], [y], arch=arch, check_cuda=False)
    binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
    assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    imma, ldsm, _, other = hmma_loop(binary, arch, k.function)
    assert imma > 0 and ldsm > 0, (imma, ldsm, other)


# -- ONNX ConvInteger / QLinearConv ------------------------------------------------------


def _onnx_conv(op: str, xs, ws, x_dtype, w_dtype, zx, zw, attrs, const_w=True):
    """(model, feeds) of one ConvInteger or QLinearConv node (per-channel zero points and
    scales where ``zw`` is a list)."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper, numpy_helper

    tp = {"uint8": onnx.TensorProto.UINT8, "int8": onnx.TensorProto.INT8}
    xa, wa = _ints(x_dtype, xs), _ints(w_dtype, ws)
    feeds = {"x": xa}
    ins = [helper.make_tensor_value_info("x", tp[x_dtype], xs)]
    inits = [numpy_helper.from_array(np.array(zx, x_dtype), "zx"),
             numpy_helper.from_array(np.array(zw, w_dtype), "zw")]  # fmt: skip
    if const_w:
        inits.append(numpy_helper.from_array(wa, "w"))
    else:
        ins.append(helper.make_tensor_value_info("w", tp[w_dtype], ws))
        feeds["w"] = wa
    if op == "ConvInteger":
        node = helper.make_node(op, ["x", "w", "zx", "zw"], ["y"], **attrs)
        y_type = onnx.TensorProto.INT32
    else:
        sw = RNG.uniform(0.005, 0.02, np.shape(zw) or ()).astype(np.float32)
        inits += [numpy_helper.from_array(np.array(0.02, np.float32), "sx"),
                  numpy_helper.from_array(sw, "sw"),
                  numpy_helper.from_array(np.array(0.6, np.float32), "sy"),
                  numpy_helper.from_array(np.array(7, np.uint8), "zy")]  # fmt: skip
        node = helper.make_node(op, ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy"], ["y"],
                                **attrs)  # fmt: skip
        y_type = onnx.TensorProto.UINT8
    out = helper.make_tensor_value_info("y", y_type, None)
    graph = helper.make_graph([node], "g", ins, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]), feeds


ONNX_CONVS = {
    "pad1_zw_scalar": ("ConvInteger", (2, 32, 9, 11), (16, 32, 3, 3), "uint8", "int8", 17, -3,
                       {"pads": [1, 1, 1, 1]}, True),
    "asym_pads_stride2_zw_per_channel": (
        "ConvInteger", (2, 32, 9, 11), (16, 32, 3, 3), "uint8", "int8", 17,
        [i - 8 for i in range(16)], {"pads": [1, 0, 2, 1], "strides": [2, 2]}, True),
    "groups_runtime_weight": ("ConvInteger", (1, 32, 7, 7), (16, 16, 3, 3), "int8", "int8", -5,
                              4, {"pads": [1, 1, 1, 1], "group": 2}, False),
    "1x1_uint8_weight": ("ConvInteger", (2, 16, 5, 6), (8, 16, 1, 1), "uint8", "uint8", 128, 0,
                         {}, True),
    "dilated_3_channels": ("ConvInteger", (2, 3, 9, 11), (16, 3, 3, 3), "uint8", "uint8", 17, 9,
                           {"pads": [1, 1, 1, 1], "dilations": [2, 1]}, True),
    "qlinear_zw_per_channel": ("QLinearConv", (2, 32, 9, 11), (16, 32, 3, 3), "uint8", "int8",
                               100, [i % 3 for i in range(16)], {"pads": [1, 1, 1, 1]}, True),
    "qlinear_symmetric_weight": ("QLinearConv", (2, 32, 9, 11), (16, 32, 3, 3), "uint8", "int8",
                                 100, 0, {"pads": [1, 1, 1, 1]}, True),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ONNX_CONVS))
def test_onnx_integer_convs_are_exact_with_the_raw_bytes_on_tensor_cores(case):
    """Zero points on both sides (per tensor, per output channel), pads (asymmetric too),
    strides, dilations, groups, a runtime weight: equal to ONNX's reference; the raw bytes'
    convolution on m16n8k32."""
    from onnx.reference import ReferenceEvaluator

    from polyfuse.onnx.backend import prepare

    model, feeds = _onnx_conv(*ONNX_CONVS[case])
    want = ReferenceEvaluator(model).run(None, feeds)[0]
    rep = prepare(model, "CPU")
    (got,) = rep.run(feeds)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got, want)
    assert [k for k in rep.fn.kernels if "pf_mma_m16n8k32" in k.source]


def test_a_symmetric_weight_quantized_conv_is_two_kernels():
    """The common static quantization (uint8 activations with a zero point, int8 weights
    without): the zero point's window sums of the weight are one constant table, so the
    epilogue (zero point, requantization) runs on the GEMM's fragments; the other kernel
    stores the input channels-last."""
    from onnx.reference import ReferenceEvaluator

    from polyfuse.onnx.backend import prepare

    model, feeds = _onnx_conv(*ONNX_CONVS["qlinear_symmetric_weight"])
    rep = prepare(model, "CPU")
    assert len(rep.fn.kernels) == 2
    (k,) = [k for k in rep.fn.kernels if "pf_mma_" in k.source]
    assert "unsigned char" in k.source.split("pf_mma_m16n8k32")[-1]  # the requantized store
    np.testing.assert_array_equal(rep.run(feeds)[0], ReferenceEvaluator(model).run(None, feeds)[0])


def test_weight_window_sums_keep_only_the_dims_the_padding_varies():
    """The constant table of ``sum_r wsum[o, r]`` over in-bounds offsets: full per output
    position with padding, one value per output channel without (no window leaves the
    input), equal to the window sums counted directly."""
    from polyfuse.onnx.ops_nn import ConvGeometry
    from polyfuse.onnx.ops_quant import _weight_window_sums

    class _Ctx:
        tables: list[np.ndarray] = []

        def tensor(self, v):
            if isinstance(v, np.ndarray) and v.dtype == np.int32:  # the table, not the weight
                self.tables.append(v)
                return te.placeholder(v.shape, "int32", name="t")
            return te.placeholder(np.shape(v), "int8", name="w")

    w = _ints("int8", (4, 3, 3, 3))
    ctx = _Ctx()
    _weight_window_sums(ctx, w, None, None, ConvGeometry([3, 3], [1, 1], [1, 1], [1, 1],
                                                         [1, 1], 1), (5, 6), (5, 6))  # fmt: skip
    _weight_window_sums(ctx, w, None, None, ConvGeometry([3, 3], [1, 1], [1, 1], [0, 0],
                                                         [0, 0], 1), (5, 6), (3, 4))  # fmt: skip
    padded, valid = ctx.tables
    wc = w.astype(np.int64).sum(axis=1)
    assert valid.shape == (4, 1, 1)
    np.testing.assert_array_equal(valid[:, 0, 0], wc.sum(axis=(1, 2)))
    assert padded.shape == (4, 5, 6)
    np.testing.assert_array_equal(padded[:, 0, 0], wc[:, 1:, 1:].sum(axis=(1, 2)))
    np.testing.assert_array_equal(padded[:, 2, 3], wc.sum(axis=(1, 2)))
    np.testing.assert_array_equal(padded[:, 4, 5], wc[:, :2, :2].sum(axis=(1, 2)))


def test_a_quantized_conv_chain_keeps_each_requantization_in_its_conv():
    """QLinearConv -> QLinearConv (uint8 activations with zero points, int8 weights, a bias):
    the first conv, its zero-point and requantizing epilogue store the activation
    channels-last themselves, so the model is three kernels (the input's copy and two convs)
    and equals ONNX's reference."""
    pytest.importorskip("onnx")
    from onnx import helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    from polyfuse.onnx.backend import prepare

    def c(name, v):
        return numpy_helper.from_array(v, name)

    f32 = np.float32
    inits = [c("sx", np.array(0.02, f32)), c("zx", np.array(120, np.uint8)),
             c("w1", _ints("int8", (32, 32, 3, 3))), c("sw", np.array(0.01, f32)),
             c("zw", np.array(0, np.int8)), c("s1", np.array(0.5, f32)),
             c("z1", np.array(100, np.uint8)), c("w2", _ints("int8", (32, 32, 3, 3))),
             c("s2", np.array(0.7, f32)), c("z2", np.array(90, np.uint8)),
             c("b1", RNG.integers(-500, 500, 32).astype(np.int32))]  # fmt: skip
    nodes = [
        helper.make_node("QLinearConv", ["x", "sx", "zx", "w1", "sw", "zw", "s1", "z1", "b1"],
                         ["h"], pads=[1, 1, 1, 1]),
        helper.make_node("QLinearConv", ["h", "s1", "z1", "w2", "sw", "zw", "s2", "z2"], ["y"],
                         pads=[1, 1, 1, 1]),
    ]  # fmt: skip
    import onnx

    u8 = onnx.TensorProto.UINT8
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", u8, (2, 32, 9, 11))],
                              [helper.make_tensor_value_info("y", u8, None)], inits)  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    feeds = {"x": _ints("uint8", (2, 32, 9, 11))}
    rep = prepare(model, "CPU")
    assert len(rep.fn.kernels) == 3
    assert len([k for k in rep.fn.kernels if "pf_mma_m16n8k32" in k.source]) == 2
    np.testing.assert_array_equal(rep.run(feeds)[0], ReferenceEvaluator(model).run(None, feeds)[0])


def test_a_conv_integer_with_a_zero_point_per_input_channel_is_a_one_line_error():
    """ONNX allows ConvInteger's x zero point as one value only; a vector is refused with
    the tensor named, not a wrong sum."""
    from polyfuse.errors import PolyfuseError
    from polyfuse.onnx.backend import prepare

    model, _ = _onnx_conv("ConvInteger", (1, 16, 5, 5), (8, 16, 3, 3), "uint8", "int8",
                          [3] * 16, 0, {"pads": [1, 1, 1, 1]})  # fmt: skip
    with pytest.raises(PolyfuseError, match=r"x zero point \(16,\) must be one value") as e:
        prepare(model, "CPU")
    assert "\n" not in str(e.value)


def _nhwc_conv(c: int, dtype: str):
    """A conv written channels-last in te, no padding: ``k = (kh, kw, c)``, c innermost."""
    x = te.placeholder((2, 9, 9, c), dtype, name="x")
    w = te.placeholder((16, 3, 3, c), dtype, name="w")
    kh, kw, kc = te.reduce_axis(3, "kh"), te.reduce_axis(3, "kw"), te.reduce_axis(c, "kc")
    if dtype in ("int8", "uint8"):
        y = te.compute((2, 7, 7, 16), lambda n, h, v, o: te.sum(
            te.cast(x[n, h + kh, v + kw, kc], "int32") * te.cast(w[o, kh, kw, kc], "int32"),
            axis=[kh, kw, kc]), name="y")  # fmt: skip
    else:
        y = te.compute((2, 7, 7, 16), lambda n, h, v, o: te.sum(
            x[n, h + kh, v + kw, kc] * w[o, kh, kw, kc], axis=[kh, kw, kc],
            accumulate="float32"), name="y")  # fmt: skip
    return x, w, y


@pytest.mark.parametrize(
    ("c", "dtype", "chunked"),
    [(24, "int8", False), (32, "int8", True), (24, "bfloat16", True)],
)
def test_a_gathered_operands_chunks_are_16_bytes_of_its_dtype(c, dtype, chunked):
    """A k-innermost gathered input is filled by 16-byte chunks of consecutive channels:
    16 of bytes, 8 of 16 bits. The match asked 8 of every dtype, so 24 byte channels passed
    as chunked (the fill's alignment check then took scalar copies); now they are not, and
    32 are; 24 bfloat16 channels are three chunks a pixel."""
    from polyfuse.graph.dtypes import HALF_DTYPES
    from polyfuse.graph.expr import BYTE_DTYPES
    from polyfuse.poly.tensorize import match_mma

    x, w, y = _nhwc_conv(c, dtype)
    fn = polyfuse.compile([x, w], [y], check_cuda=False, passes=False)
    got = match_mma(fn.plan.scheduled[0], HALF_DTYPES + BYTE_DTYPES)
    assert not isinstance(got, str), got
    (op,) = [o for o in got[2:4] if o.tensor == "x"]
    assert op.gather and op.chunk == (16 if dtype == "int8" else 8)
    assert op.chunked is chunked
    if dtype == "int8":  # exact on tensor cores either way
        a, b = _ints("int8", x.shape), _ints("int8", w.shape)
        want = np.zeros((2, 7, 7, 16), np.int64)
        for i in range(3):
            for j in range(3):
                want += np.einsum("nhvc,oc->nhvo", a[:, i:i + 7, j:j + 7].astype(np.int64),
                                  b[:, i, j].astype(np.int64))  # fmt: skip
        full = polyfuse.compile([x, w], [y], check_cuda=False)
        assert any("pf_mma_" in k.source for k in full.kernels)
        np.testing.assert_array_equal(full(a, b, device="emulate"), want.astype(np.int32))
