"""Several elements per thread and 128-bit global accesses (poly/coarsen.py, lower_vectorize)."""

import sys
from pathlib import Path

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.cuda.toolchain.compiler import compile_cuda
from polyfuse.poly.coarsen import vector_access
from polyfuse.poly.mapping import MappingConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402
from vector_checks import V4_LOAD, V4_STORE, elements_per_thread, require_nvrtc  # noqa: E402

FOUR = MappingConfig(elements_per_thread=4)
ORDERS = (False, "reverse", "random")


@pytest.mark.parametrize("name", ["bias_gelu_tanh", "two_branches", "adam3"])
def test_full_size_elementwise_kernels_use_float4_in_ptx(name):
    require_nvrtc()
    ins, outs, _ = suite.build(name, 1)
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    ptx = compile_cuda(fn.cuda_source, "sm_90", compiler="nvrtc", output="ptx").ptx
    assert V4_LOAD.search(ptx) and V4_STORE.search(ptx), name
    assert ".local" not in ptx  # the lane registers stay registers
    chosen = [c for c in elements_per_thread(fn) if c["factor"] > 1]
    assert chosen and all(c["vector"] for c in chosen)
    assert "waves" in str(fn.plan)


@pytest.mark.parametrize(
    "name", ["bias_gelu_tanh", "two_branches", "adam3", "lstm_cell", "rmsnorm_swiglu"]
)
def test_coarsened_suite_kernels_correct_in_race_modes(name):
    ins, outs, ref = suite.build(name, 64)
    fn = polyfuse.compile(ins, outs, mapping=FOUR, check_cuda=False)
    assert any(c["factor"] == 4 for c in elements_per_thread(fn))
    arrays = suite.random_inputs(name, ins)
    want = ref(*arrays)
    for order in ORDERS:
        got = fn(*arrays, race_check=order)
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5, err_msg=f"{name} {order}")
    fn(*arrays, device="emulate")
    for k, t in zip(fn.kernels, fn.last_traffic, strict=True):
        assert (t.bytes_read, t.bytes_written) == (k.bytes_read, k.bytes_written), k.name


def _gelu_rows(cols: int):
    x = te.placeholder((24, cols), name="x")
    b = te.placeholder((cols,), name="b")
    return [x, b], [ops.gelu(ops.add(x, b), approximate="tanh", name="gelu")]


