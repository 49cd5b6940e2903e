"""Bad input gets a one-line polyfuse error naming the tensor or op."""

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.errors import CallError, DtypeError, ExpressionError, PolyfuseError


def one_line(e: Exception) -> str:
    msg = str(e)
    assert "\n" not in msg
    return msg


def test_shape_mismatch_names_op():
    a, b = te.placeholder((4, 8), name="a"), te.placeholder((3,), name="b")
    with pytest.raises(ExpressionError) as ei:
        ops.add(a, b, name="y")
    assert "'y'" in one_line(ei.value) and "(4, 8)" in str(ei.value)


def test_index_arity_mismatch_names_tensor():
    a = te.placeholder((4, 8), name="a")
    with pytest.raises(ExpressionError, match="tensor 'a'"):
        te.compute((4,), lambda i: a[i], name="bad")


def test_unknown_dtype():
    with pytest.raises(DtypeError) as ei:
        te.placeholder((4,), dtype="float42", name="w")
    assert "'w'" in one_line(ei.value) and "float42" in str(ei.value)


def test_non_affine_index_names_tensor():
    a = te.placeholder((16,), name="a")
    with pytest.raises(ExpressionError) as ei:
        te.compute((4,), lambda i: a[i * i], name="sq")
    msg = one_line(ei.value)
    assert "'a'" in msg and "'sq'" in msg and "not affine" in msg


def test_data_dependent_index_rejected():
    a, idx = te.placeholder((16,), name="a"), te.placeholder((4,), name="idx")
    with pytest.raises(ExpressionError, match="tensor 'a'"):
        te.compute((4,), lambda i: a[te.cast(idx[i], "int32")], name="gather")


def test_reduce_axis_used_twice():
    x = te.placeholder((4, 8), name="x")
    k = te.reduce_axis(8, name="k")
    with pytest.raises(ExpressionError, match="used twice"):
        te.compute((4,), lambda i: te.sum(x[i, k], axis=[k, k]), name="r")
    with pytest.raises(ExpressionError, match="reduce axis 'k'"):
        te.compute((4, 8), lambda i, j: x[i, k] + x[i, j], name="leak")


def test_placeholder_not_in_inputs():
    x, y = te.placeholder((4,), name="x"), te.placeholder((4,), name="y")
    z = ops.add(x, y, name="z")
    with pytest.raises(ExpressionError, match="'y'"):
        polyfuse.compile([x], [z])


def test_python_bool_condition_rejected():
    x = te.placeholder((4,), name="x")
    with pytest.raises(ExpressionError, match="te.equal"):
        te.compute((4,), lambda i: te.where(i == 0, x[i], 0.0), name="w")


@pytest.fixture(scope="module")
def add_fn():
    x, y = te.placeholder((4, 3), name="x"), te.placeholder((4, 3), name="y")
    return polyfuse.compile([x, y], [ops.add(x, y, name="z")])


def test_missing_input_array(add_fn):
    with pytest.raises(CallError) as ei:
        add_fn(np.zeros((4, 3), np.float32))
    assert "'y'" in one_line(ei.value)


def test_wrong_array_shape_and_dtype(add_fn):
    ok = np.zeros((4, 3), np.float32)
    with pytest.raises(CallError, match="input 'y': expected shape"):
        add_fn(ok, np.zeros((3, 4), np.float32))
    with pytest.raises(CallError, match="input 'x': expected float32, got float64"):
        add_fn(np.zeros((4, 3)), ok)


def test_unknown_device_and_arch(add_fn):
    ok = np.zeros((4, 3), np.float32)
    with pytest.raises(CallError, match="unknown device"):
        add_fn(ok, ok, device="tpu")
    x = te.placeholder((4,), name="x")
    with pytest.raises(PolyfuseError, match="sm_12"):
        polyfuse.compile([x], [ops.exp(x)], arch="sm_12")


def test_cuda_device_without_gpu_is_clear(add_fn):
    from polyfuse.cuda.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    ok = np.zeros((4, 3), np.float32)
    with pytest.raises(PolyfuseError) as ei:
        add_fn(ok, ok, device="cuda")
    assert "GPU" in one_line(ei.value) or "CUDA" in str(ei.value)


def test_constants_are_bound_at_compile_time():
    x, w = te.placeholder((4, 3), name="x"), te.placeholder((3,), name="w")
    wv = np.arange(3, dtype=np.float32)
    fn = polyfuse.compile([x], [ops.mul(x, w)], constants={w: wv})
    xv = np.ones((4, 3), np.float32)
    np.testing.assert_array_equal(fn(xv, device="emulate"), xv * wv)
    with pytest.raises(ExpressionError, match="constant 'w' has shape"):
        polyfuse.compile([x], [ops.mul(x, w)], constants={w: np.zeros(4)})


def test_gather_with_data_index():
    # Data-dependent subscripts are explicit (te.data_index); isl treats the read as opaque.
    table, ids = te.placeholder((10, 4), name="table"), te.placeholder((6,), name="ids")
    out = te.compute((6, 4), lambda i, j: table[te.data_index(ids[i]), j] * 2.0, name="emb")
    fn = polyfuse.compile([table, ids], [out])
    assert str(fn.plan.graph.prims["emb"].kind) == "opaque"
    tv = np.arange(40, dtype=np.float32).reshape(10, 4)
    iv = np.array([3, 0, 9, 3, 5, 1], np.float32)
    got = fn(tv, iv, device="emulate", race_check=True)
    np.testing.assert_array_equal(got, tv[iv.astype(int)] * 2)
    with pytest.raises(ExpressionError, match="not affine"):
        te.compute((6,), lambda i: table[ids[i], 0], name="implicit")


def test_tensor_names_never_clash_with_generated_names():
    # c0 / b0 / t0 / r_x are names the generated code uses for loops, blocks and registers.
    a, b = te.placeholder((5, 40), name="c0"), te.placeholder((5, 40), name="b0")
    r = ops.add(ops.exp(a), b, name="r_x")
    fn = polyfuse.compile([a, b], [ops.softmax(r, name="t0")])
    av, bv = np.ones((5, 40), np.float32), np.zeros((5, 40), np.float32)
    e = np.exp(av) + bv
    want = np.exp(e - e.max(1, keepdims=True))
    np.testing.assert_allclose(
        fn(av, bv, device="emulate"), want / want.sum(1, keepdims=True), rtol=1e-5
    )


@pytest.mark.parametrize("shape", [(1,), (1, 1), (1, 5)])
def test_tensors_with_unit_dimensions(shape):
    x = te.placeholder(shape, name="x")
    fn = polyfuse.compile([x], [ops.relu(x), ops.reduce_sum(x)])
    xv = np.linspace(-1, 1, int(np.prod(shape)), dtype=np.float32).reshape(shape)
    r, s = fn(xv, device="emulate")
    np.testing.assert_array_equal(r, np.maximum(xv, 0))
    np.testing.assert_allclose(s, xv.sum(), atol=1e-6)
