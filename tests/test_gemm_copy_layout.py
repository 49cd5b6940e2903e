"""GEMMs with a 1-D factor, and shared-tile copy layouts for footprints of any rank (issue 19,
item 5).

``sum_k a[i, k] * b[k, j] * s[i]`` promoted ``s`` to a shared tile whose copy pinned the
thread-row index only for footprints of two or more dimensions: every row of copying threads
copied the same elements (a write-write race in every emulator mode, 128x redundant copies on a
GPU). Now :mod:`polyfuse.poly.copy_layout` spreads every footprint — 1-D, 2-D, 3-D, 4-D — over
the block's threads, each element copied by one thread, and a factor the reduction does not
index (``s[i]``, ``s[j]``, a per-batch ``s[n]``) is not a shared tile at all: each thread holds
its elements in registers, loaded once (:func:`polyfuse.poly.fragments.hoisted_fragments`).

Checked three ways: results on the emulator in every race mode against
:func:`polyfuse.reference.evaluate`; with isl, that the copy statement's instances partition
the elements the update reads (each copied exactly once per block and k-tile); and with the
emulator's request counts, that global memory is read once per element and block.
"""

from __future__ import annotations

import math
import re

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.graph.graph import build_graph
from polyfuse.graph.partition import PARTITION_RULES, partition
from polyfuse.poly.copy_layout import copy_layout, thread_extents
from polyfuse.poly.device import A100
from polyfuse.poly.kernel_map import map_gemm
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.model import build_model
from polyfuse.poly.promote import GemmKernel, Promotion
from polyfuse.poly.schedule import DEFAULT_BUDGET, compute_schedule, configure
from polyfuse.reference import evaluate

MODES = (False, True, "shadow")  # in order; reversed between barriers; shadow-memory races
SIZES = {"tile": (64, 64, 64), "non-tile": (50, 70, 37)}


def _factor_gemm(axis: str, m: int, n: int, k: int):
    """``c[i, j] = sum_k a[i, k] * b[k, j] * s[axis]``."""
    a = te.placeholder((m, k), name="a")
    b = te.placeholder((k, n), name="b")
    s = te.placeholder(({"i": m, "j": n, "k": k}[axis],), name="s")
    r = te.reduce_axis(k, name="r")

    def body(i, j):
        return te.sum(a[i, r] * b[r, j] * s[{"i": i, "j": j, "k": r}[axis]], axis=r)

    return [a, b, s], te.compute((m, n), body, name="c")


def _mixed_factors():
    """``s[i - 1]`` under a guard (zero-padded read), ``t[j]`` and an elementwise ``w[i, j]``:
    every one k-invariant, each thread's elements in registers (zeros outside the arrays)."""
    m, n, k = SIZES["non-tile"]
    a, b = te.placeholder((m, k), name="a"), te.placeholder((k, n), name="b")
    s, t = te.placeholder((m,), name="s"), te.placeholder((n,), name="t")
    w = te.placeholder((m, n), name="w")
    r = te.reduce_axis(k, name="r")
    c = te.compute(
        (m, n),
        lambda i, j: te.sum(
            a[i, r] * te.where(i >= 1, s[i - 1], 0.0) * b[r, j] * t[j] * w[i, j], axis=r
        ),
        name="c",
    )
    return [a, b, s, t, w], c


def _two_axis_gemm():
    """A 3-D footprint: ``a[i, k1, k2]`` over a block row and both reduction axes."""
    a = te.placeholder((40, 3, 20), name="a")
    b = te.placeholder((3, 20, 48), name="b")
    s = te.placeholder((20,), name="s")
    k1, k2 = te.reduce_axis(3, name="k1"), te.reduce_axis(20, name="k2")
    c = te.compute(
        (40, 48),
        lambda i, j: te.sum(a[i, k1, k2] * b[k1, k2, j] * s[k2], axis=[k1, k2]),
        name="c",
    )
    return [a, b, s], c


def _batched_scaled():
    """Batched matmul with a per-batch scale ``s[n]`` (k-invariant, 3-D operand tiles)."""
    a = te.placeholder((3, 33, 20), name="a")
    b = te.placeholder((3, 20, 40), name="b")
    s = te.placeholder((3,), name="s")
    k = te.reduce_axis(20, name="k")
    c = te.compute(
        (3, 33, 40), lambda n, i, j: te.sum(a[n, i, k] * b[n, k, j] * s[n], axis=k), name="c"
    )
    return [a, b, s], c


