"""The XOR-swizzled shared layout of the 16-bit mma operand tiles (issue 23 item 1;
:mod:`polyfuse.poly.swizzle`): the rule, bank-conflict-free cp.async writes and ldmatrix reads
on the emulator's bank counter, the shared bytes it saves and the third stage they buy, the
padding fallback, and a planted wrong swizzle caught by the conflict check.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import bank_sites
from test_tensorize import CASES, ODD, _matmul
from test_tensorize_pipeline import MODES, _compile, _run_all_modes, _stage_note

from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.graph.dtypes import tolerance
from polyfuse.poly import swizzle
from polyfuse.poly import tensorize as tz
from polyfuse.poly import tensorize_tiling as tzt
from polyfuse.poly.swizzle import ROW_PAD, SharedLayout, operand_layout, swizzle_rule

TILINGS = {"64x64": ((64, 64, 2, 2),), "128x128": ((128, 128, 2, 4),)}
#: M, N, K with rows of whole 16-byte chunks (cp.async fills), several k-tiles, odd M
SIZE = (72, 80, 112)


def _group(byte_address: int) -> int:
    """The group of 4 banks (16 bytes) a 16-byte access falls on."""
    return byte_address // 16 % 8


@pytest.mark.parametrize("row_bytes", [16, 32, 64, 128, 256, 512])
def test_the_rule_is_conflict_free_for_every_power_of_two_row(row_bytes):
    """8 consecutive rows at one logical chunk (an ldmatrix matrix, a fill's quarter-warp)
    fall on 8 distinct bank groups; a row's chunks stay a permutation of the row; a 128-byte
    span written row-major (8 chunks) is conflict-free too."""
    bits, shift = swizzle_rule(row_bytes)
    chunks = row_bytes // 16
    assert (1 << bits) == min(chunks, 8) and bits + shift == 3

    def at(r: int, c: int) -> int:  # byte address of logical chunk c of row r
        return r * row_bytes + 16 * (c ^ (r >> shift) & ((1 << bits) - 1))

    for r0 in range(0, 32, 8):
        for c in range(chunks):
            assert len({_group(at(r0 + i, c)) for i in range(8)}) == 8, (r0, c)
    for r in range(16):
        assert sorted(at(r, c) - r * row_bytes for c in range(chunks)) == [
            16 * c for c in range(chunks)
        ]
    flat = [(r, c) for r in range(32) for c in range(chunks)]
    for i in range(0, len(flat), 8):
        assert len({_group(at(r, c)) for r, c in flat[i : i + 8]}) == 8
    # without the XOR, rows under 128 bytes conflict (16-byte rows excepted)
    if 16 < row_bytes:
        plain = {(r * row_bytes) // 16 % 8 for r in range(8)}
        assert len(plain) < 8


@pytest.mark.parametrize("row_bytes", [0, 8, 24, 48, 96, 192])
def test_the_rule_refuses_rows_of_no_power_of_two_chunks(row_bytes):
    assert swizzle_rule(row_bytes) is None


def test_operand_layouts_and_the_padding_fallback():
    lay = operand_layout(128, 32, 2, 16)  # a k-innermost 128x32 tile, k-steps of 16
    assert (lay.swizzled, lay.row, lay.mask, lay.shift, lay.elements) == (True, 16, 1, 2, 4096)
    # element (r, c) of the module doc's formula; 16-byte chunks stay whole
    assert lay.offset(5, 9) == 0 * 2048 + 5 * 16 + ((1 ^ 1) * 8) + 1
    assert lay.offset(3, 25) == 1 * 2048 + 3 * 16 + ((1 ^ 0) * 8) + 1
    assert sorted(lay.offset(r, c) for r in range(128) for c in range(32)) == list(range(4096))
    trans = operand_layout(32, 128, 2, 16)  # k rows, 128 m columns, 16-row A tiles
    assert (trans.swizzled, trans.elements, trans.inner // trans.row) == (True, 4096, 8)
    # the fallback: inner extent not whole 32-byte rows; 8-column B tiles of an n-innermost tile
    odd = operand_layout(32, 24, 2, 8)
    assert (odd.swizzled, odd.pad, odd.elements) == (False, ROW_PAD, 32 * 32)
    assert odd.reason == "innermost extent 24 is not a multiple of 16 elements"
    split = operand_layout(32, 48, 2, 8)
    assert split.reason == "8-column mma tiles split a 32-byte swizzled row"
    assert split.describe() == (
        "rows padded by 8 elements (8-column mma tiles split a 32-byte swizzled row)"
    )


def _conflicts(monkeypatch, tiling: str, case: str, stages: int = 2):
    """The conflicting cp.async/ldmatrix sites of one swizzled float16 matmul (asserting the
    result and that both kinds of access were seen)."""
    monkeypatch.setattr(tzt, "TILINGS", TILINGS[tiling])
    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _matmul("float16", *SIZE, **CASES[case])
    fn = _compile(inputs, out, stages)
    assert "XOR-swizzled 32-byte rows" in fn.kernels[0].notes[2], fn.kernels[0].notes
    got, copies, loads = bank_sites(fn, arrays)
    assert tolerance("float16").allclose(got, want.astype(np.float16))
    assert {(s.access, s.width) for s in copies} == {("write", 16)}
    assert {(s.access, s.width) for s in loads} == {("read", 16)}
    assert len(loads) >= 2 and len(copies) >= 2
    return [str(s) for s in copies + loads if s.conflicts]


@pytest.mark.parametrize("tiling", sorted(TILINGS))
@pytest.mark.parametrize("case", ["2d", "trans_a", "trans_b", "batched"])
def test_swizzled_fills_and_ldmatrix_reads_are_bank_conflict_free(monkeypatch, tiling, case):
    """Every cp.async write and ldmatrix (.trans) read of the unpadded, swizzled tiles is
    served in the conflict-free number of wavefronts; the product is right."""
    assert _conflicts(monkeypatch, tiling, case) == [], (tiling, case)


def test_a_planted_identity_swizzle_is_caught_by_the_conflict_check(monkeypatch):
    """The rule planted as the identity (no XOR bits) on the same unpadded 32-byte rows: the
    result is still right (fills and loads agree on the layout), but 8 rows of one chunk
    fall on 4 bank groups, so the conflict test's assertion fails."""
    monkeypatch.setattr(swizzle, "swizzle_rule", lambda row_bytes: (0, 3))
    found = _conflicts(monkeypatch, "128x128", "trans_b")
    assert found, "the planted swizzle went unseen"
    with pytest.raises(AssertionError):
        assert found == []
    assert any("2.00× the conflict-free" in s for s in found), found


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("tiling", sorted(TILINGS))
def test_swizzled_pipelined_matmuls_match_float64_in_every_mode(monkeypatch, dtype, tiling):
    """Both tilings, batched with a transposed B and an epilogue, 3 stages, odd M."""
    monkeypatch.setattr(tzt, "TILINGS", TILINGS[tiling])
    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
    for case in ("batched_trans_b_epilogue", "trans_a"):
        inputs, out, arrays, want = _matmul(dtype, *SIZE, **CASES[case])
        fn = _compile(inputs, out, 3)
        assert _stage_note(fn).startswith("tensor cores: stages: 3 stage")
        _run_all_modes(fn, dtype, arrays, want, MODES if case == "trans_a" else (True,))


def test_scalar_fills_read_swizzled_tiles_and_a_split_row_falls_back_to_padding(monkeypatch):
    """Unaligned arrays (scalar 2-byte fills) write the same swizzled layout; a 48-column
    block tile has 3 eight-column B tiles per warp (ldmatrix.x2): B stored n-innermost keeps
    padded rows, with the reason noted, and A stays swizzled; all ldmatrix reads are
    conflict-free and the result right in both thread orders."""
    monkeypatch.setattr(tzt, "TILINGS", ((64, 48, 2, 2),))
    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
    inputs, out, arrays, want = _matmul("float16", *ODD)
    fn = _compile(inputs, out, None)
    note = fn.kernels[0].notes[2]
    assert note == (
        "tensor cores: shared layout of a (A): XOR-swizzled 32-byte rows (16-byte chunk ^= "
        "(row >> 2) & 1), 2 block(s) of 64 rows; of b (B): rows padded by 8 elements (8-column "
        "mma tiles split a 32-byte swizzled row) (bank-conflict-free cp.async writes and "
        "ldmatrix reads)"
    )
    src = fn.kernels[0].source
    assert "pf_cp_async16" not in src and "pf_ldmatrix_x2_trans" in src
    _run_all_modes(fn, "float16", arrays, want, (False, True))
    got, copies, loads = bank_sites(fn, arrays)
    assert copies == [] and len(loads) >= 2
    assert [str(s) for s in loads if s.conflicts] == []
    assert tolerance("float16").allclose(got, want.astype(np.float16))


def _padded(outer, inner, itemsize, col_step):
    return SharedLayout(outer, inner, inner, ROW_PAD, reason="planted")


def test_the_swizzled_128_tile_saves_shared_memory_and_buys_a_third_stage(monkeypatch):
    """128x128x32 tiles: 2 x (128 x 32) x 2 B = 16384 B per stage swizzled against
    2 x (128 x 40) x 2 B = 20480 B padded. Under a 48 KiB budget three stages now fit
    (3 x 16384 = 49152 <= 49152; padded 61440 did not), so a forced S = 3 is taken, and where
    ALCOP's model finds two stages load-bound (1536 x 1152: 108 blocks, one per SM on sm_80)
    it chooses three, which it had to refuse before. (Candidates pinned to 128x128 and 64x64:
    the tiling model takes 256x64 here, test_tensorize_tiling.)"""
    monkeypatch.setattr(tzt, "TILINGS", TILINGS["128x128"] + TILINGS["64x64"])
    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
    # the static 48 KiB budget pinned (the stages may now take the dynamic opt-in maximum,
    # tests/test_tensorize_dynamic_smem.py)
    monkeypatch.setattr(tz, "tensor_core_tile_budget", lambda device: 49152)
    inputs, out, _, _ = _matmul("bfloat16", 1536, 1152, 4096, trans_b=True)
    budget = 49152
    fn = _compile(inputs, out, None)
    (k,) = fn.kernels
    assert "block tile 128x128x32 of 8 warps" in k.notes[0] and "(108 blocks" in k.notes[0]
    assert _stage_note(fn).startswith("tensor cores: stages: 3 stages by ALCOP's latency model")
    assert any(n.startswith("tensor cores: stages: S=3: 49152 B shared") for n in k.notes)
    assert "tensor cores: stages: S=4 refused: 4 x 16384 B = 65536 B > 49152 B budget" in k.notes
    assert "__shared__ __align__(16) __nv_bfloat16 s_a[12288];" in k.source  # 3 x 4096
    assert sum(a.bytes for a in k.facts.shared_arrays) == 3 * 16384 <= budget
    assert 3 * 2 * (128 * (32 + ROW_PAD)) * 2 > budget
    (rec,) = [r for r in fn.plan.records() if r.data.get("what") == "tensorize"]
    assert rec.data["stages"] == 3
    forced = _compile(inputs, out, 3)
    assert _stage_note(forced) == "tensor cores: stages: 3 stages (forced)"
    # the padded layout planted back: 20480 B per stage, S = 3 refused, two stages
    monkeypatch.setattr(tz, "operand_layout", _padded)
    fn = _compile(inputs, out, None)
    (k,) = fn.kernels
    assert _stage_note(fn).startswith("tensor cores: stages: 2 stages by ALCOP's latency model")
    assert "tensor cores: stages: S=3 refused: 3 x 20480 B = 61440 B > 49152 B budget" in k.notes
    assert sum(a.bytes for a in k.facts.shared_arrays) == 2 * 20480
    assert "__shared__ __align__(16) __nv_bfloat16 s_a[10240];" in k.source  # 2 x 5120


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_the_three_stage_swizzled_128_tile_without_spills(arch, monkeypatch):
    """The third stage the swizzle buys, on the 8-warp tile: 48 KiB of static shared memory
    accepted by ptxas for both archs, no spills (both operand layouts)."""
    monkeypatch.setattr(tzt, "TILINGS", TILINGS["128x128"])
    monkeypatch.setattr(tzt, "SMALL_TILINGS", ())
    for case in ("batched_trans_b_epilogue", "trans_a"):
        inputs, out, _, _ = _matmul("bfloat16", *SIZE, **CASES[case])
        fn = _compile(inputs, out, 3, arch)
        assert _stage_note(fn) == "tensor cores: stages: 3 stages (forced)"
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        for r in binary.resources.values():
            assert r.spill_stores == r.spill_loads == 0, (case, r)
            assert r.shared_bytes == 3 * 16384, r
