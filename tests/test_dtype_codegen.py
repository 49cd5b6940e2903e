"""float16 and bfloat16 storage through code generation, on the emulator (issue 22 item 2,
first step): 16-bit global buffers, float32 registers, rounding at stores and casts,
float32 accumulation of 16-bit reductions.

Every graph runs in both thread orders (race check) and is compared with
:func:`polyfuse.reference.evaluate` (float64 inside, rounded to each op's dtype) under the
one tolerance table, :func:`polyfuse.graph.dtypes.tolerance`, against the float64 oracle
(``precision="float64"``): a fused kernel rounds at its stores, not at every tensor.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import CallError, UnsupportedDtypeError
from polyfuse.graph.dtypes import numpy_dtype, tolerance

HALVES = ["float16", "bfloat16"]
RNG = np.random.default_rng(22)


def _array(shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(numpy_dtype(dtype))


def _run(inputs, outputs, arrays, dtype: str, oracle: bool = True, **compile_args):
    fn = polyfuse.compile(inputs, outputs, check_cuda=False, **compile_args)
    # the float64 oracle (16-bit inputs, float64 after): a fused kernel keeps its 16-bit
    # intermediates in float32 registers, where the storage reference rounds every tensor
    precision = "float64" if oracle else "storage"  # explicit casts: the storage reference
    want = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)), precision=precision)
    for race in (False, True):
        got = fn(*arrays, device="emulate", race_check=race)
        got = got if isinstance(got, tuple) else (got,)
        for t, g, w in zip(outputs, got, want, strict=True):
            assert g.dtype == numpy_dtype(t.dtype), t.name
            w = w.astype(numpy_dtype(t.dtype)) if t.dtype in HALVES else w
            tol = tolerance(t.dtype)
            assert tol.allclose(g, w), (t.name, np.abs(g.astype(float) - w.astype(float)).max())
    return fn


def _graphs(dtype: str):
    """(name, inputs, outputs, arrays) of the memory-bound shapes of the must-show list."""
    x = te.placeholder((48, 200), dtype, name="x")
    b = te.placeholder((200,), dtype, name="b")
    chain = te.compute(
        (48, 200), lambda i, j: te.tanh(x[i, j] * 0.5 + b[j]) - x[i, j] * x[i, j], name="chain"
    )
    k = te.reduce_axis(200, name="k")
    rows = te.compute((48,), lambda i: te.sum(x[i, k], axis=k), name="rows")
    r = te.reduce_axis(48, name="r")
    cols = te.compute((200,), lambda j: te.max(x[r, j], axis=r), name="cols")
    sm = ops.softmax(x, axis=-1, name="sm")
    ln = ops.layer_norm(x, axis=-1, name="ln")
    xs, bs = _array((48, 200), dtype), _array((200,), dtype)
    return [
        ("chain_broadcast", [x, b], [chain], [xs, bs]),
        ("row_sum", [x], [rows], [xs]),
        ("column_max", [x], [cols], [xs]),
        ("softmax", [x], [sm], [xs]),
        ("layernorm", [x], [ln], [xs]),
    ]


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    "case", ["chain_broadcast", "row_sum", "column_max", "softmax", "layernorm"]
)
def test_half_storage_graphs_match_the_reference(dtype, case):
    (name, inputs, outputs, arrays) = next(g for g in _graphs(dtype) if g[0] == case)
    fn = _run(inputs, outputs, arrays, dtype)
    src = "".join(k.source for k in fn.kernels)
    ctype = "__half" if dtype == "float16" else "__nv_bfloat16"
    assert f"const {ctype}* __restrict__" in src
    assert "float4*>(&x[" not in src  # 16-bit global buffers never move as float4


def test_a_4096_long_bfloat16_sum_accumulates_in_float32():
    """A bfloat16 running sum of 4096 ones stalls at 256 (256 + 1 rounds back to 256); the
    default accumulator is float32, so the kernel sums them exactly, as the reference does."""
    x = te.placeholder((4, 4096), "bfloat16", name="x")
    k = te.reduce_axis(4096, name="k")
    s = te.compute((4,), lambda i: te.sum(x[i, k], axis=k), name="s")
    assert s.dtype == "bfloat16" and s.op.reduce.accumulate_dtype == "float32"
    ones = np.ones((4, 4096), ml_dtypes.bfloat16)
    fn = _run([x], [s], [ones], "bfloat16")
    np.testing.assert_array_equal(fn(ones, device="emulate").astype(np.float32), 4096.0)
    k2 = te.reduce_axis(4096, name="k2")
    narrow = te.compute((4,), lambda i: te.sum(x[i, k2], axis=k2, accumulate="bfloat16"), name="n")
    assert float(reference.evaluate([narrow], {x: ones})[0][0]) == 256.0  # why the rule exists
    with pytest.raises(UnsupportedDtypeError, match="compute 'n' accumulates its sum in bfloat16"):
        polyfuse.compile([x], [narrow], check_cuda=False)


@pytest.mark.parametrize("dtype", HALVES)
def test_a_cast_rounds_in_the_kernel_and_a_fused_chain_rounds_at_its_store(dtype):
    """An explicit cast rounds where it stands; the 16-bit product after it stays in a float32
    register (as in Inductor's fused kernels), and the reference agrees."""
    x = te.placeholder((64,), name="x")
    y = te.compute((64,), lambda i: te.cast(te.cast(x[i], dtype) * 3.0, "float32"), name="y")
    xs = (1 + RNG.random(64) * 2.0**-5).astype(np.float32)  # bits a 16-bit type drops
    fn = _run([x], [y], [xs], "float32", oracle=False)
    got = fn(xs, device="emulate")
    np.testing.assert_array_equal(got, xs.astype(numpy_dtype(dtype)).astype(np.float32) * 3)
    assert np.any(got != xs * 3)


def test_a_float32_matmul_stores_a_bfloat16_result():
    """A GEMM epilogue casting to bfloat16 stores scalar 16-bit elements (no float4)."""
    a, w = te.placeholder((32, 48), name="a"), te.placeholder((48, 40), name="w")
    k = te.reduce_axis(48, name="k")
    mm = te.compute((32, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="mm")
    out = te.compute((32, 40), lambda i, j: te.cast(mm[i, j] + 1.0, "bfloat16"), name="out")
    fn = _run([a, w], [out], [_array((32, 48), "float32"), _array((48, 40), "float32")], "bfloat16")
    assert len(fn.kernels) == 1 and "__float2bfloat16_rn(" in fn.kernels[0].source


def test_a_matmul_of_half_operands_runs_off_the_gemm_path_with_the_reason():
    """The GEMM tiles copy float32 operands; 16-bit ones take the reduction mapping (float32
    accumulation), and the plan says why no GEMM tiling."""
    a, w = te.placeholder((32, 48), "float16", name="a16"), te.placeholder((48, 40), name="w")
    k = te.reduce_axis(48, name="k")
    mm = te.compute((32, 40), lambda i, j: te.sum(a[i, k] * w[k, j], axis=k), name="mm")
    fn = _run([a, w], [mm], [_array((32, 48), "float16"), _array((48, 40), "float32")], "float32")
    assert any(n == "no GEMM tiling: the operands are not float32" for n in fn.kernels[0].notes)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("cols", [2048, 2052, 2050])
def test_half_vectors_are_whole_words_where_isl_proves_them(dtype, cols):
    """Eight 16-bit lanes per 128-bit word, or four per 64-bit one, where isl proves each
    thread's run aligned (2048, 2052); x scalar where its rows start off a word (2050)."""
    x = te.placeholder((256, cols), dtype, name="x")
    b = te.placeholder((cols,), dtype, name="b")
    y = te.compute((256, cols), lambda i, j: te.tanh(x[i, j] * 0.5 + b[j]), name="y")
    fn = _run(
        [x, b], [y], [_array((256, cols), dtype), _array((cols,), dtype)], dtype, arch="sm_90"
    )
    (k,) = fn.kernels
    word = "uint4" if "8 elements per thread" in k.notes[0] else "uint2"
    assert (f"const {word} q_x0 = " in k.source) == (cols % 4 == 0), k.notes
    assert f"const {word} q_b0 = " in k.source  # b's runs start on words at every width


def test_sass_moves_bfloat16_in_128_bit_words():
    """The SASS instrument's question for the memory-bound suite in bfloat16: whole 128-bit
    loads and stores (LDG.E.128 / STG.E.128) where the plan chose eight lanes per word."""
    sass_tools = pytest.importorskip("polyfuse.cuda.toolchain.sass.tools")
    try:
        dis = sass_tools.find_disassembler()
    except Exception:
        pytest.skip("NVIDIA's disassembler is not installed (pip install polyfuse[sass])")
    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")
    x = te.placeholder((1024, 2048), "bfloat16", name="x")
    b = te.placeholder((2048,), "bfloat16", name="b")
    y = te.compute((1024, 2048), lambda i, j: te.tanh(x[i, j] * 0.5 + b[j]), name="y")
    fn = polyfuse.compile([x, b], [y], arch="sm_90", check_cuda=False)
    assert "8 elements per thread" in fn.kernels[0].notes[0]
    sass = dis.disassemble(compile_cuda(fn.cuda_source, "sm_90", compiler="nvrtc").image)
    assert "LDG.E.128" in sass and "STG.E.128" in sass


def test_bytes_moved_are_counted_in_the_dtype():
    shapes = {}
    for dtype in ("float32", "bfloat16"):
        x = te.placeholder((64, 256), dtype, name="x")
        fn = polyfuse.compile([x], [ops.softmax(x, axis=-1, name="y")], check_cuda=False)
        (k,) = fn.kernels
        shapes[dtype] = (k.bytes_read, k.bytes_written)
    assert shapes["float32"] == (64 * 256 * 4, 64 * 256 * 4)
    assert shapes["bfloat16"] == (64 * 256 * 2, 64 * 256 * 2)


def test_a_wrong_input_dtype_is_a_call_error_naming_it():
    x = te.placeholder((8,), "bfloat16", name="x_bf")
    y = te.compute((8,), lambda i: x[i] + 1.0, name="y")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    with pytest.raises(CallError, match="input 'x_bf': expected bfloat16, got float16"):
        fn(np.zeros(8, np.float16), device="emulate")
    out = fn(np.zeros(8, ml_dtypes.bfloat16), device="emulate")
    assert out.dtype == ml_dtypes.bfloat16 and np.all(out.astype(np.float32) == 1)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_every_half_kernel_without_spills(arch):
    for dtype in HALVES:
        for _, inputs, outputs, _ in _graphs(dtype):
            fn = polyfuse.compile(inputs, outputs, arch=arch, check_cuda=False)
            binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
            assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())


def test_the_dtypes_benchmark_halves_the_bytes_of_a_suite_subgraph(tmp_path):
    """``benchmarks/dtypes.py``: softmax in bfloat16 moves half the float32 bytes, in one
    kernel, and the model prices it cheaper (MODELLED figures)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "dtypes.json"
    cmd = [sys.executable, str(root / "benchmarks" / "dtypes.py"), "--only", "softmax"]
    proc = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "MODELLED" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    f32, b16 = row["float32"], row["bfloat16"]
    assert f32["kernels"] == b16["kernels"] == 1
    assert b16["global_bytes"] * 2 == f32["global_bytes"]
    assert b16["modelled_us"] < f32["modelled_us"]


@pytest.mark.parametrize("dtype", HALVES)
def test_a_shared_copy_of_a_16_bit_tensor_holds_float32_words(dtype):
    """A residual add staged in shared memory for the layer norm after it: the shared buffer
    holds float32, so its vector stores and loads are float4, not packed 16-bit words (they
    were, rounding h to 16 bits in a float buffer: 0.047 off the float64 oracle in bfloat16).
    Compared with the oracle (16-bit inputs, float64 after), as a fused kernel computes."""
    x, r = te.placeholder((32, 768), dtype, name="x"), te.placeholder((32, 768), dtype, name="r")
    h = ops.add(x, r, name="h")
    mean = ops.reduce_mean(h, axis=-1, keepdims=True, name="mean")
    d = ops.sub(h, mean, name="d")
    k = te.reduce_axis(768, name="k")
    var = te.compute((32, 1), lambda i, j: te.sum(d[i, k] * d[i, k] * (1.0 / 768), axis=k))
    y = ops.mul(d, ops.rsqrt(ops.add(var, 1e-5)), name="y")
    xs, rs = _array((32, 768), dtype), _array((32, 768), dtype)
    fn = polyfuse.compile([x, r], [y], check_cuda=False)
    (k0,) = fn.kernels
    assert "reinterpret_cast<uint2*>(&s_" not in k0.source
    assert "reinterpret_cast<float4*>(&s_" in k0.source
    want = reference.evaluate([y], {x: xs, r: rs}, precision="float64")[0]
    for race in (False, True):
        got = fn(xs, rs, device="emulate", race_check=race)
        assert tolerance(dtype).allclose(got, want)


_SUITE_FAST = ("residual_layernorm", "attn_softmax", "batchnorm_train_relu", "adam3")


def _suite_case(name: str, dtype: str) -> None:
    """Suite subgraph ``name`` with 16-bit placeholders, at 1/256 of its rows, on the emulator
    in both thread orders against the reference (every tensor rounded to its dtype, as a
    kernel holds it in registers and shared memory too) with the dtype's tolerance."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import suite

    ins, outs, _ = suite.build(name, 256, dtype=dtype)
    rng = np.random.default_rng(0)
    arrays = []
    for t in ins:
        a = rng.standard_normal(t.shape)
        arrays.append((np.abs(a) if t.name.startswith("v") else a).astype(numpy_dtype(dtype)))
    fn = polyfuse.compile(ins, outs, check_cuda=False, name=name)
    want = reference.evaluate(outs, dict(zip(ins, arrays, strict=True)))
    for race in (False, True):
        got = fn(*arrays, device="emulate", race_check=race)
        got = got if isinstance(got, tuple) else (got,)
        for t, g, w in zip(outs, got, want, strict=True):
            assert tolerance(t.dtype).allclose(g, w), (name, t.name)


@pytest.mark.parametrize("name", _SUITE_FAST)
def test_suite_subgraphs_in_bfloat16_match_the_oracle(name):
    _suite_case(name, "bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALVES)
def test_every_suite_subgraph_in_16_bits_matches_the_oracle(dtype):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import suite

    for name in suite.NAMES:
        _suite_case(name, dtype)


def _held_exactly(values: np.ndarray, dtype: str) -> bool:
    """Whether every float32 value is a value of ``dtype`` (rounding it changes nothing)."""
    narrow = values.astype(numpy_dtype(dtype)).astype(np.float32)
    return bool(np.array_equal(narrow, values))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_reduction_kept_on_chip_is_rounded_to_its_dtype(dtype):
    """A float16/bfloat16 row sum accumulates in float32; the tensor is 16-bit, so a consumer in
    the same kernel (here a cast to float32) must read the rounded sum. Kept in a register it
    read the float32 accumulator (fuzz seed 730139: int(sum) one off past a bf16 rounding)."""
    x = te.placeholder((64, 24), dtype, name="x")
    k = te.reduce_axis(24, name="k")
    s = te.compute((64,), lambda i: te.sum(x[i, k], axis=k), name="s", dtype=dtype)
    y = te.compute((64,), lambda i: te.cast(s[i], "float32"), name="y", dtype="float32")
    fn = polyfuse.compile([x], [y], check_cuda=False)
    assert len(fn.kernels) == 1 and fn.plan.kernel_plans[0].placements["s"].space == "register"
    a = np.random.default_rng(0).standard_normal((64, 24)).astype(numpy_dtype(dtype))
    want = reference.evaluate([y], {x: a})[0]
    for order in (False, True, "shadow"):
        got = fn(a, device="emulate", race_check=order)
        assert _held_exactly(got, dtype)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_elementwise_tensor_kept_in_a_register_is_rounded_to_its_dtype(dtype):
    """Fuzz seed 840038, shrunk: ``u = x * x`` stored as bfloat16, then ``u - cast(u, bf16)``
    in the same kernel. The register held the float32 product, so ``u`` and its rounded cast
    differed (0.0100 where the reference, which rounds every tensor, gives 0)."""
    x = te.placeholder((2,), dtype, name="x")
    u = te.compute((2,), lambda i: x[i] * x[i], name="u", dtype=dtype)
    b = te.compute((2,), lambda i: u[i] - te.cast(u[i], dtype), name="b", dtype="float32")
    c = te.compute((2,), lambda i: te.cast(x[i], dtype) * 1.0, name="c", dtype="float32")
    fn = polyfuse.compile([x], [b, c], check_cuda=False)
    assert len(fn.kernels) == 1 and fn.plan.kernel_plans[0].placements["u"].space == "register"
    xv = np.array([2.203125, 0.828125], dtype=numpy_dtype(dtype))
    for order in (False, True):
        got_b, got_c = fn(xv, device="emulate", race_check=order)
        np.testing.assert_array_equal(got_b, [0.0, 0.0])
        np.testing.assert_array_equal(got_c, xv.astype(np.float32))


def test_a_16_bit_reduction_read_by_an_integer_cast_in_the_same_kernel():
    """The fuzz graph of seed 730139, reduced: a bfloat16 product (k = 2), truncated to int32,
    plus a float32 vector. int() of the unrounded float32 sum was one off where the bf16
    rounding crosses an integer."""
    x0 = te.placeholder((1, 2), "bfloat16", name="x0")
    x1 = te.placeholder((2, 1), "float32", name="x1")
    k = te.reduce_axis(2, name="k")
    m = te.compute((1, 1), lambda i, j: te.sum(x0[i, k] * x1[k, j], axis=k), name="m",
                   dtype="bfloat16")  # fmt: skip
    y = te.compute((1, 1), lambda i, j: te.cast(m[i, j], "int32") + 0.5, name="y",
                   dtype="float32")  # fmt: skip
    fn = polyfuse.compile([x0, x1], [y], check_cuda=False)
    a = np.array([[1.0, 1.0]], dtype=numpy_dtype("bfloat16"))
    # bf16 products 0.75 and 0.2490234375: the float32 sum 0.9990234375 rounds up to 1.0
    b = np.array([[0.75], [0.249]], dtype=np.float32)
    want = reference.evaluate([y], {x0: a, x1: b})[0]
    assert want[0, 0] == 1.5  # int(bf16(0.999...)) == 1
    np.testing.assert_array_equal(fn(a, b, device="emulate"), want)
