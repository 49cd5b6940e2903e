"""Plan notes that are choices are decision records (issue 21 item 4): a note's text is its
record's reason (``print(fn.plan)`` reads as before) and ``note.record`` is the typed
:class:`polyfuse.base.decision.Decided` (kinds, subject, made or refused, data) that programs
filter on; the records reach ``plan.records()`` and survive pickling and the compile cache."""

from __future__ import annotations

import pickle

import islpy as isl
from test_gemm_fragments import _micro_tile  # a 2x2 micro-tile reading given accesses

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import (
    Decided,
    DecisionKind,
    DecisionNote,
    Refusal,
    note_records,
    noted,
    prefixed,
)
from polyfuse.base.decision_data import FragmentData, SplitData, TileBoxData
from polyfuse.cache import CompileCache
from polyfuse.poly.tile_box import tile_box


def _compile(inputs, outputs, **kw):
    return polyfuse.compile(inputs, outputs, check_cuda=False, cache=None, **kw)


def test_a_note_is_its_record_reason_and_keeps_the_record():
    n = noted(DecisionKind.GEMM_LOOP, "box 3x3 viewed as 9", "w", made=False)
    assert n == "box 3x3 viewed as 9" and f"note: {n}" == "note: box 3x3 viewed as 9"
    assert n.record == Decided((DecisionKind.GEMM_LOOP,), str(n), subject=("w",), made=False)
    back = pickle.loads(pickle.dumps(n))
    assert isinstance(back, DecisionNote) and back.record == n.record
    p = prefixed(n, "k1: ")
    assert p == "k1: box 3x3 viewed as 9" and p.record.subject == ("w",)
    assert prefixed("a measurement", "k1: ") == "k1: a measurement"
    assert note_records(["plain", n, p]) == [n.record, p.record]


def test_register_fragments_made_and_refused_are_records():
    frags, notes = _micro_tile({"a": "a[d0, r]", "w": "w[r, d1]", "x": "x[d0 + d1, r]"})
    assert sorted(f.tensor for f in frags) == ["a", "w"]
    recs = {r.subject: r for r in note_records(notes)}
    assert len(recs) == len(notes) == 3  # every fragment note is a decision
    x = recs[("x",)]
    assert not x.made and DecisionKind.REGISTER_FRAGMENT in x.kinds
    assert x.reason == "x: no register fragment (distinct micro-tile iterations read the same " \
        "element)"  # fmt: skip
    a = recs[("a",)]
    assert a.made and a.kinds[0] is DecisionKind.REGISTER_FRAGMENT
    assert a.data == FragmentData("a", 2, 4)  # 2 floats per thread read 4 times per kk step


def test_a_register_budget_refusal_keeps_the_refusal_kind():
    _, notes = _micro_tile({"a": "a[d0, r]", "w": "w[r, d1]"}, accumulators=125)
    (w,) = [r for r in note_records(notes) if r.subject == ("w",)]
    assert not w.made and w.kinds == (DecisionKind.REGISTER_FRAGMENT, DecisionKind.GEMM_TILE)
    assert w.reason.startswith("w: no register fragment (125 accumulators + 4 fragment floats")


def test_a_refused_tensor_core_match_and_gemm_tiling_are_records():
    a, w = te.placeholder((32, 48), "float16", name="a16"), te.placeholder((48, 40), name="w")
    k = te.reduce_axis(48, name="k")
    mm = te.compute((32, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="mm")
    fn = _compile([a, w], [mm])
    notes = fn.kernels[0].notes
    assert "no GEMM tiling: the operands are not float32" in notes  # the text as before
    recs = note_records(notes)
    (gemm,) = [r for r in recs if DecisionKind.GEMM_TILE in r.kinds and not r.made]
    assert gemm.reason == "no GEMM tiling: the operands are not float32"
    (tc,) = [r for r in recs if DecisionKind.TENSOR_CORES in r.kinds]
    assert not tc.made and tc.reason.startswith("no tensor cores: ")
    assert tc.subject == gemm.subject == (fn.plan.micrographs[0].name,)
    # the plan prints the notes' text and lists their records once
    assert f"    note: {tc.reason}" in str(fn.plan).splitlines()
    records = fn.plan.records()
    assert tc in records and gemm in records and all(type(r) is Decided for r in records)


def test_a_split_rewrite_is_the_split_record():
    s = te.placeholder((4, 1 << 18), name="s")
    fn = _compile([s], [ops.reduce_sum(s, axis=1, name="rs")])
    (rewrite,) = fn.plan.rewrites
    rec = rewrite.record
    assert rec.made and DecisionKind.SPLIT_REDUCTION in rec.kinds
    assert rec.subject[0] == "rs" and len(rec.subject) == 2  # the reduction, its partial
    assert isinstance(rec.data, SplitData) and rec.data.chunks > 1
    (split,) = fn.plan.splits
    assert rec.data == split.data and rewrite != split.reason
    assert f"  rewrite: {rewrite}" in str(fn.plan).splitlines()
    assert f"rs: {rec.data.form} split into {rec.data.chunks} partial reductions" in rewrite


def test_a_widened_tile_box_is_a_record():
    ctx = isl.Context()
    ranges = isl.Set("[b, kt] -> { : 0 <= b < 7 and 0 <= kt < 4 }", context=ctx)
    hull = isl.Map("{ S[j, kw] -> x[j + kw - 1] }", context=ctx)
    tile = isl.Set("[b, kt] -> { S[j, kw] : 8b <= j < 8b + 8 and 0 <= kw < 3 }", context=ctx)
    box = tile_box("x", hull, tile, ranges, (56,))
    assert not isinstance(box, Refusal)
    (rec,) = note_records(box.notes)
    assert rec.kinds == (DecisionKind.GEMM_LOOP,) and rec.subject == ("x",) and rec.made
    assert rec.data == TileBoxData("x", "aligned", [10], [16])
    assert "widened 10 -> 16" in rec.reason


def test_note_records_survive_the_compile_cache(tmp_path):
    a = te.placeholder((64, 96), name="a")
    w = te.placeholder((96, 80), name="w")
    out = ops.matmul(a, w, name="mm")

    def records(fn):
        return [(r.kinds, r.reason, r.subject, r.made, r.data) for r in fn.plan.records()]

    cache = CompileCache(tmp_path)
    first = polyfuse.compile([a, w], [out], check_cuda=False, cache=cache)
    assert any(DecisionKind.REGISTER_FRAGMENT in r.kinds for r in first.plan.records())
    again = polyfuse.compile([a, w], [out], check_cuda=False, cache=cache)
    assert again.cache_stats["hits"] > 0
    assert records(again) == records(first)
    assert [n for n in again.kernels[0].notes if isinstance(n, DecisionNote)] == [
        n for n in first.kernels[0].notes if isinstance(n, DecisionNote)
    ]
