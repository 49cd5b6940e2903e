"""Runs of 4 elements per lane with float4 accesses in reduction kernels (poly/lane_vector.py)."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import compile_cuda
from polyfuse.poly.mapping import MappingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402
from vector_checks import V4_LOAD, V4_STORE, elements_per_thread, require_nvrtc  # noqa: E402

V4_SHARED_LOAD = re.compile(r"ld\.shared\.v4\.f32")
V4_SHARED_STORE = re.compile(r"st\.shared\.v4\.f32")
ORDERS = (False, "reverse", "random", "shadow")


def _check(fn, arrays, want, tol=2e-5):
    for order in ORDERS:
        got = fn(*arrays, race_check=order)
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=tol, atol=tol, err_msg=str(order))
    fn(*arrays, device="emulate")
    for k, t in zip(fn.kernels, fn.last_traffic, strict=True):
        assert (t.bytes_read, t.bytes_written) == (k.bytes_read, k.bytes_written), k.name


@pytest.mark.parametrize(
    "name, store",
    [
        ("layernorm", "ln"),
        ("softmax", "sm"),
        ("attn_softmax", "probs"),
        ("residual_layernorm", "ln"),
    ],
)
def test_suite_reductions_use_float4_in_ptx_without_spills(name, store):
    require_nvrtc()
    ins, outs, _ = suite.build(name, 1)
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert c["factor"] == 4 and store in c["vector"]
    assert f"reinterpret_cast<float4*>(&{store}[" in fn.cuda_source  # the output row, float4
    ptx = compile_cuda(fn.cuda_source, "sm_90", compiler="nvrtc", output="ptx").ptx
    assert V4_LOAD.search(ptx) and V4_STORE.search(ptx), name
    # the row tile in shared memory moves as float4 runs: lane l touches bytes [16 l, 16 l + 16)
    assert V4_SHARED_LOAD.search(ptx) and V4_SHARED_STORE.search(ptx), name
    for arch in ("sm_80", "sm_90"):
        for res in fn.check_cuda(arch).resources.values():
            assert res.spill_stores == 0 and res.spill_loads == 0, (arch, res)


def _layer_norm(rows: int, cols: int):
    x = te.placeholder((rows, cols), name="x")
    g = te.placeholder((cols,), name="g")
    b = te.placeholder((cols,), name="b")
    y = ops.layer_norm(x, g, b, axis=-1, eps=1e-5, name="ln")

    def ref(a, gg, bb):
        a = a.astype(np.float64)
        m = a.mean(-1, keepdims=True)
        v = ((a - m) ** 2).mean(-1, keepdims=True)
        return [(a - m) / np.sqrt(v + 1e-5) * gg + bb]

    return [x, g, b], [y], ref


def _softmax(rows: int, cols: int):
    x = te.placeholder((rows, cols), name="x")
    y = ops.softmax(x, axis=-1, name="sm")

    def ref(a):
        e = np.exp(a - a.max(-1, keepdims=True))
        return [e / e.sum(-1, keepdims=True)]

    return [x], [y], ref


GRAPHS = {"layer_norm": _layer_norm, "softmax": _softmax}


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("shape", [(8, 128), (3, 1024), (2, 768), (1, 47), (1, 8), (5, 2000)])
def test_runs_correct_in_race_modes(graph, shape):
    ins, outs, ref = GRAPHS[graph](*shape)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert c["factor"] == 4 and "x" in c["vector"]
    assert c["tail"] == (shape[1] % 4 != 0)  # one row of 47: aligned, a scalar tail
    rng = np.random.default_rng(shape[0] * 1000 + shape[1])
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    _check(fn, arrays, ref(*arrays), 2e-5 if graph == "softmax" else 1e-4)


@pytest.mark.parametrize("graph", sorted(GRAPHS))
@pytest.mark.parametrize("shape", [(3, 47), (4, 1001)])
def test_row_length_not_a_multiple_of_four_falls_back(graph, shape):
    ins, outs, ref = GRAPHS[graph](*shape)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert "x" not in c["vector"] and "multiple of 4" in c["scalar"]["x"]
    assert "float4*>(&x[" not in fn.cuda_source
    rng = np.random.default_rng(shape[1])
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    _check(fn, arrays, ref(*arrays), 2e-5 if graph == "softmax" else 1e-4)


@pytest.mark.parametrize("name", ["layernorm", "softmax", "attn_softmax", "batchnorm_train_relu"])
def test_suite_reductions_with_runs_correct_in_race_modes(name):
    ins, outs, ref = suite.build(name, 64)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert any(c["factor"] == 4 for c in elements_per_thread(fn))
    arrays = suite.random_inputs(name, ins)
    _check(fn, arrays, ref(*arrays), 2e-4)


def test_shared_row_tile_scalar_where_runs_cannot_align():
    """A row of 45 (not a multiple of 4): the shared centred row keeps scalar accesses."""
    ins, outs, ref = _layer_norm(4, 45)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert "__shared__ float s_" in fn.cuda_source and "__align__(16)" not in fn.cuda_source
    assert "float4*>(&s_" not in fn.cuda_source
    rng = np.random.default_rng(45)
    arrays = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    _check(fn, arrays, ref(*arrays), 1e-4)


def test_dynamic_pool_slice_at_unaligned_offset_stays_scalar():
    """A shared row in the dynamic pool at an offset that is not a multiple of 4 elements
    cannot start 16-byte aligned: the pass leaves it scalar; a static one is declared aligned."""
    from polyfuse.cuda.codegen.kernel_ast import KAlloc, MemSpace
    from polyfuse.cuda.codegen.lower_vectorize import _aligned_buffers

    allocs = (
        KAlloc("s_a", MemSpace.SHARED, "float32", (768,), offset=6),
        KAlloc("s_b", MemSpace.SHARED, "float32", (768,), offset=8),
        KAlloc("s_c", MemSpace.SHARED, "float32", (768,)),
    )
    assert _aligned_buffers(allocs, frozenset({"a", "b", "c"})) == {"b", "c"}


def test_runs_off_keeps_one_element_per_lane_step():
    ins, outs, _ = _softmax(4, 1024)
    fn = polyfuse.compile(ins, outs, mapping=MappingConfig(elements_per_thread=1))
    assert not elements_per_thread(fn) and "float4" not in fn.cuda_source


def test_x_reduction_lanes_stay_scalar():
    x = te.placeholder((64, 256), name="x")
    k = te.reduce_axis(64, name="k")
    y = te.compute((256,), lambda j: te.sum(x[k, j], axis=k), name="y")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    assert all(c["factor"] == 1 for c in elements_per_thread(fn))
    a = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    np.testing.assert_allclose(fn(a), a.sum(0), rtol=1e-4, atol=1e-4)


def test_short_all_reduce_in_one_lane_run_is_combined_for_every_lane():
    """fuzz seed 100198: a min over 3 elements fits one lane's run of 4, so only lane 0 held
    the result while every lane's consumer (r3 + x) read its own register (+inf)."""
    x0 = te.placeholder((5, 3, 127), name="x0")
    k0, k2 = te.reduce_axis(5, name="k0"), te.reduce_axis(127, name="k2")
    r2 = te.compute((3,), lambda i: te.sum(x0[k0, i, k2], axis=[k0, k2]), name="r2")
    k = te.reduce_axis(3, name="k")
    r3 = te.compute((1,), lambda i: te.min(r2[k], axis=[k]), name="r3")
    b4 = te.compute((5, 3, 127), lambda a, b, c: r3[0] + x0[a, b, c], name="b4")
    fn = polyfuse.compile([x0], [b4], check_cuda=False)
    x = np.random.default_rng(3).standard_normal((5, 3, 127)).astype(np.float32)
    want = x.astype(np.float64).sum(axis=(0, 2)).min() + x
    _check(fn, [x], [want], tol=1e-4)


