"""Integer GEMMs on tensor cores: ``sum(int32(a) * int32(b))`` of int8/uint8 operands matched
against ``mma.sync.m16n8k32`` (every signedness pair), int32 accumulators, fragments by
``ldmatrix`` from k-innermost byte tiles; an operand stored m- or n-innermost is transposed by
its fill (``ldmatrix`` has no ``.trans`` of bytes). Exact against numpy's int64 product
wrapped to int32, in both thread orders (race check), at odd sizes; NVRTC sm_80/sm_90 without
spills; IMMA in the k-tile loop's SASS; 0 bank conflicts for the cp.async writes and ldmatrix
reads. ONNX's MatMulInteger / QLinearMatMul (zero points as row and column sums) and
``torch._int_mm`` take the path.
"""

from __future__ import annotations

import numpy as np
import pytest
from hmma_loops import hmma_loop
from kernel_checks import exact_without_bank_conflicts

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import ExpressionError
from polyfuse.graph.passes import DEFAULT_PASSES, PassAction

RNG = np.random.default_rng(32)
ODD = (67, 45, 53)  # M, N, K: no multiple of 16 anywhere
WHOLE = (128, 64, 128)
PAIRS = [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8")]


def _ints(dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, info.max + 1, shape).astype(dtype)
    x.flat[:2] = [info.min, info.max]
    return x


def _int_matmul(m, n, k, a_dtype="uint8", b_dtype="int8", batch=0, trans_a=False,
                trans_b=False):  # fmt: skip
    """(inputs, output, arrays, want) of the int32 product of byte operands (``a`` stored k
    by m when ``trans_a``, ``b`` n by k when ``trans_b``: ``x @ W^T``)."""
    lead = (batch,) if batch else ()
    a_shape = lead + ((k, m) if trans_a else (m, k))
    b_shape = lead + ((n, k) if trans_b else (k, n))
    a = te.placeholder(a_shape, a_dtype, name="a")
    b = te.placeholder(b_shape, b_dtype, name="b")
    r = te.reduce_axis(k, name="r")

    def body(*ix):
        *bt, i, j = ix
        av = a[(*bt, r, i)] if trans_a else a[(*bt, i, r)]
        bv = b[(*bt, j, r)] if trans_b else b[(*bt, r, j)]
        return te.sum(te.cast(av, "int32") * te.cast(bv, "int32"), axis=r)

    mm = te.compute(lead + (m, n), body, name="mm")
    arrays = [_ints(a_dtype, a_shape), _ints(b_dtype, b_shape)]
    fa, fb = (x.astype(np.int64) for x in arrays)
    fa = np.swapaxes(fa, -1, -2) if trans_a else fa
    fb = np.swapaxes(fb, -1, -2) if trans_b else fb
    return [a, b], mm, arrays, (fa @ fb).astype(np.int32)


def _exact(inputs, outs, arrays, want, **compile_args):
    """The compiled graph; its outputs equal ``want`` in both thread orders."""
    fn = polyfuse.compile(inputs, outs, check_cuda=False, **compile_args)
    for race in (False, True):
        got = fn(*arrays, device="emulate", race_check=race)
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, w in zip(got, want if isinstance(want, list) else [want], strict=True):
            assert g.dtype == w.dtype, (g.dtype, w.dtype)
            np.testing.assert_array_equal(g, w)
    return fn


def _on_tensor_cores(fn, a_dtype: str, b_dtype: str) -> list[str]:
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    kind = a_dtype if a_dtype == b_dtype else f"{a_dtype} x {b_dtype}"
    head = f"tensor cores: mma.sync.m16n8k32 {kind} -> int32 accumulators"
    assert any(n.startswith(head) for n in k.notes), k.notes
    ptx = {"int8": "s8", "uint8": "u8"}
    assert f"pf_mma_m16n8k32_s32_{ptx[a_dtype]}_{ptx[b_dtype]}(" in k.source
    assert "int pf_acc[" in k.source and "pf_ldmatrix_x4(" in k.source
    assert "_trans(" not in k.source  # bytes: no ldmatrix.trans
    return k.notes


CASES = {
    "x_wT": {"trans_b": True},  # both k-innermost: cp.async and ldmatrix on both tiles
    "2d": {},  # B n-innermost: transposed by its fill
    "trans_a": {"trans_a": True, "trans_b": True},
    "batched": {"batch": 3},
}


#: every graph pass but ``bytes_k_inner``: operands stored k-outside reach the kernel
NO_K_INNER = tuple(p for p in DEFAULT_PASSES if p != "bytes_k_inner")


#: (A, B dtypes, case, size, k_inner): every signedness pair on two cases at odd sizes; every
#: case at both sizes, with and without the pass, on uint8 x int8 (each a plain and a race-check
#: emulator build: the whole product was 64 cases, 2.5 minutes of CI)
BYTE_RUNS = [
    *[(a, b, c, ODD, True) for a, b in PAIRS[1:] for c in ("x_wT", "2d")],
    *[("uint8", "int8", c, size, k_inner) for c in sorted(CASES) for size in (ODD, WHOLE)
      for k_inner in (True, False) if k_inner or c != "x_wT"],  # fmt: skip
]


@pytest.mark.parametrize(("a_dtype", "b_dtype", "case", "size", "k_inner"), BYTE_RUNS)
def test_byte_matmuls_run_on_m16n8k32_and_are_exact(a_dtype, b_dtype, case, size, k_inner):
    """With the ``bytes_k_inner`` pass an operand stored k-outside is read through a
    transposing primitive; without it the GEMM's fill transposes it byte by byte."""
    inputs, out, arrays, want = _int_matmul(*size, a_dtype, b_dtype, **CASES[case])
    fn = _exact(inputs, [out], arrays, want, passes=True if k_inner else NO_K_INNER)
    notes = _on_tensor_cores(fn, a_dtype, b_dtype)
    transposed = [n for n in notes if "filled element by element k-innermost" in n]
    outside = {"a"} if CASES[case].get("trans_a") else set()
    outside |= set() if CASES[case].get("trans_b") else {"b"}
    assert {n.split()[2] for n in transposed} == (set() if k_inner else outside), transposed
    assert len(fn.kernels) == 1 + (len(outside) if k_inner else 0)
    if not outside:  # each tile in its own operand's dtype
        places = str(fn.plan)
        assert f"a: shared (mma operand tile in {a_dtype})" in places
        assert f"b: shared (mma operand tile in {b_dtype})" in places


def test_an_aligned_byte_gemm_is_pipelined_by_cp_async():
    """K a multiple of 16 bytes: both tiles by 16-byte cp.async chunks over several stages."""
    inputs, out, arrays, want = _int_matmul(*WHOLE, trans_b=True)
    fn = _exact(inputs, [out], arrays, want)
    (k,) = fn.kernels
    assert k.facts is not None and k.facts.mma and k.facts.async_copies
    assert any("16-byte cp.async chunks (16 elements" in n for n in k.notes), k.notes
    assert any("stages:" in n and "stages by ALCOP" in n for n in k.notes), k.notes


def test_a_dequantizing_epilogue_runs_on_the_int32_fragments():
    """``float32(acc) * scale[n] + bias[n]`` then ReLU: one kernel, the epilogue per
    accumulator element."""
    m, n, k = 50, 72, 96
    inputs, mm, arrays, acc = _int_matmul(m, n, k, "uint8", "int8", trans_b=True)
    scale = te.placeholder((n,), "float32", name="scale")
    bias = te.placeholder((n,), "float32", name="bias")
    y = te.compute((m, n), lambda i, j: te.cast(mm[i, j], "float32") * scale[j] + bias[j],
                   name="y")  # fmt: skip
    out = ops.relu(y, name="out")
    s = RNG.uniform(1e-4, 1e-3, n).astype(np.float32)
    bb = RNG.standard_normal(n).astype(np.float32)
    want = np.maximum(acc.astype(np.float32) * s + bb, np.float32(0))
    fn = polyfuse.compile([*inputs, scale, bias], [out], check_cuda=False)
    assert len(fn.kernels) == 1
    _on_tensor_cores(fn, "uint8", "int8")
    for race in (False, True):
        got = fn(*arrays, s, bb, device="emulate", race_check=race)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_a_byte_product_that_is_not_widened_stays_off_tensor_cores_with_the_reason():
    """``sum(a * b)`` of int8 wraps each product at 8 bits (numpy's and torch's arithmetic):
    not what m16n8k32 computes, so it is refused and runs on CUDA cores, still exact."""
    a = te.placeholder((32, 48), "int8", name="a")
    b = te.placeholder((48, 40), "int8", name="b")
    c = ops.matmul(a, b, name="c")
    x, y = _ints("int8", (32, 48)), _ints("int8", (48, 40))
    with np.errstate(over="ignore"):
        want = np.einsum("ik,kj->ij", x, y, dtype=np.int8)  # products and sums in int8
    fn = polyfuse.compile([a, b], [c], check_cuda=False)
    (k,) = fn.kernels
    assert "pf_mma_" not in k.source
    assert any("no tensor cores" in n and "not widened to int32" in n for n in k.notes), k.notes
    np.testing.assert_array_equal(fn(x, y, device="emulate"), want)


def test_matmul_dtype_widens_the_factors():
    """``ops.matmul(a, b, dtype="int32")`` is the exact integer GEMM; an unknown dtype is a
    one-line error naming the operation."""
    a = te.placeholder((20, 64), "int8", name="a")
    b = te.placeholder((64, 24), "uint8", name="b")
    c = ops.matmul(a, b, name="c", dtype="int32")
    assert c.dtype == "int32"
    x, y = _ints("int8", (20, 64)), _ints("uint8", (64, 24))
    fn = _exact([a, b], [c], [x, y], (x.astype(np.int64) @ y.astype(np.int64)).astype(np.int32))
    _on_tensor_cores(fn, "int8", "uint8")
    with pytest.raises(ExpressionError, match="matmul 'd': unknown dtype 'int33'"):
        ops.matmul(a, b, name="d", dtype="int33")


def test_tf32_stage_bytes_count_four_bytes_an_element():
    """The stage model priced a tf32 tile's stage at 2 bytes an element (half what the kernel
    allocates): ``shared_bytes`` is now the tiles' bytes in their dtype, for every dtype."""
    from polyfuse.poly.mapping import MappingConfig
    from polyfuse.poly.tensorize import ITEMSIZE

    a = te.placeholder((256, 128), "float32", name="a")
    b = te.placeholder((128, 256), "float32", name="b")
    c = ops.matmul(a, b, name="c")
    fn = polyfuse.compile([a, b], [c], check_cuda=False,
                          mapping=MappingConfig(allow_tf32=True))  # fmt: skip
    (tk,) = fn.plan.mapped
    assert tk.dtype == "float32" and ITEMSIZE[tk.dtype] == 4
    assert tk.shared_bytes() == 4 * (tk.a_layout.elements + tk.b_layout.elements)


def test_byte_tiles_are_written_and_read_without_bank_conflicts():
    inputs, out, arrays, want = _int_matmul(*WHOLE, trans_b=True)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    assert "XOR-swizzled 32-byte rows" in " ".join(fn.kernels[0].notes)
    exact_without_bank_conflicts(fn, arrays, want)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", ["x_wT", "2d", "2d_fill"])
@pytest.mark.usefixtures("main_tilings")
def test_nvrtc_compiles_byte_gemms_without_spills_and_imma_fills_the_loop(arch, case):
    """Every signedness pair's kernels (``x_wT``; uint8 x int8 otherwise) compile without
    spills; the k-tile loop holds IMMA (bytes' HMMA), at most 2 other instructions per IMMA
    where both tiles come by cp.async (``2d``: ``b`` through its transposing primitive;
    ``2d_fill``: transposed by the fill)."""
    passes = NO_K_INNER if case == "2d_fill" else True
    for a_dtype, b_dtype in PAIRS if case == "x_wT" else PAIRS[:1]:
        inputs, out, _, _ = _int_matmul(256, 256, 512, a_dtype, b_dtype,
                                        **CASES[case.removesuffix("_fill")])  # fmt: skip
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, passes=passes)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    imma, ldsm, _, other = hmma_loop(binary, arch, k.function)
    assert imma > 0 and ldsm > 0
    if case != "2d_fill":
        assert other / imma <= 2.0, (imma, other)


