"""ONNX operators the importer took on at stop 43: the trigonometric and hyperbolic family,
Mish/Swish/Celu/ThresholdedRelu (and a Softplus that does not overflow), Trilu,
GatherElements, EyeLike, Hardmax and the RMS/Group/MeanVariance/Lp normalizations. Each is
checked against ONNX's reference evaluator (16-bit sums in float64, rounded once), its CUDA
compiled with NVRTC for sm_80 and sm_90 and rerun in race-check mode."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _compiles_and_runs_race_free, _nodes_model  # noqa: E402

from polyfuse.graph.dtypes import tolerance  # noqa: E402
from polyfuse.onnx.backend import prepare  # noqa: E402
from polyfuse.testing.onnx_programs import reference_evaluator  # noqa: E402

RNG = np.random.default_rng(43)


def _agrees(nodes, inputs: dict, consts: dict | None = None, exact: bool = False, opset=20,
            infer: bool = True):  # fmt: skip
    """The model of ``nodes`` runs on the emulator within its dtype's tolerance of the
    reference (``exact``: equal), then again race-free with NVRTC's compile; returns the
    outputs. (``infer=False`` where ONNX's shape inference fails on the operator's own
    function body: MeanVarianceNormalization, or types a float16 GroupNormalization
    float32.)"""
    consts = consts or {}
    model = _nodes_model(nodes, inputs, consts, opset, infer)
    got = prepare(model, "CPU").run(inputs)
    want = reference_evaluator(model).run(None, inputs)
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if exact or g.dtype.kind in "biu":
            np.testing.assert_array_equal(g, w)
        else:
            tol = tolerance(str(g.dtype))
            assert tol.allclose(np.asarray(g, np.float64), np.asarray(w, np.float64)), (g, w)
    _compiles_and_runs_race_free(nodes, inputs, consts, got, model)
    return got


def _x(shape, dtype="float32", scale=2.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize(
    ("op", "lo", "hi"),
    [("Sin", -9, 9), ("Cos", -9, 9), ("Tan", -1.2, 1.2), ("Asin", -1, 1), ("Acos", -1, 1),
     ("Atan", -9, 9), ("Sinh", -4, 4), ("Cosh", -4, 4), ("Asinh", -9, 9), ("Acosh", 1, 9),
     ("Atanh", -0.95, 0.95)],  # fmt: skip
)
def test_trigonometric_and_hyperbolic_operators(op, lo, hi, dtype):
    x = RNG.uniform(lo, hi, (33, 17)).astype(dtype)
    _agrees([helper.make_node(op, ["x"], ["y"])], {"x": x})


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_mish_swish_celu_thresholded_relu_and_a_softplus_that_does_not_overflow(dtype):
    """Softplus was ``log(exp(x) + 1)``: inf from x = 89 in float32 (11 in float16), where
    the answer is x. It is now ``max(x, 0) + log1p(exp(-|x|))`` (as onnxruntime)."""
    x = _x((7, 40), dtype, 4.0)
    for op, at in (("Mish", {}), ("Celu", {"alpha": 1.5}), ("ThresholdedRelu", {"alpha": 0.3}),
                   ("Softplus", {})):  # fmt: skip
        _agrees([helper.make_node(op, ["x"], ["y"], **at)], {"x": x})
    _agrees([helper.make_node("Swish", ["x"], ["y"], alpha=0.7)], {"x": x}, opset=24)
    big = np.array([-100, -20, 0, 20, 100 if dtype == "float32" else 60000], dtype)
    model = _nodes_model([helper.make_node("Softplus", ["x"], ["y"])], {"x": big})
    got = prepare(model, "CPU").run({"x": big})[0].astype(np.float64)
    want = np.logaddexp(0, big.astype(np.float64)).astype(dtype).astype(np.float64)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-40)


def test_trilu_upper_and_lower_with_k_of_any_dtype():
    for x in (_x((2, 5, 7)), RNG.integers(-9, 9, (6, 4)).astype(np.int64), _x((3, 3)) > 0):
        for upper in (0, 1):
            for k in (-2, 0, 3):
                node = helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)
                _agrees([node], {"x": x}, {"k": np.array(k, np.int64)}, exact=True)
    _agrees([helper.make_node("Trilu", ["x"], ["y"])], {"x": _x((4, 6))}, exact=True)


def test_gather_elements_by_runtime_and_constant_indices():
    """``torch.gather``'s export: indices of the output's shape, negative ones from the
    end, along any axis, given at run time or as an initializer."""
    x = _x((4, 5, 6))
    idx = RNG.integers(-5, 5, (4, 3, 6)).astype(np.int64)
    node = helper.make_node("GatherElements", ["x", "i"], ["y"], axis=1)
    _agrees([node], {"x": x, "i": idx}, exact=True)
    node = helper.make_node("GatherElements", ["x", "c"], ["y"], axis=2)  # (its reference
    # mishandles a negative axis)
    c = RNG.integers(-6, 6, (4, 5, 3)).astype(np.int32)
    _agrees([node], {"x": x}, {"c": c}, exact=True)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_rms_group_mean_variance_and_lp_normalizations(dtype):
    """16-bit inputs compute their statistics in float32 and round once (the reference
    computes in float64); LpNormalization's p=1 norm sums magnitudes (the specification;
    onnx's reference summed signed values) and a zero norm gives 0."""
    x = _x((2, 6, 5, 4), dtype) + 3
    scale, bias = _x((6,), dtype), _x((6,), dtype)
    for axis in (-1, 1):
        s = _x(x.shape[axis:], dtype)
        node = helper.make_node("RMSNormalization", ["x", "s"], ["y"], axis=axis, epsilon=1e-4)
        _agrees([node], {"x": x, "s": s}, opset=23)
    for groups in (3, 6):  # opset 21: a scale and bias per channel
        node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups)
        _agrees([node], {"x": x, "s": scale, "b": bias}, opset=21, infer=False)
    node = helper.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)
    _agrees([node], {"x": x, "s": scale[:3], "b": bias[:3]}, opset=18, infer=False)  # per group
    _agrees([helper.make_node("MeanVarianceNormalization", ["x"], ["y"])], {"x": x}, infer=False)
    mvn = helper.make_node("MeanVarianceNormalization", ["x"], ["y"], axes=[1, 3])
    _agrees([mvn], {"x": x}, infer=False)
    x[0, 0] = 0  # a zero norm along axis 2
    for p in (1, 2):
        _agrees([helper.make_node("LpNormalization", ["x"], ["y"], axis=2, p=p)], {"x": x - 3})