def test_barriers_between_parts_under_one_hoisted_guard_stand_outside_it():
    """fuzz seeds 200486/200620: isl put one lane guard (the lanes with a run) over two
    stitched parts; the barrier between them was inside the guard (divergent)."""
    x0 = te.placeholder((8, 31), name="x0")
    k = te.reduce_axis(31, name="k")
    r2 = te.compute((8,), lambda i: te.sum(x0[i, k] + x0[i, k], axis=[k]) / 31.0, name="r2")
    u3 = te.compute((8,), lambda i: te.exp(r2[i]), name="u3")
    j = te.reduce_axis(8, name="j")
    r4 = te.compute((), lambda: te.sum(te.tanh(r2[j]), axis=[j]) / 8.0, name="r4")
    b6 = te.compute((8,), lambda i: r4[()] * r4[()] - u3[i], name="b6")
    b7 = te.compute((8,), lambda i: r4[()] - u3[i], name="b7")
    fn = polyfuse.compile([x0], [b6, b7, r4], check_cuda=False)
    x = np.random.default_rng(5).standard_normal((8, 31)).astype(np.float32)
    r2v = (2.0 * x.astype(np.float64)).sum(axis=1) / 31.0
    r4v = np.tanh(r2v).sum() / 8.0
    _check(fn, [x], [r4v * r4v - np.exp(r2v), r4v - np.exp(r2v), np.float32(r4v)], tol=1e-4)
    for kern in fn.kernels:
        for line in kern.source.splitlines():
            if "__syncthreads();  //" in line:  # part barriers stand at the kernel's top level
                assert line.startswith("  __syncthreads"), line


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_rows_run_eight_elements_per_lane_in_128_bit_words(dtype):
    """Issue 22: a 16-bit row moves one 128-bit word (eight elements) per lane step, not a
    64-bit one (runs of 4 gave ``uint2`` words): the run length is a word of the narrowest
    global tensor. Correct against the float64 reference in every race mode; a float32 row
    keeps runs of 4."""
    import ml_dtypes

    from polyfuse.reference import evaluate, tolerance

    np_dtype = ml_dtypes.bfloat16 if dtype == "bfloat16" else np.float16
    x = te.placeholder((6, 2048), dtype, name="x")
    y = ops.softmax(x)
    fn = polyfuse.compile([x], [y], check_cuda=False)
    src = fn.cuda_source
    assert "reinterpret_cast<const uint4*>(&x[" in src and "uint2" not in src
    notes = [n for k in fn.kernels for n in k.notes if "runs per lane" in n]
    assert notes and all("8-element runs per lane" in n for n in notes)
    xv = np.random.default_rng(3).standard_normal((6, 2048)).astype(np_dtype)
    want = np.asarray(evaluate([y], {x: xv}, precision="float64")[0], np.float64)
    t = tolerance(dtype)
    for order in ORDERS:
        got = fn(xv, race_check=order).astype(np.float64)
        np.testing.assert_allclose(got, want, rtol=t.rtol, atol=t.atol, err_msg=str(order))
    x32 = te.placeholder((6, 2048), name="x")
    fn32 = polyfuse.compile([x32], [ops.softmax(x32)], check_cuda=False)
    notes = [n for k in fn32.kernels for n in k.notes if "runs per lane" in n]
    assert notes and all("4-element runs per lane" in n for n in notes)


