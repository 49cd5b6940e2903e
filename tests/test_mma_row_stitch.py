"""Layer 2 for tensorized GEMMs (:mod:`polyfuse.stitch.mma_rows`): a 16-bit GEMM on tensor cores
whose block tile covers whole rows takes the row reduction after it.

Attention's scores product + softmax and a GEMM + bias + residual + layer norm in bfloat16 and
float16 become one kernel (the epilogue stores the accumulators to a shared row tile, a
barrier first: the tile overlays the operand tiles); the decision keeps both tensorized tiles'
modelled figures; the emulator runs the joined kernel in every race-check mode against float64
at sizes that are not multiples of 16; a planted missing barrier is caught; rows wider than a
tensor-core tile or than shared memory are refused with the reason.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from kernel_checks import site_text

import polyfuse
import polyfuse.gemm_rows as generation
from polyfuse import ops, te
from polyfuse.base.decision import DecisionKind
from polyfuse.base.errors import RaceError
from polyfuse.cuda.codegen.kernel_ast import KBarrier
from polyfuse.cuda.codegen.lower_mma import READ_NOTE
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.tensorize_tiling import TILINGS
from polyfuse.reference import evaluate
from polyfuse.stitch import mma_rows
from polyfuse.stitch.gemm_rows import GEMM_ROWS_RULE, row_grid
from polyfuse.stitch.mma_rows import (
    pair_store_wavefronts,
    row_pad,
    row_tilings,
    store_wavefronts,
)

MODES = (False, True, "shadow")


def _rows(fn):
    return [d for d in fn.plan.stitches if d.rule == GEMM_ROWS_RULE]


def _scores(dtype: str, heads: int, seq: int, d: int = 64):
    """Q·Kᵀ / √d then softmax over the keys: (inputs, output, arrays, float64 want)."""
    shape = (1, heads, seq, d)
    q, k = (te.placeholder(shape, dtype, name=n) for n in "qk")
    kt = ops.transpose(k, (0, 1, 3, 2), name="k_t")
    scores = ops.mul(ops.matmul(q, kt, name="qk"), 1 / math.sqrt(d), name="scores")
    out = ops.softmax(scores, axis=-1, name="probs")
    rng = np.random.default_rng(seq)
    arrays = [rng.standard_normal(shape).astype(numpy_dtype(dtype)) for _ in range(2)]
    s = arrays[0].astype(np.float64) @ np.swapaxes(arrays[1].astype(np.float64), -1, -2)
    s /= math.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    return [q, k], out, arrays, p / p.sum(-1, keepdims=True)


def _check(fn, arrays, want, dtype):
    w = want.astype(numpy_dtype(dtype))
    for race in MODES:
        got = fn(*arrays, device="emulate", race_check=race)
        err = np.abs(got.astype(np.float64) - want).max()
        assert tolerance(dtype).allclose(got, w), (race, err)


@pytest.mark.parametrize(
    ("dtype", "heads", "seq"),
    [("bfloat16", 2, 128), ("float16", 2, 77), ("bfloat16", 3, 60)],
)
def test_tensorized_scores_take_the_softmax(dtype, heads, seq):
    """One kernel (the softmax's own before): the scores product on mma.sync with a whole-row
    tile (BN the narrowest tile width covering the row), the scores only in shared memory,
    numbers as float64 in every race-check mode."""
    ins, out, arrays, want = _scores(dtype, heads, seq)
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    assert len(fn.kernels) == 1, [k.name for k in fn.kernels]
    (d,) = _rows(fn)
    assert d.stitched and d.reason.startswith("GEMM block tile covers whole rows"), d.reason
    assert d.kinds == (DecisionKind.STITCHED, DecisionKind.COST_MODEL)
    assert d.data["tensor_cores"] is True
    bm, bn, wm, wn, bk = d.data["tile"]
    assert (bm, bn, wm, wn) in row_tilings(seq) and bn >= seq and bk == 32
    assert " on tensor cores (" in d.reason and d.data["gain_us"] > 0
    assert d.data["saved_bytes"] == 2 * 2 * heads * seq * seq  # 16-bit scores, both ways
    (k,) = fn.kernels
    assert "pf_mma_m16n8k16_f32_" in k.source and "pf_ldmatrix_x4" in k.source
    assert READ_NOTE in k.source  # the operand tiles are read before the row tile overlays them
    assert k.bytes_written == 2 * heads * seq * seq  # the probabilities only
    _check(fn, arrays, want, dtype)


def test_bf16_gemm_bias_residual_layer_norm_in_one_kernel():
    """x·Wᵀ + b + residual, then layer norm over 96 features (rows 37: a partial row tile)."""
    rows, kdim, n = 37, 80, 96
    x = te.placeholder((rows, kdim), "bfloat16", name="x")
    w = te.placeholder((n, kdim), "bfloat16", name="w")
    b = te.placeholder((n,), "bfloat16", name="b")
    r = te.placeholder((rows, n), "bfloat16", name="r")
    wt = ops.transpose(w, (1, 0), name="w_t")
    h = ops.add(ops.add(ops.matmul(x, wt, name="proj"), b, name="biased"), r, name="res")
    out = ops.layer_norm(h, name="ln")
    fn = polyfuse.compile([x, w, b, r], [out], check_cuda=False)
    (d,) = _rows(fn)
    assert d.stitched and d.data["tensor_cores"] is True, d.reason
    assert len(fn.kernels) == 1, [k.name for k in fn.kernels]
    rng = np.random.default_rng(7)
    arrays = [rng.standard_normal(s).astype(numpy_dtype("bfloat16"))
              for s in ((rows, kdim), (n, kdim), (n,), (rows, n))]  # fmt: skip
    f = [a.astype(np.float64) for a in arrays]
    hh = f[0] @ f[1].T + f[2] + f[3]
    mu = hh.mean(-1, keepdims=True)
    want = (hh - mu) / np.sqrt(((hh - mu) ** 2).mean(-1, keepdims=True) + 1e-5)
    _check(fn, arrays, want, "bfloat16")


def test_missing_barrier_before_the_row_tile_is_caught(monkeypatch):
    """Planted bug: without the barrier before the epilogue, a warp's stores to the row tile
    (which overlays the operand tiles) race with another warp's last ldmatrix reads; the
    shadow race check says so."""
    real = generation.lower_mma_ir

    def planted(*args, **kwargs):
        low = real(*args, **kwargs)
        body = tuple(
            n for n in low.ir.body if not (isinstance(n, KBarrier) and n.note == READ_NOTE)
        )
        assert len(body) == len(low.ir.body) - 1
        return replace(low, ir=low.ir.with_(body=body))

    monkeypatch.setattr(generation, "lower_mma_ir", planted)
    ins, out, arrays, _ = _scores("bfloat16", 1, 128)
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    assert len(fn.kernels) == 1 and READ_NOTE not in fn.kernels[0].source
    with pytest.raises(RaceError, match="s_q|s_k|pf_pool"):
        fn(*arrays, device="emulate", race_check="shadow")


def test_rows_wider_than_a_tile_or_shared_memory_are_refused(monkeypatch):
    """S = 512: no tensor-core tile is 512 wide (the softmax keeps its own kernel); S = 197 on
    the 64x256 tile: 64 rows of 197 floats and the softmax's arrays exceed static shared
    memory (a FOOTPRINT refusal with the bytes, shown without the 32-row tile), so the
    32x256 tile is taken."""
    widest = max(t[1] for t in TILINGS)
    ins, out, _, _ = _scores("bfloat16", 1, 512)
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    (d,) = _rows(fn)
    assert not d.stitched and len(fn.kernels) == 2
    assert d.reason == f"row of 512 elements wider than the widest tensor-core tile ({widest})"
    ins, out, arrays, want = _scores("bfloat16", 1, 197)
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    (d,) = _rows(fn)
    assert d.stitched and d.data["tile"][:4] == [32, 256, 1, 4], d.data
    _check(fn, arrays, want, "bfloat16")
    # without the 32-row tile: refused for shared memory, with the bytes
    monkeypatch.setattr(mma_rows, "ROW_ONLY", ())
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    (d,) = _rows(fn)
    assert not d.stitched and len(fn.kernels) == 2 and DecisionKind.FOOTPRINT in d.kinds
    tiles = {f"the {4 * t[0] * 197} B row tile of qk + " for t in row_tilings(197)}
    assert d.reason.startswith("row too wide for shared memory: ")
    assert any(t in d.reason for t in tiles), d.reason


def test_row_tilings_and_the_grid_the_rows_correspond_to():
    """The narrowest tile width that covers the row, fewer rows first; a tensorized GEMM's
    trailing column blocks of one block are no coordinate of the correspondence."""
    assert row_tilings(128) == [(64, 128, 2, 2), (128, 128, 2, 4), (256, 128, 4, 2)]
    assert row_tilings(197)[0] == (32, 256, 1, 4)
    assert {t[1] for t in row_tilings(60)} == {64} and row_tilings(257) == []
    assert row_grid([12, 2, 1], 2) == (12, 2)
    assert row_grid([12, 2, 1], 3) == (12, 2, 1)
    assert row_grid([1, 4], 1) == (1, 4)


def test_row_tile_rows_are_padded_against_the_epilogues_bank_conflicts():
    """A warp's epilogue store writes 8 rows x 4 column pairs of the row tile, one ``float2``
    per lane: rows 128 floats apart all start in bank 0 (8 wavefronts per store, 4 per
    half-warp phase); padded by 8 floats, 2 — one per phase, conflict-free (element by
    element, padded by 4, it was 2 per 4-byte store: twice the wavefronts and the
    instructions). The emulator's bank counter sees the same; the tile holds each score
    rounded to bfloat16, as the graph says (the probabilities equal the reference's rounded
    at every tensor: with the pair's lanes unrounded, 77 % did). The softmax reads its runs of
    the row tile as float4 (before: 4-byte reads, 4 wavefronts each)."""
    assert (store_wavefronts(128), row_pad(128), store_wavefronts(132)) == (8, 8, 2)
    assert (pair_store_wavefronts(128), pair_store_wavefronts(136)) == (8, 2)
    assert min(store_wavefronts(s) for s in range(64, 200)) == 2
    assert row_pad(197) == 0  # rows not whole 16-byte runs stay as they are
    ins, out, arrays, want = _scores("bfloat16", 1, 128, 48)  # 1/√48: rounding shows
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    assert "s_qk stored a pair of adjacent columns per access" in str(fn.kernels[0].notes)
    got = fn(*arrays, race_check="banks")
    assert tolerance("bfloat16").allclose(got, want.astype(numpy_dtype("bfloat16")))
    storage = evaluate([out], dict(zip(ins, arrays, strict=True)))[0]
    assert np.mean(got == storage) > 0.99  # expf vs numpy's exp may differ in an ulp
    lines = fn.cuda_source.splitlines()
    sites = [s for t in fn.last_traffic for s in t.shared_banks if s.access == "write"]
    stores = [s for s in sites if "reinterpret_cast<float2*>(&s_qk[" in site_text(lines, s)]
    assert stores and all(s.width == 8 and s.degree == 1.0 for s in stores), [
        str(s) for s in stores
    ]
    reads = [s for t in fn.last_traffic for s in t.shared_banks
             if s.access == "read" and "&s_qk[" in site_text(lines, s)]  # fmt: skip
    assert reads and all(s.width == 16 and s.degree == 2.0 for s in reads), [str(s) for s in reads]


def test_float32_scores_with_tf32_allowed_stay_on_tensor_cores():
    """``allow_tf32``: a float32 scores product runs on ``m16n8k8`` tf32 alone, so its stitch
    keeps it there (before: the stitch moved it to CUDA-core tiles). Probabilities within tf32's
    rounding of float64 in every race-check mode; NVRTC compiles it without a spill."""
    from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
    from polyfuse.poly.mapping import MappingConfig

    q, k = (te.placeholder((1, 2, 77, 64), name=n) for n in "qk")
    kt = ops.transpose(k, (0, 1, 3, 2), name="k_t")
    scores = ops.mul(ops.matmul(q, kt, name="qk"), 0.125, name="scores")
    out = ops.softmax(scores, axis=-1, name="probs")
    cfg = MappingConfig(allow_tf32=True)
    fn = polyfuse.compile([q, k], [out], check_cuda=False, mapping=cfg)
    (d,) = _rows(fn)
    assert d.stitched and d.data["tensor_cores"] is True and len(fn.kernels) == 1, d.reason
    (k0,) = fn.kernels
    assert any("mma.sync.m16n8k8 tf32" in str(n) for n in k0.notes), k0.notes
    rng = np.random.default_rng(3)
    arrays = [rng.standard_normal((1, 2, 77, 64)).astype(np.float32) for _ in range(2)]
    s = arrays[0].astype(np.float64) @ np.swapaxes(arrays[1].astype(np.float64), -1, -2) / 8
    p = np.exp(s - s.max(-1, keepdims=True))
    want = p / p.sum(-1, keepdims=True)
    for race in MODES:
        got = fn(*arrays, device="emulate", race_check=race)
        assert np.abs(got - want).max() < 5e-3, race
    if "nvrtc" in available_compilers():
        for arch in ("sm_80", "sm_90"):
            fa = polyfuse.compile([q, k], [out], arch, check_cuda=False, mapping=cfg)
            res = compile_cuda(fa.cuda_source, arch, compiler="nvrtc").resources
            assert all(r.spill_stores == r.spill_loads == 0 for r in res.values()), arch
