"""Issue 19 item 11, ONNX: Round / IsNaN / IsInf / OneHot / GatherND, subgraph nodes whose
bodies capture outer values (folding counts them; the ones that cannot fold are listed up front
by node), and EmbeddingBag-style Loops vectorised into a gather + masked reduction.

Every model is built with ``onnx.helper``, imported, compiled, run on the CUDA emulator and
compared with ``onnx.reference.ReferenceEvaluator``; the real ``nn.EmbeddingBag`` export runs
when torch is importable.
"""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import polyfuse  # noqa: E402
import polyfuse.onnx as po  # noqa: E402
from polyfuse import te  # noqa: E402
from polyfuse.errors import ExpressionError, UnsupportedOpError  # noqa: E402
from polyfuse.graph import dtypes  # noqa: E402
from polyfuse.onnx.backend import PolyfuseBackend  # noqa: E402
from polyfuse.reference import evaluate  # noqa: E402

F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
rng = np.random.default_rng(19)


def _model(nodes, inputs, outputs, inits=(), opset=17, name="m", out_types=None):
    out_types = out_types or {}
    g = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, out_types.get(n, F), None) for n in outputs],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in dict(inits).items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def _run(model, feeds, equal=False, rtol=1e-5, atol=1e-6):
    """Import, compile, emulate; compare every output with the ONNX reference evaluator."""
    om = po.load(model)
    fn = om.compile(check_cuda=False)
    out = fn(
        *[
            np.asarray(feeds[n], dtypes.numpy_dtype(t.dtype))
            for n, t in zip(om.input_names, om.inputs, strict=True)
        ],
        device="emulate",
    )
    out = out if isinstance(out, tuple) else (out,)
    ref = dict(
        zip(
            [o.name for o in model.graph.output],
            ReferenceEvaluator(model).run(None, feeds),
            strict=True,
        )
    )
    names = [n for n in om.output_names if n not in om.constant_outputs]
    for n, got in zip(names, out, strict=True):
        want = np.asarray(ref[n]).astype(got.dtype)
        if equal:
            np.testing.assert_array_equal(got, want, err_msg=n)
        else:
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=n)
    return om, fn


# --------------------------------------------------------------------------- te functions


def test_te_round_isnan_isinf_agree_with_numpy_reference_and_emulator():
    vals = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999997, 8388609.0, np.nan, np.inf, -np.inf, 3.7]
    a = np.array(vals * 2, np.float32).reshape(2, 12)
    x = te.placeholder((2, 12), name="x")
    # a comparison is bool; dtype="float32" stores the masks as the float32 kernels can
    outs = [
        te.compute((2, 12), lambda i, j: te.round(x[i, j]), name="r"),
        te.compute((2, 12), lambda i, j: te.isnan(x[i, j]), name="n", dtype="float32"),
        te.compute((2, 12), lambda i, j: te.isinf(x[i, j]), name="inf", dtype="float32"),
        te.compute(
            (2, 12), lambda i, j: te.isinf(x[i, j], negative=False), name="pinf", dtype="float32"
        ),
        te.compute(
            (2, 12), lambda i, j: te.isinf(x[i, j], positive=False), name="ninf", dtype="float32"
        ),
    ]
    want = [
        np.rint(a),
        np.isnan(a),
        np.isinf(a),
        np.isposinf(a),
        np.isneginf(a),
    ]
    got = polyfuse.compile([x], outs, check_cuda=False)(a, device="emulate")
    ref = evaluate(outs, {x: a})
    for g, r, w in zip(got, ref, want, strict=True):
        np.testing.assert_array_equal(g, w.astype(np.float32))
        np.testing.assert_array_equal(np.asarray(r, np.float32), w.astype(np.float32))


# --------------------------------------------------------------------------- Round, IsNaN, IsInf


