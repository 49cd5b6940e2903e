"""Layer 2 for GEMMs (issue 24 item 3): a GEMM whose block tile covers whole rows takes the
row reduction after it (:mod:`polyfuse.stitch.gemm_rows`).

Attention's scores GEMM + softmax and a GEMM + bias + residual + layer norm become one kernel
whose GEMM epilogue stores the row tile to shared memory for the reduction's own code; the
decision (tile, both modelled figures) and refusals are in the plan; the emulator runs the
joined kernel (race-check modes too) against ``polyfuse.reference`` at sizes whose rows are
not a multiple of the tile; NVRTC compiles it for sm_80 and sm_90.
"""

from __future__ import annotations

from dataclasses import replace

import islpy as isl
import numpy as np
import pytest

import polyfuse
from polyfuse import ops, reference, te
from polyfuse.base.decision import DecisionKind
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.poly.costs.constants import CONSTANTS
from polyfuse.poly.device import BY_ARCH
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.promote import pipeline_stages
from polyfuse.poly.tiling import detect_gemm, rank_gemm_tiles
from polyfuse.stitch.gemm_rows import (
    GEMM_ROWS_RULE,
    block_correspondence,
    row_tiles,
    shared_pool,
)
from polyfuse.stitch.row_cost import TilePrice, row_stitch_cost

RNG = np.random.default_rng(2403)


def _rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def _rows(fn):
    return [d for d in fn.plan.stitches if d.rule == GEMM_ROWS_RULE]


def _check(fn, inputs, outputs, arrays, races=True):
    """The emulator (plain, reversed fiber order, shadow race detector) against the reference
    (float32 sums against float64: the absolute tolerance scales with the largest value)."""
    want = reference.evaluate(outputs, dict(zip(inputs, arrays, strict=True)))
    for order in (False, True, "shadow") if races else (False,):
        got = fn(*arrays, device="emulate", race_check=order)
        got = list(got) if isinstance(got, tuple) else [got]
        for g, w in zip(got, want, strict=True):
            scale = max(1.0, float(np.max(np.abs(w))))
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * scale)


def _attention(m: int, n: int, d: int = 16):
    q = te.placeholder((2, 2, m, d), name="q")
    k = te.placeholder((2, 2, d, n), name="k")
    scores = ops.mul(ops.matmul(q, k, name="scores"), 0.25, name="scaled")
    return [q, k], [ops.softmax(scores, -1, name="probs")]


@pytest.mark.parametrize(("m", "n"), [(37, 96), (21, 200), (13, 512)])
def test_scores_gemm_takes_the_softmax(m, n):
    """QK^T then softmax (rows 37/21/13: partial row tiles; widths 96, 200, 512): one kernel
    where there were two, the scores never in global memory, numbers as the reference."""
    ins, outs = _attention(m, n)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    assert len(fn.kernels) == 1
    (d,) = _rows(fn)
    assert d.stitched and d.reason.startswith("GEMM block tile covers whole rows")
    assert d.kinds == (DecisionKind.STITCHED, DecisionKind.COST_MODEL)
    bm, bn = d.data["tile"][:2]
    assert bn >= n and (bm, bn) in {(t[0], t[1]) for t in row_tiles(n)}
    # both modelled figures, and the decision they support
    assert d.data["rows_tile_us"] - d.data["best_tile_us"] < d.data["saved_us"]
    assert d.data["saved_bytes"] == 2 * 4 * 2 * 2 * m * n
    (k,) = fn.kernels
    assert "scores" not in k.tensor_bytes and "scaled" not in k.tensor_bytes
    assert k.bytes_written == 4 * 2 * 2 * m * n  # probs only
    assert k.bytes_read == 4 * 2 * 2 * 16 * (m + n)  # q and k, once
    plan = fn.plan.kernel_plans[0]
    assert plan.placements["scores"].space == "shared"
    # the reduction runs a warp per row over the GEMM block's rows in turn
    assert "for (int pf_j = 0; pf_j < " in k.source and "l0 = _t % 32" in k.source
    assert any(DecisionKind.STITCHED in r.kinds and "rows_tile_us" in r.data for r in plan.layout)
    _check(fn, ins, outs, [_rand(2, 2, m, 16), _rand(2, 2, 16, n)], races=n <= 200)


