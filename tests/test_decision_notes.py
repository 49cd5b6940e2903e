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


# --- issue 21 item 4: the GEMM, tensor-core and stage notes are records too -----------------

#: plan notes that are measurements, not choices (they stay plain text): the GEMM tile
#: estimate's occupancy and loop-code figures, the compile cache's provenance remark and the
#: SASS instrument's remarks
MEASUREMENTS = (
    "estimated ",  # registers/thread, shared bytes/block -> blocks/SM, waves (cost model)
    "loop code (GEMM tile estimate)",  # the loop-code estimate's instruction mix
    "generated earlier (compile cache)",
    "SASS",  # the SASS instrument's remarks
)


def _is_measurement(note: str) -> bool:
    text = note.split(": ", 1)[1] if note.split(": ", 1)[0].isidentifier() else note
    return note.startswith(MEASUREMENTS) or text.startswith(MEASUREMENTS)


def test_a_tensor_core_refusal_is_a_typed_refusal_about_the_micrograph():
    from poly_inputs import matmul, one

    from polyfuse.poly.device import H100, V100
    from polyfuse.poly.tensorize import map_tensor_core

    sm = one(*matmul(32, 48, 40))  # float32 operands: no 16-bit mma
    got = map_tensor_core(sm, H100)
    assert isinstance(got, Refusal) and got.kind is DecisionKind.TENSOR_CORES
    assert got.subject == (sm.name,)
    assert str(got) == "the operands are not float16, bfloat16, int8 or uint8"
    rec = got.record
    assert not rec.made and rec.kinds == (DecisionKind.TENSOR_CORES,)
    old = map_tensor_core(sm, V100, tf32=True)  # no mma.sync before sm_80
    assert isinstance(old, Refusal) and str(old) == "no m16n8k8 mma.sync on sm_70 (sm_80 and " \
        "later)"  # fmt: skip
    assert old.subject == (sm.name,)


def test_the_float32_gemm_tile_choice_and_promotions_are_records():
    a = te.placeholder((64, 96), name="a")
    w = te.placeholder((96, 80), name="w")
    fn = _compile([a, w], [ops.matmul(a, w, name="mm")])
    (k,) = fn.kernels
    recs = note_records(k.notes)
    (tile,) = [r for r in recs if r.reason.startswith("block tile ")]
    assert tile.made and DecisionKind.GEMM_TILE in tile.kinds and tile.subject == ("mm",)
    (layout,) = [d for d in fn.plan.kernel_plans[0].layout if DecisionKind.GEMM_TILE in d.kinds]
    assert tile.data.block_tile == layout.data.block_tile
    assert tile.data.micro_tile == layout.data.micro_tile
    assert tile.data.k_tile == layout.data.k_tile
    plane = next(r for r in recs if r.reason.startswith("matrix plane: "))
    assert plane.kinds == (DecisionKind.GEMM_TILE,)
    shared = {r.subject: r for r in recs if ": shared (reused across threads" in r.reason}
    assert set(shared) == {("a",), ("w",)}  # each promoted operand's tile is a record
    assert all(r.made and r.kinds == (DecisionKind.GEMM_TILE,) for r in shared.values())
    assert f"    note: {shared[('a',)].reason}" in str(fn.plan).splitlines()
    epilogue = next(r for r in recs if r.reason.startswith("epilogue on the register tile"))
    assert epilogue.kinds == (DecisionKind.GEMM_LOOP,)


def test_tensor_core_tile_stage_and_k_order_notes_are_records():
    from polyfuse.base.decision_data import GemmLoopData

    x = te.placeholder((2, 13, 11, 9), "bfloat16", name="x")
    w = te.placeholder((21, 13, 3, 3), "bfloat16", name="w")
    fn = _compile([x, w], [ops.conv2d(x, w, padding=1, name="conv")])
    notes = [n for k in fn.kernels for n in k.notes]
    (mma,) = [n for n in notes if n.startswith("tensor cores: mma.sync")]
    assert isinstance(mma, DecisionNote) and "block tile " in mma  # the tile choice's words
    assert mma.record.data["what"] == "tensorize"
    assert mma.record in fn.plan.records()  # the layout's record, listed once
    (order,) = [n for n in notes if "reduction flattened in the order" in n]
    assert isinstance(order, DecisionNote)
    assert order.record.kinds == (DecisionKind.GEMM_LOOP,) and order.record.subject == ("conv",)
    assert isinstance(order.record.data, GemmLoopData) and order.record.data.what == "k order"
    stages = [n for n in notes if n.startswith("tensor cores: stages: ")]
    assert stages and all(isinstance(n, DecisionNote) for n in stages)
    assert all(n.record.kinds == (DecisionKind.PIPELINE_STAGES,) for n in stages)
    assert stages[0].record.made  # the choice first, then each candidate


