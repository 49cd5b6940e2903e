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

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.errors import ExpressionError

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


@pytest.mark.parametrize(("a_dtype", "b_dtype"), PAIRS)
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("size", [ODD, WHOLE], ids=["odd", "whole"])
def test_byte_matmuls_run_on_m16n8k32_and_are_exact(a_dtype, b_dtype, case, size):
    inputs, out, arrays, want = _int_matmul(*size, a_dtype, b_dtype, **CASES[case])
    fn = _exact(inputs, [out], arrays, want)
    notes = _on_tensor_cores(fn, a_dtype, b_dtype)
    transposed = [n for n in notes if "filled element by element k-innermost" in n]
    want_t = {"a"} if CASES[case].get("trans_a") else set()
    want_t |= set() if CASES[case].get("trans_b") else {"b"}
    assert {n.split()[2] for n in transposed} == want_t, transposed


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


def _bank_sites(fn, arrays):
    """(result, cp.async write sites, ldmatrix read sites) under the bank counter."""
    got = fn(*arrays, race_check="banks")
    lines = fn.cuda_source.splitlines()
    sites = [s for t in fn.last_traffic for s in t.shared_banks]
    copies = [s for s in sites if "pf_cp_async16(" in lines[s.line - 1]]
    loads = [s for s in sites if "pf_ldmatrix" in lines[s.line - 1]]
    return got, copies, loads


def test_byte_tiles_are_written_and_read_without_bank_conflicts():
    inputs, out, arrays, want = _int_matmul(*WHOLE, trans_b=True)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    assert "XOR-swizzled 32-byte rows" in " ".join(fn.kernels[0].notes)
    got, copies, loads = _bank_sites(fn, arrays)
    np.testing.assert_array_equal(got, want)
    assert len(copies) >= 2 and len(loads) >= 2
    assert [str(s) for s in copies + loads if s.conflicts] == []


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("case", ["x_wT", "2d"])
def test_nvrtc_compiles_byte_gemms_without_spills_and_imma_fills_the_loop(arch, case):
    """Every signedness pair's kernel compiles; the k-tile loop holds IMMA (bytes' HMMA),
    at most 2 other instructions per IMMA where both tiles come by cp.async."""
    for a_dtype, b_dtype in PAIRS:
        inputs, out, _, _ = _int_matmul(256, 256, 512, a_dtype, b_dtype, **CASES[case])
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
    imma, ldsm, _, other = hmma_loop(binary, arch)
    assert imma > 0 and ldsm > 0
    if case == "x_wT":
        assert other / imma <= 2.0, (imma, other)
