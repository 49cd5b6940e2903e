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
    seen |= kinds_present(extract(_half_matmul()))  # no GEMM tiling, no tensor cores
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
            assert f"in plain words: {d['partition']['plain']}" in text
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


# --------------------------------------------------------------------------- big reports
# Repeated layers fold into cards, every reason has a plain-language line, the page is small.


def test_tandem_repeats_and_where_a_copy_starts():
    from polyfuse.viz.groups import Repeat, find_repeats

    seq = list("xabcabcabcy")
    assert find_repeats(seq) == [Repeat(1, 3, 3)]
    assert find_repeats(list("abcdefgh")) == []  # nothing repeats
    assert find_repeats(list("xababy")) == []  # covers fewer than MIN_COVER kernels
    # a0 b0 a1 b1 ... a4: periodic from 0 with period 2. A copy starts where the fewest
    # tensors cross between copies: two tensors flow a_i -> b_i and one b_i -> a_i+1, so
    # the copies are "ab" (cuts before each a); the other way round, "ba".
    seq = list("ababababa")
    inside = [(i, i + 1, f"{t}{i}") for i in range(0, 8, 2) for t in "st"]
    across = [(i, i + 1, f"u{i}") for i in range(1, 8, 2)]
    assert find_repeats(seq, inside + across) == [Repeat(0, 2, 4)]
    inside = [(i, i + 1, f"u{i}") for i in range(0, 8, 2)]
    across = [(i, i + 1, f"{t}{i}") for i in range(1, 8, 2) for t in "st"]
    assert find_repeats(seq, inside + across) == [Repeat(1, 2, 4)]
    # two different repeats, found largest first, returned in order
    seq = list("abababab") + list("xyzxyzxyz")
    assert find_repeats(seq) == [Repeat(0, 2, 4), Repeat(8, 3, 3)]


def test_segment_labels_are_whole_name_components():
    from polyfuse.viz.groups import _label

    def label(*names):
        data = {
            "inputs": [{"id": n, "constant": True} for n in names]
            + [{"id": "x", "constant": False}],
            "prims": [{"id": "p", "kernel": "k"}],
            "input_edges": [{"src": n, "dst": "p"} for n in (*names, "x")],
        }
        return _label(data, ["k"])

    assert label("layer0_attn_q_w", "layer0_ffn_fc1_w") == "layer0"
    assert label("stage2_block1_conv1_w", "stage2_block1_bn1_gamma") == "stage2_block1"
    assert label("layer1_w", "layer10_w") == ""  # "layer1" is not a component of layer10_w
    assert label("stem_w", "stage1_block1_w") == ""
    assert label("fc_w") == ""  # one weight names nothing in common


@pytest.mark.slow  # 6 s
def test_segments_between_repeats_fold_too():
    """Where layers repeat, what lies between them folds as well (a column of cards)."""
    from polyfuse import zoo

    m = zoo.build("lstm", "full", weights="zeros")  # its time steps repeat, after the first
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    g = extract(fn)["groups"]
    assert g["repeats"] and g["collapse_at_load"]
    plain = [s for s in g["segments"] if s["repeat"] is None]
    assert plain and all(s["foldable"] for s in g["segments"])
    assert [k for s in g["segments"] for k in s["kernels"]] == [k.name for k in fn.kernels]


@pytest.fixture(scope="module")
def bert_tiny():
    from polyfuse import zoo

    m = zoo.build("bert_base", "tiny", weights="zeros")
    fn = polyfuse.compile(
        m.inputs, m.outputs, constants=m.constants, check_cuda=False, name="bert_tiny"
    )
    return fn, extract(fn), zoo.MODELS["bert_base"].configs["tiny"]["layers"]


def test_transformer_layers_fold_into_segments(bert_tiny):
    fn, data, layers = bert_tiny
    g = data["groups"]
    assert len(g["repeats"]) == 1
    rep = g["repeats"][0]
    assert rep["count"] == layers and rep["period"] * layers == g["folded_kernels"]
    # every kernel in exactly one segment, in plan order
    assert [k for s in g["segments"] for k in s["kernels"]] == [k.name for k in fn.kernels]
    copies = [s for s in g["segments"] if s["repeat"] == 0]
    assert [s["copy"] for s in copies] == list(range(layers))
    assert [s["label"] for s in copies] == [f"layer{i}" for i in range(layers)]  # from weights
    # each copy holds one layer: the weights it reads are that layer's, and all of them
    kernel_of = {p["id"]: p["kernel"] for p in data["prims"]}
    for s in copies:
        ks = set(s["kernels"])
        weights = {e["src"] for e in data["input_edges"] if kernel_of[e["dst"]] in ks}
        weights -= {i["id"] for i in data["inputs"] if not i["constant"]}
        assert weights and all(w.split("_")[0] == s["label"] for w in weights), weights
    # the copies compute the same thing
    from polyfuse.viz.groups import kernel_signatures

    sigs = dict(zip([k["id"] for k in data["kernels"]], kernel_signatures(data), strict=True))
    first = [sigs[k] for k in copies[0]["kernels"]]
    assert all([sigs[k] for k in s["kernels"]] == first for s in copies)
    assert not g["collapse_at_load"]  # 30 kernels: small enough to open unfolded