@pytest.mark.parametrize(("m", "kdim", "n"), [(37, 32, 96), (19, 24, 200)])
def test_gemm_bias_residual_layer_norm_in_one_kernel(m, kdim, n):
    """x @ w + b + residual, then layer norm over the row: the GEMM and the add + layer norm
    kernel become one; the numbers are the reference's."""
    x, w = te.placeholder((m, kdim), name="x"), te.placeholder((kdim, n), name="w")
    b, r = te.placeholder((n,), name="b"), te.placeholder((m, n), name="r")
    g, be = te.placeholder((n,), name="g"), te.placeholder((n,), name="be")
    y = ops.add(ops.add(ops.matmul(x, w, name="mm"), b, name="bias"), r, name="res")
    out = ops.layer_norm(y, g, be, name="ln")
    ins = [x, w, b, r, g, be]
    fn = polyfuse.compile(ins, [out], check_cuda=False)
    assert len(fn.kernels) == 1
    (d,) = _rows(fn)
    assert d.stitched and d.data["rows_tile_us"] > 0 and d.data["best_tile_us"] > 0
    arrays = [_rand(m, kdim), _rand(kdim, n), _rand(n), _rand(m, n), _rand(n), _rand(n)]
    _check(fn, ins, [out], arrays)


def test_row_too_wide_for_shared_memory_is_refused_with_the_bytes():
    """Rows of 2048 floats: no whole-row tile fits static shared memory with the reduction's
    own tiles; the GEMM and the softmax stay two kernels, and the plan says why."""
    x, w = te.placeholder((16, 16), name="x"), te.placeholder((16, 2048), name="w")
    out = ops.softmax(ops.matmul(x, w, name="mm"), -1)
    fn = polyfuse.compile([x, w], [out], check_cuda=False)
    assert len(fn.kernels) == 2
    (d,) = _rows(fn)
    assert not d.stitched and d.kinds == (DecisionKind.FOOTPRINT,)
    assert d.reason.startswith("row too wide for shared memory: the ")
    assert "> 49152 B static shared memory per block" in d.reason
    assert d.tensors == ["mm"]
    _check(fn, [x, w], [out], [_rand(16, 16), _rand(16, 2048)], races=False)


def _bias_residual_layer_norm(m: int, kdim: int, n: int):
    x, w = te.placeholder((m, kdim), name="x"), te.placeholder((kdim, n), name="w")
    b, r = te.placeholder((n,), name="b"), te.placeholder((m, n), name="r")
    y = ops.add(ops.add(ops.matmul(x, w, name="mm"), b, name="bias"), r, name="res")
    return [x, w, b, r], [ops.layer_norm(y, name="ln")]


def test_row_stitch_cost_takes_and_refuses_by_its_numbers():
    """The decision itself: it saves the intermediate's DRAM round trip and a launch, it costs
    the whole-row tile's time over the best tile's; taken when the saving is larger, refused
    on a loss or a tie, the figures in its reason and data."""
    a100 = BY_ARCH["sm_80"]
    best = TilePrice((64, 128, 4, 8, 16), 10.0, "FP32 pipe", 96, 0.44, 8192)
    size = 1 << 20  # one MiB kept on chip: 2 MiB of DRAM traffic saved
    dram = 2 * size / (a100.bandwidth_gbps * 1e3)
    saved = dram + CONSTANTS.launch_us
    win = row_stitch_cost("mm", replace(best, tile=(16, 1024, 8, 8, 32), us=12.0), best, size, a100)
    assert win.dram_us == pytest.approx(dram) and win.saved_us == pytest.approx(saved)
    assert win.extra_us == pytest.approx(2.0) and win.gain_us == pytest.approx(saved - 2.0)
    assert win.taken and saved > 2.0
    assert "+2.00 us" in win.figures() and f"saves {2 * size} B of DRAM traffic" in win.figures()
    d = win.data()
    assert d["tile"] == [16, 1024, 8, 8, 32] and d["best_tile"] == [64, 128, 4, 8, 16]
    assert d["saved_bytes"] == 2 * size and d["gain_us"] == round(saved - 2.0, 3)
    lose = row_stitch_cost("mm", replace(best, us=10.0 + saved + 0.5), best, size, a100)
    assert not lose.taken and lose.gain_us == pytest.approx(-0.5)
    assert "gain -0.50 us" in lose.figures()
    tie = row_stitch_cost("mm", replace(best, us=10.0 + saved), best, size, a100)
    assert not tie.taken


