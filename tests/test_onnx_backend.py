"""The ONNX project's own backend runner (onnx.backend.test.BackendTest) over polyfuse.

Runs the model tests shipped inside the onnx package: ``simple``, ``pytorch-operator``,
``pytorch-converted`` (fast tier) and the nine ``light`` zoo models (slow tier, on the CPU
emulator). Everything we do not support is in EXCLUDED with the reason.
"""

from __future__ import annotations

import re

import pytest

onnx = pytest.importorskip("onnx")

import numpy as np  # noqa: E402
from onnx import helper  # noqa: E402
from onnx.backend.test import BackendTest  # noqa: E402

from polyfuse.onnx.backend import PolyfuseBackend  # noqa: E402

#: test-name regex -> why polyfuse does not run it
EXCLUDED: dict[str, str] = {
    # simple
    r"test_gradient_of_add": "ai.onnx.preview.training.Gradient is a training operator",
    r"test_sequence_model": "sequence values (SequenceConstruct/At/Insert...) are not tensors",
    r"test_strnorm_model": "string tensors (StringNormalizer)",
    # every group: devices
    r"_cuda$": "no GPU in CI (device CUDA needs pycuda and a driver)",
}

LIGHT = [
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
]

_bt = BackendTest(PolyfuseBackend, __name__)
for _pat in EXCLUDED:
    _bt.exclude(_pat)
_cases = _bt.test_cases
_GROUPS = {
    "Simple": "simple",
    "PyTorchOperator": "pytorch-operator",
    "PyTorchConverted": "pytorch-converted",
}
for _cat in _GROUPS:
    globals()[f"OnnxBackend{_cat}ModelTest"] = _cases[f"OnnxBackend{_cat}ModelTest"]
OnnxBackendRealModelTest = pytest.mark.slow(_cases["OnnxBackendRealModelTest"])


def _all_names() -> list[str]:
    return [n for c in _cases.values() for n in dir(c) if n.startswith("test_")]


def test_exclusions_are_reasoned_and_used():
    names = [n for n in _all_names() if not n.startswith("test_exclusions")]
    print("\nexcluded ONNX backend tests:")
    for pat, why in EXCLUDED.items():
        hits = [n for n in names if re.search(pat, n)]
        print(f"  {pat!r}: {len(hits)} tests - {why}")
        assert why.strip(), pat
        assert hits, f"exclusion {pat!r} matches no test; drop it"


def test_run_node_wraps_node():
    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=0.1)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    (y,) = PolyfuseBackend.run_node(node, [x])
    np.testing.assert_allclose(y, np.where(x < 0, 0.1 * x, x), rtol=1e-6)
    assert PolyfuseBackend.supports_device("CPU")
    assert not PolyfuseBackend.supports_device("TPU")


@pytest.mark.parametrize("model", LIGHT)
def test_light_models_are_in_the_slow_runner(model):
    assert f"test_{model}_cpu" in dir(OnnxBackendRealModelTest)  # two are excluded above


def test_backend_specializes_on_attribute_like_graph_inputs():
    node = helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3, 4]),
            helper.make_tensor_value_info("axes", onnx.TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )
    rep = PolyfuseBackend.prepare(helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)]))
    for ax in (1, 2, 1):
        (y,) = rep.run([x, np.array([ax], dtype=np.int64)])
        np.testing.assert_allclose(y, x.sum(axis=ax))
    assert rep.specialized == ["axes"] and len(rep.variants) == 2  # one compile per value
    _, fn = next(iter(rep.variants.values()))
    assert "specialized on the values of graph inputs axes=[1]" in str(fn.plan)
