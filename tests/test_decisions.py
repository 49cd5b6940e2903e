"""Decisions are typed records: the visualizer reads their kinds, never their wording."""

from __future__ import annotations

import dataclasses

import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import Decided, DecisionKind
from polyfuse.viz import extract, kinds_present


def _graphs():
    x = te.placeholder((4, 65536), name="x")  # spills, recomputes (footprint, cost model)
    yield [x], [ops.softmax(x)], {}
    z, w = te.placeholder((6, 40), name="z"), te.placeholder((40,), name="w")
    c0 = te.compute((6, 40), lambda i, j: z[i, j] * 2.0 + w[j], name="c0")
    c1 = te.compute((6, 40), lambda i, j: te.tanh(c0[i, j]), name="c1")
    yield [z, w], [c1], {"budget": 10}  # isl feedback
    y = te.placeholder((64, 48), name="y")
    rows = ops.reduce_sum(ops.exp(y), axis=1, keepdims=True)
    yield [y], [ops.reduce_sum(ops.div(y, rows), axis=0)], {}


def _reword(plan) -> None:
    """Every reason of the plan replaced by text that names no kind."""
    part = plan.partition
    part.decisions[:] = [
        dataclasses.replace(d, reason=f"reworded {i}") for i, d in enumerate(part.decisions)
    ]
    plan.stitches[:] = [
        dataclasses.replace(d, reason=f"reworded s{i}") for i, d in enumerate(plan.stitches)
    ]
    for kp in plan.kernel_plans:
        for t, p in kp.placements.items():
            kp.placements[t] = dataclasses.replace(p, reason="reworded placement")
        kp.recomputes[:] = [dataclasses.replace(r, reason="reworded") for r in kp.recomputes]
    plan.packs[:] = [dataclasses.replace(d, reason="reworded pack") for d in plan.packs]


@pytest.mark.parametrize("case", range(3))
def test_visualizer_kinds_survive_rewording(case):
    ins, outs, kw = list(_graphs())[case]
    fn = polyfuse.compile(ins, outs, check_cuda=False, **kw)
    data = extract(fn)
    before = [d["kinds"] for d in data["decisions"]]
    packs = [d["kinds"] for d in data["packs"]]
    assert any(before)
    _reword(fn.plan)
    after = extract(fn)
    assert [d["kinds"] for d in after["decisions"]] == before
    assert [d["kinds"] for d in after["packs"]] == packs
    assert all("reworded" in d["summary"] for d in after["decisions"])


def test_the_kinds_cover_the_filters():
    seen: set[str] = set()
    for ins, outs, kw in _graphs():
        seen |= kinds_present(extract(polyfuse.compile(ins, outs, check_cuda=False, **kw)))
    assert {"footprint", "cost model", "isl feedback", "no rule", "fused"} <= seen


def test_plan_records_are_typed():
    ins, outs, kw = next(_graphs())
    records = polyfuse.compile(ins, outs, check_cuda=False, **kw).plan.records()
    assert records and all(isinstance(r, Decided) for r in records)
    assert all(isinstance(k, DecisionKind) for r in records for k in r.kinds)
    recompute = [r for r in records if DecisionKind.COST_MODEL in r.kinds]
    assert recompute and recompute[0].data["tensor"] and recompute[0].data["readers"]


def test_typed_kinds_survive_the_compile_cache(tmp_path):
    from polyfuse.cache import CompileCache

    ins, outs, kw = next(_graphs())
    first = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache(tmp_path), **kw)
    again = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache(tmp_path), **kw)
    assert again.cache_stats["hits"] > 0
    assert [d["kinds"] for d in extract(again)["decisions"]] == [
        d["kinds"] for d in extract(first)["decisions"]
    ]
    assert [r.kinds for r in again.plan.records()] == [r.kinds for r in first.plan.records()]


def test_device_table_measured_h100_beside_datasheet():
    from polyfuse.poly.device import A100, H100

    assert H100.dram_gbps == 3350.0 and H100.measured is not None
    assert H100.bandwidth_gbps == 3010.0 and H100.throughput_tflops == 51.7
    assert "measured 2026-11-22" in H100.figures and "datasheet 3350" in H100.figures
    assert A100.measured is None and A100.bandwidth_gbps == A100.dram_gbps
    assert A100.figures.startswith("datasheet")


def _reword_layout_note(monkeypatch) -> None:
    """The reduction-layout note reworded to text that names no kind."""
    from polyfuse.poly.cost import ReductionStrategy

    monkeypatch.setattr(ReductionStrategy, "note", property(lambda s: f"launch shape: {s}"))


def _cost_layouts(data) -> list[dict]:
    return [c for c in data["cost_model"] if "reduction layout" in c["kinds"]]


