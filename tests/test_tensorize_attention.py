"""Attention's two products on tensor cores (issue 23 item 4): ``softmax(Q·Kᵀ/√d)·V`` on 16-bit
``[batch, heads, S, d]`` operands. The scores product (K read k-innermost: ``x @ W^T``'s
layout, two batch dims) and the PV product (V n-innermost, ``ldmatrix.trans``) are each matched
by :func:`polyfuse.poly.tensorize.match_mma` and tensorized; the softmax between them runs in the
scores product's kernel where a whole-row tensor-core tile holds its rows in shared memory
(:mod:`polyfuse.stitch.mma_rows`: S = 77 and 128), else as its own row kernel (S = 512: no tile
is 512 wide). Correct against float64 numpy at S = 128, 512 and odd S in every emulator mode;
NVRTC compiles them without spills.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import numpy_dtype, tolerance

HALVES = ["float16", "bfloat16"]
MODES = (False, True, "shadow")
D = 64


def _attention(dtype: str, seq: int, batch: int = 1, heads: int = 2):
    """(inputs, output, arrays, float64 want) of scaled dot-product attention in ``dtype``."""
    shape = (batch, heads, seq, D)
    q, k, v = (te.placeholder(shape, dtype, name=n) for n in "qkv")
    scale = 1.0 / math.sqrt(D)
    kt = ops.transpose(k, (0, 1, 3, 2), name="k_t")
    scores = ops.mul(ops.matmul(q, kt, name="qk"), scale, name="scores")
    out = ops.matmul(ops.softmax(scores, axis=-1, name="probs"), v, name="attn")
    rng = np.random.default_rng(seq)
    arrays = [rng.standard_normal(shape).astype(numpy_dtype(dtype)) for _ in range(3)]
    fq, fk, fv = (a.astype(np.float64) for a in arrays)
    s = fq @ np.swapaxes(fk, -1, -2) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ fv
    return [q, k, v], out, arrays, want


def _products(fn) -> list:
    """The kernels holding the two products, each asserted tensorized; the softmax in the
    scores product's kernel where its rows fit one tensor-core tile (S <= 256), else its own."""
    mm = [k for k in fn.kernels if k.name.endswith(("_qk", "_attn"))]
    assert [k.name.split("_", 1)[1] for k in mm] == ["qk", "attn"], [k.name for k in fn.kernels]
    seq = fn.inputs[0].shape[-2]
    assert len(fn.kernels) == (2 if seq <= 256 else 3), [k.name for k in fn.kernels]
    for k in mm:
        assert any(n.startswith("tensor cores: mma.sync.m16n8k16") for n in k.notes), k.notes
        assert "pf_mma_m16n8k16_f32_" in k.source and "pf_ldmatrix_x4" in k.source
        assert not any(n.startswith("no tensor cores") for n in k.notes), k.notes
    return mm


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    "seq",
    [pytest.param(77, marks=pytest.mark.slow), 128, pytest.param(512, marks=pytest.mark.slow)],
)
def test_attention_products_are_tensorized_and_match_float64(dtype, seq):
    """Both products on mma.sync (Q·Kᵀ with K k-innermost, P·V with V loaded ``.trans``),
    correct in every emulator mode (in-order, reversed thread order, shadow race check)."""
    heads = 1 if seq == 512 else 2
    inputs, out, arrays, want = _attention(dtype, seq, heads=heads)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    qk, pv = _products(fn)
    (qk_loads,) = [n for n in qk.notes if "(A) in shared" in n]
    assert "ldmatrix.x4 (two mma tiles)" in qk_loads and ".trans" not in qk_loads
    assert pv.notes[1].endswith(".trans"), pv.notes[1]
    w = want.astype(numpy_dtype(dtype))
    for race in MODES:
        got = fn(*arrays, device="emulate", race_check=race)
        err = np.abs(got.astype(np.float64) - w.astype(np.float64)).max()
        assert tolerance(dtype).allclose(got, w), (race, err)


def test_odd_sequence_rows_take_scalar_fills_with_the_reason():
    """S = 77: P's rows (77 elements) are not whole 16-byte chunks, so P·V's tiles are filled
    by scalar copies (the reason noted); Q·Kᵀ reads d = 64 rows and keeps cp.async."""
    inputs, out, _, _ = _attention("float16", 77)
    fn = polyfuse.compile(inputs, [out], check_cuda=False)
    qk, pv = _products(fn)
    assert "pf_cp_async16(" in qk.source and "pf_cp_async16(" not in pv.source
    assert any("innermost extent 77 is not a multiple of 8" in n for n in pv.notes), pv.notes


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", HALVES)
def test_nvrtc_compiles_tensorized_attention_without_spills(arch, dtype):
    for seq in (77, 512):
        inputs, out, _, _ = _attention(dtype, seq)
        fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
        _products(fn)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        assert binary.resources
        assert all(r.spill_stores == r.spill_loads == 0 for r in binary.resources.values())