def _check_figures(fn, arch: str, m: int, n: int) -> dict:
    """The decision's figures are the cost model's: both tiles priced again on the GEMM's
    shape, the round trip of the m x n intermediate at the device's bandwidth, one launch."""
    device = BY_ARCH[arch]
    (d,) = _rows(fn)
    data = d.data
    (gemm,) = [s for s in fn.plan.scheduled if s.name == d.producer[0]]
    shape = detect_gemm(gemm)
    stages = pipeline_stages(arch)
    (rows,) = rank_gemm_tiles(shape, device, tuple(data["tile"]), limit=1, stages=stages)
    (best,) = rank_gemm_tiles(shape, device, limit=1, stages=stages)
    assert data["rows_tile_us"] == round(rows.modelled_us, 3)
    assert data["best_tile"] == list(best.choice)
    assert data["best_tile_us"] == round(best.modelled_us, 3)
    assert data["saved_bytes"] == 2 * 4 * m * n
    assert data["dram_us"] == round(2 * 4 * m * n / (device.bandwidth_gbps * 1e3), 3)
    assert data["launch_us"] == CONSTANTS.launch_us
    assert data["rows_blocks"] == -(-m // data["tile"][0])  # whole rows: one block per row tile
    extra = rows.modelled_us - best.modelled_us
    gain = data["dram_us"] + data["launch_us"] - extra
    assert data["gain_us"] == pytest.approx(gain, abs=2e-3)
    assert d.stitched == (gain > 0) and d.kinds[-1] == DecisionKind.COST_MODEL
    return data


def test_cost_decision_takes_a_small_gemm_layer_norm_with_its_figures():
    """37 x 32 x 96 GEMM + bias + residual + layer norm: the whole-row tile costs less than
    the round trip and the launch it saves; taken, the compared figures in its data."""
    ins, outs = _bias_residual_layer_norm(37, 32, 96)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    data = _check_figures(fn, "sm_80", 37, 96)
    assert data["gain_us"] > 0 and len(fn.kernels) == 1


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_cost_model_refusal_records_both_figures(arch):
    """BERT-base's FFN down projection (1024 x 3072 x 768) then add + layer norm: a whole-row
    tile (768 wide, padded to 1024) gives a grid of 1024 / BM blocks whose busiest SM computes
    more outputs than the best tile's (twice on sm_80: 16x1024 vs 64x128, one block per SM);
    its extra time dwarfs the 6 MiB and the launch saved. Refused, both tiles' figures
    (blocks, outputs on the busiest SM, bound) recorded."""
    x, w = te.placeholder((1024, 3072), name="x"), te.placeholder((3072, 768), name="w")
    r = te.placeholder((1024, 768), name="r")
    out = ops.layer_norm(ops.add(ops.matmul(x, w, name="mm"), r, name="res"), name="ln")
    one = MappingConfig(split_k=1)  # the GEMM in one stage (on sm_90 the model sums K in parts)
    fn = polyfuse.compile([x, w, r], [out], arch=arch, check_cuda=False, mapping=one)
    assert len(fn.kernels) == 2
    (d,) = _rows(fn)
    assert not d.stitched and d.reason.startswith("the cost model says no: whole-row tile ")
    assert d.kinds == (DecisionKind.COST_MODEL,)
    data = _check_figures(fn, arch, 1024, 768)
    assert data["rows_tile_us"] - data["best_tile_us"] >= data["saved_us"] > 0
    assert data["gain_us"] < 0 and data["extra_us"] > 10 * data["saved_us"]
    assert data["rows_sm_outputs"] > data["best_sm_outputs"]
    assert "outputs on the busiest SM" in d.reason and "gain -" in d.reason


def test_block_correspondence_is_checked_by_isl():
    """The map from reduction blocks to GEMM blocks: rows in runs of ``repeat``, other
    coordinates alike; a reduction grid the GEMM's blocks do not cover is refused."""
    ins, outs = _attention(37, 96)
    fn = polyfuse.compile(ins, outs, check_cuda=False)
    gk, rm = fn.plan.kernel_plans[0].parts
    tile = _rows(fn)[0].data["tile"]
    repeat = tile[0] // (gk.tiling.nthreads // 32)
    corr = block_correspondence(gk, rm, repeat)
    assert corr.is_single_valued()
    assert corr.range().is_subset(
        isl.Set(
            f"{{ [g0, g1, g2] : 0 <= g0 < 2 and 0 <= g1 < 2 and 0 <= g2 < {gk.grid_dims[-1]} }}"
        )
    )
    # half the repeat leaves reduction blocks no GEMM block runs
    if repeat > 1:
        assert "have no GEMM block" in block_correspondence(gk, rm, repeat // 2).reason
    wrong = block_correspondence(gk, replace(rm, block_params=[]), repeat)
    assert "do not correspond" in wrong.reason


def test_shared_pool_overlays_the_gemm_tiles():
    """The GEMM's operand tiles are dead when the row tile is stored: the pool is the larger
    of the two phases, not their sum."""
    assert shared_pool(row=8192, gemm=41472, rows=16640) == 41472
    assert shared_pool(row=16384, gemm=10240, rows=33024) == 49408


def test_no_stitch_when_the_gemm_output_is_also_a_graph_output():
    """The scores are an output too: they must reach global memory; refused with the reason."""
    q, k = te.placeholder((1, 2, 24, 16), name="q"), te.placeholder((1, 2, 16, 40), name="k")
    s = ops.matmul(q, k, name="s")
    p = ops.softmax(s, -1, name="p")
    fn = polyfuse.compile([q, k], [s, p], check_cuda=False)
    assert len(fn.kernels) == 2
    (d,) = _rows(fn)
    assert not d.stitched and d.reason == "s is a graph output"


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_joined_kernel_compiles_with_nvrtc(arch):
    """NVRTC compiles the joined kernel; ptxas's static shared memory is the pool the facts
    record, and nothing spills."""
    ins, outs = _attention(45, 128, 64)
    fn = polyfuse.compile(ins, outs, arch=arch, check_cuda=True)
    (k,) = fn.kernels
    assert k.registers is not None and k.spill_stores == 0
    assert k.static_shared_bytes == k.facts.shared_bytes <= 48 * 1024
    assert "__syncthreads();  // the row tile is complete" in fn.cuda_source


@pytest.mark.slow  # 6 s
def test_tiny_transformer_out_projection_add_layer_norm_is_one_kernel():
    """A small BERT layer (zoo ``bert_base`` tiny: batch 2, seq 8, hidden 32, 2 heads): the
    attention output projection — its input the heads merged back by a transpose + reshape
    folded into its loads — with its bias, the residual add and the layer norm is one kernel
    per layer that writes only the layer norm's output; the model's outputs are numpy's."""
    from polyfuse import zoo

    m = zoo.build("bert_base", "tiny", seed=5)
    fn = polyfuse.compile(m.inputs, m.outputs, constants=m.constants, check_cuda=False)
    stitched = [d for d in _rows(fn) if d.stitched]
    for layer in range(m.config["layers"]):
        (k,) = [k for k in fn.kernels if f"layer{layer}_attn_o_w" in k.tensor_bytes]
        assert f"layer{layer}_ln1_gamma" in k.tensor_bytes, k.name
        written = [t for t, (_, w) in k.tensor_bytes.items() if w]
        assert len(written) == 1, written  # the layer norm's output only
        (d,) = [d for d in stitched if set(d.producer) <= set(k.micrographs)]
        assert d.data["gain_us"] > 0 and d.tensors[0] not in k.tensor_bytes
        plan = fn.plan.kernel_plans[fn.kernels.index(k)]
        assert plan.placements[d.tensors[0]].space == "shared"
    arrays = m.sample_inputs(3)
    want = m.reference(*arrays)
    for order in (False, "shadow"):
        got = fn(*arrays, device="emulate", race_check=order)
        got = list(got) if isinstance(got, tuple) else [got]
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=2e-3, atol=2e-4)