def test_hardmax_marks_the_first_maximum_and_eye_like_is_a_constant():
    x = RNG.integers(-3, 3, (4, 5, 6)).astype(np.float32)  # ties: the first maximum wins
    x[0, 0, 2] = np.nan
    for axis in (0, -1):
        _agrees([helper.make_node("Hardmax", ["x"], ["y"], axis=axis)], {"x": x}, exact=True)
    for k, dtype in ((0, None), (2, onnx.TensorProto.INT32), (-1, onnx.TensorProto.DOUBLE)):
        at = {"k": k} | ({"dtype": dtype} if dtype else {})
        nodes = [helper.make_node("EyeLike", ["x"], ["e"], **at),
                 helper.make_node("Add", ["e", "e"], ["y"])]  # fmt: skip
        _agrees(nodes, {"x": _x((4, 6))}, exact=True)


def _kv_cache_indices(b: int, h: int, pos: int) -> np.ndarray:
    """ScatterND indices writing one position of a (b, h, seq, d) cache per (b, h)."""
    ii = np.stack(np.meshgrid(np.arange(b), np.arange(h), indexing="ij"), -1)
    return np.concatenate([ii, np.full((b, h, 1), pos)], -1).reshape(b, h, 1, 3)


@pytest.mark.parametrize("reduction", ["none", "add", "max", "min"])
def test_scatter_nd_writes_rows_and_the_last_duplicate_wins(reduction):
    """A KV cache's update (one position per batch and head, at run time and as a
    constant), and rows with duplicate and negative index tuples: the last row wins
    (``none``, as the reference applies them in order) or all combine with the old value."""
    cache = _x((2, 3, 7, 4))
    new = _x((2, 3, 1, 4))
    node = helper.make_node("ScatterND", ["c", "i", "u"], ["y"], reduction=reduction)
    idx = _kv_cache_indices(2, 3, 5).astype(np.int64)
    _agrees([node], {"c": cache, "i": idx, "u": new}, exact=reduction != "add")
    rows = np.array([[1, 2], [-1, 0], [1, 2], [0, -5]], np.int64)  # rows 0 and 2 collide
    ints = RNG.integers(-50, 50, (2, 7, 3)).astype(np.int32)
    updates = RNG.integers(-50, 50, (4, 3)).astype(np.int32)
    _agrees([helper.make_node("ScatterND", ["d", "r", "u"], ["y"], reduction=reduction)],
            {"d": ints, "u": updates}, {"r": rows}, exact=True)  # fmt: skip