def _conv_scaled():
    """A conv with a per-input-channel scale ``s[c]``: 4-D input and weight footprints."""
    x = te.placeholder((1, 6, 10, 12), name="x")
    w = te.placeholder((8, 6, 3, 3), name="w")
    s = te.placeholder((6,), name="s")
    c, kh, kw = te.reduce_axis(6, name="c"), te.reduce_axis(3, name="kh"), te.reduce_axis(3, "kw")
    y = te.compute(
        (1, 8, 8, 10),
        lambda n, o, h, v: te.sum(
            x[n, c, h + kh, v + kw] * w[o, c, kh, kw] * s[c], axis=[c, kh, kw]
        ),
        name="y",
    )
    return [x, w, s], y


CASES = {
    **{
        f"s[{ax}] {size}": (lambda ax=ax, sz=sz: _factor_gemm(ax, *sz))
        for ax in "ijk"
        for size, sz in SIZES.items()
    },
    "s[i - 1], t[j], w[i, j]": _mixed_factors,
    "s[k], one vector per row": lambda: _factor_gemm("k", 40, 48, 4),
    "two reduction axes (3-D)": _two_axis_gemm,
    "batched, per-batch scale": _batched_scaled,
    "conv, per-channel scale (4-D)": _conv_scaled,
}


def _arrays(inputs, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(t.shape).astype(np.float32) for t in inputs]


def _gemm_kernel(inputs, out) -> GemmKernel:
    """The GEMM kernel the driver maps the graph's one micrograph to (A100)."""
    ctx = configure(isl.Context())
    graph = build_graph(inputs, [out], ctx)
    (mg,) = partition(graph, PARTITION_RULES, set()).micrographs
    sm = compute_schedule(build_model(graph, mg, ctx), DEFAULT_BUDGET)
    gk = map_gemm(sm, A100, MappingConfig())
    assert isinstance(gk, GemmKernel)
    return gk


@pytest.mark.parametrize("case", list(CASES))
def test_factor_gemms_run_in_every_race_mode(case):
    inputs, out = CASES[case]()
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    assert any("register micro-tile" in n for k in fn.kernels for n in k.notes)  # GEMM path
    arrays = _arrays(inputs)
    (want,) = evaluate(out, dict(zip(inputs, arrays, strict=True)))
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"mode {mode}")


def _copied_elements(gk: GemmKernel, p: Promotion) -> isl.Map:
    """``{ E[kt..., e...] -> C[kt..., e..., thread...] }`` with the block coordinates as
    parameters: which copy instance (and which thread of the grid) copies each element."""
    sets = gk.schedule_map.domain().get_set_list()
    (cset,) = [
        sets.get_at(i)
        for i in range(sets.n_set())
        if sets.get_at(i).get_tuple_name() == p.copy_stmt
    ]
    cset = cset.intersect_params(gk.context.align_params(cset.get_space()))
    for name, _ in p.grid:  # the thread coordinates become set dims
        pos = cset.find_dim_by_name(isl.dim_type.param, name)
        cset = cset.move_dims(
            isl.dim_type.set, cset.dim(isl.dim_type.set), isl.dim_type.param, pos, 1
        )
    nk = sum(1 for v in gk.iterators if v.startswith("kt"))
    ne = len(p.size)
    ks = [f"k{i}" for i in range(nk)]
    es = [f"e{i}" for i in range(ne)]
    fs = [f"f{i}" for i in range(ne)]
    ps = [f"p{i}" for i in range(len(p.grid))]
    same = [f"{f} = {e}" for f, e in zip(fs[:-1], es[:-1], strict=True)]
    same.append(f"{es[-1]} <= {fs[-1]} < {es[-1]} + {p.width}")  # a vector instance
    expand = isl.Map(
        f"{{ {p.copy_stmt}[{', '.join(ks + es + ps)}] -> E[{', '.join(ks + fs)}] : "
        f"{' and '.join(same)} }}",
        context=cset.get_ctx(),
    )
    cset = cset.reset_tuple_id().set_tuple_name(p.copy_stmt)
    expand = expand.align_params(cset.get_space()).intersect_domain(
        cset.align_params(expand.get_space())
    )
    return _block_params_only(gk, expand.reverse())


def _block_params_only(gk: GemmKernel, m):
    """``m`` with every parameter but the block coordinates projected out."""
    keep = set(gk.block_params)
    for i in reversed(range(m.dim(isl.dim_type.param))):
        if m.get_dim_name(isl.dim_type.param, i) not in keep:
            m = m.project_out(isl.dim_type.param, i, 1)
    return m


