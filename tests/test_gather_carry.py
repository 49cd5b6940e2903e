"""An implicit GEMM's gathered chunk fill carries its reduction digits across k-tiles
(:func:`polyfuse.cuda.codegen.lower_mma_gather_chunks.carried`).

A channels-last conv's input tile is filled by 16-byte chunks, each at the chunk's ``k``
split back into ``(kh, kw, c)`` and tested against a per-chunk padding mask. Where the
channels are a multiple of the k-tile, every k-tile lies at one filter position: its channel
offset is ``k0`` modulo the channels (the same for every thread: no per-chunk division) and
its filter position is carried from the previous k-tile's like an odometer (``kw + 1``
after the channels' last k-tile, its wrap into ``kh``), instead of three divisions per
k-tile. Checked against float64 numpy at odd spatial sizes in every race-check mode, at 1-4
stages, unrolled and rolled steady states, single- and double-buffered fragments, k-tiles of
32 and 64 and several k-tiles per filter position; a planted early wrap is caught; the SASS
of ResNet-50's stage-1 3x3 conv.
"""

from __future__ import annotations

import numpy as np
import pytest
from hmma_loops import hmma_loop
from kernel_checks import compiles_without_spills, require_sass_tools
from test_tensorize_conv import _conv

import polyfuse
from polyfuse.cuda.codegen import lower_mma_gather_chunks
from polyfuse.cuda.codegen.kernel_arith import cmp, mod
from polyfuse.cuda.codegen.kernel_ast import KLet
from polyfuse.errors import EmulatorError
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig

MODES = (False, True, "shadow")
CARRY = "pf_kd0_s_x_cl += (pf_kc1 ? 1 : 0);"
SPLIT = "const int pf_d0 = (pf_k / "


def _compile(size, kernel=3, stride=1, pad=1, **mapping):
    inputs, out, arrays, want = _conv("bfloat16", size, kernel, stride, pad)
    cfg = MappingConfig(**mapping)
    fn = polyfuse.compile(inputs, [out], check_cuda=False, mapping=cfg)
    return fn, fn.kernels[-1], arrays, want


def _check(fn, arrays, want, modes=MODES) -> None:
    w = want.astype(numpy_dtype("bfloat16"))
    for race in modes:
        got = fn(*arrays, device="emulate", race_check=race)
        err = np.abs(got.astype(np.float64) - want).max()
        assert tolerance("bfloat16").allclose(got, w), (race, err)


@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("unroll", [None, False])
def test_carried_digits_match_float64_at_every_stage_count(stages, unroll):
    """32 channels, 3x3 pad 1, k-tiles of 32: nine k-tiles, one per filter position, the
    digits carried (``c`` wraps every k-tile); the steady state unrolled where the model
    does and rolled, followed by the guarded tail (9 - (S - 1) steady k-tiles)."""
    fn, k, arrays, want = _compile((2, 32, 21, 11, 9), gemm_stages=stages,
                                   mma_stage_unroll=unroll if stages > 1 else None)  # fmt: skip
    assert CARRY in k.source and SPLIT not in k.source
    assert "pf_pm_s_x_cl[pf_u] & pf_bit" in k.source
    _check(fn, arrays, want)


@pytest.mark.parametrize(
    "size, kernel, stride, pad, mapping",
    [
        # 96 channels: three k-tiles per filter position (c wraps every third)
        ((2, 96, 19, 7, 9), 3, 1, 1, {"gemm_stages": 3}),
        # k-tiles of 64 over 64 channels, double- and single-buffered fragments
        ((1, 64, 21, 9, 11), 3, 1, 1, {"mma_block_k": 64, "mma_fragment_buffers": 2}),
        ((1, 64, 21, 9, 11), 3, 1, 1, {"mma_block_k": 64, "mma_fragment_buffers": 1}),
        # strided, and a 5x5 filter (25 mask bits)
        ((2, 32, 17, 13, 11), 3, 2, 1, {}),
        ((1, 32, 9, 13, 11), 5, 1, 2, {"gemm_stages": 4}),
    ],
)
def test_carried_digits_over_shapes_and_k_tiles(size, kernel, stride, pad, mapping):
    fn, k, arrays, want = _compile(size, kernel, stride, pad, **mapping)
    assert CARRY in k.source and SPLIT not in k.source
    _check(fn, arrays, want)


def test_channels_not_a_multiple_of_the_k_tile_split_each_k_tile():
    """16 channels under k-tiles of 32: a k-tile spans two filter positions, so its chunks'
    digits are split from their ``k`` as before (nothing carried); still correct."""
    fn, k, arrays, want = _compile((2, 16, 21, 11, 9))
    assert "pf_kd0_" not in k.source and SPLIT in k.source
    _check(fn, arrays, want, (False, True))