def test_a_bool_mask_beside_a_16_bit_row_keeps_runs_of_eight():
    """Fuzz seed 720130: a bool input (1-byte elements) set the run to 16, and the float16
    row's 16-element group was printed as one ``uint2`` of eight pairs (g++ rejected
    ``make_uint2`` with 8 arguments). Bool tensors stay scalar, so the run is 8."""
    from polyfuse.reference import evaluate, tolerance

    m = te.placeholder((32,), "bool", name="m")
    x = te.placeholder((1,), "float16", name="x")
    b = te.compute((32,), lambda i: m[i] - x[0], name="b", dtype="float16")
    k = te.reduce_axis(32, name="k")
    s = te.compute((1,), lambda i: te.sum(b[k], axis=[k]) / 32.0, name="s", dtype="float16")
    y = te.compute((32,), lambda i: te.abs(s[0] * b[i]), name="y", dtype="float16")
    fn = polyfuse.compile([m, x], [y, s], check_cuda=False)
    notes = [n for kk in fn.kernels for n in kk.notes if "runs per lane" in n]
    assert notes and all("16-element" not in n for n in notes)
    mv = np.arange(32) % 3 == 0
    xv = np.array([-0.233], np.float16)
    want = evaluate([y, s], {m: mv, x: xv}, precision="float64")
    t = tolerance("float16")
    for order in ORDERS:
        got = fn(mv, xv, race_check=order)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(
                g.astype(np.float64), np.asarray(w, np.float64), rtol=t.rtol, atol=t.atol
            )
