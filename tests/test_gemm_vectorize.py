"""128-bit vector copies into the GEMM's shared tiles, only where isl proves them legal.

The proof (:mod:`polyfuse.poly.vectorize`) is checked on hand-written isl sets; the generated
kernels are checked on their CUDA text, their PTX (NVRTC, when installed: ``ld.global...v4``)
and on the emulator at sizes that are not tile multiples, in order and in the race-check modes.
"""

from __future__ import annotations

import math
import re

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.vectorize import prove_vector_copy

ORDERS = (False, "reverse", "random")
V4_LOAD = re.compile(r"ld\.global(?:\.nc)?\.v4\.\w+")
V4_STORE = re.compile(r"st\.global\.v4\.\w+")
VECTOR_STORE = "*reinterpret_cast<float4*>(&matmul"


def _fp(text: str) -> isl.Set:
    return isl.Set(text, context=isl.Context())


def test_proof_aligned_box_of_a_row_major_array():
    # A k-tile of A (4096 x 4096): rows 64*b0.., columns 8*kt0.. (8 wide).
    fp = _fp(
        "[b0, kt0] -> { a[e0, e1] : 0 <= b0 < 64 and 0 <= kt0 < 512 and "
        "64b0 <= e0 < 64b0 + 64 and 8kt0 <= e1 < 8kt0 + 8 }"
    )
    proof = prove_vector_copy(fp, ["64b0", "8kt0"], [64, 8], (4096, 4096))
    assert proof.width == 4, proof.reason


def test_proof_rejects_row_length_not_a_multiple_of_four():
    fp = _fp(
        "[b0, kt0] -> { a[e0, e1] : 0 <= b0 < 3 and 0 <= kt0 < 126 and "
        "16b0 <= e0 < 16b0 + 16 and 8kt0 <= e1 < 8kt0 + 8 }"
    )
    proof = prove_vector_copy(fp, ["16b0", "8kt0"], [16, 8], (40, 1001))
    assert proof.width == 1 and "aligned" in proof.reason


def test_proof_rejects_unaligned_start_extent_and_holes():
    # The box starts at 2 + 8*kt0: never 16-byte aligned, although the rows are.
    fp = _fp(
        "[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 2 + 8kt0 <= e1 < 2 + 8kt0 + 8 }"
    )
    assert prove_vector_copy(fp, ["0", "2 + 8kt0"], [4, 8], (4, 64)).width == 1
    # Row extent 6: the vectors would not tile a row.
    fp = _fp("[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 8kt0 <= e1 < 8kt0 + 6 }")
    assert "extent" in prove_vector_copy(fp, ["0", "8kt0"], [4, 6], (4, 64)).reason
    # Every other column (a strided access): the box has holes.
    fp = _fp(
        "[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 8kt0 <= e1 < 8kt0 + 8 "
        "and e1 mod 2 = 0 }"
    )
    assert "holes" in prove_vector_copy(fp, ["0", "8kt0"], [4, 8], (4, 64)).reason


def test_proof_keeps_the_cause_apart_from_the_printed_reason():
    """Callers reword a proof's cause (``why``) without stripping the printed reason."""
    fp = _fp("[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 8kt0 <= e1 < 8kt0 + 6 }")
    scalar = prove_vector_copy(fp, ["0", "8kt0"], [4, 6], (4, 64))
    assert scalar.why == "row extent 6 is not a multiple of 4"
    assert scalar.reason == f"scalar copy: {scalar.why}"
    fp = _fp("[kt0] -> { a[e0, e1] : 0 <= kt0 < 4 and 0 <= e0 < 4 and 8kt0 <= e1 < 8kt0 + 8 }")
    vector = prove_vector_copy(fp, ["0", "8kt0"], [4, 8], (4, 64))
    assert vector.reason == f"128-bit vector copy: {vector.why}"
    assert not vector.why.startswith("128-bit")


def test_proof_rejects_a_vector_straddling_the_edge():
    # Row length 8 at column offset 0, box 8 wide starting at 4*kt0: the last box runs past
    # the edge at 8, but the vector [4, 8) never straddles; with 10 columns [8, 12) would.
    fp = _fp("[kt0] -> { a[e0, e1] : 0 <= kt0 < 3 and 0 <= e0 < 4 and 4kt0 <= e1 < 4kt0 + 4 }")
    assert prove_vector_copy(fp, ["0", "4kt0"], [4, 4], (4, 8)).width == 4
    wide = _fp("[kt0] -> { a[e0] : 0 <= kt0 < 3 and 4kt0 <= e0 < 4kt0 + 4 }")
    assert "straddle" in prove_vector_copy(wide, ["4kt0"], [4], (10,)).reason


#: a tiling with a 2x4 register micro-tile, for the small shapes that test vector copies and
#: stores at partial tiles (the cost model may prefer 1x1 micro-tiles at such sizes)
SMALL_TILE = MappingConfig(gemm_tile=(16, 128, 2, 4, 8))


def _matmul(m: int, k: int, n: int, arch: str = "sm_75", mapping: MappingConfig | None = None):
    """sm_75: synchronous copies (no cp.async); sm_80 and later pipeline them."""
    a = te.placeholder((m, k), name="a")
    w = te.placeholder((k, n), name="w")
    fn = polyfuse.compile(
        inputs=[a, w], outputs=[ops.matmul(a, w)], arch=arch, check_cuda=False, mapping=mapping
    )
    (kern,) = fn.kernels
    return fn, kern.source


