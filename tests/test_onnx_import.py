"""polyfuse.onnx.load: small ONNX graphs per op family, load → compile → emulate vs the ONNX
reference evaluator; bad inputs (corrupt file, unsupported ops, dynamic shapes)."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyfuse.onnx as po  # noqa: E402
from polyfuse.errors import PolyfuseError, UnsupportedOpError  # noqa: E402
from polyfuse.graph import dtypes  # noqa: E402

F = TensorProto.FLOAT
rng = np.random.default_rng(0)


def _model(nodes, inputs, outputs, inits=(), opset=17, name="m"):
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, F, None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _check(model, feeds, rtol=1e-4, atol=1e-5, expect=None):
    om = po.load(model)
    fn = om.compile(check_cuda=False)
    out = fn(
        *[_feed(feeds[n], t) for n, t in zip(om.input_names, om.inputs, strict=True)],
        device="emulate",
    )
    out = out if isinstance(out, tuple) else (out,)
    names = [n for n in om.output_names if n not in om.constant_outputs]
    refs = {}
    if not set(names) <= set(expect or {}):
        ref = ReferenceEvaluator(model).run(None, feeds)
        refs = dict(zip([o.name for o in model.graph.output], ref, strict=True))
    refs.update(expect or {})  # numpy where onnx.reference disagrees with the spec
    for n, got in zip(names, out, strict=True):
        np.testing.assert_allclose(
            got, np.asarray(refs[n], dtype=np.float32), rtol=rtol, atol=atol, err_msg=n
        )
    return om


def _feed(a, t):
    """A feed in the dtype of the placeholder that takes it (int64 ids stay int64)."""
    return np.asarray(a, dtype=dtypes.numpy_dtype(t.dtype))


def _x(*shape, lo=-1.0, hi=1.0):
    return rng.uniform(lo, hi, size=shape).astype(np.float32)


def test_elementwise_family():
    s = [3, 5]
    un = ["Sqrt", "Reciprocal", "Exp", "Log", "Tanh", "Sigmoid", "Relu", "Erf", "Neg", "Abs"]
    nodes = [helper.make_node(op, ["p"], [f"u{i}"]) for i, op in enumerate(un)]
    bins = ["Add", "Sub", "Mul", "Div", "Pow"]
    nodes += [helper.make_node(op, ["p", "b"], [f"b{i}"]) for i, op in enumerate(bins)]
    nodes += [
        helper.make_node("LeakyRelu", ["x"], ["lr"], alpha=0.2),
        helper.make_node("Clip", ["x", "lo", "hi"], ["cl"]),
        helper.make_node("Max", ["x", "p", "b"], ["mx"]),
        helper.make_node("Min", ["x", "b"], ["mn"]),
        helper.make_node("Sum", ["x", "p", "b"], ["sm"]),
        helper.make_node("Less", ["x", "b"], ["lt"]),
        helper.make_node("Where", ["lt", "x", "p"], ["wh"]),
        helper.make_node("Mul", ["x", "half"], ["sc"]),
    ]
    outs = [f"u{i}" for i in range(len(un))] + [f"b{i}" for i in range(len(bins))]
    outs += ["lr", "cl", "mx", "mn", "sm", "wh", "sc"]
    m = _model(
        nodes,
        [("x", F, s), ("p", F, s)],
        outs,
        {
            "b": _x(5, lo=0.5, hi=2.0),
            "lo": np.float32(-0.3),
            "hi": np.float32(0.4),
            "half": np.float32(0.5),
        },
    )
    _check(m, {"x": _x(*s), "p": _x(*s, lo=0.1, hi=2.0)})


def test_compare_and_gelu_opset20():
    nodes = [
        helper.make_node("Gelu", ["x"], ["g"]),
        helper.make_node("Gelu", ["x"], ["gt"], approximate="tanh"),
        helper.make_node("Equal", ["x", "y"], ["eq"]),
        helper.make_node("Greater", ["x", "y"], ["gr"]),
        helper.make_node("Cast", ["gr"], ["grf"], to=F),
        helper.make_node("Add", ["grf", "eqf"], ["cmp"]),
        helper.make_node("Cast", ["eq"], ["eqf"], to=F),
    ]
    nodes = nodes[:5] + [nodes[6], nodes[5]]
    m = _model(nodes, [("x", F, [4, 6]), ("y", F, [6])], ["g", "gt", "cmp"], opset=20)
    x = _x(4, 6)
    y = x[1].copy()
    _check(m, {"x": x, "y": y}, atol=1e-4)


@pytest.mark.parametrize("opset", [11, 18])
def test_reductions_and_softmax(opset):
    ax = {"axes": [1]} if opset < 18 else {}
    ins = ["x"] if opset < 18 else ["x", "ax"]
    nodes = [
        helper.make_node("ReduceSum", ["x"] + (["ax"] if opset >= 13 else []), ["rs"], **ax),
        helper.make_node("ReduceMean", ins, ["rm"], keepdims=0, **ax),
        helper.make_node("ReduceMax", ins, ["rx"], **ax),
        helper.make_node("ReduceMin", ins, ["rn"], **ax),
        # opset < 13 Softmax flattens dims axis.. (the reference evaluator does not): last axis
        helper.make_node("Softmax", ["x"], ["sm"], axis=1 if opset >= 13 else 2),
        helper.make_node("LogSoftmax", ["x"], ["ls"], axis=-1),
    ]
    if opset < 13:
        nodes[0] = helper.make_node("ReduceSum", ["x"], ["rs"], axes=[1])
    m = _model(
        nodes, [("x", F, [2, 3, 8])], ["rs", "rm", "rx", "rn", "sm", "ls"], {"ax": [1]}, opset
    )
    _check(m, {"x": _x(2, 3, 8)})


def test_matmul_gemm():
    nodes = [
        helper.make_node("MatMul", ["a", "w"], ["mm"]),
        helper.make_node("Gemm", ["mm", "w2", "c"], ["y"], transB=1, alpha=0.5, beta=2.0),
    ]
    m = _model(
        nodes,
        [("a", F, [4, 8])],
        ["y", "mm"],
        {"w": _x(8, 16), "w2": _x(6, 16), "c": _x(6)},
    )
    _check(m, {"a": _x(4, 8)})


def test_cnn_family():
    nodes = [
        helper.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node(
            "MaxPool", ["r"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "AveragePool", ["r"], ["ap"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1
        ),
        helper.make_node(
            "Conv", ["mp", "wg"], ["cg"], group=2, auto_pad="SAME_UPPER", kernel_shape=[2, 2]
        ),
        helper.make_node("GlobalAveragePool", ["cg"], ["gap"]),
        helper.make_node("Flatten", ["gap"], ["fl"]),
    ]
    m = _model(
        nodes,
        [("x", F, [1, 3, 9, 9])],
        ["fl", "ap", "mp"],
        {
            "w": _x(4, 3, 3, 3),
            "cb": _x(4),
            "wg": _x(4, 2, 2, 2),
        },
        opset=13,
    )
    _check(m, {"x": _x(1, 3, 9, 9)})


def test_layer_norm_lrn_batch_norm():
    nodes = [
        helper.make_node("BatchNormalization", ["img", "bs", "bb", "bmu", "bvar"], ["bn"]),
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1, epsilon=1e-5),
        helper.make_node("LRN", ["img"], ["lrn"], size=3, alpha=1e-3, beta=0.75, bias=1.0),
    ]
    bn = {"bs": _x(5), "bb": _x(5), "bmu": _x(5), "bvar": _x(5, lo=0.5, hi=1.5)}
    m = _model(
        nodes,
        [("x", F, [4, 16]), ("img", F, [1, 5, 3, 3])],
        ["ln", "lrn", "bn"],
        {"g": _x(16), "b": _x(16), **bn},
    )
    img = _x(1, 5, 3, 3)
    # onnx.reference's LRN only fills channel 0 and its BatchNormalization disagrees with the
    # spec formula: compare those two against numpy
    sq = np.stack([(img[:, max(0, c - 1) : c + 2] ** 2).sum(1) for c in range(5)], 1)
    lrn = img / (1.0 + (1e-3 / 3) * sq) ** 0.75
    r = lambda a: a.reshape(1, 5, 1, 1)  # noqa: E731
    bnv = (img - r(bn["bmu"])) / np.sqrt(r(bn["bvar"]) + 1e-5) * r(bn["bs"]) + r(bn["bb"])
    _check(m, {"x": _x(4, 16), "img": img}, expect={"lrn": lrn, "bn": bnv})


def test_layout_family_and_shape_folding():
    i64 = TensorProto.INT64
    nodes = [
        # Shape -> Gather -> Unsqueeze -> Concat -> Reshape: folded on the host
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Gather", ["sh", "zero"], ["n"], axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["nu"]),
        helper.make_node("Concat", ["nu", "m1"], ["shp"], axis=0),
        helper.make_node("Reshape", ["x", "shp"], ["flat"]),
        helper.make_node("Transpose", ["x"], ["tr"], perm=[0, 2, 1]),
        helper.make_node("Slice", ["x", "st", "en", "axs", "stp"], ["sl"]),
        helper.make_node("Split", ["x", "split"], ["sp0", "sp1"], axis=2),
        helper.make_node("Unsqueeze", ["sp1", "ax0"], ["us"]),
        helper.make_node("Squeeze", ["us", "ax0"], ["sq"]),
        helper.make_node("Concat", ["sq", "sp0"], ["cc"], axis=2),
        helper.make_node("Pad", ["x", "pads"], ["pd"], mode="constant"),
        helper.make_node("Pad", ["x", "pads"], ["pr"], mode="reflect"),
        helper.make_node("Pad", ["x", "pads"], ["pe"], mode="edge"),
        helper.make_node("Expand", ["row", "eshape"], ["ex"]),
        helper.make_node("Tile", ["x", "reps"], ["ti"]),
        helper.make_node(
            "ConstantOfShape", ["cshape"], ["ones"], value=helper.make_tensor("v", F, [1], [2.0])
        ),
        helper.make_node("Mul", ["ex", "ones"], ["exo"]),
        helper.make_node("Gather", ["x", "gidx"], ["ga"], axis=2),
        helper.make_node("Cast", ["x"], ["ci"], to=TensorProto.INT32),
        helper.make_node("Cast", ["ci"], ["cf"], to=F),
        helper.make_node("Identity", ["cf"], ["idn"]),
        helper.make_node("Dropout", ["idn"], ["dr"]),
    ]
    inits = {
        "zero": np.array(0, np.int64),
        "ax0": np.array([0], np.int64),
        "m1": np.array([-1], np.int64),
        "st": np.array([-1, 0], np.int64),
        "en": np.array([-100, 4], np.int64),
        "axs": np.array([2, 1], np.int64),
        "stp": np.array([-2, 2], np.int64),
        "split": np.array([2, 3], np.int64),
        "pads": np.array([0, 1, 2, 0, 2, 1], np.int64),
        "row": _x(1, 5),
        "eshape": np.array([3, 1], np.int64),
        "reps": np.array([1, 2, 1], np.int64),
        "cshape": np.array([3, 5], np.int64),
        "gidx": np.array([[4, 2], [0, -2]], np.int64),
    }
    m = _model(
        nodes,
        [("x", F, [2, 4, 5])],
        ["flat", "tr", "sl", "cc", "pd", "pr", "pe", "exo", "ti", "ga", "dr"],
        inits,
        opset=13,
    )
    del i64
    x = _x(2, 4, 5, lo=-3, hi=3)
    om = _check(m, {"x": x})
    assert len(om.inputs) == 1


def test_gather_runtime_indices():
    m = _model(
        [helper.make_node("Gather", ["table", "ids"], ["y"], axis=0)],
        [("ids", TensorProto.INT64, [2, 3])],
        ["y"],
        {"table": _x(7, 4)},
    )
    ids = np.array([[0, 6, 2], [3, -1, 5]], np.int64)
    _check(m, {"ids": ids})


# --------------------------------------------------------------------------- bad inputs


def test_corrupt_file_names_path(tmp_path):
    p = tmp_path / "broken.onnx"
    p.write_bytes(b"\x08\x07garbage\xff\xff\xff not a protobuf")
    with pytest.raises(PolyfuseError, match="broken.onnx"):
        po.load(str(p))
    with pytest.raises(PolyfuseError, match="does not exist"):
        po.load(str(tmp_path / "missing.onnx"))


def test_unsupported_ops_listed_with_counts():
    nodes = [
        helper.make_node("Unique", ["x"], ["v"]),
        helper.make_node("NonMaxSuppression", ["b", "s"], ["n1"]),
        helper.make_node("NonMaxSuppression", ["b", "s"], ["n2"]),
        helper.make_node("Relu", ["x"], ["y"]),
    ]
    m = _model(nodes, [("x", F, [4]), ("b", F, [1, 2, 4]), ("s", F, [1, 1, 2])], ["y"])
    m.graph.name = "m"
    with pytest.raises(UnsupportedOpError) as e:
        po.load(m)
    msg = str(e.value)
    assert msg == (
        "model 'm' uses unsupported ONNX operators: NonMaxSuppression x2 "
        "(#1 'NonMaxSuppression_n1', #2 'NonMaxSuppression_n2'), Unique x1 (#0 'Unique_v')"
    )


def test_dynamic_shape_needs_shapes():
    m = _model(
        [helper.make_node("Relu", ["x"], ["y"])], [("x", F, ["batch", 8])], ["y"], name="dyn"
    )
    with pytest.raises(PolyfuseError, match=r"input 'x'.*batch.*shapes="):
        po.load(m)
    om = po.load(m, shapes={"x": (3, 8)})
    assert om.inputs[0].shape == (3, 8)
    x = _x(3, 8)
    np.testing.assert_allclose(om.compile(check_cuda=False)(x), np.maximum(x, 0))


def test_folding_runs_before_the_unsupported_op_scan():
    # Mod has no runtime form here, but Mod(Constant, Constant) folds at import time
    c = helper.make_node("Constant", [], ["a"], value=numpy_helper.from_array(np.int64(7)))
    d = helper.make_node("Constant", [], ["b"], value=numpy_helper.from_array(np.int64(4)))
    nodes = [
        c,
        d,
        helper.make_node("Mod", ["a", "b"], ["r"]),
        helper.make_node("Cast", ["r"], ["rf"], to=F),
        helper.make_node("Mul", ["x", "rf"], ["y"]),
    ]
    assert not po.unsupported_ops(_model(nodes, [("x", F, [5])], ["y"]))
    _check(_model(nodes, [("x", F, [5])], ["y"]), {"x": _x(5)})


def test_attribute_inputs_from_graph_inputs_need_values():
    nodes = [helper.make_node("Unsqueeze", ["x", "axes"], ["y"])]
    m = _model(nodes, [("x", F, [3, 4]), ("axes", TensorProto.INT64, [2])], ["y"], opset=13)
    with pytest.raises(po.InputValueNeeded, match=r"node #0 'Unsqueeze_y'.*'axes'") as e:
        po.load(m)
    assert e.value.input_name == "axes"
    om = po.load(m, values={"axes": np.array([0, 3])})
    assert om.input_names == ["x"] and om.outputs[0].shape == (1, 3, 4, 1)


def test_errors_name_the_file_node_and_position(tmp_path):
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="first"),
        helper.make_node("Conv", ["r", "w"], ["y"], name="conv7", group=5),
    ]
    m = _model(nodes, [("x", F, [1, 4, 6, 6])], ["y"], inits={"w": _x(4, 4, 3, 3)})
    m.graph.name = "main_graph"
    p = tmp_path / "net.onnx"
    onnx.save(m, str(p))
    with pytest.raises(PolyfuseError) as e:
        po.load(str(p))
    msg = str(e.value)
    assert msg.startswith("model 'net.onnx', node #1 'conv7' (Conv): ") and "main_graph" not in msg


def test_flatten_negative_axis():
    x = _x(2, 3, 4, 5)
    for ax in (-1, -3):
        nodes = [helper.make_node("Flatten", ["x"], ["y"], axis=ax)]
        om = _check(_model(nodes, [("x", F, [2, 3, 4, 5])], ["y"]), {"x": x})
        assert om.outputs[0].shape == x.reshape(int(np.prod(x.shape[: 4 + ax])), -1).shape


def test_zero_d_tensors_stay_zero_d():
    nodes = [helper.make_node("Pow", ["x", "e"], ["y"])]
    m = _model(nodes, [("x", F, [3]), ("e", F, [])], ["y"])
    om = po.load(m)
    assert om.inputs[1].shape == ()
    from polyfuse.onnx.backend import PolyfuseBackend

    (y,) = PolyfuseBackend.prepare(m).run([np.array([1, 2, 3], np.float32), np.float32(2.0)])
    np.testing.assert_allclose(y, [1, 4, 9])


def test_layer_norm_mean_and_inv_std_dev_outputs():
    nodes = [helper.make_node("LayerNormalization", ["x", "g", "b"], ["y", "m", "r"], axis=-2)]
    m = _model(nodes, [("x", F, [2, 3, 4])], ["y", "m", "r"], inits={"g": _x(3, 4), "b": _x(3, 4)})
    om = _check(m, {"x": _x(2, 3, 4)})
    assert [o.shape for o in om.outputs] == [(2, 3, 4), (2, 1, 1), (2, 1, 1)]


def test_empty_inputs_and_slices_are_host_constants():
    nodes = [
        helper.make_node("Slice", ["x", "s", "e"], ["y"]),
        helper.make_node("ReduceSum", ["z"], ["r"], keepdims=1),
    ]
    m = _model(
        nodes,
        [("x", F, [4]), ("z", F, [2, 0])],
        ["y", "r"],
        inits={"s": np.array([5]), "e": np.array([9])},
        opset=13,
    )
    om = po.load(m)
    assert om.input_names == ["x"]
    assert om.constant_outputs["y"].shape == (0,)
    np.testing.assert_array_equal(om.constant_outputs["r"], np.zeros((1, 1)))


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


def test_cast_to_narrow_float_types_is_refused():
    # float32 -> float8 -> float32 mid-graph would silently skip the float8 rounding
    nodes = [
        helper.make_node("Cast", ["x"], ["c"], to=TensorProto.FLOAT8E4M3FN),
        helper.make_node("Cast", ["c"], ["y"], to=F),
    ]
    with pytest.raises(UnsupportedOpError, match="node #0 .*float8"):
        po.load(_model(nodes, [("x", F, [4])], ["y"]))