def _records(fn, action) -> list[str]:
    return [r.reason for r in fn.plan.graph.pass_records
            if r.pass_name == "bytes_k_inner" and r.action == action]  # fmt: skip


def test_a_constant_weight_stored_k_outside_is_permuted_at_compile_time():
    """``x @ W`` with a constant ``W`` of ``[K, N]``: the pass stores it ``[N, K]`` at compile
    time, so both tiles fill by cp.async (the kernel without the pass transposes ``W`` in its
    fill, element by element)."""
    m, n, k = 96, 80, 128
    x = te.placeholder((m, k), "uint8", name="x")
    w = te.placeholder((k, n), "int8", name="w")
    y = ops.matmul(x, w, name="y", dtype="int32")
    xs, ws = _ints("uint8", (m, k)), _ints("int8", (k, n))
    want = (xs.astype(np.int64) @ ws.astype(np.int64)).astype(np.int32)
    fn = polyfuse.compile([x], [y], constants={w: ws}, check_cuda=False)
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    assert made.startswith("y reads w (constant, permuted at compile time) with k innermost")
    notes = _on_tensor_cores(fn, "uint8", "int8")
    assert not [n for n in notes if "element by element" in n]
    assert fn.kernels[0].facts.async_copies
    for race in (False, True):
        np.testing.assert_array_equal(fn(xs, device="emulate", race_check=race), want)
    fn = polyfuse.compile([x], [y], constants={w: ws}, check_cuda=False, passes=NO_K_INNER)
    notes = _on_tensor_cores(fn, "uint8", "int8")
    assert [n for n in notes if "w is stored n innermost; its tile is filled element" in n]
    np.testing.assert_array_equal(fn(xs, device="emulate"), want)


