"""Before/after tests of poly/coarsen.py: elements per thread for plain kernels — the float4
proof per tensor over band points, the refusals, the factor the cost model picks, and the
strip-mined schedule tree."""

from __future__ import annotations

import islpy as isl
import pytest
from poly_inputs import isl_map, one, with_schedule

from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.poly.coarsen import (
    MARK,
    CoarsenConfig,
    _linear,
    choose_coarsening,
    prove,
    strip_mine,
    whole_warps,
)
from polyfuse.poly.device import H100


def _scale(shape: tuple[int, ...], read=None):
    """``y = x * 2`` over ``shape`` (x read at ``read(i, j)``, default the same element)."""
    x = te.placeholder(shape, name="x")
    if len(shape) == 1:
        y = te.compute(shape, lambda i: x[i] * 2.0, name="y")
    else:
        y = te.compute(shape, lambda i, j: (x[read(i, j)] if read else x[i, j]) * 2.0, name="y")
    return one([x], y)


def _band(sm):
    return sm.schedule.get_root().child(0)


def _points(sm, text: str) -> isl.UnionMap:
    return isl.UnionMap(text, context=sm.model.ctx)


# ------------------------------------------------------------------------------ the proof


def test_linear_offset_is_row_major():
    ctx = isl.Context()
    assert _linear("x", (3, 4, 5), ctx).is_equal(
        isl_map("{ x[i0, i1, i2] -> [20i0 + 5i1 + i2] }", ctx)
    )


def test_proof_per_tensor_over_every_band_point():
    x = te.placeholder((8, 1024), name="x")
    b = te.placeholder((1024,), name="b")
    t = te.placeholder((1024, 8), name="t")
    y = te.compute((8, 1024), lambda i, j: x[i, j] + b[j] + t[j, i], name="y")
    sm = one([x, b, t], y)
    band = _points(sm, "{ S_y[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1024 }")
    c = prove(sm, band, 2, 4)
    # x and y contiguous and aligned, b broadcast over rows (still contiguous along d1),
    # t transposed: 8 elements apart along d1
    assert c.vector == {"y": True, "x": True, "b": True, "t": False}
    assert c.why_scalar == {"t": "start offset not a multiple of 4 for some thread"}
    assert c.uniform == {"y": True, "x": True, "b": True}
    assert (c.factor, c.tail) == (4, False)


def test_proof_of_rows_not_a_multiple_of_four_and_a_tail():
    sm = _scale((8, 1001))
    band = _points(sm, "{ S_y[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1001 }")
    c = prove(sm, band, 2, 4)
    assert c.vector == {"y": False, "x": False} and c.tail  # 1001 = 4 x 250 + 1
    assert set(c.why_scalar.values()) == {"start offset not a multiple of 4 for some thread"}


def test_proof_refuses_a_guarded_read():
    """x is read only where j < 1020 (the rest of y is padding): not at every band point."""
    x = te.placeholder((8, 1020), name="x")
    y = te.compute((8, 1024), lambda i, j: te.where(j < 1020, x[i, j], 0.0) * 2.0, name="y")
    sm = one([x], y)
    band = _points(sm, "{ S_y[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1024 }")
    c = prove(sm, band, 2, 4)
    assert c.vector == {"y": True, "x": False}
    assert c.why_scalar == {"x": "not touched at every band point (a guarded access)"}


def test_proof_refuses_a_tensor_read_through_two_subscripts_of_a_select():
    """``where(j < 512, x[i, j + 512], x[i, j - 512])`` (a roll, a concat of two slices of
    ``x``): the read relation is one aligned, contiguous run per group, but the vector form
    loads one run per statement and tensor, and the other branch read the same registers."""
    x = te.placeholder((8, 1024), name="x")
    y = te.compute((8, 1024), lambda i, j: te.where(j < 512, x[i, j + 512], x[i, j - 512]),
                   name="y")  # fmt: skip
    sm = one([x], y)
    band = _points(sm, "{ S_y[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1024 }")
    c = prove(sm, band, 2, 4)
    assert c.vector == {"y": True, "x": False}
    assert c.why_scalar["x"].startswith("S_y reads it through several subscripts")
    # the same subscript in both branches is one access
    y2 = te.compute((8, 1024), lambda i, j: te.where(j < 512, x[i, j], -x[i, j]), name="y2")
    sm2 = one([x], y2)
    band2 = _points(sm2, "{ S_y2[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1024 }")
    assert prove(sm2, band2, 2, 4).vector == {"y2": True, "x": True}


