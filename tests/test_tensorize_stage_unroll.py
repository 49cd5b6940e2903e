"""A pipelined tensor-core kernel's steady k-tile loop unrolled by its S stages (issue 23:
the hot loop's non-HMMA instructions; :func:`polyfuse.poly.tensorize_fragments.stage_unroll`
decides, :mod:`polyfuse.cuda.codegen.lower_mma_pipeline` writes the loop).

Unrolled, each stage a k-tile reads or fills is ``(pf_kt + i) % S``, a constant once NVRTC
unrolls the loop, where the rolled loop keeps two wrapping counters and multiplies them by the
stage size at run time. Correct against float64 numpy in every race-check mode and bit for bit
what the rolled loop computes (the same mma order), at S = 2, 3, 4, with a steady state
shorter than S, not a multiple of S, and followed by the guarded tail, whose counters are set
where the unrolled loop hands over; single- and double-buffered fragments. A planted wrong
stage is caught. The register model's decision and reasons; SASS before and after.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_tensorize import CASES, _matmul
from test_tensorize_pipeline import MODES

import polyfuse
from polyfuse.cuda.codegen import lower_mma_pipeline
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.graph.dtypes import numpy_dtype, tolerance
from polyfuse.poly.mapping import MappingConfig

#: 64x64 blocks of four warps, 2x4 mma tiles each: what the model unrolls
SMALL = (64, 64, 2, 2)
UNROLLED = "tensor cores: steady k-tile loop unrolled by its"
ROLLED = "tensor cores: steady k-tile loop rolled"


def _compile(inputs, out, stages, unroll=None, buffers=None, tile=SMALL, arch="sm_80"):
    cfg = MappingConfig(gemm_stages=stages, mma_stage_unroll=unroll,
                        mma_fragment_buffers=buffers, mma_tile=tile)  # fmt: skip
    return polyfuse.compile(inputs, [out], arch=arch, check_cuda=False, mapping=cfg)


def _note(fn) -> str:
    (note,) = [n for n in fn.kernels[0].notes if "steady k-tile loop" in n]
    return note


def _check(fn, arrays, want, dtype, modes=MODES) -> np.ndarray:
    w = want.astype(numpy_dtype(dtype))
    for race in modes:
        got = fn(*arrays, device="emulate", race_check=race)
        err = np.abs(got.astype(np.float64) - w.astype(np.float64)).max()
        assert tolerance(dtype).allclose(got, w), (race, err)
    return got


@pytest.mark.parametrize("stages", [2, 3, 4])
@pytest.mark.parametrize(
    "k",
    # k-tiles of 32: 7 (6 whole: a steady state of 6 - (S - 1), shorter than S at S = 4, the
    # tail 1-3 guarded ones) and 17 (16 whole: 13-15 steady iterations, not all multiples of S)
    [200, 520],
)
def test_the_unrolled_steady_state_matches_float64_and_the_rolled_bits(stages, k):
    """bf16 ``x @ W^T + bias`` + GELU batched, at odd M and N (67 x 40): unrolled by the
    model (its note), every race mode against float64, the same bits as the rolled loop;
    single-buffered fragments too (S = 2 keeps them single; at 3 and 4 both forms)."""
    dtype = "bfloat16"
    inputs, out, arrays, want = _matmul(dtype, 67, 40, k, **CASES["batched_trans_b_epilogue"])
    for buffers in (None, 1) if stages > 2 else (None,):
        fn = _compile(inputs, out, stages, buffers=buffers)
        assert _note(fn).startswith(f"{UNROLLED} {stages} stages (the register model)")
        src = fn.kernels[0].source
        assert f"  #pragma unroll {stages}\n  for (int pf_kt = 0;" in src
        got = _check(fn, arrays, want, dtype)
        rolled = _compile(inputs, out, stages, False, buffers)
        assert _note(rolled) == f"{ROLLED} (forced: mma_stage_unroll=False)"
        assert f"#pragma unroll {stages}\n" not in rolled.kernels[0].source
        assert np.array_equal(rolled(*arrays, device="emulate"), got, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_transposed_and_plain_operands_unrolled(dtype):
    """A stored k-by-m (ldmatrix.trans) and plain ``a @ b`` at 3 stages over 7 k-tiles."""
    for case, size in (("trans_a", (72, 40, 200)), ("2d", (67, 40, 200))):
        inputs, out, arrays, want = _matmul(dtype, *size, **CASES[case])
        fn = _compile(inputs, out, 3)
        assert _note(fn).startswith(UNROLLED)
        _check(fn, arrays, want, dtype, (False, True))


def test_the_loop_text_unrolled_and_rolled():
    """Unrolled: the stages from ``pf_kt`` in the steady state, no counter advanced there; the
    counters set where the rolled tail takes over (k-tile 4 of 3 stages: read 1, filled 0).
    Rolled: the counters advance each iteration, as before."""
    inputs, out, _, _ = _matmul("bfloat16", 67, 40, 200, **CASES["batched_trans_b_epilogue"])
    src = _compile(inputs, out, 3).kernels[0].source
    steady = src[src.index("  #pragma unroll 3\n  for (int pf_kt = 0;") :]
    steady, tail = steady.split("  #pragma unroll 1\n  for (int pf_kt = 4;")
    assert "(s_a + (((pf_kt + 2) % 3) * " in steady  # the fill of k-tile pf_kt + 2
    assert "pf_sa = (s_a + (((pf_kt + 1) % 3) * " in steady  # the next k-tile's fragments
    assert "pf_rs = ((pf_rs == 2)" not in steady
    assert steady.rstrip().endswith("pf_rs = 1;\n  pf_ws = 0;".rstrip()), steady[-200:]
    assert "pf_rs = ((pf_rs == 2) ? 0 : (pf_rs + 1));" in tail
    rolled = _compile(inputs, out, 3, False).kernels[0].source
    # steady, the tail's partial k-tile and the drain
    assert rolled.count("pf_ws = ((pf_ws == 2) ? 0 : (pf_ws + 1));") == 3


@pytest.mark.parametrize("where", ["fill", "read"])
def test_a_planted_wrong_stage_is_caught(monkeypatch, where):
    """The unrolled loop filling the stage it reads next, or reading the one being filled,
    gives a wrong product."""
    inputs, out, arrays, want = _matmul("bfloat16", 67, 40, 520, trans_b=True)
    good = lower_mma_pipeline.stage

    def planted(counter, ahead, stages, unrolled):
        wrong = (counter == "pf_ws") == (where == "fill")
        return good(counter, ahead + 1 if wrong and unrolled else ahead, stages, unrolled)

    monkeypatch.setattr(lower_mma_pipeline, "stage", planted)
    from polyfuse.cuda.codegen import lower_mma_fragments

    monkeypatch.setattr(lower_mma_fragments, "stage", planted)
    fn = _compile(inputs, out, 3)
    got = fn(*arrays, device="emulate")
    assert not tolerance("bfloat16").allclose(got, want.astype(numpy_dtype("bfloat16")))


def test_the_register_model_decides_with_the_reason():
    """64x64 of four warps: unrolled (its modelled registers and the margin under 255);
    128x256 of eight 64x64 warps: rolled (over 255: unrolled, such tiles spilled), unless
    forced; one stage and scalar fills: nothing to unroll, no note."""
    inputs, out, _, _ = _matmul("bfloat16", 67, 40, 200, trans_b=True)
    assert _note(_compile(inputs, out, 3)) == (
        f"{UNROLLED} 3 stages (the register model): every stage read and filled at a "
        "constant shared offset, no stage counters; 122 + 40 (unrolled) = 162 modelled "
        "registers <= 255 per thread"
    )
    big = (128, 256, 2, 4)
    assert _note(_compile(inputs, out, 3, tile=big)) == (
        f"{ROLLED}, its stages counted at run time: unrolled by its 3 stages, 250 + 40 "
        "(unrolled) = 290 modelled registers > 255 per thread"
    )
    forced = _compile(inputs, out, 3, True, tile=big)
    assert _note(forced).startswith(f"{UNROLLED} 3 stages (forced)")
    assert _note(forced).endswith("= 290 modelled registers > 255 per thread")
    one = _compile(inputs, out, 1)
    assert not [n for n in one.kernels[0].notes if "steady k-tile loop" in n]
    scalar_in, scalar_out, _, _ = _matmul("float16", 67, 45, 53)  # unaligned rows
    scalar = _compile(scalar_in, scalar_out, None, tile=None)
    assert not [n for n in scalar.kernels[0].notes if "steady k-tile loop" in n]
    (rec,) = [r for r in _compile(inputs, out, 3).plan.records()
              if r.data.get("what") == "tensorize"]  # fmt: skip
    assert rec.data["stage_unroll"] is True


@pytest.mark.slow  # four full-size compiles and disassemblies, ~40 s
@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_sass_of_the_bert_ffn_down_rolled_and_unrolled(arch):
    """BERT-base's FFN down projection (1024 x 768 x 3072 bf16, the model's 64x64 tile of
    four warps at 4 stages), per k-tile: 16 HMMA, 8 LDSM, 4 LDGSTS either way, no spill;
    others 46 / 47 rolled (2.88 / 2.94 per HMMA, sm_80 / sm_90), 27-30 unrolled, one loop
    iteration running the 4 k-tiles (1.70 / 1.83 per HMMA: the issue's at most 2)."""
    from hmma_loops import hmma_loop

    from polyfuse.cuda.toolchain.compiler import compile_cuda
    from polyfuse.cuda.toolchain.sass import DisassemblerNotFound, find_disassembler, parse_listing
    from polyfuse.cuda.toolchain.sass import hmma_loop as sass_hmma_loop

    try:
        dis = find_disassembler()
    except DisassemblerNotFound:
        pytest.skip("NVIDIA's disassembler is not installed")
    inputs, out, _, _ = _matmul("bfloat16", 1024, 768, 3072)
    figures = {}
    for unroll in (False, None):
        fn = _compile(inputs, out, None, unroll, tile=None, arch=arch)
        (k,) = fn.kernels
        assert any("block tile 64x64x32 of 4 warps" in n for n in k.notes), k.notes
        binary = compile_cuda(fn.cuda_source, arch, compiler="nvrtc")
        res = binary.resources[k.function]
        assert res.spill_stores == res.spill_loads == 0, res
        (f,) = parse_listing(dis.disassemble(binary.image), arch).values()
        figures[unroll] = (hmma_loop(binary, arch), sass_hmma_loop(f))
    (rolled, rolled_loop), (unrolled, unrolled_loop) = figures[False], figures[None]
    assert rolled[:3] == unrolled[:3] == (16, 8, 4), figures
    assert (rolled_loop.ktiles, unrolled_loop.ktiles) == (1, 4), figures
    assert rolled_loop.per_hmma > 2.5 and unrolled_loop.per_hmma <= 1.9, figures