def _read_elements(gk: GemmKernel, tensor: str, merge=()) -> isl.Set:
    """``{ E[kt..., e...] }``: the elements of ``tensor`` the update reads in each k-tile of a
    block (all its threads), block coordinates as parameters; with ``merge`` (a promotion's
    view, :attr:`Promotion.merge`), in the tile's view of the tensor."""
    assert gk.shape is not None
    upd = gk.shape.update.name
    lst = gk.schedule_map.get_map_list()
    (sched,) = [
        lst.get_at(i)
        for i in range(lst.n_map())
        if lst.get_at(i).get_tuple_name(isl.dim_type.in_) == upd
    ]
    nk = sum(1 for v in gk.iterators if v.startswith("kt"))
    sched = sched.project_out(isl.dim_type.out, nk, sched.dim(isl.dim_type.out) - nk)
    acc = next(m for n, m in gk.shape.operands if n == tensor)
    if merge:
        ins = [f"i{d}" for d in range(len(merge[0]))]
        outs = [" + ".join(f"{c} * {i}" for c, i in zip(row, ins, strict=True)) for row in merge]
        view = f"{{ {tensor}[{', '.join(ins)}] -> {tensor}[{', '.join(outs)}] }}"
        acc = acc.apply_range(isl.Map(view, context=acc.get_ctx()))
    reads = sched.reverse().apply_range(acc.align_params(sched.get_space()))
    reads = reads.intersect_params(gk.context.align_params(reads.get_space()))
    return _block_params_only(gk, reads).wrap().flatten().set_tuple_name("E")


@pytest.mark.parametrize("case", list(CASES))
def test_isl_copies_each_footprint_element_exactly_once(case):
    gk = _gemm_kernel(*CASES[case]())
    assert gk.promotions
    for p in gk.promotions:
        rel = _copied_elements(gk, p)
        # one instance of one thread per element, and every element the update reads
        assert rel.is_single_valued(), f"{p.tensor}: an element is copied more than once"
        read = _read_elements(gk, p.tensor, p.merge)
        covered = rel.domain()
        covered = covered.align_params(read.get_space())
        assert read.align_params(covered.get_space()).is_subset(covered), p.tensor
        # and the thread grid has every thread of the block
        assert math.prod(p.thread_grid) == gk.block


def _in_array_loads(gk: GemmKernel, frag, n: int) -> int:
    """How many (block, thread, fragment index) load an element of the hoisted 1-D fragment
    ``frag`` inside its array of ``n`` elements (isl enumerates them)."""
    (elem,) = frag.element
    zero = elem.sub(elem)
    loads = elem.ge_set(zero).intersect(elem.lt_set(zero.add_constant_val(n)))
    ranges = " and ".join(
        [f"0 <= {v} < {e}" for v, e in zip(frag.index_vars, frag.shape, strict=True)] + ["0 = 0"]
    )
    ranges = isl.Set(f"[{', '.join(frag.index_vars)}] -> {{ : {ranges} }}", context=elem.get_ctx())
    for c in (frag.context, gk.context, ranges):  # blocks, threads, the fragment's index
        loads = loads.intersect_params(c.align_params(loads.get_space()))
        loads = loads.align_params(c.get_space())
    keep = {*gk.block_params, *gk.thread_params, *frag.index_vars}  # the load's coordinates
    for i in reversed(range(loads.dim(isl.dim_type.param))):
        if loads.get_dim_name(isl.dim_type.param, i) not in keep:
            loads = loads.project_out(isl.dim_type.param, i, 1)
    nparam = loads.dim(isl.dim_type.param)
    loads = loads.move_dims(isl.dim_type.set, 0, isl.dim_type.param, 0, nparam)
    points: list = []
    loads.foreach_point(points.append)
    return len(points)


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("axis", ["i", "j"])
def test_k_invariant_factor_is_held_in_registers(axis, size):
    """The policy: ``s[i]`` / ``s[j]`` get no shared tile; each thread loads its elements
    from global memory once, before the k-tile loop (or, where the pipeline's k-tiles are all
    peeled, before the first of them), and requests nothing else of ``s``."""
    inputs, out = _factor_gemm(axis, *SIZES[size])
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    (k,) = fn.kernels
    src = k.source
    assert "s_s[" not in src
    assert "s: global (k-invariant operand: register fragment r_s_frag[" in str(fn.plan)
    load = re.search(r"r_s_frag\[\w+\] = [^;]*\bs\[", src)
    ktile = re.search(r"for \(int kt0|const int kt0 = ", src)  # the loop or its first peel
    assert load and ktile and load.start() < ktile.start()
    assert len(re.findall(r"r_s_frag\[\w+\] = ", src)) == 1  # one load statement only
    fn(*_arrays(inputs), device="emulate")
    gk = _gemm_kernel(inputs, out)
    (frag,) = [f for f in gk.fragments if f.tensor == "s"]
    assert frag.hoisted and "s" not in {p.tensor for p in gk.promotions}
    loads = _in_array_loads(gk, frag, inputs[2].shape[0])
    assert 0 < loads <= gk.grid * gk.block * frag.floats  # at most once per thread
    (t,) = fn.last_traffic
    assert t.requested_reads["s"] == 4 * loads