@pytest.mark.parametrize("reduction", ["none", "add", "max", "min"])
def test_scatter_elements_along_any_axis_with_duplicates(reduction):
    """``torch.scatter``'s export: indices smaller than the data on the other axes (the
    rest of the data passes through), negative and duplicate indices, any axis."""
    data = _x((5, 6, 4))
    for axis, shape in ((1, (3, 4, 2)), (0, (7, 6, 4)), (-1, (5, 2, 9))):
        n = data.shape[axis]
        idx = RNG.integers(-n, n, shape).astype(np.int64)
        node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=axis,
                                reduction=reduction)  # fmt: skip
        _agrees([node], {"d": data, "i": idx, "u": _x(shape)}, exact=reduction != "add")


def test_a_scatter_with_an_unknown_reduction_is_refused_naming_the_node():
    from polyfuse.errors import UnsupportedOpError

    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], reduction="mean")
    model = _nodes_model([node], {"d": _x((3, 3)), "i": np.zeros((1, 3), np.int64),
                                  "u": _x((1, 3))}, infer=False)  # fmt: skip
    with pytest.raises(UnsupportedOpError, match=r"ScatterElements 'y': reduction 'mean' is not"):
        prepare(model, "CPU")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "uint32", "int64", "uint64"])
def test_bitwise_operators_of_every_integer_type(dtype):
    """BitwiseAnd/Or/Xor/Not on the bits of each ONNX integer type (held widened, a uint64
    in int64 bits): ``~`` of a uint8 held in int32 wraps back to 0..255."""
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, (5, 8), dtype=dtype, endpoint=True)
    b = RNG.integers(info.min, info.max, (8,), dtype=dtype, endpoint=True)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        _agrees([helper.make_node(op, ["a", "b"], ["y"])], {"a": a, "b": b}, exact=True)
    got = _agrees([helper.make_node("BitwiseNot", ["a"], ["y"])], {"a": a}, exact=True)
    np.testing.assert_array_equal(got[0], ~a)


def test_resize_of_a_long_axis_tabulates_its_taps_sparsely():
    """onnx fuzz seed 25241 (``--max-elements``): a linear Resize of a 66 690-long axis built
    the reference's dense 66 690 x 66 690 map (33 GiB) and failed. The taps are now probed
    a few columns at a time (:func:`polyfuse.onnx.ops_resize._taps`); a wide antialiased
    window (more taps than the first probe tells apart) grows the probe, and the tables
    equal the dense map's."""
    from polyfuse.onnx.ops_resize import _taps

    x = _x((1, 1, 40000, 2))
    sizes = np.array([1, 1, 60001, 3], np.int64)
    node = helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode="linear",
                            coordinate_transformation_mode="align_corners")  # fmt: skip
    _agrees([node], {"x": x}, {"s": sizes})
    small = _x((1, 2, 57, 40))
    for mode, out in (("cubic", (1, 2, 8, 40)), ("linear", (1, 2, 17, 13))):
        node = helper.make_node("Resize", ["x", "", "", "s"], ["y"], mode=mode, antialias=1)
        _agrees([node], {"x": small}, {"s": np.array(out, np.int64)})

    def window(d, taps=27, stride=3):  # a clamped moving window of 27 taps
        o = np.arange(19)[:, None] * stride + np.arange(taps)[None, :] - 5
        wts = np.linspace(1, 2, taps)
        return (d[np.clip(o, 0, len(d) - 1)] * wts[None, :, None]).sum(axis=1) + 0.5

    idx, w, c = _taps(window, 57)
    dense = np.zeros((19, 57))
    np.add.at(dense, (np.arange(19)[None, :].repeat(len(idx), 0), idx), w)
    np.testing.assert_allclose(dense, window(np.eye(57)) - 0.5, atol=1e-12)
    np.testing.assert_allclose(c, 0.5)