def test_layout_has_a_card_per_copy_and_stacks_segments(bert_tiny):
    _, data, _ = bert_tiny
    lay, segs = data["layout"], data["groups"]["segments"]
    assert set(lay["segments"]) == {s["id"] for s in segs}
    tops = []
    for s in segs:
        box, card, chips = (lay["segments"][s["id"]][k] for k in ("box", "card", "chips"))
        for k in s["kernels"]:  # the segment's box holds its kernels
            kb = lay["kernels"][k]
            assert box[0] <= kb[0] and kb[0] + kb[2] <= box[0] + box[2]
            assert box[1] <= kb[1] and kb[1] + kb[3] <= box[1] + box[3]
        assert list(chips) == s["kernels"]
        assert card[1] == box[1] and card[3] < box[3]  # folded: the card, shorter
        for c in chips.values():  # chips inside the card, apart from each other
            assert card[0] <= c[0] and c[0] + c[2] <= card[0] + card[2]
            assert card[1] <= c[1] and c[1] + c[3] <= card[1] + card[3]
        xs = sorted((c[1], c[0]) for c in chips.values())
        assert all(a != b for a, b in zip(xs, xs[1:], strict=False))
        tops.append((box[1], box[1] + box[3]))
    assert all(a[1] < b[0] for a, b in zip(tops, tops[1:], strict=False))  # stacked, apart


def _plain_records(data):
    """(stage, kinds, reason, plain) of every reason in a report."""
    out = []
    for d in data["decisions"]:
        p = d["partition"]
        out.append(("partition", p["kinds"], p["reason"], p["plain"]))
        if d["placement"]:
            pl = d["placement"]
            out.append(("placement", pl["kinds"], pl["reason"], pl["plain"]))
    out += [("stitch", s["kinds"], s["reason"], s["plain"]) for s in data["stitches"]]
    out += [("pack", s["kinds"], s["reason"], s["plain"]) for s in data["packs"]]
    out += [("layout", s["kinds"], s["text"], s["plain"]) for s in data["launch_layouts"]]
    out += [("feedback", ["isl feedback"], f["reason"], f["plain"]) for f in data["feedback"]]
    out += [("cost", c["kinds"], c["note"], c["plain"]) for c in data["cost_model"] if c["kinds"]]
    return out


def _kind_reports(layer_norm):
    """Reports that together carry every reason kind (as in the test above)."""
    x = te.placeholder((4, 65536), name="x")
    yield extract(polyfuse.compile([x], [ops.softmax(x)], check_cuda=False))
    y = te.placeholder((64, 48), name="y")
    rows = ops.reduce_sum(ops.exp(y), axis=1, keepdims=True)
    yield extract(
        polyfuse.compile([y], [ops.reduce_sum(ops.div(y, rows), axis=0)], check_cuda=False)
    )
    z, w = te.placeholder((6, 40), name="z"), te.placeholder((40,), name="w")
    c0 = te.compute((6, 40), lambda i, j: z[i, j] * 2.0 + w[j], name="c0")
    c1 = te.compute((6, 40), lambda i, j: te.tanh(c0[i, j]), name="c1")
    yield extract(polyfuse.compile([z, w], [c1], budget=10, check_cuda=False))
    u, v = te.placeholder((64, 48), name="u"), te.placeholder((64, 48), name="v")
    branches = [ops.relu(v), ops.tanh(v), ops.softmax(u), ops.softmax(u)]
    yield extract(polyfuse.compile([u, v], branches, check_cuda=False))
    a_, w_ = te.placeholder((96, 112), name="a"), te.placeholder((112, 80), name="w")
    w2_ = te.placeholder((112, 80), name="w2")
    yield extract(polyfuse.compile([a_, w_, w2_], [ops.matmul(a_, w_), ops.matmul(a_, w2_)]))
    yield extract(_half_matmul())
    yield extract(layer_norm)


