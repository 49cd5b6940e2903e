"""One decision record and one refusal type (issue 21 item 4).

Every decision a compiled plan carries is a :class:`polyfuse.base.decision.Decided` with typed
data (a frozen :class:`polyfuse.base.decision_data.DecisionData`, never a dict); functions that
may decline return :class:`polyfuse.base.decision.Refusal` (kind, subject, reason) instead of
a bare string, with the reasons the string returns had; and no ``-> X | str`` refusal return
comes back into the converted modules (an AST check, shown to catch a planted one).
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import islpy as isl
import pytest
from poly_inputs import one

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.base.decision import Decided, DecisionKind, Refusal, note_records
from polyfuse.base.decision_data import (
    NO_DATA,
    DecisionData,
    GemmLoopData,
    RecomputeData,
    SplitData,
    typed_data,
)
from polyfuse.cache import CompileCache
from polyfuse.graph.graph import build_graph
from polyfuse.graph.passes import DEFAULT_PASSES, run_passes
from polyfuse.graph.passes.merge_siblings import _match
from polyfuse.poly.coarsen import _plain_band
from polyfuse.poly.fragments import _thread_footprint
from polyfuse.poly.model import Statement
from polyfuse.stitch.facts import KernelFacts
from polyfuse.stitch.gemm_rows import GEMM_ROWS_RULE, block_correspondence, gemm_tile_footprint
from polyfuse.stitch.parallel import PartShape, pack_layout

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------ every record is typed


def _graphs():
    """Plans that between them carry every decision family: partition edges, Layer 2
    stitches, placements, recomputes, reduction layouts, splits, elements per thread, GEMM
    tiles and loops, a GEMM + softmax row stitch, Layer 3 packs."""
    x = te.placeholder((4, 65536), name="x")  # spills, recomputes
    yield [x], [ops.softmax(x)]
    q, k = te.placeholder((2, 2, 37, 16), name="q"), te.placeholder((2, 2, 16, 96), name="k")
    scores = ops.mul(ops.matmul(q, k, name="scores"), 0.25, name="scaled")
    yield [q, k], [ops.softmax(scores, -1, name="probs")]  # GEMM tile/loops + row stitch
    s = te.placeholder((4, 1 << 18), name="s")
    yield [s], [ops.reduce_sum(s, axis=1, name="rs")]  # a split reduction
    a, b = te.placeholder((64, 256), name="a"), te.placeholder((64, 256), name="b")
    y = te.placeholder((2048, 1024), name="y")
    yield [a, b, y], [ops.softmax(a), ops.layer_norm(b), ops.relu(y, name="r")]  # packs


@pytest.fixture(scope="module")
def plans():
    return [polyfuse.compile(ins, outs, "sm_90", check_cuda=False).plan for ins, outs in _graphs()]


def _untyped(value) -> bool:
    """Whether a record's data holds an untyped dict where a record belongs."""
    if isinstance(value, dict):
        return True
    if isinstance(value, DecisionData):
        return any(
            isinstance(getattr(value, f.name), DecisionData | dict)
            and _untyped(getattr(value, f.name))
            for f in dataclasses.fields(value)
            if f.name != "scalar"  # CoarsenData.scalar: tensor -> why (a table, not a record)
        )
    return False


def test_every_decision_of_a_plan_is_the_one_record_with_typed_data(plans):
    families: set[str] = set()
    for plan in plans:
        records = plan.records()
        # every stage's decisions are in the records, as records, then those of the notes
        # that are decisions (each once)
        staged = (
            len(plan.partition.decisions)
            + len(plan.stitches)
            + sum(
                len(kp.placements) + len(kp.recomputes) + len(kp.layout) for kp in plan.kernel_plans
            )
            + len(plan.packs)
            + len(plan.splits)
        )
        noted = note_records([n for k in plan.kernels for n in k.notes])
        assert set(noted) <= set(records) and set(records[staged:]) <= set(noted)
        assert len(records[staged:]) == len(set(records[staged:]))
        for r in records:
            assert type(r) is Decided
            assert isinstance(r.data, DecisionData) and not _untyped(r.data), r
            assert dataclasses.is_dataclass(r.data) and type(r.data).__dataclass_params__.frozen
            assert isinstance(r.reason, str) and r.reason and "\n" not in r.reason
            assert all(isinstance(k, DecisionKind) for k in r.kinds)
            assert isinstance(r.subject, tuple) and all(isinstance(s, str) for s in r.subject)
            assert isinstance(r.made, bool)
            families.add(type(r.data).__name__)
        for kp in plan.kernel_plans:  # the kernel plans' own lists hold records too
            assert all(type(r) is Decided for r in [*kp.layout, *kp.recomputes])
        assert all(type(d.record) is Decided for d in [*plan.stitches, *plan.packs])
    assert {
        "EdgeData", "StitchData", "PlacementData", "RecomputeData", "ReductionLayoutData",
        "SplitData", "CoarsenData", "GemmTileData", "GemmLoopData", "RowStitchData", "PackData",
    } <= families  # fmt: skip


