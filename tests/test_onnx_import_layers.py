"""Tests of the ONNX importer (continued from test_onnx_import.py): n-d and transposed convs,
the shapes option, index/scan/layout ops, TopK, Resize, recurrent layers, reductions,
training-mode batch norm, pooling indices and refused casts.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from test_onnx_import import F, _check, _feed, _model, _x  # noqa: E402, F401

from polyfuse.errors import PolyfuseError  # noqa: E402


@pytest.mark.parametrize(
    "xs,ws,at",
    [
        ([1, 4, 9], [6, 2, 3], dict(group=2, strides=[2], pads=[2, 1], dilations=[2])),
        ([1, 2, 5, 4, 6], [3, 2, 2, 3, 2], dict(pads=[1, 0, 1, 0, 2, 1], strides=[1, 2, 2])),
        ([1, 2, 7], [4, 2, 3], dict(auto_pad="SAME_LOWER", strides=[2])),
    ],
)
def test_conv_n_d(xs, ws, at):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], **at)]
    m = _model(nodes, [("x", F, xs)], ["y"], inits={"w": _x(*ws), "b": _x(ws[0])})
    _check(m, {"x": _x(*xs)})


@pytest.mark.parametrize(
    "xs,ws,at",
    [
        ([1, 4, 3, 4], [4, 3, 3, 2], dict(group=2, strides=[2, 3], pads=[1, 0, 0, 1])),
        ([1, 2, 5], [2, 3, 3], dict(strides=[3], output_padding=[1], dilations=[2])),
        ([1, 1, 3, 2, 3], [1, 2, 2, 2, 2], dict(strides=[2, 1, 2], auto_pad="SAME_UPPER")),
        ([1, 1, 3, 3], [1, 2, 3, 3], dict(strides=[3, 2], output_shape=[10, 8])),
    ],
)
def test_conv_transpose(xs, ws, at):
    nodes = [helper.make_node("ConvTranspose", ["x", "w"], ["y"], **at)]
    m = _model(nodes, [("x", F, xs)], ["y"], inits={"w": _x(*ws)})
    x = _x(*xs)
    # onnx.reference's ConvTranspose mishandles group > 1: compare with torch-free numpy
    _check(m, {"x": x}, expect={"y": _conv_transpose_ref(x, m)} if "group" in at else None)


def _conv_transpose_ref(x, m):
    """Scatter form of ConvTranspose (explicit pads, dilation 1) in numpy."""
    import itertools

    at = {a.name: helper.get_attribute_value(a) for a in m.graph.node[0].attribute}
    w = numpy_helper.to_array(m.graph.initializer[0])
    (n, c, *sp), (_, og, *k) = x.shape, w.shape
    nd, g = len(sp), at.get("group", 1)
    s, pads = list(at["strides"]), list(at["pads"])
    full = [s[i] * (sp[i] - 1) + k[i] for i in range(nd)]
    y = np.zeros((n, og * g, *full))
    for ic, oc in itertools.product(range(c), range(og)):
        for pos in itertools.product(*map(range, sp)):
            for r in itertools.product(*map(range, k)):
                o = tuple(pos[i] * s[i] + r[i] for i in range(nd))
                y[(slice(None), ic // (c // g) * og + oc, *o)] += (
                    x[(slice(None), ic, *pos)] * w[(ic, oc, *r)]
                )
    return y[
        (slice(None), slice(None), *[slice(pads[i], full[i] - pads[nd + i]) for i in range(nd)])
    ]


def test_shapes_option_on_every_model_verb(tmp_path, capsys):
    from polyfuse.cli import main
    from polyfuse.shapes_arg import parse_shapes

    m = _model([helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 8])], ["y"])
    p = tmp_path / "dyn.onnx"
    onnx.save(m, str(p))
    zoo = ["zoo", str(p), "--no-cuda-check", "--quiet", "--cache-dir", str(tmp_path / "c")]
    assert main(zoo) == 1
    assert "--shapes x=" in capsys.readouterr().err
    assert main([*zoo, "--shapes", "x=3,8"]) == 0
    assert main(["explain", str(p), "--shapes", "x=3x8"]) == 0
    assert parse_shapes(["a=1,2", "b=4x5x6"]) == {"a": (1, 2), "b": (4, 5, 6)}
    with pytest.raises(PolyfuseError, match="NAME=D0,D1"):
        parse_shapes(["a:1,2"])


I64 = TensorProto.INT64


@pytest.mark.parametrize(
    "node,inputs,inits",
    [
        (helper.make_node("Mod", ["x", "y"], ["z"], fmod=0), [("x", F, [6]), ("y", F, [6])], {}),
        (helper.make_node("Mod", ["x", "y"], ["z"], fmod=1), [("x", F, [6]), ("y", F, [6])], {}),
        (
            helper.make_node("ArgMax", ["x"], ["z"], axis=1, keepdims=0, select_last_index=1),
            [("x", F, [3, 4, 2])],
            {},
        ),
        (helper.make_node("ArgMin", ["x"], ["z"], axis=-1), [("x", F, [3, 5])], {}),
        (
            helper.make_node("CumSum", ["x", "a"], ["z"], exclusive=1, reverse=1),
            [("x", F, [3, 5])],
            {"a": np.array(1)},
        ),
        (
            helper.make_node("Einsum", ["x", "y"], ["z"], equation="bij,bjk->bik"),
            [("x", F, [2, 3, 4]), ("y", F, [2, 4, 5])],
            {},
        ),
        (
            helper.make_node("Einsum", ["x"], ["z"], equation="...ii->...i"),
            [("x", F, [2, 3, 3])],
            {},
        ),
        (
            helper.make_node("DepthToSpace", ["x"], ["z"], blocksize=2, mode="CRD"),
            [("x", F, [1, 8, 2, 3])],
            {},
        ),
        (helper.make_node("SpaceToDepth", ["x"], ["z"], blocksize=2), [("x", F, [1, 2, 4, 6])], {}),
    ],
)
def test_index_scan_and_layout_ops(node, inputs, inits):
    feeds = {n: _x(*s) * 4 for n, _, s in inputs}
    if node.op_type == "Mod":
        feeds["y"] = np.array([2.1, -3.4, 8.0, -2.1, np.inf, -np.inf], np.float32)
        feeds["x"] = np.array([-4.3, 7.2, 5.0, 4.3, -7.2, 8.0], np.float32)
    _check(_model([node], inputs, ["z"], inits=inits, opset=13), feeds)


def test_topk_values_and_indices():
    node = helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=1)
    m = _model([node], [("x", F, [3, 6])], ["v", "i"], inits={"k": np.array([3])}, opset=13)
    x = _x(3, 6)
    x[0, 2] = x[0, 4] = 5.0  # a tie: the lower index first
    _check(m, {"x": x})


@pytest.mark.parametrize(
    "at,scales,sizes",
    [
        (dict(mode="nearest", nearest_mode="round_prefer_ceil"), [1, 1, 1.7, 2.3], None),
        (dict(mode="linear", coordinate_transformation_mode="align_corners"), None, [1, 2, 7, 3]),
        (dict(mode="cubic", exclude_outside=1), [1, 1, 0.6, 1.5], None),
        (
            dict(
                mode="linear",
                coordinate_transformation_mode="tf_crop_and_resize",
                extrapolation_value=7.0,
            ),
            None,
            [1, 2, 5, 6],
        ),
    ],
)
def test_resize_modes(at, scales, sizes):
    inits = {"roi": np.array([0, 0, -0.2, 0.1, 1, 1, 0.9, 1.3], np.float32)}
    names = ["x", "roi", "scales" if scales else "", "sizes" if sizes else ""]
    if scales:
        inits["scales"] = np.array(scales, np.float32)
    if sizes:
        inits["sizes"] = np.array(sizes, np.int64)
    node = helper.make_node(
        "Resize", [n for n in names if n] if sizes is None else names, ["y"], **at
    )
    if sizes is not None:
        node.input[2] = ""
    _check(
        _model([node], [("x", F, [1, 2, 4, 5])], ["y"], inits=inits, opset=19),
        {"x": _x(1, 2, 4, 5)},
    )


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_recurrent_layers_unrolled(op, direction):
    g, hid, nd = {"LSTM": 4, "GRU": 3}[op], 3, 2 if direction == "bidirectional" else 1
    inits = {
        "w": _x(nd, g * hid, 4),
        "r": _x(nd, g * hid, hid),
        "b": _x(nd, 2 * g * hid),
        "h0": _x(nd, 2, hid),
    }
    ins = ["x", "w", "r", "b", "", "h0"]
    outs = ["y", "yh"]
    kw = {"linear_before_reset": 1} if op == "GRU" and nd == 2 else {}
    if op == "LSTM":
        inits["c0"], inits["p"] = _x(nd, 2, hid), _x(nd, 3 * hid)
        ins += ["c0", "p"]
        outs.append("yc")
    node = helper.make_node(op, ins, outs, hidden_size=hid, direction=direction, **kw)
    _check(_model([node], [("x", F, [5, 2, 4])], outs, inits=inits, opset=14), {"x": _x(5, 2, 4)})


def test_four_reduce_axes_compile_correctly():
    from polyfuse import reference, te

    x = te.placeholder((2, 3, 2, 3), name="x")
    a, b, c, d = (te.reduce_axis(2, name=f"k{i}") for i in range(4))
    y = te.compute(
        (2, 2, 1, 2),
        lambda o, i, j, q: te.sum(x[a, i + b, j + c, q + d], axis=[a, b, c, d]),
        name="y",
    )
    xv = _x(2, 3, 2, 3)
    fn = __import__("polyfuse").compile([x], [y], check_cuda=False)
    got = fn(xv, device="emulate")
    np.testing.assert_allclose(got, reference.evaluate([y], {x: xv})[0], rtol=1e-5, atol=1e-5)


def test_batch_norm_training_mode_outputs():
    node = helper.make_node(
        "BatchNormalization", ["x", "s", "b", "m", "v"], ["y", "rm", "rv"], training_mode=1
    )
    inits = {"s": _x(3), "b": _x(3), "m": _x(3), "v": _x(3, lo=0.5, hi=1.0)}
    _check(
        _model([node], [("x", F, [2, 3, 4, 5])], ["y", "rm", "rv"], inits=inits, opset=15),
        {"x": _x(2, 3, 4, 5)},
    )


@pytest.mark.parametrize("order", [0, 1])
def test_max_pool_indices(order):
    node = helper.make_node(
        "MaxPool",
        ["x"],
        ["y", "i"],
        kernel_shape=[3, 2],
        strides=[2, 1],
        pads=[1, 0, 1, 1],
        storage_order=order,
    )
    _check(_model([node], [("x", F, [2, 2, 5, 4])], ["y", "i"]), {"x": _x(2, 2, 5, 4)})


def test_a_cast_through_float8_mid_graph_rounds_onto_its_grid():
    """float32 -> float8 -> float32 must round (it was refused, so as not to skip the
    rounding silently); saturating, as ONNX's default."""
    import ml_dtypes

    from polyfuse.onnx.backend import prepare

    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["c"], ["y"], to=F),
    ]
    x = np.array([0.3, 1000.0, 0.1, -3.3], np.float32)
    (y,) = prepare(_model(nodes, [("x", F, [4])], ["y"]), "CPU").run({"x": x})
    want = np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(y, want)
    assert y[1] == 448 and y[0] == 0.3125


def test_an_output_of_undeclared_type_keeps_its_own_dtype():
    """A graph output with no element type was returned as float32 whatever it held: an
    int64 ArgMax came back as floats (exact only below 2**24), a float16 Relu widened. It is
    now the value's own dtype; an integer takes the type ONNX infers (uint8 held in int32)."""
    from polyfuse.onnx.backend import prepare

    vi = helper.make_tensor_value_info
    cases = (("ArgMax", {"axis": 1}, TensorProto.FLOAT, np.float32, np.int64),
             ("Relu", {}, TensorProto.FLOAT16, np.float16, np.float16),
             ("Cast", {"to": TensorProto.UINT8}, TensorProto.FLOAT, np.float32, np.uint8),
             ("Not", {}, TensorProto.BOOL, np.bool_, np.bool_))  # fmt: skip
    for op, at, et, dtype, want in cases:
        untyped = helper.make_value_info("y", onnx.TypeProto())
        g = helper.make_graph([helper.make_node(op, ["x"], ["y"], **at)], "g",
                              [vi("x", et, [3, 4])], [untyped])  # fmt: skip
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
        x = (np.arange(12).reshape(3, 4) * 7.3).astype(dtype)
        assert prepare(m, "CPU").run({"x": x})[0].dtype == want, op