def _half_matmul():
    """A float16 x float32 matmul: the float32 GEMM tiles and tensor cores both decline it."""
    a, w = te.placeholder((32, 48), "float16", name="a16"), te.placeholder((48, 40), name="w")
    k = te.reduce_axis(48, name="k")
    mm = te.compute((32, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="mm")
    return polyfuse.compile([a, w], [mm], check_cuda=False)


#: Per reason kind, words its plain line must hold (somewhere among the records of that kind).
PLAIN_WORDS = {
    "fused": "fused: ",
    "stitched": "on-chip memory with a barrier inside the block",
    "no rule": "needs a barrier between them",
    "cycle": "before and after",
    "isl feedback": "within its operation budget",
    "form mismatch": "reduces along rows (y-reduce) but",
    "footprint": "does not fit in shared memory",
    "cost model": "the cost model",
    "parallel stitch": "one launch",
    "packed": "independent kernels run as one launch",
    "shared buffer": "stages in shared memory or registers",
    "elements per thread": "elements: fewer threads, each with more work",
    "split reduction": "reduced in one pass",
    "reduction layout": "threads share the work of each",
    "gemm tile": "patch in registers",
    "register fragment": "in registers instead of re-reading shared memory",
    "tensor cores": "no tensor cores",
    "pipeline stages": "the next tiles load while",
}


def test_a_plain_line_beside_every_reason_of_every_kind(layer_norm):
    seen: dict[str, list[str]] = {}
    for data in _kind_reports(layer_norm):
        for stage, kinds, reason, line in _plain_records(data):
            assert line and line != reason, (stage, kinds, reason)
            for k in kinds:
                seen.setdefault(k, []).append(line)
        for d in data["decisions"]:
            lines = [d["partition"]["plain"]] + [s["plain"] for s in [d["stitch"]] if s]
            assert d["plain"] in lines  # the edge's headline is one of its lines
    for kind, words in PLAIN_WORDS.items():
        assert any(words in line for line in seen[kind]), (kind, seen[kind][:3])
    assert set(seen) | {"tile mismatch"} == set(REASON_KINDS)  # tile mismatch: below


def test_plain_line_per_stitch_kind_follows_the_record(layer_norm):
    """The stitch sentence is chosen by the record's kinds and forms, nothing else."""
    from polyfuse.viz.plain import _Index, stitch_line

    data = extract(layer_norm)
    ix = _Index(data)
    s = dict(data["stitches"][0], stitched=False)
    words = {
        "tile mismatch": "a dependence that crosses blocks",
        "cycle": "no single kernel can run both",
        "no rule": "Layer 2 only joins a reduction",
        "form mismatch": "fastest with a different number of threads",  # same forms
        "stitched": "one kernel runs both",
    }
    lines = {k: stitch_line(ix, dict(s, kinds=[k])) for k in words}
    for k, w in words.items():
        assert w in lines[k], (k, lines[k])
    assert len(set(lines.values())) == len(lines)
    # the same reduction form on both sides vs different forms
    mg = data["stitches"][0]["consumer"][0]
    ix.mg[mg] = dict(ix.mg[mg], form={"kind": "x", "kept": [72], "reduced": 12})
    assert "along rows (y-reduce) but" in stitch_line(ix, dict(s, kinds=["form mismatch"]))


def test_reduction_producer_in_plain_words(layer_norm):
    """The issue's example: a consumer of a row reduction needs a barrier between them."""
    data = extract(layer_norm)
    d = next(
        d
        for d in data["decisions"]
        if d["producer"] == "layer_norm_var" and not d["partition"]["fused"]
    )
    assert "has combined a whole row" in d["partition"]["plain"]
    assert "needs a barrier between them" in d["partition"]["plain"]


def test_plain_lines_do_not_depend_on_the_wording_of_reasons():
    """Reword every reason of a plan: every plain line stays the same."""
    import dataclasses

    x = te.placeholder((4, 65536), name="x")
    u, v = te.placeholder((64, 48), name="u"), te.placeholder((64, 48), name="v")
    outs = [ops.softmax(x), ops.relu(v), ops.tanh(v), ops.softmax(u)]
    fn = polyfuse.compile([x, u, v], outs, check_cuda=False)
    before = [r[3] for r in _plain_records(extract(fn))]
    plan = fn.plan
    part = plan.partition
    part.decisions[:] = [dataclasses.replace(d, reason="reworded") for d in part.decisions]
    plan.stitches[:] = [dataclasses.replace(d, reason="reworded") for d in plan.stitches]
    plan.packs[:] = [dataclasses.replace(d, reason="reworded") for d in plan.packs]
    for kp in plan.kernel_plans:
        for t, p in kp.placements.items():
            kp.placements[t] = dataclasses.replace(p, reason="reworded")
        kp.recomputes[:] = [dataclasses.replace(r, reason="reworded") for r in kp.recomputes]
        kp.layout[:] = [dataclasses.replace(r, reason="reworded") for r in kp.layout]
    after = extract(fn)
    assert all(r[2] == "reworded" for r in _plain_records(after) if r[0] != "layout")
    assert [r[3] for r in _plain_records(after)] == before


def test_report_page_is_compressed_and_round_trips(bert_tiny, tmp_path):
    import base64
    import gzip

    _, data, _ = bert_tiny
    html = render_html(data)
    raw = json.dumps(data, separators=(",", ":"))
    assert len(html) < len(raw) / 3  # the data travels gzip + base64
    blob = re.search(r'id="report-data"[^>]*>([A-Za-z0-9+/=]+)</script>', html).group(1)
    assert json.loads(gzip.decompress(base64.b64decode(blob))) == json.loads(raw)
    assert "</script" not in blob and html == render_html(data)  # deterministic


@pytest.mark.parametrize(("dtype", "itemsize"), [("float32", 4), ("float64", 8), ("float16", 4)])
def test_shared_tile_bytes_are_in_the_dtype_of_the_tile(dtype, itemsize):
    """A softmax row kept in shared memory takes 1000 elements of its register dtype (a double
    8 bytes, a half widened to a float 4); the visualizer showed 4 bytes per element always."""
    x = te.placeholder((64, 1000), name="x", dtype=dtype)
    data = extract(polyfuse.compile([x], [ops.softmax(x, axis=-1, name="softmax")]))
    (kernel,) = data["kernels"]
    (tile,) = [p for p in kernel["placements"] if p["space"] == "shared"]
    assert tile["bytes"] == 1000 * itemsize <= kernel["shared_bytes"]
    shared = [d["placement"] for d in data["decisions"] if d["placement"]["space"] == "shared"]
    assert shared and all(p["bytes"] == 1000 * itemsize for p in shared)


def test_kernel_memory_shows_stages_buffers_and_the_tensorized_region():
    """A bfloat16 GEMM on tensor cores: the engine, the intrinsic, the warp grid and the
    stages of its typed decision, its two operand arrays (stages included) and the source
    lines that issue mma/ldmatrix; a float32 GEMM on CUDA cores: its cp.async stages and padded
    tiles; an elementwise kernel: no pipeline."""
    from polyfuse.base.decision_data import TensorCoreData

    a = te.placeholder((256, 256), name="a", dtype="bfloat16")
    b = te.placeholder((256, 256), name="b", dtype="bfloat16")
    fn = polyfuse.compile([a, b], [ops.matmul(a, b, name="mm")])
    (tc,) = [d.data for d in fn.plan.kernel_plans[0].layout if isinstance(d.data, TensorCoreData)]
    (k,) = extract(fn)["kernels"]
    mem = k["memory"]
    assert mem["engine"] == "tensor cores" and mem["stages"] == tc.stages > 1
    assert mem["intrinsic"] == f"mma.sync.aligned.{tc.intrinsic}" and mem["warps"] == tc.warps
    assert mem["block_tile"] == tc.block and mem["fill"] == tc.fill
    assert sum(mem["arrays"]) + mem["dynamic"] <= k["shared_bytes"] and len(mem["arrays"]) == 2
    # each operand tile: its layout and its bytes per stage (the arrays hold every stage)
    assert [b["tensor"] for b in mem["buffers"]] == ["a", "b"]
    assert [b["bytes"] * tc.stages for b in mem["buffers"]] == mem["arrays"]
    assert all(b["layout"].startswith("XOR-swizzled") for b in mem["buffers"])
    first, last = mem["region"]
    lines = k["source"].splitlines()
    assert "pf_ldmatrix" in lines[first] or "pf_mma" in lines[first]
    assert "pf_mma" in lines[last] and first < last
    assert f"{tc.stages} stages" in mem["plain"] and "tensor cores" in mem["plain"]

    x, w = te.placeholder((256, 256), name="x"), te.placeholder((256, 256), name="w")
    (k,) = extract(polyfuse.compile([x, w], [ops.matmul(x, w, name="mm")]))["kernels"]
    mem = k["memory"]
    assert mem["engine"] == "CUDA cores" and mem["stages"] == 2 and mem["region"] == []
    assert {b["tensor"] for b in mem["buffers"]} == {"x", "w"}

    y = te.placeholder((64, 64), name="y")
    (k,) = extract(polyfuse.compile([y], [ops.relu(y, name="r")]))["kernels"]
    assert k["memory"]["engine"] == "" and k["memory"]["plain"] == "no shared memory tiles"
    assert "on-chip memory and pipeline" in render_html(extract(fn))


def test_explain_names_the_engine_and_stages_of_a_gemm_kernel():
    a = te.placeholder((128, 128), name="a", dtype="float16")
    b = te.placeholder((128, 128), name="b", dtype="float16")
    data = extract(polyfuse.compile([a, b], [ops.matmul(a, b, name="mm")]))
    text = explain(data, "mm")
    (line,) = [ln for ln in text.splitlines() if ln.startswith("kernel ")]
    assert "tensor cores" in line and "mma.sync.aligned.m16n8k16.float16" in line
    assert f"{data['kernels'][0]['memory']['stages']} stages" in line or "one shared stage" in line
