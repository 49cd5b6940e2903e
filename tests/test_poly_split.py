"""Before/after tests of poly/split.py: which reductions are split into partial reductions
across blocks (and why not), the two primitives a split produces, and the graph rewrite."""

from __future__ import annotations

import islpy as isl
import numpy as np
import pytest

from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.graph.expr import ComputeOp
from polyfuse.graph.graph import build_graph
from polyfuse.poly.cost import ReductionConfig
from polyfuse.poly.device import H100
from polyfuse.poly.split import (
    SplitModel,
    choose_split,
    is_contraction,
    needs_two_stages,
    split_long_reductions,
    two_stage,
)
from polyfuse.reference import evaluate

CFG = ReductionConfig()


def _row_sum(shape: tuple[int, ...]):
    """(graph, the sum over the last axis of x of ``shape``, x)."""
    x = te.placeholder(shape, name="x")
    s = ops.reduce_sum(x, axis=len(shape) - 1, name="s")
    return build_graph([x], [s], isl.Context()), s, x


# ------------------------------------------------------------------------------ contractions


def test_contractions_are_sums_of_products_with_two_reused_reads():
    a, b = te.placeholder((8, 12), name="a"), te.placeholder((12, 16), name="b")
    x = te.placeholder((12,), name="x")
    r = te.reduce_axis(12, name="r")
    mm = te.compute((8, 16), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="mm")
    assert is_contraction(mm)
    # a zero-padded factor (conv's padding) is still a read
    pad = te.compute(
        (8, 16), lambda i, j: te.sum(te.where(i >= 1, a[i - 1, r], 0.0) * b[r, j], axis=r)
    )
    assert is_contraction(pad)
    mx = te.compute((8, 16), lambda i, j: te.max(a[i, r] * b[r, j], axis=r), name="mx")
    assert not is_contraction(mx)  # not a sum
    mv = te.compute((8,), lambda i: te.sum(a[i, r] * x[r], axis=r), name="mv")
    assert not is_contraction(mv)  # only x ignores an output axis
    rs = te.compute((8,), lambda i: te.sum(a[i, r], axis=r), name="rs")
    assert not is_contraction(rs)  # one read


def test_contraction_is_never_split():
    a, b = te.placeholder((8, 4096), name="a"), te.placeholder((4096, 8), name="b")
    r = te.reduce_axis(4096, name="r")
    mm = te.compute((8, 8), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="mm")
    g = build_graph([a, b], [mm], isl.Context())
    d = choose_split(g, "mm", H100, CFG)
    assert (d.chunks, d.form) == (1, "y-reduce [64, 4096]")
    assert d.reason == (
        "mm: y-reduce [64, 4096]: one stage: a contraction (a product of reads, two reused "
        "across outputs): the GEMM path tiles its reduction (poly/tiling.py)"
    )


# ------------------------------------------------------------------------------ chunks


def test_two_stages_needed_for_a_huge_all_reduce_and_overlong_rows():
    _, s, _ = _row_sum((100_000,))
    assert needs_two_stages(s, H100, CFG) == 7  # ceil(100000 / 16384 chunk)
    # rows of 2^20: 1024 lanes would loop 1024 times each (> 256): chunks of 256 x 1024
    _, s, _ = _row_sum((2, 1 << 20))
    assert needs_two_stages(s, H100, CFG) == 4
    _, s, _ = _row_sum((4096, 512))
    assert needs_two_stages(s, H100, CFG) == 1


@pytest.mark.parametrize(
    ("shape", "model", "chunks", "reason"),
    [
        ((100_000,), None, 7, "all-reduce [1, 100000]: split, all-reduce over 100000 > 65536 "
         "elements"),
        ((2, 1 << 20), None, 4, "y-reduce [2, 1048576]: split, a thread would combine more "
         "than 256 elements"),
        ((4096, 512), None, 1, "y-reduce [4096, 512]: one stage: 4096 blocks fill 132 SMs "
         "(31.0 waves)"),
        ((4, 4096), None, 1, "y-reduce [4, 4096]: one stage: 16384 elements < 1048576, a "
         "second launch would dominate"),
        ((4, 4096), SplitModel(min_elements=0), 1, "y-reduce [4, 4096]: one stage: 4096 "
         "reduced elements are too few to cut into chunks"),
    ],
)  # fmt: skip
def test_split_decisions_and_their_reasons(shape, model, chunks, reason):
    g, _, _ = _row_sum(shape)
    d = choose_split(g, "s", H100, CFG, model)
    assert (d.tensor, d.chunks, d.reason, d.modelled_us) == ("s", chunks, f"s: {reason}", None)


def test_few_long_rows_split_where_the_model_gains_and_not_under_a_stricter_gain():
    g, _, _ = _row_sum((4, 262144))
    d = choose_split(g, "s", H100, CFG)
    # 4 blocks for 132 SMs: min(ceil(2 x 132 / 4), 262144 // 4096) = 64 chunks
    assert d.chunks == 64 and d.modelled_us is not None
    one, two = d.modelled_us
    assert two <= SplitModel().gain * one
    assert d.reason.startswith("s: y-reduce [4, 262144]: split, 4 blocks for 132 SMs: modelled ")
    assert d.reason.endswith("as 64 partial reductions + a final one (measured figures)")
    strict = choose_split(g, "s", H100, CFG, SplitModel(gain=0.0))
    assert strict.chunks == 1 and strict.modelled_us == d.modelled_us
    assert strict.reason.startswith("s: y-reduce [4, 262144]: one stage, 4 blocks for 132 SMs")


