"""The fusion benchmark suite (benchmarks/suite.py): builders, references, the runner.

Fast: graphs are compiled at a reduced scale without the CUDA check, and nothing is emulated.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse.reference import evaluate

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import fusion  # noqa: E402
import suite  # noqa: E402

COMPILE_SCALE = 16  # rows / 16: compiles stay quick, reduced axes keep their full size
TINY_SCALE = 4096  # the numpy interpreter then handles every graph in well under a second


def _nbytes(tensors) -> int:
    return sum(4 * math.prod(t.shape) for t in tensors)


def test_names_match_the_readme_table():
    assert len(suite.NAMES) == 12
    assert set(suite.BUILDERS) == set(suite.NAMES) == set(suite.SCALED)


@pytest.mark.parametrize(
    "dims, scale, want",
    [
        ((8192,), 1, (8192,)),
        ((8192,), 64, (128,)),
        ((16, 12, 128), 64, (1, 3, 128)),
        ((16, 12, 128), 4096, (1, 1, 5)),
        ((256,), 1000, (1,)),
    ],
)
def test_scale_dims(dims, scale, want):
    assert suite.scale_dims(dims, scale) == want


@pytest.mark.parametrize("name", suite.NAMES)
def test_builds_and_compiles(name):
    inputs, outputs, ref = suite.build(name, COMPILE_SCALE)
    assert callable(ref)
    fn = polyfuse.compile(inputs=inputs, outputs=outputs, check_cuda=False, name=name)
    assert len(fn.kernels) >= 1
    assert len(fn.plan.graph.prims) >= len(fn.kernels)
    assert fn.compulsory_bytes() == _nbytes(inputs) + _nbytes(outputs)
    assert fn.global_bytes() >= fn.compulsory_bytes()


@pytest.mark.parametrize("name", suite.NAMES)
def test_reduced_axes_are_not_scaled(name):
    """Scaling changes only the dims SCALED names: every reduction keeps its extent."""
    full_in, full_out, _ = suite.build(name, 1)
    small_in, small_out, _ = suite.build(name, 64)
    for a, b in zip(full_in + full_out, small_in + small_out, strict=True):
        assert a.ndim == b.ndim
        assert all(s <= f for s, f in zip(b.shape, a.shape, strict=True))
    red = {
        "layernorm": 768,
        "layernorm_lib": 768,
        "softmax": 1024,
        "log_softmax": 1024,
        "residual_layernorm": 768,
        "attn_softmax": 128,
        "rmsnorm_swiglu": 4096,
    }
    if name in red:
        assert small_in[0].shape[-1] == red[name]
    if name == "batchnorm_train_relu":
        n, _, h, w = small_in[0].shape
        assert (n, h, w) == (64, 28, 28)
    if name == "two_branches":
        assert small_in[1].shape[-1] == 1024


@pytest.mark.parametrize("name", suite.NAMES)
def test_full_size_matches_peers(name):
    """At scale 1 the inputs and compulsory bytes are those the peers measured."""
    path = fusion.DEFAULT_PEERS
    if not path.is_file():
        pytest.skip(f"{path} not present")
    peer = json.loads(path.read_text())["subgraphs"][name]
    inputs, outputs, _ = suite.build(name, 1)
    assert [[t.name, list(t.shape)] for t in inputs] == peer["inputs"]
    assert _nbytes(inputs) + _nbytes(outputs) == peer["compulsory_bytes"]


@pytest.mark.parametrize("name", suite.NAMES)
def test_numpy_reference_agrees_with_interpreter(name):
    inputs, outputs, ref = suite.build(name, TINY_SCALE)
    arrays = suite.random_inputs(name, inputs, seed=1)
    want = evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    got = ref(*arrays)
    assert len(got) == len(want) == len(outputs)
    for t, g, w in zip(outputs, got, want, strict=True):
        assert g.dtype == np.float32
        g = np.reshape(g, w.shape)
        assert np.all(np.isfinite(w)), t.name
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"{name}: {t.name}")


def test_runner_without_emulator(tmp_path, capsys):
    out = tmp_path / "r.json"
    rc = fusion.main(["--only", "two_branches,lstm_cell", "--no-emulate", "--json", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    assert "exact isl footprints" in text and "FULL size" in text
    data = json.loads(out.read_text())
    assert list(data["subgraphs"]) == ["two_branches", "lstm_cell"]
    r = data["subgraphs"]["two_branches"]["full"]
    assert r["kernels"] >= 1 and r["global_bytes"] >= r["compulsory_bytes"]
    assert data["subgraphs"]["two_branches"]["emulated"] == {"skipped": "--no-emulate"}


def test_runner_without_peers_file(tmp_path, capsys):
    rc = fusion.main(
        [
            "--only",
            "two_branches",
            "--no-emulate",
            "--json",
            str(tmp_path / "r.json"),
            "--peers",
            str(tmp_path / "missing.json"),
        ]
    )
    assert rc == 0
    captured = capsys.readouterr()
    assert "not found" in captured.err
