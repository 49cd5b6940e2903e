"""The drain of a pipelined tensor-core k-tile loop: its last S - 1 k-tiles fill nothing
(:func:`polyfuse.cuda.codegen.lower_mma_pipeline.tail`).

Iteration ``kt`` of an S-stage loop fills k-tile ``kt + S - 1``; past the last k-tile that
fill was left in the rolled tail under a guard that never holds, and NVRTC kept its address
arithmetic in the loop (a MobileNetV2 projection of 3 k-tiles, whose whole loop is that tail:
6.4 other SASS instructions per HMMA). The tail is now split where the filled k-tile passes
the last: a guarded fill while it exists (a partial last k-tile), then the drain with no fill
and its empty commit group (the wait counts stay exact). Correct against float64 numpy in every
race-check mode at S = 2, 3, 4 with whole and partial last k-tiles, fewer k-tiles than
stages, single- and double-buffered fragments, unrolled and rolled steady states; a drain that
skips its commit is caught; the projection's SASS.
"""

from __future__ import annotations

import pytest
from hmma_loops import hmma_loop
from kernel_checks import compiles_without_spills, require_sass_tools
from test_tensorize import CASES, _matmul
from test_tensorize_conv import _conv
from test_tensorize_stage_unroll import _check, _compile

import polyfuse
from polyfuse.cuda.codegen import lower_mma_pipeline
from polyfuse.cuda.codegen.kernel_ast import KCommit


def _loops(src: str) -> list[str]:
    """The k-tile loops' texts, in order (each up to the next)."""
    parts = src.split("for (int pf_kt = ")[1:]
    return [p.split("\n  }\n", 1)[0] for p in parts]


@pytest.mark.parametrize("k", [64, 192, 200])
@pytest.mark.parametrize("unroll", [None, False])
@pytest.mark.parametrize(
    "stages, buffers",
    # S = 2 keeps its fragments single-buffered: at 3 and 4 both forms
    [(2, None), (3, None), (3, 1), (4, None), (4, 1)],
)
def test_the_drain_matches_float64(stages, k, buffers, unroll):
    """k = 192: 6 whole k-tiles (the steady state, then S - 1 drained); 200: a partial
    seventh (one guarded fill, then the drain); 64: 2 k-tiles, at S = 4 fewer than the
    stages (no steady state)."""
    inputs, out, arrays, want = _matmul("bfloat16", 67, 40, k, **CASES["batched_trans_b_epilogue"])
    fn = _compile(inputs, out, stages, unroll, buffers)
    tiles = -(-k // 32)
    drain = _loops(fn.kernels[0].source)[-1]
    assert drain.startswith(f"{max(0, tiles - stages + 1)}; (pf_kt < {tiles});"), drain[:40]
    assert "pf_cp_async16" not in drain and drain.count("__pipeline_commit();") == 1
    _check(fn, arrays, want, "bfloat16")


def test_the_loop_text_whole_and_partial():
    """3 stages: 6 whole k-tiles steady over 0..3 and drained over 4..5; a partial seventh
    k-tile filled by iteration 4 under its k guard, drained over 5..6."""
    inputs, out, _, _ = _matmul("bfloat16", 67, 40, 192, **CASES["trans_b"])
    steady, drain = _loops(_compile(inputs, out, 3).kernels[0].source)
    assert steady.startswith("0; (pf_kt < 4);") and "pf_cp_async16" in steady
    assert drain.startswith("4; (pf_kt < 6);") and "pf_cp_async16" not in drain
    inputs, out, _, _ = _matmul("bfloat16", 67, 40, 200, **CASES["trans_b"])
    steady, filling, drain = _loops(_compile(inputs, out, 3).kernels[0].source)
    assert filling.startswith("4; (pf_kt < 5);") and "if (((pf_kt + 2) < 7)) {" in filling
    assert "(200 - pf_k)" in filling  # the k guard of the partial k-tile (k < 200)
    assert drain.startswith("5; (pf_kt < 7);") and "pf_cp_async16" not in drain


def test_a_drain_without_its_commit_is_caught(monkeypatch):
    """Without the drain's empty commit groups its wait lets the last filled k-tile still
    fly when it is read: the emulator's cp.async groups return the stage's stale data."""
    good = lower_mma_pipeline.tail

    def planted(main, k_tiles, ahead, filling, draining):
        draining = [n for n in draining if not isinstance(n, KCommit)]
        return good(main, k_tiles, ahead, filling, draining)

    monkeypatch.setattr(lower_mma_pipeline, "tail", planted)
    inputs, out, arrays, want = _matmul("bfloat16", 67, 40, 192, **CASES["trans_b"])
    fn = _compile(inputs, out, 3, buffers=1)
    assert _loops(fn.kernels[0].source)[-1].count("__pipeline_commit();") == 0
    with pytest.raises(AssertionError):
        _check(fn, arrays, want, "bfloat16", (False,))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sass_of_a_three_k_tile_projection(arch):
    """MobileNetV2's stage-2 projection, a 1x1 conv of 96 channels to 24 at 56 x 56 (batch
    32): 3 k-tiles at 3 stages, its loop all tail. Other instructions per HMMA there 6.38
    before the drain (sm_80 and sm_90, NVRTC 13.0), 1.81 / 1.88 now: <= 2; no spill."""
    require_sass_tools()
    inputs, out, _, _ = _conv("bfloat16", (32, 96, 24, 56, 56), 1, 1, 0)
    fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False)
    (k,) = fn.kernels
    binary = compiles_without_spills(fn, arch)
    hmma, _, ldgsts, other = hmma_loop(binary, arch, k.function)
    assert ldgsts == 0 and other / hmma <= 2.0, (hmma, other)


def test_the_ir_estimate_keeps_an_unrolled_steady_states_fills_in_flight():
    """A classifier's GEMM (32 x 2048 @ 2048 x 1000 + bias, bf16, sm_90: 32 blocks, 64
    k-tiles at 4 stages): the cost model's loads in flight per thread are the steady state's
    4 k-tiles of fills (48 bytes each), unrolled or rolled. With the drain no fill was left in
    a rolled loop, and the estimate took the epilogue's 4-byte bias read for them: 355 us,
    DRAM-latency-bound (ResNet-50's classifier a third of its modelled total), ~11 us now."""
    from polyfuse import te
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import device_for_arch
    from polyfuse.poly.mapping import MappingConfig

    x = te.placeholder((32, 2048), "bfloat16", name="x")
    w = te.placeholder((2048, 1000), "bfloat16", name="w")
    b = te.placeholder((1000,), "bfloat16", name="b")
    r = te.reduce_axis(2048, name="r")
    y = te.compute((32, 1000), lambda i, j: te.sum(x[i, r] * w[r, j], axis=r), name="y")
    z = te.compute((32, 1000), lambda i, j: y[i, j] + b[j], name="z")
    us = []
    for unroll in (None, False):
        cfg = MappingConfig(mma_stage_unroll=unroll)
        fn = polyfuse.compile([x, w, b], [z], arch="sm_90", check_cuda=False, mapping=cfg)
        (k,) = fn.kernels
        assert any("steady k-tile loop " + ("unrolled" if unroll is None else "rolled") in n
                   for n in k.notes), k.notes  # fmt: skip
        d = describe_kernel(k)
        assert d.inflight_bytes == 4 * 48, d
        us.append(model_kernel(d, device_for_arch("sm_90")).us)
    assert max(us) < 20 and max(us) / min(us) < 1.1, us
