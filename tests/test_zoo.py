"""The built-in model zoo and ``polyfuse zoo`` batch compilation."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import zoo
from polyfuse.batch import graph_hash
from polyfuse.cli import main

TINY_TIME_LIMITED = ["bert_base", "gpt2_small", "vit_b16", "resnet50", "mobilenet_v2", "lstm"]

#: Expected output shapes at full size (built without weights; no compile).
FULL_OUTPUTS = {
    "bert_base": [(8, 128, 768)],
    "gpt2_small": [(8, 128, 768)],
    "vit_b16": [(8, 1000)],
    "resnet50": [(8, 1000)],
    "mobilenet_v2": [(8, 1000)],
    "lstm": [(32, 512), (32, 512)],
    "wide_deep": [(512, 1)],
    "deepfm": [(512, 1)],
}


def broken_model():
    """A builder that fails mid-batch (used through ``module:function``)."""
    raise RuntimeError("this model is broken on purpose")


def killed_model():
    """A builder whose worker dies by SIGKILL (what the out-of-memory killer does)."""
    os.kill(os.getpid(), signal.SIGKILL)


def exiting_model():
    """A builder whose worker exits abruptly without a report."""
    os._exit(3)


def test_registry_lists_the_eight_models():
    assert set(zoo.MODELS) == set(FULL_OUTPUTS)


@pytest.mark.parametrize("name", list(zoo.MODELS))
def test_full_size_builds_by_shape_only(name):
    inputs, outputs, constants, reference = zoo.build(name, "full", weights="zeros")
    assert reference is None
    assert [o.shape for o in outputs] == FULL_OUTPUTS[name]
    assert inputs and all(t.is_placeholder for t in inputs)
    assert all(a.shape == t.shape for t, a in constants.items())


def test_bert_base_full_config():
    m = zoo.build("bert_base", "full", weights="zeros")
    assert m.config == dict(batch=8, seq=128, hidden=768, heads=12, ffn=3072, layers=12)
    assert [t.shape for t in m.inputs] == [(8, 128, 768)]
    n_weights = sum(a.size for a in m.constants.values())
    assert 84_000_000 < n_weights < 86_000_000  # BERT-base encoder weights


#: tiny models of 7-11 s each, run in the slow tier (as their goldens are)
SLOW_MODELS = {"vit_b16", "gpt2_small", "bert_base", "resnet50"}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in zoo.MODELS],
)
def test_tiny_model_compiles_and_matches_numpy(name):
    m = zoo.build(name, "tiny")
    inputs, outputs, constants, reference = m
    fn = polyfuse.compile(inputs, outputs, constants=constants, check_cuda=False, name=name)
    assert fn.kernels
    arrays = m.sample_inputs(seed=1)
    got = fn(*arrays, device="emulate")
    got = got if isinstance(got, tuple) else (got,)
    want = reference(*arrays)
    assert len(got) == len(want) == len(outputs)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4)


def test_a_tiny_model_in_bfloat16_runs_its_convs_on_tensor_cores():
    """``zoo.build(..., dtype="bfloat16")``: inputs, weights and sample inputs in bfloat16;
    the convolutions and the classifier on tensor cores, within bfloat16's rounding of the
    float64 reference on the same weights; an unknown dtype is a one-line error."""
    from polyfuse.graph.dtypes import numpy_dtype

    m = zoo.build("mobilenet_v2", "tiny", dtype="bfloat16")
    assert {t.dtype for t in m.inputs} | {t.dtype for t in m.constants} == {"bfloat16"}
    assert {a.dtype for a in m.constants.values()} == {numpy_dtype("bfloat16")}
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    assert len([k for k in fn.kernels if "pf_mma_m16n8k16" in k.source]) >= 5
    arrays = m.sample_inputs(seed=1)
    assert arrays[0].dtype == numpy_dtype("bfloat16")
    got = fn(*arrays, device="emulate")
    (want,) = m.reference(*arrays)
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-2, atol=1e-2)
    with pytest.raises(polyfuse.PolyfuseError, match="zoo: unknown dtype 'int8'; use float32"):
        zoo.build("mobilenet_v2", "tiny", dtype="int8")


def test_graph_hash_is_structural():
    a = zoo.build("deepfm", "tiny", weights="zeros")
    b = zoo.build("deepfm", "tiny", seed=5)  # other weight values, same structure
    c = zoo.build("wide_deep", "tiny", weights="zeros")
    ha = graph_hash(a.inputs, a.outputs, list(a.constants))
    assert ha == graph_hash(b.inputs, b.outputs, list(b.constants))
    assert ha != graph_hash(c.inputs, c.outputs, list(c.constants))


def _zoo(tmp_path: Path, *args: str, cache: str = "cache") -> tuple[int, dict]:
    out = tmp_path / "report.json"
    argv = ["zoo", *args, "--size", "tiny", "--cache-dir", str(tmp_path / cache)]
    rc = main([*argv, "--json", str(out), "--no-cuda-check", "--quiet"])
    return rc, json.loads(out.read_text())


def test_zoo_command_two_models_two_jobs(tmp_path, capsys):
    rc, doc = _zoo(tmp_path, "wide_deep", "deepfm", "--jobs", "2")
    assert rc == 0
    assert [r["name"] for r in doc["models"]] == ["wide_deep", "deepfm"]
    for r in doc["models"]:
        assert r["status"] == "ok" and r["kernels"] >= 1 and r["primitives"] >= r["kernels"]
        assert r["model_cache"] == "miss"
        assert "partition+schedule" in r["compile_seconds"]
    table = capsys.readouterr().out
    assert "wide_deep" in table and "deepfm" in table and "total" in table


def test_zoo_warm_run_hits_the_cache(tmp_path):
    rc, cold = _zoo(tmp_path, "wide_deep", "deepfm", "--jobs", "2")
    assert rc == 0 and cold["cache"]["model_hits"] == 0
    rc, warm = _zoo(tmp_path, "wide_deep", "deepfm", "--jobs", "2")
    assert rc == 0 and warm["cache"]["model_hits"] == 2
    for c, w in zip(cold["models"], warm["models"], strict=True):
        assert w["model_cache"] == "hit"
        assert w["kernels"] == c["kernels"] and w["compile_seconds"] == c["compile_seconds"]
        assert "partition+schedule" not in w["seconds"]  # nothing was compiled
    rc, nocache = _zoo(tmp_path, "deepfm", "--no-cache")
    assert rc == 0 and nocache["models"][0]["model_cache"] == "off"


def test_zoo_error_isolation(tmp_path, capsys):
    rc, doc = _zoo(tmp_path, "wide_deep", f"{__name__}:broken_model", "deepfm", "--jobs", "2")
    assert rc == 1
    by = {r["name"]: r for r in doc["models"]}
    assert by["wide_deep"]["status"] == by["deepfm"]["status"] == "ok"
    assert by["broken_model"]["status"] == "error"
    assert "broken on purpose" in by["broken_model"]["reason"]
    assert doc["failed"] == ["broken_model"]
    err = capsys.readouterr().err
    assert "broken_model" in err and "broken on purpose" in err


def test_zoo_worker_death_fails_that_model_only(tmp_path):
    """A worker killed (SIGKILL, out of memory) or exiting abruptly fails its model only."""
    models = ["wide_deep", f"{__name__}:killed_model", f"{__name__}:exiting_model", "deepfm"]
    rc, doc = _zoo(tmp_path, *models, "--jobs", "2")
    assert rc == 1
    by = {r["name"]: r for r in doc["models"]}
    assert by["wide_deep"]["status"] == by["deepfm"]["status"] == "ok"
    assert sorted(doc["failed"]) == ["exiting_model", "killed_model"]
    assert "worker died" in by["killed_model"]["reason"]
    assert "killed by SIGKILL" in by["killed_model"]["reason"]
    assert "exited with status 3" in by["exiting_model"]["reason"]


def test_zoo_corrupt_model_cache_entries_are_recompiled_and_healed(tmp_path):
    rc, cold = _zoo(tmp_path, "deepfm")
    assert rc == 0
    (entry,) = (tmp_path / "cache" / "zoo").glob("*/*.json")
    for bad in (b"", b"{}", entry.read_bytes()[:-5]):
        entry.write_bytes(bad)
        rc, doc = _zoo(tmp_path, "deepfm")
        assert rc == 0 and doc["models"][0]["model_cache"] == "miss"
        assert doc["models"][0]["kernels"] == cold["models"][0]["kernels"]
        rc, warm = _zoo(tmp_path, "deepfm")  # healed
        assert rc == 0 and warm["models"][0]["model_cache"] == "hit"


def test_zoo_onnx_corrupt_file_is_isolated(tmp_path):
    models = tmp_path / "onnx_models"
    models.mkdir()
    (models / "corrupt.onnx").write_bytes(b"\x00 this is not a protobuf \xff" * 7)
    rc, doc = _zoo(tmp_path, str(models), "deepfm")
    assert rc == 1
    by = {r["name"]: r for r in doc["models"]}
    assert by["deepfm"]["status"] == "ok"
    bad = by["onnx_models/corrupt"]
    assert bad["status"] == "error" and bad["reason"]


def test_ray_missing_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    argv = ["zoo", "deepfm", "--size", "tiny", "--executor", "ray"]
    rc = main([*argv, "--cache-dir", str(tmp_path)])
    assert rc == 2
    assert "pip install 'polyfuse[ray]'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed")
def test_zoo_with_local_ray(tmp_path):
    rc, doc = _zoo(tmp_path, "wide_deep", "deepfm", "--executor", "ray", "--jobs", "2")
    assert rc == 0
    assert [r["status"] for r in doc["models"]] == ["ok", "ok"]
    assert doc["executor"] == "ray"