def test_row_stride_not_a_multiple_of_four_falls_back_to_scalar():
    ins, outs = _gelu_rows(1001)
    fn = polyfuse.compile(ins, outs, mapping=FOUR, check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert "multiple of 4" in c["scalar"]["x"] and "gelu" in c["scalar"]
    assert c["vector"] == ["b"] and c["tail"]  # the bias row is aligned; 1001 leaves a tail
    src = fn.cuda_source
    assert "reinterpret_cast<const float4*>(&b[" in src
    assert "float4*>(&x[" not in src and "float4*>(&gelu[" not in src
    rng = np.random.default_rng(1)
    X = rng.standard_normal((24, 1001)).astype(np.float32)
    B = rng.standard_normal(1001).astype(np.float32)
    u = X.astype(np.float64) + B
    want = 0.5 * u * (1 + np.tanh(0.7978845608028654 * (u + 0.044715 * u**3)))
    for order in ORDERS:
        np.testing.assert_allclose(fn(X, B, race_check=order), want, rtol=1e-5, atol=1e-5)
    fn(X, B, device="emulate")
    (t,) = fn.last_traffic
    (k,) = fn.kernels
    assert (t.bytes_read, t.bytes_written) == (k.bytes_read, k.bytes_written)


@pytest.mark.parametrize("n", [1001, 1024, 6])
def test_one_dimensional_tail_runs_scalar_and_is_correct(n):
    x = te.placeholder((n,), name="x")
    y = ops.tanh(ops.mul(x, 2.0), name="y")
    fn = polyfuse.compile([x], [y], mapping=MappingConfig(elements_per_thread=8), check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert c["factor"] == 8 and {"x", "y"} <= set(c["vector"])
    assert c["tail"] == (n % 8 != 0)
    assert ("} else {" in fn.cuda_source) == c["tail"]  # the scalar tail beside the vector form
    X = np.linspace(-2, 2, n).astype(np.float32)
    for order in ORDERS:
        np.testing.assert_allclose(fn(X, race_check=order), np.tanh(2 * X), rtol=1e-6, atol=1e-6)
    fn(X, device="emulate")
    (t,) = fn.last_traffic
    assert (t.bytes_read, t.bytes_written) == (4 * n, 4 * n)


def test_small_kernels_keep_one_element_per_thread():
    ins, outs = _gelu_rows(1024)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert c["factor"] == 1 and "of a wave" in str(fn.plan)
    off = polyfuse.compile(ins, outs, mapping=MappingConfig(elements_per_thread=1))
    assert not elements_per_thread(off)


@pytest.mark.parametrize(
    "rel, why",
    [
        ("{ [v0, v1] -> [a] : a = 1024 v0 + v1 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", ""),
        ("{ [v0, v1] -> [a] : a = v1 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", ""),  # broadcast
        ("{ [v0, v1] -> [a] : a = 1001 v0 + v1 and 0 <= v0 < 8 and 0 <= v1 < 1001 }", "multiple"),
        ("{ [v0, v1] -> [a] : a = v0 + 8 v1 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", "multiple"),
        ("{ [v0, v1] -> [a] : a = 5 v1 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", "contiguous"),
        ("{ [v0, v1] -> [a] : a = 1024 v0 + v1 + 4 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", ""),
        ("{ [v0, v1] -> [a] : a = 1024 v0 + v1 + 2 and 0 <= v0 < 8 and 0 <= v1 < 1024 }", "mult"),
        ("{ [v0, v1] -> [a] : 1024 v0 <= a < 1024 v0 + 2 and 0 <= v0 < 8 and 0 <= v1 < 8 }", "sev"),
    ],
)
def test_isl_proof_of_contiguity_and_alignment(rel, why):
    got = vector_access(isl.Map(rel), 2, 4)
    assert (got == "") if not why else why in got


def _split_records(fn):
    return [r for r in fn.plan.records() if DecisionKind.SPLIT_REDUCTION in r.kinds]


def test_few_long_rows_are_split_across_blocks_by_the_cost_model():
    x = te.placeholder((4, 1 << 18), name="x")
    s = ops.reduce_sum(x, axis=1, name="rowsum")
    fn = polyfuse.compile([x], [s], check_cuda=False)
    (rec,) = _split_records(fn)
    assert rec.data["chunks"] > 1 and "split" in rec.reason and "modelled" in rec.reason
    one, two = rec.data["modelled_us"]
    assert two < one
    assert len(fn.kernels) == 2  # partials across many blocks, then the final reduction
    X = np.random.default_rng(2).standard_normal((4, 1 << 18)).astype(np.float32)
    for order in ORDERS:
        np.testing.assert_allclose(
            fn(X, race_check=order), X.astype(np.float64).sum(axis=1), rtol=1e-4, atol=1e-2
        )
    unsplit = polyfuse.compile([x], [s], check_cuda=False, stitch=False)
    assert len(unsplit.kernels) == 1


def test_split_refused_when_the_input_is_read_again_and_recorded():
    x = te.placeholder((4, 1 << 18), name="x")
    m = ops.reduce_max(x, axis=1, keepdims=True, name="rowmax")
    y = ops.sub(x, m, name="y")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    (rec,) = _split_records(fn)
    assert rec.data["chunks"] == 1 and "also read by y" in rec.reason
    assert "reduction split: rowmax" in str(fn.plan)


def test_batchnorm_stays_one_kernel_with_its_split_decision_recorded():
    ins, outs, _ = suite.build("batchnorm_train_relu", 1)
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    recs = _split_records(fn)
    assert {r.data["tensor"] for r in recs} == {"mu", "var"}
    assert all(r.data["chunks"] == 1 and "132 SMs" in r.reason for r in recs)
    assert len(fn.kernels) == 1


def test_plan_names_the_device_figures_the_cost_models_used():
    ins, outs = _gelu_rows(1024)
    assert "figures: measured 2026-11-22" in str(polyfuse.compile(ins, outs, arch="sm_90").plan)
    assert "figures: datasheet" in str(polyfuse.compile(ins, outs, arch="sm_80").plan)


def test_modelled_time_rewards_float4_and_stays_above_the_floor():
    from polyfuse.cuda.codegen.kernel_time import kernel_us
    from polyfuse.poly.device import H100

    ins, outs, _ = suite.build("bias_gelu_tanh", 1)
    before = polyfuse.compile(ins, outs, arch="sm_90", mapping=MappingConfig(elements_per_thread=1))
    after = polyfuse.compile(ins, outs, arch="sm_90")
    (kb,), (ka,) = before.kernels, after.kernels
    assert kb.vector_bytes == 0 and ka.vector_bytes == ka.bytes_read + ka.bytes_written
    floor = after.compulsory_bytes() / (H100.bandwidth_gbps * 1e3)
    assert floor < kernel_us(ka, H100) < kernel_us(kb, H100)


def test_coarsened_blocks_are_whole_warps_so_layer3_still_packs():
    # 11008 columns / 4 per thread once gave 251-thread blocks, which Layer 3 refused to pack
    # with the 1024-thread rmsnorm block (two kernels instead of one).
    ins, outs, _ = suite.build("rmsnorm_swiglu", 1)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert len(fn.kernels) == 1, str(fn.plan)
    assert any(c["factor"] == 4 for c in elements_per_thread(fn))


def test_each_statement_access_is_its_own_float4_stream():
    # lstm_cell reads its gates tensor through four slices (four statements, four offsets):
    # each slice is proven contiguous and aligned on its own.
    ins, outs, _ = suite.build("lstm_cell", 16)
    fn = polyfuse.compile(ins, outs, mapping=FOUR, check_cuda=False)
    (c,) = elements_per_thread(fn)
    assert "gates" in c["vector"]
    assert fn.cuda_source.count("reinterpret_cast<const float4*>(&gates[") == 4