def test_k_factor_shared_tile_copied_once_per_block():
    """``s[k]``: a 1-D shared tile (every thread reads each k); the emulator counts each
    element requested once per block (non-tile sizes: the padded k-tile reads nothing)."""
    m, n, k = SIZES["non-tile"]
    inputs, out = _factor_gemm("k", m, n, k)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    gk = _gemm_kernel(inputs, out)
    # a 1-D tile: copied by the block's threads as one grid, whatever tiling the model ranks
    want = f"each element copied once by a {gk.block} thread grid"
    assert "s: shared (" in str(fn.plan) and want in str(fn.plan)
    fn(*_arrays(inputs), device="emulate")
    gk = _gemm_kernel(inputs, out)
    blocks = gk.grid
    (t,) = fn.last_traffic
    assert t.requested_reads["s"] == 4 * k * blocks


def test_3d_footprints_read_once_per_block():
    """The two-axis GEMM's 3-D tiles: global bytes requested = each element once per block
    column (a) or block row (b), as the tiling has them."""
    inputs, out = _two_axis_gemm()
    gk = _gemm_kernel(inputs, out)
    by = {p.tensor: p for p in gk.promotions}
    # a 3-D footprint covering its inner dims whole: copied as one contiguous run per block
    # (poly/tile_box.py); b's two whole reduction dims as one
    assert len(by["a"].merge) == 1 and len(by["a"].merge[0]) == 3
    assert len(by["b"].size) == 2 and by["b"].merge == ((20, 1, 0), (0, 0, 1))
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    fn(*_arrays(inputs), device="emulate")
    (t,) = fn.last_traffic
    bm, bn = gk.tiling.block
    rows, cols = -(-40 // bm), -(-48 // bn)
    assert t.requested_reads["a"] == 4 * 40 * 3 * 20 * cols
    assert t.requested_reads["b"] == 4 * 3 * 20 * 48 * rows
    assert t.requested_reads["s"] == 4 * 20 * rows * cols


def test_thread_extents_cover_the_block_for_any_rank():
    # innermost first (coalesced), the outermost dimension takes the threads left
    assert thread_extents([16, 8], 4, 256) == [128, 2]
    assert thread_extents([8, 128], 4, 256) == [8, 32]
    assert thread_extents([16], 4, 256) == [256]
    assert thread_extents([16, 3, 3, 3], 1, 256) == [4, 4, 4, 4]
    assert thread_extents([1, 3, 3, 130], 1, 256) == [1, 1, 1, 256]
    assert thread_extents([1, 1], 1, 128) == [1, 128]  # one element: thread 0 copies it
    # a block of 192 threads: every extent divides the threads left (product 192)
    for size, width in (([16, 512], 1), ([5, 7, 9], 1), ([1000], 4)):
        assert math.prod(thread_extents(size, width, 192)) == 192
    one = copy_layout([], [], 1, 64, "p0", [])
    assert one.coords == (("p0c", 64),) and one.constraints == ("p0c = 0",)


def test_forced_non_power_of_two_block():
    """192 threads per block (forced 48x64 tile, 4x4 micro-tile): copies still partition."""
    inputs, out = _factor_gemm("k", 96, 64, 40)
    fn = polyfuse.compile(
        inputs, [out], check_cuda=False, mapping=MappingConfig(gemm_tile=(48, 64, 4, 4, 8))
    )
    assert "12x16 threads" in str(fn.plan)
    arrays = _arrays(inputs)
    (want,) = evaluate(out, dict(zip(inputs, arrays, strict=True)))
    for mode in MODES:
        got = fn(*arrays, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"mode {mode}")


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("case", list(CASES))
def test_nvrtc_compiles_factor_gemms(case):
    inputs, out = CASES[case]()
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    binary = fn.check_cuda("sm_80")
    for res in binary.resources.values():
        assert res.spill_stores == 0 and res.spill_loads == 0