def test_records_name_their_subject_and_whether_the_choice_was_made(plans):
    plan = plans[0]
    for d, r in zip(plan.partition.decisions, plan.records(), strict=False):
        assert r.subject == (d.producer, d.consumer) and r.made == d.fused
        assert r.data.tensor == d.tensor and r.data.rule == d.rule
    (rec,) = [r for r in plans[2].records() if DecisionKind.SPLIT_REDUCTION in r.kinds]
    assert rec.subject == ("rs",) and rec.made and isinstance(rec.data, SplitData)
    recompute = [r for r in plan.records() if isinstance(r.data, RecomputeData)]
    assert recompute and all(r.subject[0] == r.data.tensor for r in recompute)
    (row,) = [d for d in plans[1].stitches if d.rule == GEMM_ROWS_RULE]
    assert row.record.made and row.record.data.figures is row.data
    assert row.data.tile == row.data["tile"] and row.data.rows_tile_us > 0


def test_plan_lists_are_typed():
    hints = {f.name: f.type for f in dataclasses.fields(polyfuse.plan.Plan)}
    assert hints["stitches"].startswith("list[StitchDecision]")
    assert hints["packs"].startswith("list[PackDecision]")
    assert "Any" not in hints["stitches"] + hints["packs"] + hints["splits"]


def test_typed_data_reads_as_the_json_it_replaces():
    """The records' JSON (visualizer, compile cache) keeps its keys; a plain dict becomes the
    family its kinds name, and a dict no family claims is refused."""
    loop = Decided((DecisionKind.GEMM_LOOP,), "peel", {"what": "peel", "loop": "kt0"})
    assert loop.data == GemmLoopData("peel", loop="kt0")
    assert loop.data.as_dict() == {"what": "peel", "loop": "kt0"} == loop.data
    assert loop.data["loop"] == "kt0" and "steps" not in loop.data
    assert typed_data((), {}) is NO_DATA
    with pytest.raises(TypeError, match="no typed decision data"):
        Decided((DecisionKind.FUSED,), "x", {"stage": "partition"})
    with pytest.raises(TypeError, match="DecisionData"):
        Decided((DecisionKind.FUSED,), "x", ["not", "typed"])  # type: ignore[arg-type]


def test_typed_records_survive_the_compile_cache(tmp_path):
    ins, outs = list(_graphs())[1]
    first = polyfuse.compile(ins, outs, "sm_90", check_cuda=False, cache=CompileCache(tmp_path))
    again = polyfuse.compile(ins, outs, "sm_90", check_cuda=False, cache=CompileCache(tmp_path))
    assert again.cache_stats["hits"] > 0
    before = [kp.layout for kp in first.plan.kernel_plans]
    after = [kp.layout for kp in again.plan.kernel_plans]
    assert after == before  # kinds, reason, typed data, subject and made
    assert any(isinstance(r.data, GemmLoopData) for layout in after for r in layout)


# ---------------------------------------------------------- refusals: one type, old reasons


def _part(name, threads, collective=False, grid=64):
    return PartShape(name, grid, threads, 1 << 20, KernelFacts(barriers=collective))


def test_pack_layout_refuses_with_a_refusal():
    got = pack_layout([_part("r", 256, True), _part("s", 512, True)])
    assert got == Refusal(
        DecisionKind.FORM_MISMATCH,
        "launch shapes differ: parts with barriers need their own block size: r (256), s (512)",
        ("r", "s"),
    )
    got = pack_layout([_part("r", 256, True), _part("e", 384)])
    assert isinstance(got, Refusal) and got.subject == ("r", "e")
    assert (
        str(got)
        == got.reason
        == (
            "launch shapes differ: e's 384 threads and the 256-thread block of a part with "
            "barriers: neither divides the other"
        )
    )
    assert got.record == Decided(
        (DecisionKind.FORM_MISMATCH,), got.reason, NO_DATA, ("r", "e"), made=False
    )