def test_the_deprecated_upsample_of_older_exports():
    """Upsample (opsets 7-9; YOLOv3-era exports): scales as an input (opset 9) or an
    attribute (opset 7), nearest and linear: the Resize it defines (asymmetric coordinates,
    nearest rounding down), as the reference computes that (its own Upsample cannot run an
    attribute or linear mode)."""
    x = _x((1, 2, 5, 7))
    scales = np.array([1, 1, 2, 3], np.float32)
    for mode in ("nearest", "linear"):
        resize = helper.make_node("Resize", ["x", "", "s"], ["y"], mode=mode, nearest_mode="floor",
                                  coordinate_transformation_mode="asymmetric")  # fmt: skip
        as_resize = _nodes_model([resize], {"x": x}, {"s": scales}, opset=13)
        want = reference_evaluator(as_resize).run(None, {"x": x})[0]
        for opset, ins, at in ((9, ["x", "s"], {}), (7, ["x"], {"scales": scales.tolist()})):
            node = helper.make_node("Upsample", ins, ["y"], mode=mode, **at)
            model = _nodes_model([node], {"x": x}, {"s": scales} if opset == 9 else {}, opset)
            got = prepare(model, "CPU").run({"x": x})[0]
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, err_msg=f"{mode} {opset}")



@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int64"])
def test_reduce_prod_and_cum_prod(dtype):
    """ReduceProd over any axes and CumProd (exclusive, reverse) by te's product reduction;
    a 16-bit product in float32, rounded once (its reference in float64)."""
    if dtype.startswith("int"):
        x = RNG.choice(np.array([-2, -1, 1, 1, 3]), (4, 6, 5)).astype(dtype)
    else:
        x = (1 + RNG.standard_normal((4, 6, 5)) * 0.2).astype(dtype)
    for axes, keep in (([1], 1), ([0, 2], 0), (None, 1)):
        consts = {} if axes is None else {"a": np.array(axes, np.int64)}
        node = helper.make_node("ReduceProd", ["x", *consts], ["y"], keepdims=keep)
        _agrees([node], {"x": x}, consts)
    for excl, rev in ((0, 0), (1, 0), (0, 1), (1, 1)):
        node = helper.make_node("CumProd", ["x", "ax"], ["y"], exclusive=excl, reverse=rev)
        _agrees([node], {"x": x}, {"ax": np.array(1, np.int64)}, opset=24)


def test_scatter_with_a_product():
    """ScatterND and ScatterElements with ``reduction='mul'`` (refused before te had a
    product reduction): the old value times every matching update."""
    data = _x((5, 6))
    node = helper.make_node("ScatterElements", ["d", "i", "u"], ["y"], axis=1, reduction="mul")
    idx = RNG.integers(-6, 6, (5, 4)).astype(np.int64)
    _agrees([node], {"d": data, "i": idx, "u": _x((5, 4))})
    node = helper.make_node("ScatterND", ["d", "i", "u"], ["y"], reduction="mul")
    rows = np.array([[1], [-1], [1]], np.int64)
    _agrees([node], {"d": data, "u": _x((3, 6))}, {"i": rows})