def test_round_halves_to_even_and_fake_quantisation():
    """Round on halves and negatives, and the fake-quantisation chain it appears in
    (x / s -> Round -> Clip -> * s)."""
    nodes = [
        helper.make_node("Round", ["x"], ["r"]),
        helper.make_node("Div", ["x", "s"], ["q"]),
        helper.make_node("Round", ["q"], ["qr"]),
        helper.make_node("Clip", ["qr", "lo", "hi"], ["qc"]),
        helper.make_node("Mul", ["qc", "s"], ["fq"]),
    ]
    inits = {"s": np.float32(0.25), "lo": np.float32(-8), "hi": np.float32(7)}
    m = _model(nodes, [("x", F, [16])], ["r", "fq"], inits)
    x = np.array(
        [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.49, 0.125, -0.375, 1.875, 2.0, -0.0, 1e30]
        + [np.nan, -np.inf],
        np.float32,
    )
    _run(m, {"x": x}, equal=True)


@pytest.mark.parametrize("pos,neg", [(1, 1), (1, 0), (0, 1), (0, 0)])
def test_isnan_isinf_flags_through_the_backend(pos, neg):
    nodes = [
        helper.make_node("IsInf", ["x"], ["inf"], detect_positive=pos, detect_negative=neg),
        helper.make_node("IsNaN", ["x"], ["nan"]),
    ]
    m = _model(nodes, [("x", F, [2, 4])], ["inf", "nan"], out_types={"inf": B, "nan": B})
    x = np.array([[np.inf, -np.inf, np.nan, 0.0], [1e38, -1e38, -0.0, np.inf]], np.float32)
    got = PolyfuseBackend.prepare(m).run([x])
    want = ReferenceEvaluator(m).run(None, {"x": x})
    for g, w in zip(got, want, strict=True):
        assert g.dtype == np.bool_
        np.testing.assert_array_equal(g, w)


# --------------------------------------------------------------------------- OneHot


@pytest.mark.parametrize("axis", [-1, 0, 1, -2])
def test_onehot_negative_and_out_of_range_indices_every_axis(axis):
    nodes = [helper.make_node("OneHot", ["idx", "depth", "vals"], ["y"], axis=axis)]
    m = _model(
        nodes,
        [("idx", I64, [2, 3])],
        ["y"],
        {"depth": np.float32(5.0), "vals": np.array([-2.0, 3.0], np.float32)},
        opset=11,
    )
    idx = np.array([[0, 4, -1], [-5, 7, -6]], np.int64)  # -1 -> 4, -5 -> 0; 7 and -6 all off
    om, _ = _run(m, {"idx": idx}, equal=True)
    assert om.outputs[0].shape == ReferenceEvaluator(m).run(None, {"idx": idx})[0].shape


def test_onehot_values_read_at_run_time():
    nodes = [helper.make_node("OneHot", ["idx", "depth", "vals"], ["y"])]
    m = _model(nodes, [("idx", F, [4]), ("vals", F, [2])], ["y"], {"depth": np.int64(3)}, opset=11)
    feeds = {"idx": np.array([2, 0, -1, 3], np.float32), "vals": np.array([0.5, 9.0], np.float32)}
    _run(m, feeds, equal=True)


# --------------------------------------------------------------------------- GatherND


def _gnd(data_shape, idx, b=0, runtime=False):
    nodes = [helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=b)]
    inputs = [("x", F, list(data_shape))]
    inits = {}
    if runtime:
        inputs.append(("i", I64, list(idx.shape)))
    else:
        inits["i"] = idx
    m = _model(nodes, inputs, ["y"], inits, opset=13)
    feeds = {"x": rng.standard_normal(data_shape).astype(np.float32)}
    if runtime:
        feeds["i"] = idx
    return m, feeds


