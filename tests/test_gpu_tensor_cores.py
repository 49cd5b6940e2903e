"""On a real GPU (skipped without one): the tensor-core kernels (issue 23) compute on hardware
what they compute in the emulator — ``mma.sync`` fragments, ``ldmatrix`` lane layouts, XOR
swizzles and ``cp.async`` groups are only as right as the emulator's model of them, so this is
where that model is checked against the chip.

Each graph (odd sizes: no multiple of 16 anywhere, or aligned rows with a ragged k edge) runs
on the GPU and in the emulator; both must match float64 numpy under the dtype's tolerance
(:func:`polyfuse.graph.dtypes.tolerance`; tf32 under its operand-truncation bound), and the GPU
must match the emulator as closely (the chip's accumulation order inside an ``mma`` differs).
Run on a lent machine with ``python -m pytest -q tests/test_gpu_tensor_cores.py`` (the GPU
day's ``tests`` step runs it).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tensorize import _matmul
from test_tensorize_attention import _attention
from test_tensorize_conv import CASES as CONV_CASES
from test_tensorize_conv import _conv
from test_tensorize_tf32 import _bound

import polyfuse
from polyfuse.cuda.runtime import gpu_available
from polyfuse.errors import CompilerNotFound
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig

pytestmark = pytest.mark.skipif(not gpu_available(), reason="no GPU (cuda-bindings or pycuda)")

ODD = (67, 45, 53)  # M, N, K
ODD_ALIGNED = (67, 40, 200)  # 16-byte rows: the cp.async fills, a ragged last k-tile
LARGE = (1000, 776, 1048)  # big warp tiles, several k-tiles, ragged edges


def _on_both(fn, arrays, want, dtype: str, emulate: bool = True) -> None:
    """GPU and emulator results against float64 numpy and against each other (``emulate``
    False, or no C++ compiler on the machine: the GPU against numpy alone)."""
    tol = tolerance(dtype)
    w = want.astype(numpy_dtype(dtype))
    got = fn(*arrays, device="cuda")
    assert got.dtype == numpy_dtype(dtype)
    err = float(np.abs(got.astype(np.float64) - want).max())
    assert tol.allclose(got, w), ("gpu", err)
    if not emulate:
        return
    try:
        emu = fn(*arrays, device="emulate")
    except CompilerNotFound:
        return
    assert tol.allclose(emu, w), "emulator"
    assert tol.allclose(got, emu), ("gpu vs emulator", err)


def _compile(inputs, out, **mapping):
    cfg = MappingConfig(**mapping)
    fn = polyfuse.compile(inputs, [out], mapping=cfg)
    assert any("mma.sync" in n for k in fn.kernels for n in k.notes), "not tensorized"
    return fn


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("size", [ODD, ODD_ALIGNED], ids=["odd", "odd_aligned"])
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
def test_tensor_core_matmuls_at_every_stage_count(dtype, size, stages):
    m, n, k = size
    inputs, out, arrays, want = _matmul(dtype, m, n, k)
    if stages > 1 and size == ODD:
        pytest.skip("odd rows keep the one-stage scalar fill (tests/test_tensorize_pipeline.py)")
    _on_both(_compile(inputs, out, gemm_stages=stages), arrays, want, dtype)


@pytest.mark.parametrize(
    "variant",
    [
        {"trans_b": True},
        {"trans_a": True},
        {"batch": 3},
        {"epilogue": True},
    ],
    ids=["trans_b", "trans_a", "batched", "bias_gelu"],
)
def test_tensor_core_matmul_variants(variant):
    m, n, k = ODD_ALIGNED if not variant.get("trans_a") else (72, 40, 200)
    inputs, out, arrays, want = _matmul("bfloat16", m, n, k, **variant)
    _on_both(_compile(inputs, out), arrays, want, "bfloat16")


def test_large_tensor_core_matmul_with_the_models_tiles():
    inputs, out, arrays, want = _matmul("bfloat16", *LARGE, epilogue=True)
    _on_both(_compile(inputs, out), arrays, want, "bfloat16", emulate=False)


@pytest.mark.parametrize("block_k", [32, 64])
def test_stages_in_the_dynamic_pool(block_k):
    """Four stages past the static 48 KB (the launch raises the function's limit)."""
    inputs, out, arrays, want = _matmul("bfloat16", 2000, 1032, 1048, trans_b=True)
    fn = _compile(inputs, out, gemm_stages=4, mma_block_k=block_k)
    assert fn.kernels[0].dynamic_shared_bytes > 48 * 1024, fn.kernels[0].notes
    _on_both(fn, arrays, want, "bfloat16", emulate=False)


def test_tf32_matmul_on_the_gpu():
    inputs, out, arrays, want = _matmul("float32", *ODD_ALIGNED)
    fn = _compile(inputs, out, allow_tf32=True)
    bound = _bound(arrays, False)
    for device in ("cuda", "emulate"):
        try:
            got = fn(*arrays, device=device)
        except CompilerNotFound:
            continue
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= bound).all(), (device, float((err / bound).max()))


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_tensor_core_convs(case):
    kernel, stride, pad = CONV_CASES[case]
    inputs, out, arrays, want = _conv("bfloat16", (2, 24, 40, 11, 9), kernel, stride, pad)
    _on_both(_compile(inputs, out), arrays, want, "bfloat16")


@pytest.mark.parametrize("seq", [128, 200])
def test_tensor_core_attention(seq):
    inputs, out, arrays, want = _attention("bfloat16", seq)
    fn = polyfuse.compile(inputs, [out])
    _on_both(fn, arrays, want, "bfloat16")


@pytest.mark.parametrize(("a_dtype", "b_dtype"), [("uint8", "int8"), ("int8", "int8")])
@pytest.mark.parametrize("case", ["x_wT", "2d"])
@pytest.mark.parametrize("size", [ODD, (1000, 776, 1056)], ids=["odd", "large"])
def test_byte_gemms_on_m16n8k32_are_exact_on_the_gpu(a_dtype, b_dtype, case, size):
    """int8/uint8 GEMMs (m16n8k32, int32 accumulators): the chip's sums equal numpy's int64
    product wrapped to int32, and the emulator's, exactly (``2d``: ``b`` stored k-outside,
    read through its transposing primitive)."""
    from test_tensorize_int8 import CASES as BYTE_CASES
    from test_tensorize_int8 import _int_matmul

    inputs, out, arrays, want = _int_matmul(*size, a_dtype, b_dtype, **BYTE_CASES[case])
    fn = _compile(inputs, out)
    got = fn(*arrays, device="cuda")
    np.testing.assert_array_equal(got, want)
    try:
        np.testing.assert_array_equal(fn(*arrays, device="emulate"), got)
    except CompilerNotFound:
        pass
