"""ONNX front end with dtypes (issue 22 item 4): float16 and bfloat16 inputs, initializers,
constants and outputs import as te tensors of that dtype, operators keep their operand dtype,
``Cast``/``CastLike`` follow ONNX, float64 is imported and compiled as float64
(never downcast), and a wrong input dtype is a CallError naming the input. Results are
compared with float64 numpy at the per-dtype tolerance (:func:`polyfuse.graph.dtypes.tolerance`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import polyfuse.onnx  # noqa: E402
from polyfuse.errors import CallError  # noqa: E402
from polyfuse.graph.dtypes import tolerance  # noqa: E402
from polyfuse.onnx.backend import PolyfuseBackend  # noqa: E402
from polyfuse.onnx.conformance import _table, case_dtypes, column_of, run_case  # noqa: E402

ELEM = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
NP = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}


def _model(nodes, inputs, outputs, inits=(), opset=18):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem, shape):
    return helper.make_tensor_value_info(name, elem, shape)


def _init(name, arr):
    if arr.dtype == ml_dtypes.bfloat16:  # numpy_helper wants the bits for bfloat16
        t = helper.make_tensor(
            name, TensorProto.BFLOAT16, arr.shape, arr.astype(np.float32).ravel()
        )
        return t
    return numpy_helper.from_array(arr, name)


def _check(got, want64, dtype):
    assert got.dtype == NP[dtype]
    g = np.asarray(got).astype(np.float64)
    assert tolerance(dtype).allclose(g, want64), float(np.abs(g - want64).max())


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_mlp_block_keeps_its_dtype(dtype):
    # MatMul + Add (initializers of the dtype) + Relu, then Softmax: every te tensor is 16-bit
    rng = np.random.default_rng(0)
    e = ELEM[dtype]
    w = rng.standard_normal((8, 6)).astype(NP[dtype])
    b = rng.standard_normal((6,)).astype(NP[dtype])
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Softmax", ["r"], ["y"], axis=-1),
    ]
    m = _model(nodes, [_vi("x", e, [4, 8])], [_vi("y", e, [4, 6])], [_init("w", w), _init("b", b)])
    om = polyfuse.onnx.load(m)
    assert [t.dtype for t in om.inputs] == [dtype]
    assert {t.dtype for t in om.constants} == {dtype}
    assert [t.dtype for t in om.outputs] == [dtype]
    x = rng.standard_normal((4, 8)).astype(NP[dtype])
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x])
    a = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + b.astype(np.float64), 0)
    want = np.exp(a - a.max(-1, keepdims=True))
    _check(y, want / want.sum(-1, keepdims=True), dtype)


def test_float16_layer_norm_and_long_sum_accumulate_in_float32():
    # a 4096-long float16 sum of ones is 4096 (a float16 running sum stalls at 2048)
    n = 4096
    nodes = [
        helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], axis=-1),
    ]
    e = TensorProto.FLOAT16
    g = np.full((n,), 1.5, np.float16)
    b = np.full((n,), 0.25, np.float16)
    m = _model(
        nodes,
        [_vi("x", e, [2, n])],
        [_vi("s", e, [2]), _vi("ln", e, [2, n])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes"), _init("g", g), _init("b", b)],
    )
    x = np.ones((2, n), np.float16)
    x[1] = np.linspace(-2, 2, n).astype(np.float16)
    s, ln = PolyfuseBackend.prepare(m, "CPU").run([x])
    x64 = x.astype(np.float64)
    assert s[0] == 4096.0
    _check(s, x64.sum(-1), "float16")
    mu, var = x64.mean(-1, keepdims=True), x64.var(-1, keepdims=True)
    _check(ln, (x64 - mu) / np.sqrt(var + 1e-5) * 1.5 + 0.25, "float16")


def test_float16_conv_keeps_its_dtype():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((3, 2, 3, 3)).astype(np.float16)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    e = TensorProto.FLOAT16
    m = _model([node], [_vi("x", e, [1, 2, 5, 5])], [_vi("y", e, [1, 3, 5, 5])], [_init("w", w)])
    om = polyfuse.onnx.load(m)
    assert om.outputs[0].dtype == "float16"
    x = rng.standard_normal((1, 2, 5, 5)).astype(np.float16)
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x])
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    want = np.zeros((1, 3, 5, 5))
    for o in range(3):
        for i in range(5):
            for j in range(5):
                want[0, o, i, j] = (xp[0, :, i : i + 3, j : j + 3] * w[o].astype(np.float64)).sum()
    _check(y, want, "float16")


@pytest.mark.parametrize("to", ["float16", "bfloat16"])
def test_runtime_cast_rounds_to_nearest_even(to):
    node = helper.make_node("Cast", ["x"], ["y"], to=ELEM[to])
    m = _model([node], [_vi("x", TensorProto.FLOAT, [6])], [_vi("y", ELEM[to], [6])])
    om = polyfuse.onnx.load(m)
    assert om.outputs[0].dtype == to
    x = np.array([1.0009766, 1 + 2**-11, 3.14159, -7.7e4, 1e-8, np.inf], np.float32)
    if to == "bfloat16":
        x = np.array([1.00390625, 1 + 2**-8, 3.14159, -3.3e38, 1e-8, np.inf], np.float32)
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x])
    assert y.dtype == NP[to]
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(NP[to]).astype(np.float32))


def test_castlike_takes_a_runtime_tensors_dtype():
    nodes = [helper.make_node("CastLike", ["x", "like"], ["y"])]
    m = _model(
        nodes,
        [_vi("x", TensorProto.FLOAT, [3]), _vi("like", TensorProto.BFLOAT16, [1])],
        [_vi("y", TensorProto.BFLOAT16, [3])],
    )
    om = polyfuse.onnx.load(m)
    assert om.outputs[0].dtype == "bfloat16"
    x = np.array([1.0, 2.0 + 2**-7, -0.3], np.float32)
    like = np.zeros(1, ml_dtypes.bfloat16)
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x, like])
    np.testing.assert_array_equal(y, x.astype(ml_dtypes.bfloat16))


def test_cast_to_float64_at_run_time_compiles_to_a_double_kernel():
    node = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.DOUBLE)
    m = _model([node], [_vi("x", TensorProto.FLOAT, [3])], [_vi("y", TensorProto.DOUBLE, [3])])
    assert polyfuse.onnx.load(m).outputs[0].dtype == "float64"  # not downcast
    x = np.array([0.1, -2.5, 3e38], np.float32)
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x])
    assert y.dtype == np.float64
    np.testing.assert_array_equal(y, x.astype(np.float64))


def test_casts_of_constants_fold_to_any_dtype():
    # float64 and int64 constants cast on the host: only the float16 result reaches run time
    c = numpy_helper.from_array(np.array([0.1, 2.5, -3.75], np.float64), "c")
    nodes = [
        helper.make_node("Cast", ["c"], ["ci"], to=TensorProto.INT64),
        helper.make_node("Cast", ["ci"], ["ch"], to=TensorProto.FLOAT16),
        helper.make_node("Add", ["x", "ch"], ["y"]),
    ]
    e = TensorProto.FLOAT16
    m = _model(nodes, [_vi("x", e, [3])], [_vi("y", e, [3])], [c])
    x = np.array([1.0, 1.0, 1.0], np.float16)
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([x])
    np.testing.assert_array_equal(y, np.array([1.0, 3.0, -2.0], np.float16))


def test_float64_model_computes_in_float64_not_downcast():
    node = helper.make_node("Add", ["a", "b"], ["y"])
    d = TensorProto.DOUBLE
    m = _model([node], [_vi("a", d, [3]), _vi("b", d, [3])], [_vi("y", d, [3])])
    om = polyfuse.onnx.load(m)
    assert [t.dtype for t in om.inputs] == ["float64", "float64"]
    a, b = np.array([0.1, 1e-300, 1.0]), np.array([0.2, 1e300, 2**-40])
    (y,) = PolyfuseBackend.prepare(m, "CPU").run([a, b])
    assert y.dtype == np.float64 and np.array_equal(y, a + b)  # float32 would lose all three


def test_wrong_input_dtype_is_a_call_error_naming_the_input():
    node = helper.make_node("Relu", ["x"], ["y"])
    e = TensorProto.FLOAT16
    rep = PolyfuseBackend.prepare(_model([node], [_vi("x", e, [4])], [_vi("y", e, [4])]), "CPU")
    with pytest.raises(CallError, match="x"):
        rep.run([np.ones(4, np.float32)])


def test_compile_binds_16_bit_constants_in_their_dtype():
    # regression: polyfuse.compile stored every constant as float32, so a float16 constant
    # placeholder met its kernel's __half pointer with a float32 buffer (CallError at run)
    from polyfuse import te

    x = te.placeholder((4,), "float16", "x")
    c = te.placeholder((4,), "bfloat16", "c")
    y = te.compute((4,), lambda i: te.cast(x[i] * c[i], "float16"), name="y")
    cv = np.array([0.5, 2.0, -1.0, 3.0], np.float32)  # converted to the placeholder's dtype
    fn = polyfuse.compile([x], [y], constants={c: cv})
    got = fn(np.array([1.0, 2.0, 3.0, 4.0], np.float16))
    np.testing.assert_array_equal(got, np.array([0.5, 4.0, -3.0, 12.0], np.float16))


# ------------------------------------------------------------------ the conformance table

FLOAT16_NODE_CASES = [
    "test_max_float16",
    "test_min_float16",
    "test_mod_mixed_sign_float16",
    "test_isnan_float16",
    "test_isinf_float16",
    "test_cast_FLOAT_to_FLOAT16",
    "test_castlike_FLOAT16_to_FLOAT",
    "test_cast_FLOAT_to_BFLOAT16",  # NaN and inf included
    "test_einsum_batch_matmul_bfloat16",
]


@pytest.mark.parametrize("name", FLOAT16_NODE_CASES)
def test_16_bit_node_cases_pass(name):
    r = run_case("node", name)
    assert r.passed, r.reason
    assert column_of(r.dtypes) in ("float16", "bfloat16")


@pytest.mark.parametrize(
    "name", ["test_cast_FLOAT8E4M3FN_to_FLOAT16", "test_castlike_INT4_to_FLOAT"]
)
def test_narrow_inputs_widen_to_float32_exactly(name):
    # 8/4-bit floats and 4-bit integers (ml_dtypes) are held exactly by float32
    r = run_case("node", name)
    assert r.passed, r.reason


@pytest.mark.parametrize(
    ("suite", "name"),
    [
        ("node", "test_max_float64"),
        ("node", "test_cumsum_2d_axis_1"),
        ("node", "test_cast_DOUBLE_to_FLOAT16"),
        ("pytorch-operator", "test_operator_add_broadcast"),
        ("pytorch-operator", "test_operator_add_size1_broadcast"),
    ],
)
def test_float64_cases_pass(suite, name):
    """float64 node and pytorch-operator cases (refused before the double kernels)."""
    r = run_case(suite, name)
    assert r.passed and not r.refused and r.dtypes in ("float64", "float16+float64"), r.reason


def test_castlike_to_float8_is_compared_as_floats():
    """CastLike to float8 is computed right (bit for bit, NaN included) and the conformance
    run says so: comparing float8 arrays with assert_array_equal counted their NaNs as a
    mismatch ("wrong result"), 12 false failures in the table."""
    r = run_case("node", "test_castlike_FLOAT_to_FLOAT8E4M3FN")
    assert r.passed, r.reason


def test_table_lists_dtypes_per_case_group():
    assert column_of("float16+float32") == "float16"
    assert column_of("float16+float64") == "float64"
    assert column_of("float16+float8_e4m3fn") == "float8/float4"
    assert case_dtypes(None, [np.zeros(2, np.int64), np.zeros(2, np.float32)]) == "float32"
    assert case_dtypes(None, [np.zeros(2, np.int64), np.zeros(2, np.bool_)]) == "int"
    assert column_of("int") == "int/bool"
    assert case_dtypes(None, [np.zeros(2, ml_dtypes.bfloat16)]) == "bfloat16"
    assert case_dtypes(None, [np.array(["a"], object)]) == "other"
    rs = [run_case("node", n) for n in ("test_max_float16", "test_max_float64", "test_max_example")]
    table = _table(rs)
    assert "| operator | float32 | float16 | float64 | all | failures |" in table
    assert "| Max | 1 / 1 | 1 / 1 | 1 / 1 | 3 / 3 |  |" in table