def test_subscripts_equal_only_under_their_guards_are_two_subscripts():
    """Fuzz seed 20736 (``--onnx --max-elements``): an edge Pad of an extent-1 axis reads
    ``p[i, j, h, w]`` where ``j < 1`` and ``p[i, 0, h, w]`` where ``j >= 1``. Under their guards
    the two are one function, so the proof loaded one float4 run, written ``p[i, j, h, w]``, for
    both branches: past ``p``'s end where ``j = 1`` (an out-of-bounds read on the emulator),
    another row's elements where ``i = 0``. Subscripts are compared as written."""
    import numpy as np

    import polyfuse

    p = te.placeholder((2, 1, 4096, 16), name="p")
    y = te.compute((2, 2, 4096, 16),
                   lambda i, j, h, w: te.where(j < 1, p[i, j, h, w], p[i, 0, h, w]), name="y")
    sm = one([p], y)
    band = _points(sm, "{ S_y[d0, d1, d2, d3] -> [d0, d1, d2, d3] : 0 <= d0 < 2 and "
                       "0 <= d1 < 2 and 0 <= d2 < 4096 and 0 <= d3 < 16 }")  # fmt: skip
    c = prove(sm, band, 4, 4)
    assert c.vector == {"y": True, "p": False}
    assert c.why_scalar["p"].startswith("S_y reads it through several subscripts")
    fn = polyfuse.compile([p], [y], check_cuda=False)
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
    a = np.random.default_rng(0).standard_normal(p.shape).astype(np.float32)
    for order in (False, True):
        got = fn(a, device="emulate", race_check=order)
        np.testing.assert_array_equal(got, np.concatenate([a, a], axis=1))


def test_a_proof_beyond_its_isl_limits_is_a_refusal(monkeypatch):
    """The float4 proof runs under ``PROOF_LIMITS`` (fuzz seed 2075's quasi-affine chain ran
    for hours in it); a proof that runs out is a refusal naming the limit, not a hang."""
    from polyfuse.poly import coarsen
    from polyfuse.poly.guard import Limits

    sm = _scale((8, 1024))
    band = _points(sm, "{ S_y[d0, d1] -> [d0, d1] : 0 <= d0 < 8 and 0 <= d1 < 1024 }")
    assert prove(sm, band, 2, 4).vector == {"y": True, "x": True}
    monkeypatch.setattr(coarsen, "PROOF_LIMITS", Limits(operations=5, seconds=1.0, inline=5))
    c = prove(sm, band, 2, 4)
    assert c.vector == {"y": False, "x": False}
    assert c.why_scalar["x"].startswith("no proof within isl's limits (isl budget of 5 operations")


def test_a_rolled_read_runs_right_with_elements_per_thread_and_reduction_runs():
    """Found by ``polyfuse fuzz --onnx`` (seed 117: ReduceSumSquare of a Concat of a tensor
    with itself read ``x`` out of bounds on the emulator). A plain kernel with 4 elements per
    thread and a reduction with 4-element runs per lane loaded ``x[i + 2h]`` as float4 and
    used it for the ``x[i]`` branch too: wrong in bounds (error 5472 here), out of bounds
    where the other subscript runs past the end."""
    import numpy as np

    import polyfuse
    from polyfuse import reference

    n = 1 << 21
    h = n // 2
    x, w = te.placeholder((2 * n,), name="x"), te.placeholder((n,), name="w")
    y = te.compute((n,), lambda i: te.where(i < h, x[i + 2 * h], x[i]) * 2.0, name="y")
    k = te.reduce_axis(n, name="k")
    s = te.compute((1,), lambda i: te.sum(te.where(k < h, x[k + 2 * h], x[k]) * w[k], axis=[k]),
                   name="s")  # fmt: skip
    fn = polyfuse.compile([x, w], [y, s], check_cuda=False, pack=False)
    assert "4 elements per thread" in str(fn.plan)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(2 * n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    for got, want in zip(fn(a, b, device="emulate"), reference.evaluate([y, s], {x: a, w: b}),
                         strict=True):  # fmt: skip
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-2)
    # the fuzz case: a concat of x with itself into a reduction's 8-element runs
    x8 = te.placeholder((8,), name="x8")
    cat = ops.concat([x8, x8], axis=0)
    r = te.reduce_axis(16, name="r")
    sq = te.compute((1,), lambda i: te.sum(cat[r] * cat[r], axis=[r]), name="sq")
    a8 = np.arange(8, dtype=np.float32)
    assert polyfuse.compile([x8], [sq], check_cuda=False)(a8, device="emulate")[0] == 280.0


# ------------------------------------------------------------------------------ refusals


def test_refusals_of_kernels_that_are_not_plain():
    sm = _scale((64, 1024))
    dom = "{ S_y[d0, d1] : 0 <= d0 <= 63 and 0 <= d1 <= 1023 }"
    serial = (
        f'{{ domain: "{dom}", child: {{ schedule: "[{{ S_y[d0, d1] -> [(d0)] }}, '
        '{ S_y[d0, d1] -> [(d1)] }]", permutable: 1, coincident: [ 1, 0 ] } }'
    )
    got = choose_coarsening(with_schedule(sm, serial), _band(with_schedule(sm, serial)), H100)
    assert (got.factor, got.reason) == (
        1,
        "one element per thread: not every band member is parallel",
    )
    rows = (
        f'{{ domain: "{dom}", child: {{ schedule: "[{{ S_y[d0, d1] -> [(d0)] }}]", '
        "permutable: 1, coincident: [ 1 ] } }"
    )
    sr = with_schedule(sm, rows)
    assert choose_coarsening(sr, _band(sr), H100).reason == (
        "one element per thread: S_y runs several instances per band point"
    )
    x = te.placeholder((64, 1024), name="x")
    rs = one([x], ops.reduce_sum(x, axis=1, name="s"))
    assert (
        choose_coarsening(rs, _band(rs), H100).reason == "one element per thread: has a reduction"
    )


