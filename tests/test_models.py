"""Model arguments resolved and loaded in one place (polyfuse/models.py)."""

from __future__ import annotations

import pytest

from polyfuse import zoo
from polyfuse.errors import PolyfuseError
from polyfuse.models import ModelSource, load_model, resolve_model, resolve_models

PYFILE = """
from polyfuse import ops, te
x = te.placeholder((4, 8), name="x")
inputs, outputs = [x], [ops.relu(x)]
"""


def builder():
    from polyfuse import ops, te

    x = te.placeholder((2, 3), name="x")
    return [x], [ops.relu(x)]


def test_each_kind_resolves(tmp_path):
    (tmp_path / "m.py").write_text(PYFILE)
    (tmp_path / "a.onnx").write_bytes(b"")
    kinds = [
        resolve_model(s).kind
        for s in ["bert_base", "softmax", str(tmp_path / "m.py"), str(tmp_path / "a.onnx")]
    ]
    assert kinds == ["zoo", "example", "pyfile", "onnx"]
    assert resolve_model("tests.test_models:builder") == ModelSource(
        "builder", "python", "tests.test_models:builder"
    )


def test_no_argument_is_the_zoo_and_directories_expand(tmp_path):
    assert [m.label for m in resolve_models([])] == list(zoo.MODELS)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.onnx").write_bytes(b"")
    (tmp_path / "a.onnx").write_bytes(b"")
    found = resolve_models([str(tmp_path)])
    assert [(m.label, m.kind) for m in found] == [
        (f"{tmp_path.name}/a", "onnx"),
        (f"{tmp_path.name}/sub/b", "onnx"),
    ]
    (tmp_path / "e").mkdir()
    (empty,) = resolve_models([str(tmp_path / "e")])
    assert empty.kind == "invalid"


def test_unknown_arguments_are_invalid_with_a_reason(tmp_path):
    src = resolve_model("no_such_model")
    assert src.kind == "invalid" and "not a zoo model" in src.reason and "softmax" in src.reason
    missing = resolve_model(str(tmp_path / "x.onnx"))
    assert missing.kind == "invalid" and "no such file" in missing.reason
    with pytest.raises(PolyfuseError, match="not a zoo model"):
        load_model("no_such_model")


def test_load_every_python_kind(tmp_path):
    (tmp_path / "m.py").write_text(PYFILE)
    assert [t.shape for t in load_model(str(tmp_path / "m.py")).inputs] == [(4, 8)]
    m = load_model("tests.test_models:builder")
    assert (m.name, [t.shape for t in m.outputs]) == ("builder", [(2, 3)])
    assert load_model("softmax").outputs
    tiny = load_model("lstm", size="tiny")
    assert tiny.name == "lstm" and tiny.inputs and isinstance(tiny.constants, dict)


def test_pyfile_without_outputs_is_a_clear_error(tmp_path):
    (tmp_path / "bad.py").write_text("inputs = []\n")
    with pytest.raises(PolyfuseError, match="must define 'inputs' and 'outputs'"):
        load_model(str(tmp_path / "bad.py"))