def test_a_quantized_activation_is_stored_k_innermost_by_its_own_producer():
    """``q(v)`` of ``[K, N]`` read only by the GEMM: the quantizing primitive's loop nest is
    permuted (no copy); where ``q`` is also an output, a transposing primitive copies it."""
    m, n, k = 64, 48, 96
    a = te.placeholder((m, k), "int8", name="a")
    v = te.placeholder((k, n), "float32", name="v")
    q = te.compute((k, n), lambda i, j: te.cast(te.round(v[i, j] * 20.0), "int8"), name="q")
    y = ops.matmul(a, q, name="y", dtype="int32")
    av = _ints("int8", (m, k))
    vv = RNG.uniform(-6, 6, (k, n)).astype(np.float32)
    qv = np.round(vv * np.float32(20.0)).astype(np.int8)
    want = (av.astype(np.int64) @ qv.astype(np.int64)).astype(np.int32)
    fn = polyfuse.compile([a, v], [y], check_cuda=False)
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    assert "q (its producer q stores it k-innermost, no copy)" in made, made
    for race in (False, True):
        np.testing.assert_array_equal(fn(av, vv, device="emulate", race_check=race), want)
    fn = polyfuse.compile([a, v], [y, q], check_cuda=False)  # q is also an output
    (made,) = _records(fn, PassAction.SIMPLIFIED)
    assert f"q (a transposing primitive, {2 * k * n} bytes moved)" in made, made
    assert len(fn.kernels) == 3  # q, its transposed copy, the GEMM
    got, gq = fn(av, vv, device="emulate")
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(gq, qv)


