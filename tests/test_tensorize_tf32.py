"""float32 GEMMs on tf32 tensor cores, opt-in (issue 23 item 1: ``mma.sync.m16n8k8`` tf32 when
the user allows it, off by default like torch; ``MappingConfig(allow_tf32=True)``).

tf32 keeps 10 of float32's 23 mantissa bits (the tensor core truncates each operand: relative
error under 2^-10), products accumulate in float32. The results are checked against float64
numpy under that bound, elementwise: ``|got - want| <= 2.1 * 2^-10 * (|A| @ |B|)`` (plus the
epilogue's float32 roundoff), in every emulator mode.
"""

from __future__ import annotations

import numpy as np
import pytest
from kernel_checks import site_text
from test_tensorize import CASES, ODD, _matmul
from test_tensorize_pipeline import MODES, ODD_ALIGNED, _stage_note

import polyfuse
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda
from polyfuse.poly.mapping import MappingConfig

TF32 = MappingConfig(allow_tf32=True)


def _compile(inputs, out, stages=None, arch="sm_80", allow=True):
    cfg = MappingConfig(allow_tf32=allow, gemm_stages=stages)
    return polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)


def _bound(arrays, trans_b: bool) -> np.ndarray:
    """tf32's elementwise error bound of ``a @ b`` (see the module doc)."""
    a, b = (np.abs(x.astype(np.float64)) for x in arrays[:2])
    b = np.swapaxes(b, -1, -2) if trans_b else b
    return 2.1 * 2.0**-10 * (a @ b) + 1e-6


def _check(fn, arrays, want, trans_b, modes=MODES, epilogue=False, arrays_in=None):
    """Run ``fn`` on ``arrays_in`` (default ``arrays``, whose first two give the bound)."""
    bound = _bound(arrays, trans_b)
    if epilogue:  # bias + GELU: |gelu'| <= 1.13, then float32 roundoff
        bound = 1.13 * bound + 1e-5 * np.abs(want)
    for race in modes:
        got = fn(*(arrays_in or arrays), device="emulate", race_check=race)
        assert got.dtype == np.float32
        err = np.abs(got.astype(np.float64) - want)
        assert (err <= bound).all(), (race, float((err / bound).max()))
    return err


def _tf32(fn) -> None:
    (k,) = fn.kernels
    assert k.notes[0].startswith(
        "tensor cores: mma.sync.m16n8k8 tf32 (float32 operands, allow_tf32) -> float32"
    ), k.notes
    assert "pf_mma_m16n8k8_f32_tf32(" in k.source and "pf_ldmatrix_x4(" in k.source
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in fn.cuda_source
    (rec,) = [r for r in fn.plan.records() if r.data.get("what") == "tensorize"]
    assert rec.data["intrinsic"] == "m16n8k8.tf32" and rec.data["block"][2] == 16