@pytest.mark.parametrize(
    "data_shape,idx,b,affine",
    [
        ((4, 5, 3), [[[0, 1], [1, 2]], [[2, 3], [3, 4]]], 0, True),  # i0 = 2p + q, i1 = i0 + 1
        ((6, 5), [[5], [3], [-5]], 0, True),  # rows 5, 3, 1 (-5 wraps): 5 - 2p
        ((2, 4, 3), [[[1], [2]], [[1], [2]]], 1, True),  # batch_dims=1: row 1 + q per batch
        ((3, 4, 5), [[1], [-1], [-3]], 0, False),  # rows 1, 2, 0: an index tensor at run time
    ],
)
def test_gathernd_constant_indices(data_shape, idx, b, affine):
    m, feeds = _gnd(data_shape, np.array(idx, np.int64), b)
    om, _ = _run(m, feeds, equal=True)
    # an affine pattern becomes affine subscripts: no index tensor is read at run time
    assert (len(om.constants) == 0) == affine, om.constants


@pytest.mark.parametrize(
    "data_shape,idx_shape,b",
    [((3, 4, 2), (2, 2, 2), 0), ((2, 3, 4), (2, 3, 1), 1), ((2, 3, 4, 2), (2, 3, 5, 1), 2)],
)
def test_gathernd_run_time_indices_with_batch_dims(data_shape, idx_shape, b):
    m_ = idx_shape[-1]
    hi = np.asarray(data_shape[b : b + m_])
    idx = rng.integers(-hi, hi, size=idx_shape).astype(np.int64)  # negatives included
    m, feeds = _gnd(data_shape, idx, b, runtime=True)
    _run(m, feeds, equal=True)


def test_gathernd_constant_index_out_of_bounds_names_the_node():
    nodes = [helper.make_node("GatherND", ["x", "i"], ["y"], name="gnd7")]
    m = _model(nodes, [("x", F, [3, 4])], ["y"], {"i": np.array([[1, 4]], np.int64)}, opset=13)
    with pytest.raises(ExpressionError, match=r"node #0 'gnd7' \(GatherND\).*out of bounds"):
        po.load(m)


# --------------------------------------------------------------------------- captured values


