"""ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss: every reduction, with and
without class weights and ``ignore_index`` (negative, in range, beyond the classes), targets
read at run time, float32 and float16 (summed in float32), against ONNX's reference
evaluator; an undefined target (outside the classes, not ignored) gives NaN, never a
neighbouring class's score."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import helper  # noqa: E402
from test_onnx_fuzz import _nodes_model  # noqa: E402
from test_onnx_norms_and_math import _agrees  # noqa: E402

from polyfuse.errors import PolyfuseError  # noqa: E402
from polyfuse.onnx.backend import prepare  # noqa: E402

RNG = np.random.default_rng(12)


def _case(op, shape, dtype, reduction, weight, ignore):
    x = RNG.standard_normal(shape).astype(dtype)
    t = RNG.integers(0, shape[1], (shape[0], *shape[2:])).astype(np.int64)
    if ignore is not None:
        t.reshape(-1)[::3] = ignore
    inputs = {"x": x, "t": t}
    names = ["x", "t"]
    if weight:
        inputs["w"] = RNG.uniform(0.2, 2, shape[1]).astype(dtype)
        names.append("w")
    at = {"reduction": reduction} | ({} if ignore is None else {"ignore_index": ignore})
    outs = ["loss", "log_prob"] if op == "SoftmaxCrossEntropyLoss" else ["loss"]
    return [helper.make_node(op, names, outs, **at)], inputs


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize(
    ("shape", "weight", "ignore"),
    [((7, 5), False, None), ((3, 11, 4, 5), True, 2), ((5, 6, 9), False, -100),
     ((4, 3, 7), True, 13)],  # fmt: skip
)
def test_losses_against_the_reference(op, reduction, shape, weight, ignore):
    nodes, inputs = _case(op, shape, "float32", reduction, weight, ignore)
    _agrees(nodes, inputs, opset=22)


@pytest.mark.parametrize("op", ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"])
def test_float16_losses_sum_in_float32(op):
    nodes, inputs = _case(op, (64, 10, 33), "float16", "mean", True, 1)
    _agrees(nodes, inputs, opset=22)


def test_a_target_outside_the_classes_gives_nan_not_a_neighbours_score():
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    t = np.array([0, 3, -1, -7], np.int64)  # 3 and -1 are no class; -7 is ignored
    node = helper.make_node("NegativeLogLikelihoodLoss", ["x", "t"], ["loss"],
                            reduction="none", ignore_index=-7)  # fmt: skip
    got = prepare(_nodes_model([node], {"x": x, "t": t}, opset=22), "CPU").run({"x": x, "t": t})
    np.testing.assert_array_equal(got[0], [-x[0, 0], np.nan, np.nan, 0.0])


def test_a_target_of_the_wrong_shape_is_a_one_line_error():
    node = helper.make_node("SoftmaxCrossEntropyLoss", ["x", "t"], ["loss"], name="ce3")
    inputs = {"x": np.zeros((4, 3, 2), np.float32), "t": np.zeros((4, 3), np.int64)}
    with pytest.raises(PolyfuseError) as e:
        prepare(_nodes_model([node], inputs, opset=22, infer=False), "CPU")
    msg = str(e.value)
    assert "target (4, 3) must be the scores (4, 3, 2) without their class axis 1" in msg
    assert "ce3" in msg and "\n" not in msg