def _vector_copied(src: str, tensor: str) -> bool:
    """A 128-bit copy of ``tensor``: a float4 load (from the array or its strength-reduced
    pointer ``pf_gp<k>_<tensor>``), or a 16-byte cp.async."""
    sync = re.search(rf"\*reinterpret_cast<const float4\*>\(&(?:{tensor}|pf_gp\d+_{tensor})\[", src)
    return sync or bool(re.search(rf"__pipeline_memcpy_async\(&s_{tensor}\[[^;]*, 16[,)]", src))


def test_4096_matmul_copies_both_operands_as_float4():
    fn, src = _matmul(4096, 4096, 4096)
    assert _vector_copied(src, "a") and _vector_copied(src, "w")
    assert "__shared__ __align__(16) float s_a[" in src
    assert "__shared__ __align__(16) float s_w[" in src
    assert VECTOR_STORE in src  # the register tile's runs of 4 columns
    assert any("isl proves every start 16-byte aligned" in n for n in fn.kernels[0].notes)


@pytest.mark.skipif(not available_compilers(), reason="no NVRTC/nvcc installed")
def test_4096_matmul_ptx_has_vector_loads_for_both_operands():
    fn, _ = _matmul(4096, 4096, 4096)
    ptx = compile_cuda(fn.cuda_source, "sm_75", output="ptx").ptx
    assert len(V4_LOAD.findall(ptx)) >= 2, sorted(set(re.findall(r"ld\.global\S*", ptx)))
    assert not re.search(r"ld\.global(?:\.nc)?\.f32", ptx)  # no scalar global load left
    assert V4_STORE.search(ptx) and not re.search(r"st\.global\.f32", ptx)  # epilogue
    for arch in ("sm_80", "sm_90"):
        for res in fn.check_cuda(arch).resources.values():
            assert res.spill_stores == 0 and res.spill_loads == 0, res


def test_misaligned_rows_copy_scalar_and_stay_correct():
    # A's rows are 1001 floats long: its k-tile starts are not 16-byte aligned, W's are.
    fn, src = _matmul(40, 1001, 64)
    assert not _vector_copied(src, "a") and _vector_copied(src, "w")
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 1001)).astype(np.float32)
    w = rng.standard_normal((1001, 64)).astype(np.float32)
    want = a.astype(np.float64) @ w
    for order in ORDERS:
        got = fn(a, w, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-3, err_msg=f"order {order}")
    if available_compilers():
        ptx = compile_cuda(fn.cuda_source, "sm_75", output="ptx").ptx
        assert V4_LOAD.search(ptx) and re.search(r"ld\.global(?:\.nc)?\.f32", ptx)


@pytest.mark.parametrize("arch", ["sm_75", "sm_80"])
@pytest.mark.parametrize("shape", [(33, 76, 52), (67, 72, 132)])
def test_vector_copies_correct_at_partial_tiles(shape, arch):
    m, k, n = shape
    fn, src = _matmul(m, k, n, arch, SMALL_TILE)
    assert _vector_copied(src, "a") and _vector_copied(src, "w")
    zero = "make_float4(0.0f, 0.0f, 0.0f, 0.0f)" if arch == "sm_75" else ") ? 0 : 16);"
    assert zero in src  # whole vectors outside the array: zeros
    assert VECTOR_STORE in src  # N a multiple of 4: runs never straddle the edge
    rng = np.random.default_rng(2)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((k, n)).astype(np.float32)
    want = a.astype(np.float64) @ w
    for order in ORDERS:
        got = fn(a, w, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"order {order}")


def test_epilogue_scalar_where_rows_misaligned_and_correct():
    # N = 66: output rows are not 16-byte aligned; bias + GELU epilogue stores stay scalar.
    m, k, n = 40, 64, 66
    a, w, b = (
        te.placeholder((m, k), name="a"),
        te.placeholder((k, n), name="w"),
        te.placeholder((n,), name="b"),
    )
    fn = polyfuse.compile([a, w, b], [ops.gelu(ops.add(ops.matmul(a, w), b))], check_cuda=False)
    (kern,) = fn.kernels
    assert "*reinterpret_cast<float4*>(&gelu" not in kern.source
    assert any(n.startswith("epilogue stores scalar") for n in kern.notes)
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]
    x = arrays[0].astype(np.float64) @ arrays[1] + arrays[2]
    want = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    for order in ORDERS:
        got = fn(*arrays, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"order {order}")


def test_epilogue_vector_store_with_bias_gelu_partial_tiles():
    m, k, n = 37, 24, 72
    a, w, b = (
        te.placeholder((m, k), name="a"),
        te.placeholder((k, n), name="w"),
        te.placeholder((n,), name="b"),
    )
    y = ops.gelu(ops.add(ops.matmul(a, w), b))
    fn = polyfuse.compile([a, w, b], [y], check_cuda=False, mapping=SMALL_TILE)
    (kern,) = fn.kernels
    assert "*reinterpret_cast<float4*>(&gelu" in kern.source
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]
    x = arrays[0].astype(np.float64) @ arrays[1] + arrays[2]
    want = 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))
    for order in ORDERS:
        got = fn(*arrays, device="emulate", race_check=order)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"order {order}")


@pytest.mark.skipif(not available_compilers(), reason="no NVRTC/nvcc installed")
def test_4096_matmul_sm80_copies_with_16_byte_cp_async():
    fn, src = _matmul(4096, 4096, 4096, "sm_80")
    assert _vector_copied(src, "a") and _vector_copied(src, "w")
    ptx = compile_cuda(fn.cuda_source, "sm_80", output="ptx").ptx
    assert len(re.findall(r"cp\.async\.\w+\.shared\.global \[[^\]]*\], \[[^\]]*\], 16", ptx)) >= 2
    assert V4_STORE.search(ptx)