def test_the_mma_tile_choice_is_a_record():
    from poly_inputs import one

    from polyfuse.base.decision_data import TensorCoreData
    from polyfuse.poly.device import A100
    from polyfuse.poly.tensorize import match_mma
    from polyfuse.poly.tensorize_tiling import choose_mma_tiling

    a = te.placeholder((200, 40), "float16", name="a")
    b = te.placeholder((40, 1100), "float16", name="b")
    r = te.reduce_axis(40, name="r")
    c = te.compute((200, 1100), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    shape = match_mma(one([a, b], c))[0]
    tiling, why = choose_mma_tiling(shape, A100)
    assert isinstance(why, DecisionNote) and why.startswith("block tile ")
    assert why.record.subject == ("c",) and DecisionKind.GEMM_TILE in why.record.kinds
    assert why.record.data == TensorCoreData(
        "tile", "m16n8k16", [tiling.block_m, tiling.block_n, tiling.block_k],
        [tiling.warps_m, tiling.warps_n],
    )  # fmt: skip


def _representative():
    """matmul + bias + GELU, a bf16 matmul, a float32 conv + ReLU, a softmax."""
    from polyfuse.examples import EXAMPLES

    yield EXAMPLES["matmul_bias_gelu"].build()[:2]
    a = te.placeholder((67, 53), "bfloat16", name="a")
    b = te.placeholder((53, 45), "bfloat16", name="b")
    yield [a, b], [ops.matmul(a, b, name="mm16")]
    yield EXAMPLES["conv2d_relu"].build()[:2]
    yield EXAMPLES["softmax"].build()[:2]


def test_every_kernel_note_is_a_record_but_the_measurements():
    plain = []
    for inputs, outputs in _representative():
        fn = _compile(inputs, outputs)
        for k in fn.kernels:
            plain += [n for n in k.notes if not isinstance(n, DecisionNote)]
            assert all(n.record.reason == n for n in k.notes if isinstance(n, DecisionNote))
    assert [n for n in plain if not _is_measurement(n)] == []
    assert any(n.startswith("loop code (GEMM tile estimate)") for n in plain)


def test_a_promotion_note_keeps_its_reshaped_tile_box_record():
    from polyfuse.examples import EXAMPLES

    inputs, outputs = EXAMPLES["conv2d_relu"].build()[:2]
    fn = _compile(inputs, outputs)
    recs = {
        r.subject: r
        for k in fn.kernels
        for r in note_records(k.notes)
        if ": shared (reused across threads" in r.reason
    }
    x = recs[("x",)]
    assert x.made and x.kinds == (DecisionKind.GEMM_TILE,)
    assert x.data == TileBoxData("x", "merged dims", [1, 3, 3, 18], [3, 3, 18])
    assert "box 1x3x3x18 viewed as 3x3x18 of 3x14x14" in x.reason  # the words it quotes


def test_a_micrograph_without_a_parallel_loop_records_why_it_runs_in_one_thread():
    """A one-point result has no coincident band member: the note was a plain string."""
    x = te.placeholder((5,), name="x")
    y = te.compute((1,), lambda i: x[0] * 2.0, name="y")
    fn = _compile([x], [y])
    (k,) = fn.kernels
    (rec,) = [r for r in note_records(k.notes) if "one thread" in r.reason]
    assert rec.reason == "no coincident outer band member: the micrograph runs in one thread"
    assert rec.kinds == (DecisionKind.TILE_MISMATCH,) and not rec.made
    assert rec.subject == (fn.plan.micrographs[0].name,)
