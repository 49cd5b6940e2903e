"""Before/after tests of poly/cost.py and poly/canonical.py: the canonical form of a
reduction and the launch shape the reduction cost model gives each form."""

from __future__ import annotations

import pytest

from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.poly.canonical import CanonicalForm, form_of
from polyfuse.poly.cost import choose_reduction_strategy, lanes_over_runs
from polyfuse.poly.device import H100


def test_canonical_forms_follow_the_reduced_input_layout():
    x = te.placeholder((64, 128), name="x")
    assert str(form_of(ops.reduce_sum(x, axis=1))) == "y-reduce [64, 128]"
    assert str(form_of(ops.reduce_sum(x, axis=0))) == "x-reduce [64, 128]"
    assert str(form_of(ops.reduce_sum(x))) == "all-reduce [1, 8192]"
    z = te.placeholder((4, 16, 32), name="z")
    mid = form_of(ops.reduce_sum(z, axis=1))  # the innermost dim kept: columns
    assert (mid.kind, mid.kept, mid.reduced, mid.shape2d) == ("x", (4, 32), 16, (16, 128))
    assert str(form_of(ops.reduce_sum(z, axis=(0, 2)))) == "y-reduce [16, 128]"
    # extent-1 dims are neither kept nor looked at
    y = te.placeholder((8, 1, 128), name="y")
    assert str(form_of(ops.reduce_sum(y, axis=2))) == "y-reduce [8, 128]"
    assert str(form_of(ops.reduce_sum(y, axis=(0, 1)))) == "x-reduce [8, 128]"
    assert CanonicalForm("y", (8,), 4).same_as(CanonicalForm("y", (8,), 9))
    assert not CanonicalForm("y", (8,), 4).same_as(CanonicalForm("x", (8,), 4))


@pytest.mark.parametrize(
    ("form", "kept_tile", "lanes", "serial", "combine"),
    [
        # short rows: a warp per row, 8 rows per block (fewer when there are fewer rows)
        (CanonicalForm("y", (64,), 47), 8, 32, 2, "warp shuffles"),
        (CanonicalForm("y", (3,), 200), 2, 32, 7, "warp shuffles"),
        # long rows: a block per row, about 4 elements per lane, 64..1024 lanes
        (CanonicalForm("y", (64,), 1000), 1, 256, 4, "warp shuffles + shared memory"),
        (CanonicalForm("y", (64,), 100_000), 1, 1024, 98, "warp shuffles + shared memory"),
        (CanonicalForm("all", (), 100), 1, 64, 2, "warp shuffles + shared memory"),
        # columns: a kept tile dividing the columns, thread rows over the reduced dim
        (CanonicalForm("x", (64,), 4096), 32, 8, 512, "shared-memory tree across thread rows"),
        (CanonicalForm("x", (48,), 100), 24, 8, 13, "shared-memory tree across thread rows"),
        (CanonicalForm("x", (37,), 5), 37, 4, 2, "shared-memory tree across thread rows"),
        (CanonicalForm("x", (1031,), 5), 1, 8, 1, "shared-memory tree across thread rows"),
    ],
)
def test_launch_shape_per_form(form, kept_tile, lanes, serial, combine):
    st = choose_reduction_strategy(form, H100)
    assert (st.kept_tile, st.lanes, st.serial_per_thread(), st.combine) == (
        kept_tile,
        lanes,
        serial,
        combine,
    )
    assert st.lanes_fastest == (form.kind != "x")
    if form.kind == "x":  # no partial kept tiles: every thread reaches the combine's barriers
        assert form.kept[-1] % st.kept_tile == 0


def test_runs_shrink_the_lanes_only_below_the_runs_of_a_row():
    st = choose_reduction_strategy(CanonicalForm("y", (64,), 1000), H100)
    assert lanes_over_runs(st, 4) is st  # 250 runs of 4: still 256 lanes
    eight = lanes_over_runs(st, 8)  # 125 runs of 8: 128 lanes
    assert (eight.lanes, eight.reason) == (128, "block per row, 8-element runs per lane")
    warp = choose_reduction_strategy(CanonicalForm("y", (64,), 100), H100)
    assert lanes_over_runs(warp, 4) is warp  # a warp per row keeps its 32 lanes


def test_layout_record():
    st = choose_reduction_strategy(CanonicalForm("y", (64,), 1000), H100)
    rec = st.decision(64)
    assert rec.kinds == (DecisionKind.COST_MODEL, DecisionKind.REDUCTION_LAYOUT)
    assert rec.reason == (
        "reduction layout: y-reduce [64, 1000]: 1 kept x 256 lanes = 256 threads, 4 "
        "serial/thread, combine by warp shuffles + shared memory (block per row)"
    )
    assert rec.data["blocks"] == 64 and rec.data["threads_per_block"] == 256
