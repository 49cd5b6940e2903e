"""ONNX integer and boolean tensors (issue 22 item 4): int32/int64/bool inputs, initializers and
results are te tensors of their dtype, operators give ONNX's output dtype, and results are
exact — compared for equality with onnxruntime where it is installed (an optional
cross-check) and the ONNX reference evaluator otherwise and where onnxruntime's behaviour is
undefined, with values beyond float32's 2**24 that the float32
representation of integers rounded before. Integer ``Div`` truncates toward zero, ``Mod``
follows ``fmod``, ``Cast`` truncates floats and wraps integers; a result a handler could
only compute in floats is refused with the node and dtype named.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyfuse.onnx as po  # noqa: E402
from polyfuse.errors import UnsupportedOpError  # noqa: E402
from polyfuse.onnx.backend import PolyfuseBackend  # noqa: E402

ELEM = {
    "int32": TensorProto.INT32,
    "int64": TensorProto.INT64,
    "bool": TensorProto.BOOL,
    "int8": TensorProto.INT8,
    "uint8": TensorProto.UINT8,
    "uint64": TensorProto.UINT64,
    "float32": TensorProto.FLOAT,
}
BIG = 2**40 + 1  # float32 holds integers exactly only up to 2**24
rng = np.random.default_rng(22)


def _model(nodes, inputs, outputs, inits=None, opset=18):
    """``inputs``/``outputs``: (name, dtype name, shape); ``inits``: name -> array."""
    g = helper.make_graph(
        nodes,
        "ints",
        [helper.make_tensor_value_info(n, ELEM[d], s) for n, d, s in inputs],
        [helper.make_tensor_value_info(n, ELEM[d], s) for n, d, s in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _expected(model, feeds, oracle):
    """The oracle's outputs: onnxruntime where ``oracle`` is "ort" and it is installed (an
    optional cross-check), else the ONNX reference evaluator, which agrees on every case here."""
    if oracle == "ort" and importlib.util.find_spec("onnxruntime") is not None:
        import onnxruntime as ort
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return sess.run(None, feeds)
    return ReferenceEvaluator(model).run(None, feeds)


def _check(model, feeds, oracle="ort"):
    """Run through polyfuse (import, compile, emulate) and compare every output for equality
    (values and dtype) with ``oracle``; return the imported model."""
    got = PolyfuseBackend.prepare(model, "CPU").run(feeds)
    want = _expected(model, feeds, oracle)
    for o, g, w in zip(model.graph.output, got, want, strict=True):
        g, w = np.asarray(g), np.asarray(w)
        assert g.dtype == w.dtype, (o.name, g.dtype, w.dtype)
        np.testing.assert_array_equal(g, w, err_msg=o.name)
    return po.load(model)


def _ints(dtype, shape, lo=-50, hi=50):
    return rng.integers(lo, hi, size=shape).astype(dtype)


# --------------------------------------------------------------------- storage and exactness


def test_int_tensors_are_te_tensors_of_their_dtype():
    m = _model(
        [
            helper.make_node("Add", ["a", "b"], ["s"]),
            helper.make_node("Less", ["a", "b"], ["lt"]),
            helper.make_node("Add", ["c", "k"], ["t"]),
        ],
        [("a", "int64", [3]), ("b", "int64", [3]), ("c", "int32", [3])],
        [("s", "int64", [3]), ("lt", "bool", [3]), ("t", "int32", [3])],
        {"k": np.array([1, 2, 3], np.int32)},
    )
    om = po.load(m)
    assert [t.dtype for t in om.inputs] == ["int64", "int64", "int32"]
    assert [t.dtype for t in om.outputs] == ["int64", "bool", "int32"]
    assert {t.dtype for t in om.constants} == {"int32"}


def test_int64_beyond_2_24_round_trips_exactly():
    # Add / Mul / Gather (run-time indices) / Where / Concat of int64 values near 2**40: the
    # float32 representation rounded 2**40 + 1 to 2**40 (and the products further)
    a = np.array([BIG, -BIG, 2**53 + 3, 7], np.int64)
    b = np.array([3, BIG + 2, -5, -(2**45) - 1], np.int64)
    idx = np.array([3, 0, 2, 1, 0], np.int64)
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Mul", ["a", "three"], ["p"]),
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=0),
        helper.make_node("Greater", ["a", "b"], ["gt"]),
        helper.make_node("Where", ["gt", "a", "b"], ["w"]),
        helper.make_node("Concat", ["w", "p", "g"], ["c"], axis=0),
    ]
    m = _model(
        nodes,
        [("a", "int64", [4]), ("b", "int64", [4]), ("idx", "int64", [5])],
        [("s", "int64", [4]), ("g", "int64", [5]), ("w", "int64", [4]), ("c", "int64", [13])],
        {"three": np.array(3, np.int64)},
    )
    _check(m, {"a": a, "b": b, "idx": idx})
    got = PolyfuseBackend.prepare(m, "CPU").run({"a": a, "b": b, "idx": idx})
    assert got[0][0] == BIG + 3 and got[3][4] == 3 * BIG  # spelled out: not float32-rounded


# --------------------------------------------------------------------- operator families


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_arithmetic_family(dt):
    ops_ = ["Add", "Sub", "Mul", "Max", "Min"]
    nodes = [helper.make_node(op, ["a", "b"], [op.lower()]) for op in ops_]
    nodes += [
        helper.make_node("Neg", ["a"], ["neg"]),
        helper.make_node("Abs", ["a"], ["abs"]),
        helper.make_node("Sign", ["a"], ["sign"]),
        helper.make_node("Relu", ["a"], ["relu"]),
        helper.make_node("Clip", ["a", "lo", "hi"], ["clip"]),
        helper.make_node("Pow", ["a", "e"], ["pow"]),
        helper.make_node("Add", ["a", "one"], ["inc"]),  # a scalar initializer stays an int
    ]
    outs = [o for n in nodes for o in n.output]
    m = _model(
        nodes,
        [("a", dt, [2, 6]), ("b", dt, [6])],
        [(o, dt, None) for o in outs],
        {
            "lo": np.array(-20, dt),
            "hi": np.array(30, dt),
            "e": np.array(3, dt),
            "one": np.array(1, dt),
        },
    )
    _check(m, {"a": _ints(dt, (2, 6)), "b": _ints(dt, (6,))})


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_variadic_sum_max_of_ints(dt):
    # onnxruntime has no integer Sum: the reference evaluator is the oracle
    nodes = [helper.make_node(op, ["a", "b", "c"], [op.lower()]) for op in ("Sum", "Max", "Min")]
    m = _model(nodes, [(n, dt, [5]) for n in "abc"], [(n.output[0], dt, [5]) for n in nodes])
    big = BIG if dt == "int64" else 2**30
    feeds = {"a": np.array([big, -big, 1, 2, 3], dt), "b": _ints(dt, (5,)), "c": _ints(dt, (5,))}
    _check(m, feeds, oracle="reference")


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_comparison_and_logic_family(dt):
    nodes = [
        helper.make_node(op, ["a", "b"], [op.lower()])
        for op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual")
    ]
    nodes += [
        helper.make_node("And", ["less", "equal"], ["and"]),
        helper.make_node("Or", ["less", "equal"], ["or"]),
        helper.make_node("Xor", ["less", "greater"], ["xor"]),
        helper.make_node("Not", ["less"], ["not"]),
        helper.make_node("Where", ["less", "a", "b"], ["where"]),
    ]
    outs = [(o, "bool", None) for n in nodes[:-1] for o in n.output] + [("where", dt, None)]
    m = _model(nodes, [("a", dt, [3, 4]), ("b", dt, [4])], outs)
    a = _ints(dt, (3, 4), -3, 3)
    _check(m, {"a": a, "b": a[0].copy()})


@pytest.mark.parametrize(
    "dt", ["int32", "int64"]
)
def test_div_truncates_toward_zero_and_mod_in_both_modes(dt):
    # negative operands in every sign combination; run-time divisors and a constant one
    a = np.array([7, -7, 7, -7, 0, 13, -13, 1, -1, 100], dt)
    b = np.array([2, 2, -2, -2, 3, -5, 5, 7, 7, -9], dt)
    nodes = [
        helper.make_node("Div", ["a", "b"], ["div"]),
        helper.make_node("Mod", ["a", "b"], ["mod"], fmod=0),
        helper.make_node("Mod", ["a", "b"], ["fmod"], fmod=1),
        helper.make_node("Div", ["a", "c"], ["divc"]),
        helper.make_node("Mod", ["a", "c"], ["modc"], fmod=0),
        helper.make_node("Mod", ["a", "c"], ["fmodc"], fmod=1),
    ]
    outs = [(o, dt, [10]) for n in nodes for o in n.output]
    m = _model(nodes, [("a", dt, [10]), ("b", dt, [10])], outs, {"c": np.array(-3, dt)})
    _check(m, {"a": a, "b": b})
    got = PolyfuseBackend.prepare(m, "CPU").run({"a": a, "b": b})
    assert got[0][:4].tolist() == [3, -3, -3, 3]  # truncation, not floor (-4, 4)
    assert got[1][:4].tolist() == [1, 1, -1, -1]  # the divisor's sign
    assert got[2][:4].tolist() == [1, -1, 1, -1]  # the dividend's sign


def test_int64_div_mod_exact_beyond_2_53():
    # run-time int64 divisors: float64 alone would round these operands
    a = np.array([2**62 + 7, -(2**62) - 9, 2**53 + 1, -(2**63), 2**63 - 1, BIG, -BIG, 5], np.int64)
    b = np.array([3, -7, 2, 2**62, -(2**62) - 1, -(2**20) - 3, 2**40, -(2**63)], np.int64)
    nodes = [
        helper.make_node("Div", ["a", "b"], ["div"]),
        helper.make_node("Mod", ["a", "b"], ["mod"], fmod=0),
        helper.make_node("Mod", ["a", "b"], ["fmod"], fmod=1),
    ]
    outs = [(n.output[0], "int64", [8]) for n in nodes]
    m = _model(nodes, [("a", "int64", [8]), ("b", "int64", [8])], outs)
    _check(m, {"a": a, "b": b}, oracle="reference")


def test_int_division_by_zero_is_zero_as_the_reference():
    nodes = [
        helper.make_node("Div", ["a", "b"], ["div"]),
        helper.make_node("Mod", ["a", "b"], ["mod"]),
        helper.make_node("Mod", ["a", "b"], ["fmod"], fmod=1),
    ]
    m = _model(
        nodes,
        [("a", "int32", [3]), ("b", "int32", [3])],
        [(n.output[0], "int32", [3]) for n in nodes],
    )
    a, b = np.array([5, -5, 0], np.int32), np.array([0, 0, 0], np.int32)
    with np.errstate(all="ignore"):
        _check(m, {"a": a, "b": b}, oracle="reference")


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_cast_family(dt):
    x = np.array([-2.7, -0.5, 0.0, 0.9, 2.5, 3.99, -7.01, 100.2], np.float32)
    i = np.array([-129, 128, 255, -1, 0, 300, 2**15 + 3, -(2**15) - 5], dt)
    nodes = [
        helper.make_node("Cast", ["x"], ["f2i"], to=ELEM[dt]),  # truncation toward zero
        helper.make_node("Cast", ["i"], ["i2f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["i"], ["i2b"], to=TensorProto.BOOL),
        helper.make_node("Cast", ["i2b"], ["b2i"], to=ELEM[dt]),
        helper.make_node("Cast", ["i"], ["i2i8"], to=TensorProto.INT8),  # wraps
        helper.make_node("Cast", ["i"], ["i2u8"], to=TensorProto.UINT8),  # wraps
        helper.make_node("CastLike", ["x", "i"], ["like"]),
    ]
    outs = [
        ("f2i", dt, None),
        ("i2f", "float32", None),
        ("i2b", "bool", None),
        ("b2i", dt, None),
        ("i2i8", "int8", None),
        ("i2u8", "uint8", None),
        ("like", dt, None),
    ]
    m = _model(nodes, [("x", "float32", [8]), ("i", dt, [8])], outs)
    _check(m, {"x": x, "i": i})
    got = PolyfuseBackend.prepare(m, "CPU").run({"x": x, "i": i})
    assert got[0].tolist() == [-2, 0, 0, 0, 2, 3, -7, 100]


def test_cast_int64_to_int32_wraps_and_back():
    x = np.array([2**31 + 5, -(2**31) - 1, BIG, -3], np.int64)
    nodes = [
        helper.make_node("Cast", ["x"], ["n"], to=TensorProto.INT32),
        helper.make_node("Cast", ["n"], ["w"], to=TensorProto.INT64),
    ]
    m = _model(nodes, [("x", "int64", [4])], [("n", "int32", [4]), ("w", "int64", [4])])
    _check(m, {"x": x})


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_reduction_family(dt):
    nodes = [
        helper.make_node("ReduceSum", ["x", "ax1"], ["sum"], keepdims=0),
        helper.make_node("ReduceMax", ["x", "ax1"], ["max"], keepdims=1),
        helper.make_node("ReduceMin", ["x", "ax0"], ["min"], keepdims=0),
        helper.make_node("ReduceMean", ["x", "ax1"], ["mean"], keepdims=0),  # truncates
        helper.make_node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0),
        helper.make_node("ArgMin", ["x"], ["argmin"], axis=0, keepdims=1, select_last_index=1),
        helper.make_node("CumSum", ["x", "cax"], ["cumsum"]),
        helper.make_node("TopK", ["x", "k"], ["topv", "topi"], axis=1),
    ]
    outs = [
        ("sum", dt, None),
        ("max", dt, None),
        ("min", dt, None),
        ("mean", dt, None),
        ("argmax", "int64", None),
        ("argmin", "int64", None),
        ("cumsum", dt, None),
        ("topv", dt, None),
        ("topi", "int64", None),
    ]
    inits = {
        "ax1": np.array([1], np.int64),
        "ax0": np.array([0], np.int64),
        "cax": np.array(1, np.int64),
        "k": np.array([2], np.int64),
    }
    m = _model(nodes, [("x", dt, [3, 5])], outs, inits)
    x = _ints(dt, (3, 5), -9, 9)
    x[0, 1] = x[0, 3] = 20  # ties: the first (last) index
    _check(m, {"x": x})


def test_int64_reduce_sum_beyond_2_24():
    x = np.array([[BIG, 1, 2**35], [-BIG, 2**50, 3]], np.int64)
    m = _model(
        [helper.make_node("ReduceSum", ["x", "ax"], ["s"], keepdims=0)],
        [("x", "int64", [2, 3])],
        [("s", "int64", [2])],
        {"ax": np.array([1], np.int64)},
    )
    _check(m, {"x": x})


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_layout_family(dt):
    nodes = [
        helper.make_node("Gather", ["x", "idx"], ["gather"], axis=1),
        helper.make_node("Gather", ["x", "cidx"], ["gatherc"], axis=0),  # constant indices
        helper.make_node("Slice", ["x", "st", "en", "axs"], ["slice"]),
        helper.make_node("Concat", ["x", "x"], ["concat"], axis=0),
        helper.make_node("Reshape", ["x", "shp"], ["reshape"]),
        helper.make_node("Transpose", ["x"], ["transpose"], perm=[1, 0]),
        helper.make_node("Expand", ["row", "eshp"], ["expand"]),
        helper.make_node("Pad", ["x", "pads", "pv"], ["pad"]),
        helper.make_node("Tile", ["row", "reps"], ["tile"]),
        helper.make_node("Unsqueeze", ["row", "ax0"], ["unsq"]),
    ]
    inits = {
        "cidx": np.array([2, 0, 2], np.int64),
        "st": np.array([1], np.int64),
        "en": np.array([4], np.int64),
        "axs": np.array([1], np.int64),
        "shp": np.array([4, -1], np.int64),
        "eshp": np.array([3, 4], np.int64),
        "pads": np.array([1, 0, 0, 2], np.int64),
        "pv": np.array(-7, dt),
        "reps": np.array([3], np.int64),
        "ax0": np.array([0], np.int64),
    }
    outs = [(o, dt, None) for n in nodes for o in n.output]
    m = _model(nodes, [("x", dt, [3, 4]), ("idx", "int64", [2, 2]), ("row", dt, [4])], outs, inits)
    x = _ints(dt, (3, 4))
    if dt == "int64":
        x[1, 2] = BIG
    feeds = {"x": x, "idx": np.array([[3, -1], [0, 1]], np.int64), "row": _ints(dt, (4,))}
    _check(m, feeds)


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_onehot_and_gathernd_with_int_tensors(dt):
    nodes = [
        helper.make_node("OneHot", ["ids", "depth", "vals"], ["oh"], axis=-1),
        helper.make_node("GatherND", ["x", "nd"], ["gnd"]),
    ]
    m = _model(
        nodes,
        [("ids", "int64", [4]), ("x", dt, [3, 4]), ("nd", "int64", [2, 2])],
        [("oh", dt, None), ("gnd", dt, None)],
        {"depth": np.array(5, np.int64), "vals": np.array([-BIG if dt == "int64" else -9, 4], dt)},
        opset=13,
    )
    feeds = {
        "ids": np.array([0, 4, -1, 2], np.int64),
        "x": _ints(dt, (3, 4)),
        "nd": np.array([[2, 3], [0, -1]], np.int64),
    }
    _check(m, feeds, oracle="reference")


@pytest.mark.parametrize("dt", ["int8", "uint8"])
def test_narrow_int_arithmetic_wraps_before_a_comparison(dt):
    # int8/uint8 are held in int32; 100 + 100 must be int8's -56 (uint8's 200 - 250 = 206)
    # when the next node compares or divides it, not 200 (-50)
    nodes = [
        helper.make_node("Add", ["a", "b"], ["s"]),
        helper.make_node("Sub", ["a", "b"], ["d"]),
        helper.make_node("Mul", ["a", "b"], ["p"]),
        helper.make_node("Greater", ["s", "z"], ["gs"]),
        helper.make_node("Greater", ["d", "z"], ["gd"]),
        helper.make_node("Div", ["p", "three"], ["q"]),
    ]
    outs = [("s", dt, [4]), ("gs", "bool", [4]), ("gd", "bool", [4]), ("q", dt, [4])]
    inits = {"z": np.array(0, dt), "three": np.array(3, dt)}
    m = _model(nodes, [("a", dt, [4]), ("b", dt, [4])], outs, inits)
    a = np.array([100, 120, 5, 60], dt)
    b = np.array([100, 120, 7, 3], dt)
    _check(m, {"a": a, "b": b}, oracle="reference")


@pytest.mark.parametrize("dt", ["int32", "int64"])
def test_matmul_of_ints_is_exact(dt):
    m = _model(
        [helper.make_node("MatMul", ["a", "b"], ["y"])],
        [("a", dt, [3, 4]), ("b", dt, [4, 5])],
        [("y", dt, [3, 5])],
    )
    a = _ints(dt, (3, 4), -1000, 1000)
    if dt == "int64":
        a[0, 0] = BIG
    _check(m, {"a": a, "b": _ints(dt, (4, 5))})


def test_maxpool_of_uint8_is_exact_in_its_dtype():
    x = rng.integers(0, 256, size=(1, 2, 5, 5)).astype(np.uint8)
    m = _model(
        [helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 0, 0])],
        [("x", "uint8", [1, 2, 5, 5])],
        [("y", "uint8", None)],
    )
    # numpy oracle (the ONNX reference pads uint8 with NaN): padding never wins the max
    pad = np.pad(x.astype(np.int32), ((0, 0), (0, 0), (1, 0), (1, 0)), constant_values=-1)
    want = np.max([pad[:, :, di : di + 5, dj : dj + 5] for di in (0, 1) for dj in (0, 1)], 0)
    (got,) = PolyfuseBackend.prepare(m, "CPU").run({"x": x})
    assert got.dtype == np.uint8
    np.testing.assert_array_equal(got, want.astype(np.uint8))


# --------------------------------------------------------------------- refusals


def test_int_result_computed_in_floats_is_refused_naming_node_and_dtype():
    # ReduceL2 of int64 takes a float sqrt: the result would be exact only to 2**24
    m = _model(
        [helper.make_node("ReduceL2", ["x"], ["y"], name="l2", keepdims=0)],
        [("x", "int64", [2, 3])],
        [("y", "int64", None)],
    )
    with pytest.raises(UnsupportedOpError, match=r"node #0 'l2' \(ReduceL2\).*int64.*float32"):
        po.load(m)


def test_uint64_from_2_63_keeps_its_unsigned_order_and_division():
    # uint64 is held in int64 (same bits): values from 2**63 read as negative unless ordered
    # operators flip the top bit, Div/Mod divide unsigned and Cast converts unsigned
    ops_ = ["Div", "Mod", "Less", "Greater", "GreaterOrEqual", "Max", "Min", "Add", "Sub"]
    nodes = [helper.make_node(o, ["a", "b"], [o.lower()]) for o in ops_]
    nodes += [
        helper.make_node("Cast", ["a"], ["f64"], to=TensorProto.DOUBLE),
        helper.make_node("Cast", ["a"], ["f32"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["h"], ["back"], to=TensorProto.UINT64),
        helper.make_node("ArgMax", ["a"], ["am"], axis=0, keepdims=0),
        helper.make_node("ReduceMax", ["a"], ["rmax"], keepdims=0),
        helper.make_node("TopK", ["a", "k"], ["tv", "ti"]),
        helper.make_node("Sign", ["a"], ["sign"]),
    ]
    u, b_ = TensorProto.UINT64, TensorProto.BOOL
    types = {"less": b_, "greater": b_, "greaterorequal": b_, "f64": TensorProto.DOUBLE}
    types.update({"f32": TensorProto.FLOAT, "am": TensorProto.INT64, "ti": TensorProto.INT64})
    outs = [o for n in nodes for o in n.output]
    g = helper.make_graph(
        nodes,
        "u64",
        [
            helper.make_tensor_value_info("a", u, [12]),
            helper.make_tensor_value_info("b", u, [12]),
            helper.make_tensor_value_info("h", TensorProto.DOUBLE, [4]),
        ],
        [helper.make_tensor_value_info(o, types.get(o, u), None) for o in outs],
        [numpy_helper.from_array(np.array([3], np.int64), "k")],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    a = np.array(
        [2**64 - 1, 2**63, 2**63 + 5, 7, 2**63 - 1, 0, 2**64 - 3, 12345678901234567890]
        + [9, 2**63, 1, 2**53 + 1],
        np.uint64,
    )
    b = np.array(
        [3, 2**63 + 1, 2, 2**64 - 1, 2**63, 5, 2**62, 98765, 1, 2**63, 2**64 - 1, 2], np.uint64
    )
    h = np.array([2.0**63, 2.0**64 - 2048, 3.0, 2.0**63 + 4096], np.float64)
    _check(m, {"a": a, "b": b, "h": h}, oracle="reference")


def test_uint64_op_reading_values_as_signed_is_refused():
    m = _model(
        [helper.make_node("ReduceMean", ["x"], ["y"], name="mean", keepdims=0)],
        [("x", "uint64", [4])],
        [("y", "uint64", None)],
    )
    with pytest.raises(UnsupportedOpError, match=r"'mean'.*uint64"):
        po.load(m)


def test_loop_body_over_int64_values_is_exact():
    # a vectorised Loop (independent iterations): the int64 iteration index times a captured
    # int64 tensor beyond 2**24, truncating Div by (it + 1) and a sum, per iteration
    i64 = TensorProto.INT64
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "it"], ["p"]),
            helper.make_node("Add", ["it", "one"], ["it1"]),
            helper.make_node("Div", ["x", "it1"], ["q"]),
            helper.make_node("ReduceSum", ["q"], ["s"], keepdims=1),  # (1,): vstack-able
            helper.make_node("Identity", ["c"], ["c_out"]),
        ],
        "body",
        [helper.make_tensor_value_info("it", i64, []), helper.make_tensor_value_info("c", 9, [])],
        [helper.make_tensor_value_info("c_out", 9, [])]
        + [helper.make_tensor_value_info(n, i64, None) for n in ("p", "q", "s")],
    )
    loop = helper.make_node("Loop", ["M", "cond"], ["P", "Q", "S"], body=body)
    m = _model(
        [loop],
        [("x", "int64", [3])],
        [(n, "int64", None) for n in ("P", "Q", "S")],
        {"M": np.array(4, np.int64), "one": np.array(1, np.int64), "cond": np.array(True)},
        opset=13,
    )
    _check(m, {"x": np.array([BIG, -BIG - 6, 2**50 + 3], np.int64)}, oracle="reference")
