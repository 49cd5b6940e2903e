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