def test_split_refused_when_another_primitive_reads_the_input():
    x = te.placeholder((4, 65536), name="x")
    m = ops.reduce_max(x, axis=1, name="m")
    y = te.compute((4, 65536), lambda i, j: x[i, j] - m[i], name="y")
    g = build_graph([x], [y], isl.Context())
    d = choose_split(g, "m", H100, CFG, SplitModel(min_elements=0))
    assert d.chunks == 1
    assert d.reason == (
        "m: y-reduce [4, 65536]: one stage although 4 blocks leave SMs of 132 idle: its input "
        "is also read by y, which a split would read again"
    )


def test_blocks_count_a_partial_last_tile_of_rows():
    """Short rows run 8 per block (a warp each): 1001 rows are 126 blocks, 3 rows (2 per
    block) are 2; the reasons said 125 and 1."""
    g, _, _ = _row_sum((1001, 200))
    assert choose_split(g, "s", H100, CFG).reason == (
        "s: y-reduce [1001, 200]: one stage: 126 blocks fill 132 SMs (1.0 waves)"
    )
    x = te.placeholder((3, 200), name="x")
    m = ops.reduce_max(x, axis=1, name="m")
    y = te.compute((3, 200), lambda i, j: x[i, j] - m[i], name="y")
    g = build_graph([x], [y], isl.Context())
    assert choose_split(g, "m", H100, CFG).reason == (
        "m: y-reduce [3, 200]: one stage although 2 blocks leave SMs of 132 idle: its input is "
        "also read by y, which a split would read again"
    )


def test_decision_record_carries_the_chunks_and_modelled_times():
    g, _, _ = _row_sum((4, 262144))
    rec = choose_split(g, "s", H100, CFG).decision
    assert rec.kinds == (DecisionKind.COST_MODEL, DecisionKind.SPLIT_REDUCTION)
    assert rec.data["tensor"] == "s" and rec.data["chunks"] == 64
    assert rec.data["form"] == "y-reduce [4, 262144]" and len(rec.data["modelled_us"]) == 2


# ------------------------------------------------------------------------------ the rewrite


def test_two_stage_partial_then_final_over_offset_axes_with_a_ragged_last_chunk():
    """21 reduced elements (k1 in [1, 4), k2 in [2, 9), k3 of extent 1) in 4 chunks of 6:
    the last chunk's 3 steps past 21 are guarded to the max's identity."""
    x = te.placeholder((4, 5, 10), name="x")
    k1, k2 = te.reduce_axis((1, 4), name="k1"), te.reduce_axis((2, 9), name="k2")
    k3 = te.reduce_axis(1, name="k3")
    t = te.compute((5,), lambda j: te.max(x[k1, j, k2 + k3], axis=[k1, k2, k3]), name="t")
    partial, final = two_stage(t, 4)
    assert (partial.name, partial.shape, final.name, final.shape) == (
        "t_partial",
        (4, 5),
        "t",
        (5,),
    )
    assert final.uid == t.uid  # the final takes the reduction's place in the graph
    assert isinstance(partial.op, ComputeOp) and partial.op.reduce is not None
    assert [a.extent for a in partial.op.reduce.axes] == [6]
    assert [a.extent for a in final.op.reduce.axes] == [4]
    a = np.random.default_rng(0).standard_normal((4, 5, 10)).astype(np.float32)
    (got,) = evaluate(final, {x: a})
    np.testing.assert_array_equal(got, a[1:4, :, 2:9].max(axis=(0, 2)))
    (parts,) = evaluate(partial, {x: a})
    flat = a[1:4, :, 2:9].transpose(1, 0, 2).reshape(5, 21)  # q = 7 (k1 - 1) + (k2 - 2)
    np.testing.assert_array_equal(parts[3], flat[:, 18:].max(axis=1))


def test_split_long_reductions_rewrites_the_graph_and_records_every_decision():
    x = te.placeholder((100_000,), name="x")
    s = ops.reduce_sum(x, name="s")
    y = te.placeholder((64, 64), name="y")
    r = ops.reduce_sum(y, axis=1, name="r")
    g = build_graph([x, y], [s, r], isl.Context())
    decisions: list = []
    notes = split_long_reductions(g, H100, CFG, decisions)
    assert notes == [
        "s: all-reduce [1, 100000] split into 7 partial reductions (s_partial_) and a final "
        "reduction over them"
    ]
    assert sorted(d.data["tensor"] for d in decisions) == ["r", "s"]
    assert set(g.prims) == {"s_partial_", "s", "r"}
    a = np.random.default_rng(1).standard_normal(100_000).astype(np.float32)
    (got,) = evaluate(g.prims["s"].tensor, {x: a})
    np.testing.assert_allclose(got, a.sum(dtype=np.float64), rtol=1e-5)
