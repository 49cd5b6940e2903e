"""The visualizer's data (no browser): every reason kind appears and is asserted; explain."""

from __future__ import annotations

import json
import re

import pytest

import polyfuse
from polyfuse import examples, ops, te
from polyfuse.cli import main
from polyfuse.viz import REASON_KINDS, explain, extract, kinds_present, render_html


def _with(data, kind):
    return [d for d in data["decisions"] if kind in d["kinds"]]


@pytest.fixture(scope="module")
def layer_norm():
    ins, outs, _ = examples.layer_norm()
    return polyfuse.compile(ins, outs, check_cuda=False, name="layer_norm")


def test_counts_and_every_edge_match_the_plan(layer_norm):
    fn = layer_norm
    data = extract(fn)
    assert data["counts"]["kernels"] == len(fn.kernels)
    assert data["counts"]["micrographs"] == len(fn.plan.micrographs)
    assert data["counts"]["primitives"] == len(fn.plan.graph.prims)
    assert len(data["decisions"]) == len(fn.plan.partition.decisions)
    for d, pd in zip(data["decisions"], fn.plan.partition.decisions, strict=True):
        assert (d["producer"], d["consumer"]) == (pd.producer, pd.consumer)
        assert d["partition"]["reason"] == pd.reason  # one source of truth: the plan's text
        assert d["kinds"] and set(d["kinds"]) <= set(REASON_KINDS)
    json.dumps(data)  # JSON-able
    lay = data["layout"]
    assert set(lay["nodes"]) == set(fn.plan.graph.prims)
    assert set(lay["kernels"]) == {k.name for k in fn.kernels}


def test_fused_stitched_no_rule_cycle(layer_norm):
    data = extract(layer_norm)
    fused = _with(data, "fused")
    assert fused and all(d["partition"]["rule"] for d in fused)
    stitched = _with(data, "stitched")
    assert stitched
    for d in stitched:
        assert d["stitch"]["rule"] in (7, 8) and d["stitch"]["stitched"]
        assert d["placement"]["space"] in ("register", "shared", "global", "recomputed")
        assert d["kernel_producer"] == d["kernel_consumer"]
    assert any("no partition rule" in d["partition"]["reason"] for d in _with(data, "no rule"))
    assert any("cycle" in d["partition"]["reason"] for d in _with(data, "cycle"))


def _step(c, b, name):
    return te.compute((6, 40), lambda i, j: te.exp(c[i, j]) + b[j], name=name)


def test_isl_budget_feedback():
    x, b = te.placeholder((6, 40), name="x"), te.placeholder((40,), name="b")
    c = x
    for n in range(5):
        c = _step(c, b, f"c{n}")
    fn = polyfuse.compile([x, b], [c], budget=10, check_cuda=False)
    data = extract(fn)
    assert data["feedback"] and "budget" in data["feedback"][0]["reason"]
    fb = _with(data, "isl feedback")
    assert fb and all("isl feedback" in d["partition"]["reason"] for d in fb)
    assert any(m["feedback"] for m in data["micrographs"])


def test_form_or_tile_mismatch():
    # Row sums, then a column reduction of the result: y-reduce feeds x-reduce.
    x = te.placeholder((64, 48), name="x")
    rows = ops.reduce_sum(ops.exp(x), axis=1, keepdims=True, name="rows")
    col = ops.reduce_sum(ops.div(x, rows, name="y"), axis=0, name="col")
    data = extract(polyfuse.compile([x], [col], check_cuda=False))
    bad = _with(data, "form mismatch") + _with(data, "tile mismatch")
    assert bad
    d = bad[0]
    assert d["outcome"] == "separate" and d["refusals"]
    assert any(
        "forms differ" in s["reason"] or "do not match" in s["reason"] for s in d["refusals"]
    )
    assert "not stitched" in d["summary"]


def test_footprint_too_large_and_cost_model():
    # Rows of 65536 floats (256 KB) do not fit shared memory: the cost model recomputes.
    x = te.placeholder((4, 65536), name="x")
    data = extract(polyfuse.compile([x], [ops.softmax(x, name="sm")], check_cuda=False))
    fp = _with(data, "footprint")
    assert fp
    assert all("cost model" in d["kinds"] for d in fp)
    assert any("recomputed in" in d["placement"]["reason"] for d in fp)
    assert any("does not fit" in n and "recomputes" in n for d in fp for n in d["notes"])
    assert any("reduction layout" in c["note"] for c in data["cost_model"])