def test_onnx_dynamically_quantized_linear_runs_its_gemm_on_tensor_cores():
    """DynamicQuantizeLinear → MatMulInteger (the activation's zero point, an int8 weight) →
    dequantize: equal to ONNX's reference; the GEMM on m16n8k32 with the weight permuted at
    compile time and the zero point's column sums folded into a constant."""
    onnx = pytest.importorskip("onnx")
    from onnx import helper
    from test_onnx_fuzz import _nodes_model
    from test_onnx_norms_and_math import _agrees

    from polyfuse.onnx.backend import prepare

    x = RNG.standard_normal((2, 37, 96)).astype(np.float32)
    w = _ints("int8", (96, 75))
    consts = {"w": w, "wz": np.array(0, np.int8), "ws": np.array(0.02, np.float32)}
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
        helper.make_node("MatMulInteger", ["xq", "w", "xz", "wz"], ["acc"]),
        helper.make_node("Cast", ["acc"], ["accf"], to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", ["xs", "ws"], ["s"]),
        helper.make_node("Mul", ["accf", "s"], ["y"]),
    ]
    _agrees(nodes, {"x": x}, consts, opset=21)
    fn = prepare(_nodes_model(nodes, {"x": x}, consts, 21), "CPU").fn
    assert len(fn.kernels) == 2  # the quantization (min, max, round), the GEMM + epilogue
    notes = _on_tensor_cores(fn, "uint8", "int8")
    assert not [n for n in notes if "element by element" in n]