def test_float32_gemms_stay_on_cuda_cores_unless_allowed():
    assert MappingConfig().allow_tf32 is False
    inputs, out, arrays, want = _matmul("float32", *ODD_ALIGNED, trans_b=True)
    fn = _compile(inputs, out, allow=False)
    assert "mma.sync" not in fn.cuda_source
    assert np.allclose(fn(*arrays, device="emulate"), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("stages", [None, 1, 3])
@pytest.mark.parametrize("case", ["trans_b", "batched_trans_b_epilogue"])
def test_tf32_x_at_w_transposed_runs_on_tensor_cores_within_the_tf32_bound(case, stages):
    """x @ W^T (A m-by-k, B n-by-k: the Linear layout) at odd M, rows of whole 16-byte
    chunks: cp.async fills of 4 floats, S stages, swizzled 32-byte rows of 8 floats."""
    inputs, out, arrays, want = _matmul("float32", *ODD_ALIGNED, **CASES[case])
    fn = _compile(inputs, out, stages)
    _tf32(fn)
    k = fn.kernels[0]
    assert "pf_cp_async16(" in k.source and "4 * pf_n" in k.source
    assert "XOR-swizzled 32-byte rows (16-byte chunk ^= (row >> 2) & 1), 2 block(s)" in k.notes[2]
    if stages:
        assert _stage_note(fn).startswith(f"tensor cores: stages: {stages} stage")
    err = _check(fn, arrays, want, True, MODES if stages == 3 else (True,), "epilogue" in case)
    # the operands really lost their low mantissa bits (a float32 product is ~1e-6 off)
    assert err.max() > 1e-3


def test_tf32_with_unaligned_rows_takes_scalar_fills():
    inputs, out, arrays, want = _matmul("float32", *ODD, trans_b=True)
    fn = _compile(inputs, out)
    _tf32(fn)
    assert "pf_cp_async16" not in fn.kernels[0].source
    assert _stage_note(fn).startswith(
        "tensor cores: stages: single-stage, scalar 4-byte fills: a's innermost extent 53"
    )
    _check(fn, arrays, want, True, (False, True))


@pytest.mark.parametrize("case", ["2d", "trans_a", "batched"])
def test_tf32_operands_stored_k_outside_load_fragments_by_plain_loads(case):
    """B stored k-by-n (``a @ b``) or A k-by-m: ldmatrix has no .trans of 32-bit elements, so
    each lane reads its tf32 fragment elements by 32-bit shared loads through the same swizzled
    layout; right within the tf32 bound in every mode."""
    inputs, out, arrays, want = _matmul("float32", *ODD_ALIGNED, **CASES[case])
    fn = _compile(inputs, out)
    (k,) = fn.kernels
    assert k.notes[0].startswith("tensor cores: mma.sync.m16n8k8 tf32"), k.notes
    loads = "32-bit shared loads (no ldmatrix.trans of 32-bit elements)"
    assert f"b (B) n innermost, {loads}" in k.notes[1]
    a_loads = f"a (A) in shared as float32, m innermost, {loads}"
    assert (a_loads in k.notes[1]) == (case == "trans_a")
    assert "__float_as_uint(pf_sb[" in k.source and "pf_ldmatrix_x4_trans" not in k.source
    a, b = arrays[:2]
    a_t = np.swapaxes(a, -1, -2) if case == "trans_a" else a
    _check(fn, [a_t, b], want, False, MODES if case == "2d" else (True,), arrays_in=arrays)


def test_tf32_off_the_tensor_cores_says_why():
    """No mma.sync before sm_80: the float32 tiles compute it, the plan says why."""
    inputs, out, arrays, want = _matmul("float32", *ODD_ALIGNED, trans_b=True)
    fn = _compile(inputs, out, arch="sm_70")
    (k,) = fn.kernels
    assert "mma.sync" not in fn.cuda_source
    assert "no tf32 tensor cores: no m16n8k8 mma.sync on sm_70 (sm_80 and later)" in k.notes
    assert np.allclose(fn(*arrays, device="emulate"), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", ["trans_b", "2d", "trans_a"])
def test_tf32_fills_and_fragment_loads_are_bank_conflict_free(case):
    """cp.async writes, ldmatrix reads (k innermost) and the 32-bit fragment loads (k outside:
    4 k rows x 8 columns of a warp on 32 distinct banks) of the swizzled float32 tiles."""
    inputs, out, arrays, want = _matmul("float32", 96, 80, 112, **CASES[case])
    fn = _compile(inputs, out, 2)
    got = fn(*arrays, race_check="banks")
    a = np.swapaxes(arrays[0], -1, -2) if case == "trans_a" else arrays[0]
    assert (np.abs(got - want) <= _bound([a, arrays[1]], case == "trans_b")).all()
    lines = fn.cuda_source.splitlines()
    sites = [s for t in fn.last_traffic for s in t.shared_banks]
    copies = [s for s in sites if "pf_cp_async16(" in site_text(lines, s)]
    loads = [s for s in sites if "pf_ldmatrix" in site_text(lines, s)]
    plain = [s for s in sites if "__float_as_uint(pf_s" in site_text(lines, s)]
    assert len(copies) >= 2 and len(loads) + len(plain) >= 2
    assert {(s.access, s.width) for s in plain} <= {("read", 4)}
    assert (len(plain) > 0) == (case != "trans_b")
    assert [str(s) for s in copies + loads + plain if s.conflicts] == []


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_tf32_kernels_without_spills(arch):
    for size, case in (
        (ODD_ALIGNED, "batched_trans_b_epilogue"),
        ((2048, 2048, 1024), "trans_b"),
        (ODD_ALIGNED, "2d"),
        (ODD_ALIGNED, "trans_a"),
    ):
        inputs, out, _, _ = _matmul("float32", *size, **CASES[case])
        fn = _compile(inputs, out, None, arch)
        assert "mma.sync.aligned.m16n8k8" in fn.cuda_source
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        for r in binary.resources.values():
            assert r.spill_stores == r.spill_loads == 0, (case, r)