def test_every_reason_kind_is_covered_by_these_reports(layer_norm):
    """Union over the reports above: every kind."""
    x = te.placeholder((4, 65536), name="x")
    a = extract(polyfuse.compile([x], [ops.softmax(x)], check_cuda=False))
    y = te.placeholder((64, 48), name="y")
    rows = ops.reduce_sum(ops.exp(y), axis=1, keepdims=True)
    b = extract(polyfuse.compile([y], [ops.reduce_sum(ops.div(y, rows), axis=0)], check_cuda=False))
    z, w = te.placeholder((6, 40), name="z"), te.placeholder((40,), name="w")
    c0 = te.compute((6, 40), lambda i, j: z[i, j] * 2.0 + w[j], name="c0")
    c1 = te.compute((6, 40), lambda i, j: te.tanh(c0[i, j]), name="c1")
    c = extract(polyfuse.compile([z, w], [c1], budget=10, check_cuda=False))
    u, v = te.placeholder((64, 48), name="u"), te.placeholder((64, 48), name="v")
    branches = [ops.relu(v), ops.tanh(v), ops.softmax(u), ops.softmax(u)]  # Layer 3
    d = extract(polyfuse.compile([u, v], branches, check_cuda=False))
    seen = (
        kinds_present(a) | kinds_present(b) | kinds_present(c) | kinds_present(extract(layer_norm))
    )
    seen |= kinds_present(d)
    a_, w_ = te.placeholder((96, 112), name="a"), te.placeholder((112, 80), name="w")
    w2_ = te.placeholder((112, 80), name="w2")
    gemms = [ops.matmul(a_, w_), ops.matmul(a_, w2_)]  # GEMM tiles; a staged by both: apart
    seen |= kinds_present(extract(polyfuse.compile([a_, w_, w2_], gemms)))
    seen |= {"form mismatch"} if "tile mismatch" in seen else set()  # either names the refusal
    seen |= {"tile mismatch"} if "form mismatch" in seen else set()
    assert seen == set(REASON_KINDS), set(REASON_KINDS) - seen


def test_html_is_self_contained(layer_norm, tmp_path):
    assert layer_norm.visualize(tmp_path / "r.html", tmp_path / "r.json") == tmp_path / "r.html"
    data = extract(layer_norm)
    html = (tmp_path / "r.html").read_text()
    assert "<script src" not in html and "<link" not in html
    urls = set(re.findall(r"https?://[^\s\"'<>)]+", html))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls
    assert json.loads((tmp_path / "r.json").read_text())["counts"] == data["counts"]
    assert render_html(data) == html


def test_explain_one_op(layer_norm, capsys):
    data = extract(layer_norm)
    reduction = next(p["id"] for p in data["prims"] if p["kind"] == "reduction")
    text = explain(data, reduction)
    assert f"op {reduction}: reduction" in text
    for d in data["decisions"]:
        if reduction in (d["producer"], d["consumer"]):
            assert f"{d['producer']} -> {d['consumer']}" in text
            assert d["partition"]["reason"] in text
    assert main(["explain", "layer_norm", "--op", reduction]) == 0
    out = capsys.readouterr().out
    assert "partition:" in out and reduction in out
    assert main(["explain", "layer_norm", "--op", "no_such_op"]) == 2


def test_cli_viz_writes_html_and_json(tmp_path, capsys):
    model = tmp_path / "model.py"
    model.write_text(
        "from polyfuse import te, ops\n"
        "x = te.placeholder((8, 100), name='x')\n"
        "inputs = [x]\n"
        "outputs = [ops.softmax(x, name='p')]\n"
    )
    out, js = tmp_path / "m.html", tmp_path / "m.json"
    assert main(["viz", str(model), "-o", str(out), "--json", str(js)]) == 0
    data = json.loads(js.read_text())
    assert data["counts"]["kernels"] == 1 and data["counts"]["primitives"] == 5
    assert out.stat().st_size > 10_000
    assert "wrote" in capsys.readouterr().err