def test_coarsening_refuses_a_reduction_band_with_a_refusal():
    x = te.placeholder((8, 64), name="x")
    sm = one([x], ops.reduce_sum(x, axis=1, name="s"))
    got = _plain_band(sm, sm.schedule.get_root().child(0))
    assert got == Refusal(DecisionKind.ELEMENTS_PER_THREAD, "has a reduction", (sm.name,))


def _fragment(access: str):
    ctx = isl.Context()
    sched = isl.UnionMap(
        "[t0, t1] -> { U[d0, d1, r] -> [kt0, 2, 0, kk0, ii0, ii1, 0] : d0 = t0 + 4ii0 and "
        "d1 = t1 + 4ii1 and r = 8kt0 + kk0 and 0 <= ii0 < 2 and 0 <= ii1 < 2 and "
        "0 <= kk0 < 8 and 0 <= kt0 < 2 and 0 <= t0 < 4 and 0 <= t1 < 4 }",
        context=ctx,
    )
    update = Statement.__new__(Statement)
    object.__setattr__(update, "name", "U")
    acc = isl.Map(f"{{ U[d0, d1, r] -> {access} }}", context=ctx)
    iters = ["kt0", "ph", "sub", "kk0", "ii0", "ii1", "pos"]
    return _thread_footprint(update, sched, iters, ["ii0", "ii1"], [2, 2], acc, ())


def test_register_fragments_refuse_with_a_refusal():
    assert _fragment("x[d0 + d1, r]") == Refusal(
        DecisionKind.GEMM_TILE, "distinct micro-tile iterations read the same element", ("x",)
    )
    assert _fragment("x[d0, q] : 0 <= q < 2") == Refusal(
        DecisionKind.GEMM_TILE, "the read is not a function of the micro-tile", ("x",)
    )


def test_gemm_row_stitch_refuses_with_refusals():
    q, k = te.placeholder((2, 2, 37, 16), name="q"), te.placeholder((2, 2, 16, 96), name="k")
    scores = ops.mul(ops.matmul(q, k, name="scores"), 0.25, name="scaled")
    fn = polyfuse.compile([q, k], [ops.softmax(scores, -1)], check_cuda=False)
    gk, rm = fn.plan.kernel_plans[0].parts
    names = (gk.scheduled.name, rm.scheduled.name)
    got = block_correspondence(gk, dataclasses.replace(rm, block_params=[]), 1)
    assert got == Refusal(
        DecisionKind.TILE_MISMATCH,
        f"block grids do not correspond ({gk.grid_dims} GEMM, {rm.grid_dims} reduction)",
        names,
    )
    got = gemm_tile_footprint(gk, "nothing")
    assert got == Refusal(
        DecisionKind.TILE_MISMATCH, "nothing is not stored by one epilogue statement", ("nothing",)
    )


def test_plan_rows_refusal_reaches_the_plan_with_its_reason():
    """plan_rows' FOOTPRINT refusal is the stitch decision's reason, worded as before."""
    x, w = te.placeholder((16, 16), name="x"), te.placeholder((16, 2048), name="w")
    fn = polyfuse.compile([x, w], [ops.softmax(ops.matmul(x, w, name="mm"), -1)], check_cuda=False)
    (d,) = [d for d in fn.plan.stitches if d.rule == GEMM_ROWS_RULE]
    assert d.kinds == (DecisionKind.FOOTPRINT,) and not d.record.made
    assert d.reason.startswith("row too wide for shared memory: the ")
    assert "= 132096 B > 49152 B static shared memory per block" in d.reason