@pytest.mark.parametrize("per_row", [False, True])
def test_onnx_qlinear_matmul_zero_points_are_row_and_column_sums(per_row):
    """QLinearMatMul with nonzero zero points on both sides (per column of B, per tensor or
    per row of A): exact against ONNX's reference (per row: numpy), the raw-byte product on
    tensor cores."""
    pytest.importorskip("onnx")
    from onnx import helper
    from test_onnx_fuzz import _nodes_model
    from test_onnx_norms_and_math import _agrees

    from polyfuse.onnx.backend import prepare

    a, b = _ints("uint8", (70, 64)), _ints("int8", (64, 40))
    az = RNG.integers(100, 140, 70 if per_row else 1).astype(np.uint8)
    consts = {"as": np.array([0.02], np.float32), "az": az,
              "bs": RNG.uniform(0.01, 0.03, 40).astype(np.float32),
              "bz": RNG.integers(-4, 4, 40).astype(np.int8),
              "ys": np.array([0.7], np.float32), "yz": np.array([128], np.uint8)}  # fmt: skip
    node = helper.make_node("QLinearMatMul", ["a", "as", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
    model = _nodes_model([node], {"a": a, "b": b}, consts, 21)
    fn = prepare(model, "CPU").fn
    _on_tensor_cores(fn, "uint8", "int8")
    if not per_row:
        _agrees([node], {"a": a, "b": b}, consts, exact=True, opset=21)
        return
    (y,) = prepare(model, "CPU").run({"a": a, "b": b})
    acc = (a.astype(np.int64) - az[:, None].astype(np.int64)) @ (
        b.astype(np.int64) - consts["bz"].astype(np.int64)
    )
    scale = np.float64(np.float32(np.float32(0.02) * consts["bs"]) / np.float32(0.7))
    want = np.clip(np.rint(acc * scale) + 128, 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(y, want)


@pytest.mark.extra
def test_torch_int_mm_runs_on_tensor_cores():
    torch = pytest.importorskip("torch")
    from kernel_checks import torch_matches_eager

    from polyfuse.torch import last_compiled

    a = torch.randint(-128, 128, (48, 96), dtype=torch.int8)
    b = torch.randint(-128, 128, (96, 40), dtype=torch.int8)
    rep = torch_matches_eager(lambda a, b, s: torch._int_mm(a, b).float() * s, a, b,
                              torch.rand(40))  # fmt: skip
    assert rep["polyfuse"]["aten._int_mm.default"] == 1 and not rep["eager"]
    region = last_compiled().polyfuse_regions[0]
    (k,) = [k for k in region.compiled.kernels if "pf_mma_" in k.source]
    assert "pf_mma_m16n8k32_s32_s8_s8(" in k.source
