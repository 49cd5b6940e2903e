"""Split-K: float32 contractions whose tiles leave SMs idle sum their reduction in parts.

BERT-base's FFN down projection in float32 (M 1024, N 768, K 3072) ran 384 blocks of 64
threads, 189 us modelled on sm_90; in 4 parts, 384 blocks of 128 threads and a final sum that
takes the epilogue, 149 us. A small-batch linear layer (M 16, N 1000, K 2048) ran 63 blocks.
"""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import te
from polyfuse.base.errors import ExpressionError
from polyfuse.cuda.codegen.kernel_cost import describe_kernel
from polyfuse.poly.costs import model_kernel
from polyfuse.poly.device import device_for_arch
from polyfuse.poly.mapping import MappingConfig
from polyfuse.poly.split_k import SplitKModel


def _linear(m: int, n: int, k: int, dtype: str = "float32"):
    """``relu(a @ b + bias)``: inputs and output."""
    a = te.placeholder((m, k), dtype, name="a")
    b = te.placeholder((k, n), dtype, name="b")
    bias = te.placeholder((n,), dtype, name="bias")
    r = te.reduce_axis(k, "r")
    c = te.compute((m, n), lambda i, j: te.sum(a[i, r] * b[r, j], axis=r), name="c")
    y = te.compute((m, n), lambda i, j: te.maximum(c[i, j] + bias[j], 0.0), name="y")
    return [a, b, bias], y


def _modelled(fn) -> float:
    dev = device_for_arch("sm_90")
    return sum(model_kernel(describe_kernel(k), dev).us for k in fn.kernels)


def _split_notes(fn) -> list[str]:
    return [line for line in str(fn.plan).splitlines() if "split-K" in line or "summed in" in line]


def test_ffn_down_is_split_and_modelled_faster():
    """1024 x 768 x 3072: split in parts, two kernels (the partial GEMM, the final sum with
    the bias and ReLU), modelled faster than one stage (the record names both figures)."""
    ins, out = _linear(1024, 768, 3072)
    fn = polyfuse.compile(ins, [out], check_cuda=False, arch="sm_90")
    one = polyfuse.compile(
        ins, [out], check_cuda=False, arch="sm_90", mapping=MappingConfig(split_k=1)
    )
    assert len(fn.kernels) == 2 and len(one.kernels) == 1
    notes = _split_notes(fn)
    assert any("split-K" in n and "in one stage" in n for n in notes), notes
    part = fn.kernels[0]
    assert part.grid[0] > one.kernels[0].grid[0] or part.block[0] > one.kernels[0].block[0]
    assert _modelled(fn) < 0.9 * _modelled(one), (_modelled(fn), _modelled(one))


def test_a_small_batch_linear_layer_fills_the_sms():
    """16 x 1000 x 2048: the partial GEMM runs at least 4x the blocks of one stage."""
    ins, out = _linear(16, 1000, 2048)
    fn = polyfuse.compile(ins, [out], check_cuda=False, arch="sm_90")
    one = polyfuse.compile(
        ins, [out], check_cuda=False, arch="sm_90", mapping=MappingConfig(split_k=1)
    )
    assert fn.kernels[0].grid[0] >= 4 * one.kernels[0].grid[0]
    assert _modelled(fn) < _modelled(one)


@pytest.mark.parametrize("parts", [None, 2, 3, 5])
def test_split_results_match_float64(parts):
    """Odd M and N (37 x 45), K 1056 (the model's choice: 3 parts of 11 k-tiles) and forced
    part counts (5 parts of 211: a partial last k-tile), every race mode."""
    k = 1055 if parts == 5 else 1056
    ins, out = _linear(37, 45, k)
    fn = polyfuse.compile(ins, [out], mapping=MappingConfig(split_k=parts))
    assert len(fn.kernels) == 2, [kk.name for kk in fn.kernels]
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    want = np.maximum(xs[0].astype(np.float64) @ xs[1] + xs[2], 0)
    for mode in (False, True):
        got = fn(*xs, device="emulate", race_check=mode)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=2e-4)


def test_what_is_not_split():
    """A GEMM whose tiles fill the SMs (its reason recorded), a short reduction, a bfloat16
    GEMM (tensor cores), tf32, ``split_k=1`` and a forced tiling: one kernel each."""
    ins, out = _linear(4096, 4096, 1024)
    fn = polyfuse.compile(ins, [out], check_cuda=False, arch="sm_90")
    assert len(fn.kernels) == 1
    (rec,) = [d for d in fn.plan.splits if "contraction over" in d.reason]
    assert "one stage" in rec.reason and "fill 132 SMs" in rec.reason, rec.reason
    assert SplitKModel().min_k > 512
    for args, mapping in (
        ((64, 64, 512), None),
        ((64, 64, 4096, "bfloat16"), None),
        ((64, 64, 4096), MappingConfig(allow_tf32=True)),
        ((64, 64, 4096), MappingConfig(split_k=1)),
        ((64, 64, 4096), MappingConfig(gemm_tile=(64, 64, 4, 4, 8))),
    ):
        ins, out = _linear(*args)
        fn = polyfuse.compile(ins, [out], check_cuda=False, arch="sm_90", mapping=mapping)
        assert len(fn.kernels) == 1, (args, mapping, [k.name for k in fn.kernels])


def test_a_forced_part_count_that_does_not_divide_is_recorded():
    ins, out = _linear(16, 32, 1024)
    fn = polyfuse.compile(ins, [out], check_cuda=False, mapping=MappingConfig(split_k=3))
    assert len(fn.kernels) == 1
    assert "split_k=3 does not divide 1024" in str(fn.plan)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_a_bad_part_count_is_refused(bad):
    ins, out = _linear(16, 32, 1024)
    with pytest.raises(ExpressionError, match=r"MappingConfig.split_k=.*part count"):
        polyfuse.compile(ins, [out], check_cuda=False, mapping=MappingConfig(split_k=bad))


def test_decisions_are_kept_by_the_compile_cache(tmp_path, monkeypatch):
    """A second compile with the same cache directory reads the decision back (the pricing
    does not run again) and records the same split under the primitive's name."""
    from polyfuse.cache import CompileCache
    from polyfuse.poly import split_k

    ins, out = _linear(16, 1000, 2048)
    first = polyfuse.compile(ins, [out], check_cuda=False, cache=CompileCache(tmp_path))

    def priced_again(*args, **kwargs):
        raise AssertionError("split-K priced again")

    monkeypatch.setattr(split_k, "choose_split_k", priced_again)
    again = polyfuse.compile(ins, [out], check_cuda=False, cache=CompileCache(tmp_path))
    reasons = [[d.reason for d in fn.plan.splits] for fn in (first, again)]
    assert reasons[0] == reasons[1] and any("split-K" in r for r in reasons[0]), reasons
    assert [k.name for k in again.kernels] == [k.name for k in first.kernels]