def _counting_loop(carried_from: str, name: str = "loop"):
    """A Loop with one carried value (y += x each step) whose body reads ``x`` from the
    enclosing graph (captured, not a node input)."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["y_in", "x"], ["y_out"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("it", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("y_in", F, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("y_out", F, [3]),
        ],
    )
    return helper.make_node("Loop", ["M", "c", carried_from], ["y"], body=body, name=name)


def test_loop_capturing_a_run_time_value_is_listed_up_front():
    nodes = [helper.make_node("Relu", ["x0"], ["x"], name="relu"), _counting_loop("y0")]
    inits = {"M": np.int64(3), "c": np.bool_(True), "y0": np.zeros(3, np.float32)}
    m = _model(nodes, [("x0", F, [3])], ["y"], inits)
    # every node input of the Loop is a constant: only the captured x is known at run time
    assert po.unsupported_ops(m) == {"Loop": 1}
    with pytest.raises(UnsupportedOpError) as e:
        po.load(m)
    msg = str(e.value)
    assert msg.startswith("model 'm' uses unsupported ONNX operators: Loop x1 (#1 'loop': ")
    assert "loop-carried" in msg and "rt_inits" not in msg


def test_loop_unsupported_through_the_backend_names_graph_and_node():
    nodes = [helper.make_node("Relu", ["x0"], ["x"], name="relu"), _counting_loop("y0", "acc")]
    inits = {"M": np.int64(3), "c": np.bool_(True), "y0": np.zeros(3, np.float32)}
    m = _model(nodes, [("x0", F, [3])], ["y"], inits, name="main_graph")
    with pytest.raises(UnsupportedOpError, match=r"model 'main_graph' .*Loop x1 \(#1 'acc': "):
        PolyfuseBackend.prepare(m)


def test_loop_capturing_only_constants_folds():
    nodes = [_counting_loop("y0"), helper.make_node("Mul", ["y", "z"], ["out"])]
    inits = {
        "M": np.int64(4),
        "c": np.bool_(True),
        "y0": np.ones(3, np.float32),
        "x": np.array([1.0, 2.0, 3.0], np.float32),
    }
    m = _model(nodes, [("z", F, [3])], ["out"], inits)
    assert not po.unsupported_ops(m)
    _run(m, {"z": np.array([1.0, -1.0, 0.5], np.float32)})


def test_if_capturing_a_run_time_value_is_listed_up_front():
    def branch(op, name):
        return helper.make_graph(
            [helper.make_node(op, ["x"], [f"{name}_y"])],
            name,
            [],
            [helper.make_tensor_value_info(f"{name}_y", F, [3])],
        )

    node = helper.make_node(
        "If",
        ["c"],
        ["y"],
        name="choose",
        then_branch=branch("Neg", "then"),
        else_branch=branch("Abs", "else"),
    )
    m = _model([node], [("x", F, [3])], ["y"], {"c": np.bool_(True)})
    with pytest.raises(UnsupportedOpError, match=r"If x1 \(#0 'choose': .*run-time values"):
        po.load(m)


def test_loop_body_vectorised_over_the_iteration():
    """Independent iterations: every per-iteration value is one tensor with a leading axis of
    the trip count (gathers by the iteration, layout ops with shifted axes, reductions,
    broadcasting against invariant values, a loop-invariant scan output)."""
    m_count = 4
    body = helper.make_graph(
        [
            helper.make_node("Gather", ["x", "it"], ["g"], axis=0),  # (2, 3)
            helper.make_node("Transpose", ["g"], ["t"], perm=[1, 0]),  # (3, 2)
            helper.make_node("Reshape", ["t", "shp"], ["r"]),  # (2, 3)
            helper.make_node("ReduceSum", ["r", "ax1"], ["s"], keepdims=1),  # (2, 1)
            helper.make_node("Squeeze", ["s", "ax1"], ["sq"]),  # (2,)
            helper.make_node("Unsqueeze", ["sq", "ax0"], ["u"]),  # (1, 2)
            helper.make_node("Concat", ["u", "w"], ["c"], axis=0),  # (2, 2)
            helper.make_node("Cast", ["it"], ["itf"], to=F),
            helper.make_node("Mul", ["c", "itf"], ["e"]),
            helper.make_node("Gather", ["y", "it"], ["h"], axis=1),  # (3,)
            helper.make_node("Flatten", ["g"], ["f"], axis=0),  # (1, 6)
            helper.make_node("ReduceMax", ["f"], ["fm"], keepdims=0),  # ()
            helper.make_node("Relu", ["x0"], ["k"]),  # does not depend on the iteration
            helper.make_node("Less", ["it", "two"], ["cond_out"]),  # ignored: no cond input
        ],
        "body",
        [helper.make_tensor_value_info("it", I64, []), helper.make_tensor_value_info("cnd", B, [])],
        [helper.make_tensor_value_info("cond_out", B, [])]
        + [helper.make_tensor_value_info(n, F, None) for n in ("e", "h", "fm", "k")],
    )
    loop = helper.make_node("Loop", ["M", ""], ["E", "H", "FM", "K"], body=body, name="vec")
    inits = {
        "M": np.int64(m_count),
        "shp": np.array([2, -1], np.int64),
        "ax0": np.array([0], np.int64),
        "ax1": np.array([1], np.int64),
        "w": np.array([[1.0, -2.0]], np.float32),
        "two": np.int64(2),
    }
    m = _model(
        [loop],
        [("x", F, [m_count, 2, 3]), ("y", F, [3, m_count]), ("x0", F, [2])],
        ["E", "H", "FM", "K"],
        inits,
        opset=13,
    )
    assert not po.unsupported_ops(m)
    feeds = {
        "x": rng.standard_normal((m_count, 2, 3)).astype(np.float32),
        "y": rng.standard_normal((3, m_count)).astype(np.float32),
        "x0": np.array([-1.0, 2.0], np.float32),
    }
    om = po.load(m)
    got = om.compile(check_cuda=False)(*[feeds[n] for n in om.input_names], device="emulate")
    # scan outputs stack the per-iteration values on a new leading axis (onnxruntime, torch);
    # the ONNX reference evaluator np.vstack-s them instead, so the oracle is numpy here
    x, y, x0 = feeds["x"], feeds["y"], feeds["x0"]
    want = [[], [], [], []]
    for it in range(m_count):
        g = x[it]
        sq = g.T.reshape(2, 3).sum(axis=1)
        want[0].append(np.concatenate([sq[None], inits["w"]]) * it)
        want[1].append(y[:, it])
        want[2].append(g.reshape(1, 6).max())
        want[3].append(np.maximum(x0, 0))
    for g_, w_ in zip(got, want, strict=True):
        np.testing.assert_allclose(g_, np.stack(w_), rtol=1e-5, atol=1e-6)
    assert [o.shape for o in om.outputs] == [(4, 2, 2), (4, 3), (4,), (4, 2)]


# --------------------------------------------------------------------------- EmbeddingBag loops


def _bag_model(mode, n_ids=9, n_bags=3, rows=20, dim=4, weights=False, body_tail=None):
    """The graph torch exports for ``nn.EmbeddingBag(rows, dim, mode)`` (opset 17): a Loop over
    the bags whose body slices ``ids[starts[m]:ends[m]]`` with bounds read from the run-time
    ``offsets``, gathers those rows of the table and reduces them."""
    big = np.iinfo(np.int64).max
    c = {
        "zero": np.int64(0),
        "ax0": np.array([0], np.int64),
        "ax1": np.array([1], np.int64),
        "one1": np.array([1], np.int64),
        "big1": np.array([big], np.int64),
        "true": np.bool_(True),
        "table": rng.standard_normal((rows, dim)).astype(np.float32),
    }
    outer = [
        helper.make_node("Shape", ["ids"], ["ids_shape"]),
        helper.make_node("Gather", ["ids_shape", "zero"], ["n_ids"], axis=0),
        helper.make_node("Unsqueeze", ["n_ids", "ax0"], ["n_ids1"]),
        helper.make_node("Concat", ["offsets", "n_ids1"], ["ext"], axis=0),
        helper.make_node("Slice", ["ext", "one1", "big1", "ax0", "one1"], ["ends"]),
        helper.make_node("Shape", ["ends"], ["ends_shape"]),
        helper.make_node("Gather", ["ends_shape", "zero"], ["M"], axis=0),
    ]
    red = {"sum": "ReduceSum", "mean": "ReduceMean", "max": "ReduceMax"}[mode]
    inner = [
        helper.make_node("Gather", ["ext", "it"], ["s0"], axis=0),
        helper.make_node("Gather", ["ends", "it"], ["e0"], axis=0),
        helper.make_node("Unsqueeze", ["s0", "ax0"], ["s"]),
        helper.make_node("Unsqueeze", ["e0", "ax0"], ["e"]),
        helper.make_node("Slice", ["ids", "s", "e", "ax0"], ["bag"]),
        helper.make_node("Gather", ["table", "bag"], ["vecs"], axis=0),
    ]
    last = "vecs"
    if weights:
        inner += [
            helper.make_node("Slice", ["w", "s", "e", "ax0"], ["wb"]),
            helper.make_node("Unsqueeze", ["wb", "ax1"], ["wb1"]),
            helper.make_node("Mul", ["vecs", "wb1"], ["wvecs"]),
        ]
        last = "wvecs"
    inner += body_tail or [helper.make_node(red, [last], ["out"], axes=[0], keepdims=0)]
    inner.append(helper.make_node("Cast", ["true"], ["cond_out"], to=B))
    body = helper.make_graph(
        inner,
        "bag_body",
        [helper.make_tensor_value_info("it", I64, []), helper.make_tensor_value_info("cnd", B, [])],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("out", F, [dim]),
        ],
    )
    loop = helper.make_node("Loop", ["M", "true"], ["bags"], body=body, name="bag_loop")
    inputs = [("ids", I64, [n_ids]), ("offsets", I64, [n_bags])]
    if weights:
        inputs.append(("w", F, [n_ids]))
    return _model([*outer, loop], inputs, ["bags"], c, name="main_graph")


@pytest.mark.parametrize(
    "mode,offsets,weights",
    [
        ("mean", [0, 4, 6], False),
        ("sum", [0, 2, 2], False),  # an empty bag sums to 0
        ("max", [0, 5, 8], False),
        ("mean", [0, 0, 7], False),  # an empty bag's mean is NaN (as numpy / the reference)
        ("sum", [0, 3, 7], True),  # per-sample weights: Slice + Unsqueeze + Mul on the bag
    ],
)
@pytest.mark.filterwarnings("ignore:Mean of empty slice", "ignore:invalid value encountered")
def test_embedding_bag_loop_is_a_gather_plus_masked_reduction(mode, offsets, weights):
    m = _bag_model(mode, weights=weights)
    assert not po.unsupported_ops(m)
    feeds = {
        "ids": rng.integers(0, 20, size=9).astype(np.int64),
        "offsets": np.array(offsets, np.int64),
    }
    if weights:
        feeds["w"] = rng.uniform(0.1, 2.0, size=9).astype(np.float32)
    om, _ = _run(m, feeds)
    assert om.outputs[0].shape == (3, 4)
    # one masked reduction over all ids per bag (the table gathered inside), no per-bag unroll
    bags = [t for t in _computes(om.outputs) if "loop_bag" in t.name and t.op.reduce is not None]
    assert len(bags) == 1 and bags[0].shape == (3, 4)


def _computes(outs):
    seen, stack = {}, list(outs)
    while stack:
        t = stack.pop()
        if t.uid in seen or t.op is None:
            continue
        seen[t.uid] = t
        stack.extend(t.op.inputs())
    return list(seen.values())


@pytest.mark.parametrize(
    "tail,why",
    [
        (
            [helper.make_node("Softmax", ["vecs"], ["out"], axis=0, name="soft")],
            r"body node 'soft' \(Softmax\): reads a slice whose bounds depend on the iteration",
        ),
        (
            [helper.make_node("Identity", ["vecs"], ["out"], name="keep")],
            r"scan output 'out' is a slice whose length varies",
        ),
    ],
)
def test_embedding_bag_like_loop_without_a_reduction_is_listed_up_front(tail, why):
    m = _bag_model("sum", body_tail=tail)
    assert po.unsupported_ops(m) == {"Loop": 1}
    with pytest.raises(UnsupportedOpError, match=r"Loop x1 \(#7 'bag_loop': " + why):
        PolyfuseBackend.prepare(m)


@pytest.mark.extra  # needs PyTorch
def test_torch_embedding_bag_mean_export(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    bag = torch.nn.EmbeddingBag(60, 8, mode="mean")
    ids = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 59, 0])
    offsets = torch.tensor([0, 4, 5])
    path = tmp_path / "bag.onnx"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(bag, (ids, offsets), str(path), opset_version=17, dynamo=False)
    model = onnx.load(str(path))
    assert any(n.op_type == "Loop" for n in model.graph.node)
    want = bag(ids, offsets).detach().numpy()
    feeds = {"input": ids.numpy(), "offsets": offsets.numpy()}
    (ref,) = ReferenceEvaluator(model).run(None, feeds)
    np.testing.assert_allclose(ref, want, rtol=1e-5, atol=1e-6)
    (got,) = PolyfuseBackend.prepare(model).run([ids.numpy(), offsets.numpy()])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # other bag boundaries through the same compiled model
    offsets2 = np.array([0, 1, 9], np.int64)
    (got2,) = PolyfuseBackend.prepare(model).run([ids.numpy(), offsets2])
    want2 = bag(ids, torch.from_numpy(offsets2)).detach().numpy()
    np.testing.assert_allclose(got2, want2, rtol=1e-5, atol=1e-6)