def test_a_planted_early_wrap_is_caught(monkeypatch):
    """The filter position advancing one k-tile early (at the k-tile before the last of its
    channels) reads the wrong input window: a wrong conv, or a read past the input that the
    emulator's bounds check stops."""
    good = lower_mma_gather_chunks._advance

    def planted(f, k0):
        out = good(f, k0)
        if out:  # the innermost's wrap test, one k-tile earlier
            ext = f.red[-1][1] - f.red[-1][0] + 1
            out[0] = KLet(out[0].name, cmp("==", mod(k0, ext), ext - 2 * f.block_k), "bool")
        return out

    monkeypatch.setattr(lower_mma_gather_chunks, "_advance", planted)
    fn, k, arrays, want = _compile((2, 96, 21, 11, 9), gemm_stages=3)
    assert CARRY in k.source and "% 96) == 32)" in k.source
    try:
        got = fn(*arrays, device="emulate")
    except EmulatorError as e:
        assert "out-of-bounds read of buffer 'x_cl'" in str(e)
    else:
        assert not tolerance("bfloat16").allclose(got, want.astype(numpy_dtype("bfloat16")))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sass_of_resnet50_stage1_conv3x3(arch):
    """ResNet-50's stage-1 3x3 conv (batch 32, 64 channels, 56 x 56, channels-last, 64x64
    block tiles of 4 warps, 4 stages unrolled): other instructions per HMMA in the k-tile
    loop 2.94 / 3.05 (sm_80 / sm_90) with the digits split per k-tile, 2.25 / 2.38 carried
    (NVRTC 13.0): <= 2.45; no spill."""
    require_sass_tools()
    inputs, out, _, _ = _conv("bfloat16", (32, 64, 64, 56, 56), 3, 1, 1)
    cfg = MappingConfig(mma_tile=(64, 64, 2, 2), gemm_stages=4)
    fn = polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)
    k = fn.kernels[-1]
    assert CARRY in k.source
    binary = compiles_without_spills(fn, arch)
    hmma, _, _, other = hmma_loop(binary, arch, k.function)
    assert other / hmma <= 2.45, (hmma, other)


@pytest.mark.slow
def test_random_channels_last_convs_match_float64():
    """24 random bf16 convs (channels 16-128, filters 1-5, strides 1-2, paddings, forced
    stages, unroll, k-tiles, fragment buffers and block tiles), carried or not, each against
    float64 numpy in a random race-check mode."""
    import random

    rng = random.Random(2611)
    carried = 0
    for _ in range(24):
        c = rng.choice([32, 64, 96, 128, 16, 40])
        k = rng.choice([1, 2, 3, 3, 5])
        stride, pad = rng.choice([1, 1, 2]), rng.randint(0, k // 2)
        size = (rng.randint(1, 2), c, rng.randint(5, 40), rng.randint(k, 15), rng.randint(k, 15))
        m: dict = {}
        if rng.random() < 0.7:
            m["gemm_stages"] = rng.randint(1, 4)
        if m.get("gemm_stages", 2) > 1 and rng.random() < 0.5:
            m["mma_stage_unroll"] = rng.choice([True, False])
        if rng.random() < 0.3:
            m["mma_block_k"] = 64
        if m.get("gemm_stages", 3) > 2 and rng.random() < 0.3:
            m["mma_fragment_buffers"] = rng.choice([1, 2])
        if rng.random() < 0.4:
            m["mma_tile"] = rng.choice([(64, 64, 2, 2), (128, 64, 2, 2), (32, 32, 2, 2)])
        fn, kern, arrays, want = _compile(size, k, stride, pad, **m)
        carried += CARRY.split("_s_")[0] in kern.source
        race = rng.choice([False, True, "shadow"])
        got = fn(*arrays, device="emulate", race_check=race)
        w = want.astype(numpy_dtype("bfloat16"))
        assert tolerance("bfloat16").allclose(got, w), (size, k, stride, pad, m, race)
    assert carried >= 6, carried


@pytest.mark.parametrize("stages", [2, 4])
def test_merged_heads_rows_past_the_end_read_a_clamped_row(stages):
    """An attention output projection over the heads merged back (``pv[b, k // 64, s, k %
    64]``, bf16, 37 tokens: the last 64-row tile partial): the head digit is carried, and a
    chunk past the last row takes that row's offset (its mask clear, it copies nothing), so
    the steady state's address has no select (ViT-B/16's projections 2.08 -> 1.95 others per
    HMMA on sm_90, NVRTC 13.0). Every race mode against float64; the emulator's bounds check
    sees every address inside."""
    from polyfuse import ops, te

    b, heads, s, d, n = 2, 4, 37, 64, 96
    pv = te.placeholder((b, heads, s, d), "bfloat16", name="pv")
    w = te.placeholder((heads * d, n), "bfloat16", name="w")
    ctx = ops.reshape(ops.transpose(pv, (0, 2, 1, 3)), (b, s, heads * d))
    out = ops.matmul(ctx, w, name="out")
    cfg = MappingConfig(gemm_stages=stages, mma_tile=(64, 64, 2, 2))
    fn = polyfuse.compile([pv, w], [out], check_cuda=False, mapping=cfg)
    (k,) = [k for k in fn.kernels if "pf_mma_" in k.source]
    src = k.source
    assert "pf_kd0_s_pv" in src and "pf_pm_s_pv[pf_u] & pf_bit" in src
    assert "const int pf_r = (((pf_m0 + pf_t) > 36) ? 36 : (pf_m0 + pf_t));" in src
    steady = src[src.index("for (int pf_kt = 0;") :].split("for (int pf_kt = ")[1]
    assert "const unsigned pf_off = (pf_ro_s_pv[pf_u] + pf_kp);" in steady
    rng = np.random.default_rng(7)
    x = rng.standard_normal((b, heads, s, d)).astype(numpy_dtype("bfloat16"))
    y = rng.standard_normal((heads * d, n)).astype(numpy_dtype("bfloat16"))
    want = np.transpose(x.astype(np.float64), (0, 2, 1, 3)).reshape(b, s, -1) @ y.astype(
        np.float64
    )
    _check(fn, [x, y], want)