def test_cost_filter_survives_a_reworded_reduction_layout_note(monkeypatch, tmp_path):
    """The visualizer's cost-model list picks reduction layouts by kind, fresh or cached."""
    from polyfuse.cache import CompileCache

    _reword_layout_note(monkeypatch)
    ins, outs, kw = next(_graphs())  # softmax: reduction kernels and a recompute
    fresh = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache(tmp_path), **kw)
    cached = polyfuse.compile(ins, outs, check_cuda=False, cache=CompileCache(tmp_path), **kw)
    assert cached.cache_stats["hits"] > 0 and all(kp.cached for kp in cached.plan.kernel_plans)
    for fn in (fresh, cached):
        data = extract(fn)
        layouts = _cost_layouts(data)
        assert layouts and all(c["note"].startswith("launch shape: ") for c in layouts)
        assert not any("reduction layout" in c["note"] for c in data["cost_model"])
        recomputes = [c for c in data["cost_model"] if c not in layouts]
        assert recomputes and all("cost model" in c["kinds"] for c in recomputes)
        # the note the plan prints is the record's reason: one text, never two
        notes = {n for k in fn.kernels for n in k.notes}
        assert all(c["note"] in notes for c in layouts)
    assert _cost_layouts(extract(cached)) == _cost_layouts(extract(fresh))


def test_reduction_layout_record_data():
    ins, outs, kw = next(_graphs())
    fn = polyfuse.compile(ins, outs, check_cuda=False, **kw)
    recs = [r for r in fn.plan.records() if DecisionKind.REDUCTION_LAYOUT in r.kinds]
    assert recs
    for r in recs:
        (mm,) = next(kp.parts for kp in fn.plan.kernel_plans if r in kp.layout)
        d = r.data
        assert d["lanes"] == mm.strategy.lanes and d["kept_tile"] == mm.strategy.kept_tile
        assert d["threads_per_block"] == mm.block and d["blocks"] == mm.grid
        assert d["form"] == str(mm.strategy.form) and d["reason"] == mm.strategy.reason


def test_gemm_tile_record_data(tmp_path):
    from polyfuse.cache import CompileCache

    a, w = te.placeholder((96, 112), name="a"), te.placeholder((112, 80), name="w")
    fn = polyfuse.compile([a, w], [ops.matmul(a, w)], cache=CompileCache(tmp_path))
    (kp,) = [kp for kp in fn.plan.kernel_plans if kp.parts and kp.parts[0].tiling is not None]
    (r,) = [r for r in kp.layout if DecisionKind.GEMM_TILE in r.kinds]
    mm = kp.parts[0]
    assert r.reason == mm.tiling.label
    assert any(n.startswith(r.reason) for n in fn.plan.kernels[0].notes)  # as printed
    assert r.data["threads_per_block"] == mm.block and r.data["blocks"] == mm.grid
    assert r.data["stages"] == mm.stages and tuple(r.data["block_tile"]) == mm.tiling.choice[:2]
    again = polyfuse.compile([a, w], [ops.matmul(a, w)], cache=CompileCache(tmp_path))
    assert again.cache_stats["hits"] > 0
    assert [r for kp in again.plan.kernel_plans for r in kp.layout] == kp.layout


#: Prefix tests: how a classifier reads a kind from prose (never needed on typed records).
_PREFIX_METHODS = {"startswith", "endswith", "removeprefix", "removesuffix"}
#: Splits, when applied to a decision's prose.
_SPLIT_METHODS = {"split", "rsplit", "partition", "rpartition"}
_PROSE = ("note", "reason", "text", "summary", "why")


def _prose_matches(source: str) -> list[str]:
    """Places in ``source`` that classify decision prose: any prefix test, a split or ``re``
    call on an expression naming a note/reason/text, or a string literal tested with ``in``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            f = node.func
            target = ast.unparse(f.value)
            prose = any(w in target for w in _PROSE)
            if f.attr in _PREFIX_METHODS or (f.attr in _SPLIT_METHODS and prose):
                found.append(ast.unparse(node))
            args = " ".join(ast.unparse(a) for a in node.args)
            if target == "re" and any(w in args for w in _PROSE):
                found.append(ast.unparse(node))
        if isinstance(node, ast.Compare) and any(
            isinstance(op, (ast.In, ast.NotIn)) for op in node.ops
        ):
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                found.append(ast.unparse(node))
    return found


def test_the_visualizer_never_matches_decision_prose():
    from pathlib import Path

    import polyfuse.viz

    old = 'cost = [n for n in k.notes if n.startswith("reduction layout") or "recomputed" in n]'
    assert len(_prose_matches(old)) == 2  # the check sees the classifier this replaced
    assert _prose_matches('kind = r.reason.split(":")[0]')
    for path in sorted(Path(polyfuse.viz.__file__).parent.glob("*.py")):
        assert not _prose_matches(path.read_text()), path.name