def test_refusal_of_statements_at_different_band_points():
    x = te.placeholder((8, 1024), name="x")
    y = te.compute((8, 1024), lambda i, j: x[i, j] * 2.0, name="y")
    sm = one([x], te.compute((8, 1024), lambda i, j: y[i, j] + 1.0, name="z"))
    box = "0 <= d0 <= 7 and 0 <= d1 <= 1023"
    dom = f"{{ S_y[d0, d1] : {box}; S_z[d0, d1] : {box} }}"
    rows = "{ S_y[d0, d1] -> [(d0)]; S_z[d0, d1] -> [(d0)] }"
    cols = "{ S_y[d0, d1] -> [(d1)]; S_z[d0, d1] -> [(d1 + 1)] }"  # z one column on
    shifted = (
        f'{{ domain: "{dom}", child: {{ schedule: "[{rows}, {cols}]", permutable: 1, '
        "coincident: [ 1, 1 ] } }"
    )
    s2 = with_schedule(sm, shifted)
    assert choose_coarsening(s2, _band(s2), H100).reason == (
        "one element per thread: statements cover different band points"
    )


def test_refusals_without_float4_or_without_enough_threads():
    sm = _scale((8, 1001))
    assert choose_coarsening(sm, _band(sm), H100).reason == (
        "one element per thread: no float4 access (x: start offset not a multiple of 4 for "
        "some thread; y: start offset not a multiple of 4 for some thread)"
    )
    sm = _scale((64, 64))
    got = choose_coarsening(sm, _band(sm), H100)
    assert (got.factor, got.reason) == (
        1,
        "one element per thread: 4096 threads; with 4 per thread they would fill less than "
        "0.25 of a wave on H100-SXM5-80GB",
    )


# ------------------------------------------------------------------------------ the factor


def test_factor_four_unless_eight_gains_the_model_resolution():
    sm = _scale((4096, 4096))
    c = choose_coarsening(sm, _band(sm), H100)
    assert c.factor == 4 and c.vector == {"y": True, "x": True}
    assert c.reason.startswith(
        "4 elements per thread along the innermost parallel dimension: 15.52 waves of "
        "256-thread blocks on H100-SXM5-80GB, modelled "
    )
    assert c.reason.endswith("float4 proven for x, y")
    # without the 3 % margin the (slightly) faster 8 is taken
    assert choose_coarsening(sm, _band(sm), H100, cfg=CoarsenConfig(min_gain=0.0)).factor == 8
    rec = c.decision
    assert rec.kinds == (DecisionKind.COST_MODEL, DecisionKind.ELEMENTS_PER_THREAD)
    assert rec.data == {"factor": 4, "vector": ["x", "y"], "scalar": {}, "tail": False}


def test_forced_factor_skips_the_wave_floor_and_names_its_tail():
    sm = _scale((1002,))
    c = choose_coarsening(sm, _band(sm), H100, forced=4)
    assert (c.factor, c.tail) == (4, True)
    assert c.reason.endswith(
        "float4 proven for x, y; scalar tail where the extent is not a multiple "
        "(forced by MappingConfig.elements_per_thread)"
    )


# ------------------------------------------------------------------------------ the schedule


@pytest.mark.parametrize("factor", [4, 8])
def test_strip_mine_splits_the_innermost_member_under_a_mark(factor):
    sm = _scale((64, 1024))
    tile = strip_mine(_band(sm), factor)
    assert tile.band_n_member() == 2
    mark = tile.child(0)
    assert mark.get_type() == isl.schedule_node_type.mark
    assert mark.mark_get_id().get_name() == f"{MARK}:{factor}"
    point = mark.child(0)
    assert point.band_n_member() == 1  # the size-1 point members are gone
    want = isl_map(
        f"{{ S_y[d0, d1] -> [d0, floor(d1 / {factor}), d1 mod {factor}] : "
        "0 <= d0 < 64 and 0 <= d1 < 1024 }",
        sm.model.ctx,
    )
    sched = tile.get_schedule()
    got = sched.get_map().intersect_domain(sched.get_domain())
    assert got.is_equal(isl.UnionMap.from_map(want))


def test_whole_warps_rounds_the_innermost_thread_tile_up_within_the_block_limit():
    assert whole_warps([1, 48], 1024) == [1, 64]
    assert whole_warps([48], 1024) == [64]
    assert whole_warps([4, 16], 1024) == [4, 16]  # within one warp
    assert whole_warps([2, 64], 1024) == [2, 64]  # whole warps already
    assert whole_warps([8, 200], 1024) == [8, 200]  # 8 x 224 > 1024 threads