def test_merge_siblings_refuses_with_a_refusal():
    x = te.placeholder((4, 16), name="x")
    w1, w2 = te.placeholder((16, 8), name="w1"), te.placeholder((20, 8), name="w2")
    k1, k2 = te.reduce_axis(16, "k"), te.reduce_axis(16, "k")
    a = te.compute((4, 8), lambda i, j: te.sum(x[i, k1] * w1[k1, j], axis=k1), name="a")
    b = te.compute((4, 8), lambda i, j: te.sum(x[i, k2] * w2[k2, j], axis=k2), name="b")
    consts = {w1: _ones(16, 8), w2: _ones(20, 8)}
    before = DEFAULT_PASSES[: DEFAULT_PASSES.index("merge_siblings")]
    g = run_passes(
        build_graph([x, w1, w2], [ops.add(a, b, name="out")], constants=consts),
        before,
        lambda t, feeds: reference.evaluate([t], feeds)[0],
    )
    got = _match(g, g.prims["a"], g.prims["b"])
    assert got == Refusal(
        DecisionKind.FORM_MISMATCH,
        "a and b: weights w1 [16, 8] and w2 [20, 8] differ in a dimension other than the "
        "concatenated one (1), or are not read whole along it: shapes not compatible",
        ("a", "b"),
    )


def test_shared_memory_and_register_budget_refusals_are_refusals():
    """The reason-or-nothing checks: a pack over the shared-memory budget (with its bytes),
    a row tile too wide, a register fragment without reuse."""
    from polyfuse.base.decision_data import SmemData
    from polyfuse.poly.device import H100
    from polyfuse.poly.fragments import _refusal
    from polyfuse.stitch.facts import SharedArray
    from polyfuse.stitch.gemm_rows import too_wide
    from polyfuse.stitch.parallel import _fits

    tiles = KernelFacts(shared_arrays=(SharedArray(32 * 1024, 16),))
    big = [PartShape(f"r{i}", 64, 256, 1 << 20, tiles) for i in range(2)]
    got = _fits(big, H100)
    assert isinstance(got, Refusal) and got.kind == DecisionKind.FOOTPRINT
    assert got.subject == ("r0", "r1") and got.data == SmemData(64 * 1024, 0)
    assert "does not fit 48 KB" in got.reason and got.record.data is got.data
    assert _fits(big[:1], H100) is None
    assert too_wide("mm", 1024, 1024, 1024) is None
    assert too_wide("mm", 40000, 1024, 10000) == Refusal(
        DecisionKind.FOOTPRINT,
        "row too wide for shared memory: the 40000 B row tile of mm + 10000 B of the reduction "
        "(or the GEMM's 1024 B operand tiles, which the two overlay) = 50000 B > 49152 B "
        "static shared memory per block",
        ("mm",),
    )
    assert _refusal("w", 4, 4, 4, 0, "per kk step") == Refusal(
        DecisionKind.GEMM_TILE, "each of its 4 elements per kk step is read once: no reuse", ("w",)
    )
    assert _refusal("w", 2, 8, 4, 0, "per kk step") is None


def _ones(*shape):
    import numpy as np

    return np.ones(shape, np.float32)


# ------------------------------------------------- no new `-> X | str` refusal returns

#: the modules whose refusals are Refusal records (poly/tile_box.py's too, but its
#: ``_aff_text -> str | None`` is an optional isl text, which this check would flag)
CONVERTED = [
    "polyfuse/stitch/gemm_rows.py",
    "polyfuse/stitch/parallel.py",
    "polyfuse/poly/coarsen.py",
    "polyfuse/poly/fragments.py",
    "polyfuse/graph/passes/merge_siblings.py",
    "polyfuse/poly/kernel_map.py",
    "polyfuse/poly/tiling.py",
    "polyfuse/poly/promote.py",
    "polyfuse/poly/gemm_kernel.py",
    "polyfuse/poly/gemm_tile_schedule.py",
    "polyfuse/poly/gemm_promotion.py",
    "polyfuse/poly/gemm_pipeline.py",
    "polyfuse/poly/gemm_barriers.py",
    "polyfuse/poly/gemm_codegen.py",
    "polyfuse/poly/gemm_shape.py",
]


