"""Tensorized GEMM stages past the static 48 KB: the dynamic shared-memory pool (issue 23 item
2, ALCOP's S stages of large tiles).

The stage model's budget for tensor-core tiles is the device's opt-in dynamic maximum
(:func:`polyfuse.poly.policy.tensor_core_tile_budget`: 163 KB on an A100, 227 KB on an H100);
a kernel whose stages exceed 48 KB declares them in the ``extern __shared__`` pool, its launch
passes the bytes and the runtime raises the function's limit. Measured on an H100 (2026-11-26,
``benchmarks/gpu.py``): the 4096³ bf16 GEMM's model-chosen two stages were the most the
static 48 KB allowed for its 128x256x32 tile, so forced three and four stages were refused.
``MappingConfig.mma_block_k`` forces the k-tile (64: two k-steps more per barrier).
"""

from __future__ import annotations

import pytest
from test_tensorize import _matmul
from test_tensorize_pipeline import MODES, _run_all_modes, _stage_note

import polyfuse
import polyfuse.cuda.codegen.lower_mma as lower_mma
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.poly.mapping import MappingConfig

BIG = (4096, 4096, 4096)


def _compile(size, arch="sm_90", check=False, **mapping):
    inputs, out, _, _ = _matmul("bfloat16", *size)
    return polyfuse.compile(
        inputs, [out], arch=arch, check_cuda=check, mapping=MappingConfig(**mapping)
    )


@pytest.mark.slow  # ~20 s
def test_stages_past_48_kb_live_in_the_dynamic_pool():
    """128x256x32 bf16 tiles take 24576 B per stage: S = 3 and 4 (73728, 98304 B) were refused
    over the static 48 KB before; now they fit the H100's 232448 B and the A100's 166912 B."""
    for stages, nbytes in ((3, 73728), (4, 98304)):
        fn = _compile(BIG, gemm_stages=stages)
        (k,) = fn.kernels
        assert "block tile 128x256x32" in k.notes[0]
        assert _stage_note(fn) == f"tensor cores: stages: {stages} stages (forced)"
        assert k.dynamic_shared_bytes == nbytes and k.facts.static_shared_bytes == 0
        assert "extern __shared__ __align__(16) __nv_bfloat16 pf_smem[];" in k.source
        assert "__nv_bfloat16* s_b = pf_smem + " in k.source
    (k,) = _compile(BIG, gemm_stages=2).kernels  # two stages: 49152 B, still static
    assert k.dynamic_shared_bytes == 0 and "s_a[8192];" in k.source
    assert any(n.startswith("tensor cores: stages: S=4: 98304 B shared") for n in k.notes)
    (k,) = _compile(BIG).kernels  # the model's: on its tie the most stages, measured faster
    assert k.dynamic_shared_bytes == 98304, k.notes


@pytest.mark.slow  # two 4096^3 compiles: ~7 s
def test_the_budget_is_the_devices_opt_in_maximum():
    """64-deep k-tiles: 49152 B per stage of 128x256; four stages (196608 B) fit the H100's
    opt-in 232448 B but not the A100's 166912 B, where the forced count falls to three."""
    fn = _compile(BIG, gemm_stages=4, mma_block_k=64)
    assert "block tile 128x256x64" in fn.kernels[0].notes[0]
    assert fn.kernels[0].dynamic_shared_bytes == 196608
    fn80 = _compile(BIG, "sm_80", gemm_stages=4, mma_block_k=64)
    assert _stage_note(fn80) == (
        "tensor cores: stages: 4 stages forced, refused "
        "(4 x 49152 B = 196608 B > 166912 B budget): 3"
    )
    assert fn80.kernels[0].dynamic_shared_bytes == 3 * 49152


def test_a_forced_k_tile_must_be_whole_k_steps():
    with pytest.raises(ValueError, match="mma_block_k=24: a tensorized k-tile is 1 to 4"):
        _compile((64, 64, 64), mma_block_k=24)


@pytest.mark.parametrize("block_k", [32, 64])
@pytest.mark.parametrize("stages", [2, 3])
def test_dynamic_pool_tiles_match_float64(monkeypatch, block_k, stages):
    """The dynamic-pool code path on the emulator at odd sizes in every race mode: the static
    limit is lowered so that these small tiles take it (the emulator gives each launch the
    dynamic bytes it passes)."""
    monkeypatch.setattr(lower_mma, "STATIC_SMEM_LIMIT", 1024)
    for size, kw in (((67, 40, 200), {"epilogue": True}), ((72, 40, 200), {"trans_a": True})):
        inputs, out, arrays, want = _matmul("bfloat16", *size, **kw)
        cfg = MappingConfig(gemm_stages=stages, mma_block_k=block_k)
        fn = polyfuse.compile(inputs, [out], arch="sm_80", check_cuda=False, mapping=cfg)
        (k,) = fn.kernels
        assert "extern __shared__" in k.source and k.dynamic_shared_bytes > 1024
        assert f"x{block_k} of" in k.notes[0]
        _run_all_modes(fn, "bfloat16", arrays, want, MODES)


@pytest.mark.slow  # three 4096^3 kernels through NVRTC: ~11 s
@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
def test_nvrtc_compiles_the_dynamic_pool_kernels_without_spills():
    for arch, stages, bk in (("sm_90", 4, 64), ("sm_90", 3, 32), ("sm_80", 3, 64)):
        fn = _compile(BIG, arch, gemm_stages=stages, mma_block_k=bk)
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        for r in binary.resources.values():
            assert r.spill_stores == r.spill_loads == 0, (arch, stages, bk, r)
