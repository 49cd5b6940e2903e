"""Decisions are typed records: the visualizer reads their kinds, never their wording."""

from __future__ import annotations

import dataclasses

import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.decision import Decided, DecisionKind
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