def _has_str(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "str"


def _str_union(node: ast.expr, none_too: bool = True) -> bool:
    """Whether an annotation holds a union of ``str`` with another type anywhere inside it
    (``X | str``, ``dict[str, list[Y] | str]``, ``Union[X, str]``; with ``none_too`` also
    ``str | None``): a reason-or-result (or reason-or-nothing) in these modules is a
    Refusal."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.BitOr):
            members, stack = [], [sub]
            while stack:
                n = stack.pop()
                if isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr):
                    stack += [n.left, n.right]
                else:
                    members.append(n)
            others = [
                m
                for m in members
                if not _has_str(m) and (none_too or not isinstance(m, ast.Constant))
            ]
            if any(_has_str(m) for m in members) and others:
                return True
        if isinstance(sub, ast.Subscript) and getattr(sub.value, "id", "") == "Union":
            elts = sub.slice.elts if isinstance(sub.slice, ast.Tuple) else [sub.slice]
            if any(_has_str(e) for e in elts) and len(elts) > 1:
                return True
    return False


def str_refusal_returns(source: str) -> list[str]:
    """Functions (and annotated names) of ``source`` whose return or value type unions
    ``str`` with another type: a refusal returned as a bare string."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            if _str_union(node.returns):
                out.append(node.name)
        elif isinstance(node, ast.AnnAssign) and _str_union(node.annotation, none_too=False):
            # a variable or field: an optional name (``str | None``) is not a refusal
            out.append(ast.unparse(node.target))
    return out


@pytest.mark.parametrize("path", CONVERTED)
def test_no_str_refusal_returns_in_converted_modules(path):
    assert str_refusal_returns((ROOT / path).read_text()) == []


def test_the_str_refusal_check_catches_a_planted_one():
    planted = (ROOT / CONVERTED[1]).read_text() + (
        "\n\ndef planted(x: int) -> PackLayout | str:\n    return 'refused'\n"
        "\n\ndef table() -> dict[str, list[int] | str]:\n    return {}\n"
        "\n\ndef maybe(x: int) -> str | None:\n    return None\n"
        "\n\ndef fine(x: int) -> str:\n    return ''\n"
    )
    assert str_refusal_returns(planted) == ["planted", "table", "maybe"]


def test_the_row_cost_record_carries_the_one_record():
    """stitch/row_cost.py's verdict: its figures typed, its record made when taken."""
    from polyfuse.base.decision_data import RowStitchData
    from polyfuse.poly.device import BY_ARCH
    from polyfuse.stitch.row_cost import TilePrice, row_stitch_cost

    best = TilePrice((64, 128, 4, 8, 16), 10.0, "FP32 pipe", 96, 0.44, 8192)
    rows = dataclasses.replace(best, tile=(16, 1024, 8, 8, 32), us=12.0)
    cost = row_stitch_cost("mm", rows, best, 1 << 20, BY_ARCH["sm_80"])
    rec = cost.record
    assert isinstance(rec.data, RowStitchData) and rec.data == cost.data()
    assert rec.subject == ("mm",) and rec.made and rec.reason == cost.figures()
    assert rec.data.tile == [16, 1024, 8, 8, 32] and rec.data.saved_bytes == 2 << 20
    assert RowStitchData.from_dict(rec.data.as_dict()) == rec.data  # the stitch memo's JSON


# ------------------------------------- decision data built typed, never as a dict literal


def dict_data_records(source: str) -> list[int]:
    """Lines of ``source`` where a :class:`Decided` is built with a dict (a ``{...}``
    literal or ``dict(...)``) as its data: a record whose family the kinds would have to
    guess."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "Decided"):
            continue
        data = node.args[2] if len(node.args) > 2 else None
        data = next((k.value for k in node.keywords if k.arg == "data"), data)
        if isinstance(data, ast.Dict | ast.DictComp) or (
            isinstance(data, ast.Call) and getattr(data.func, "id", "") == "dict"
        ):
            out.append(node.lineno)
    return out


@pytest.mark.parametrize(
    "path", sorted(str(p.relative_to(ROOT)) for p in (ROOT / "polyfuse").rglob("*.py"))
)
def test_decisions_are_built_with_typed_data(path):
    assert dict_data_records((ROOT / path).read_text()) == []


def test_the_dict_data_check_catches_a_planted_one():
    planted = (ROOT / "polyfuse/poly/gemm_codegen.py").read_text() + (
        "\n\ndef planted(t):\n"
        "    return Decided((DecisionKind.GEMM_LOOP,), 'x', {'what': 'select free'})\n"
        "\n\ndef planted2(t):\n"
        "    return Decided((DecisionKind.GEMM_LOOP,), 'x', data=dict(what='peel'))\n"
    )
    assert len(dict_data_records(planted)) == 2
