"""Inputs staged in shared memory (polyfuse.poly.stage): a stitched kernel whose later parts
read an input again reads it from global memory once where the re-read would miss the L1."""

from __future__ import annotations

import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from kernel_checks import compiles_without_spills

import polyfuse
import polyfuse.poly.placement as placement
import polyfuse.stitch.recompute as recompute
from polyfuse import ops, te
from polyfuse.cuda.toolchain.compiler import available_compilers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import suite  # noqa: E402

ROW = 50176  # 196 KB of float32 per row: fits the H100's 227 KB per block, not the A100's


def _placement(fn, tensor: str) -> str:
    return next(
        line.strip()
        for line in str(fn.plan).splitlines()
        if line.strip().startswith(f"{tensor}: ")
    )


def _global_reads(source: str, tensor: str) -> int:
    return source.count(f"&{tensor}[")


def _run(fn, arrays):
    """The outputs (a list), checked identical under the race checker."""
    got = fn(*arrays)
    got = list(got) if isinstance(got, tuple) else [got]
    again = fn(*arrays, device="emulate", race_check=True)
    for g, a in zip(got, again if isinstance(again, tuple) else (again,), strict=True):
        np.testing.assert_array_equal(g, a)
    return got


def _no_spills(fn, arch: str) -> None:
    if "nvrtc" not in available_compilers():
        return
    compiles_without_spills(fn, arch)


def _unstaged(monkeypatch):
    monkeypatch.setattr(placement, "plan_staging", lambda *a, **k: [])


def test_batchnorm_stages_x_on_an_h100_and_reads_it_from_global_memory_once(monkeypatch):
    ins, outs, ref = suite.build("batchnorm_train_relu", 64)  # 4 channels of 64 x 28 x 28
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    line = _placement(fn, "x")
    assert "staged in shared memory by S_mu_update for S_d, S_xn" in line, line
    assert "per-block footprint 200704 B" in line
    # the mean's part loads x and stores it to the tile as float4; the variance's and the
    # output's parts read the tile; d = x - mu is recomputed there instead of a 196 KB tile
    src = fn.cuda_source
    assert _global_reads(src, "x") == 1
    assert src.count("*reinterpret_cast<float4*>(&s_x[") == 1
    assert src.count("*reinterpret_cast<const float4*>(&s_x[") == 2
    assert "s_d" not in src and "d: recomputed in xn" in str(fn.plan)
    (k,) = fn.kernels
    assert k.dynamic_shared_bytes == 200704
    arrays = suite.random_inputs("batchnorm_train_relu", ins)
    got = _run(fn, arrays)
    for g, e in zip(got, ref(*arrays), strict=True):
        np.testing.assert_allclose(g, e, rtol=2e-4, atol=2e-5)
    _no_spills(fn, "sm_90")
    # what the kernel that reads x twice computes
    _unstaged(monkeypatch)
    plain = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    assert _global_reads(plain.cuda_source, "x") == 2 and "s_d" in plain.cuda_source
    for g, p in zip(got, _run(plain, arrays), strict=True):
        np.testing.assert_allclose(g, p, rtol=1e-6, atol=1e-7)


def test_batchnorm_on_an_a100_keeps_x_in_global_memory_with_the_reason():
    ins, outs, _ = suite.build("batchnorm_train_relu", 64)
    fn = polyfuse.compile(ins, outs, arch="sm_80", check_cuda=False)
    line = _placement(fn, "x")
    assert "not staged: its 200704 B tile does not fit shared memory" in line, line
    assert "s_x" not in fn.cuda_source


def test_a_short_row_is_left_to_the_l1():
    ins, outs, _ = suite.build("layernorm", 64)  # rows of 768
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    line = _placement(fn, "x")
    assert "not staged: the later parts' re-read of its 3072 B block footprint stays in" in line
    assert "the L1 (" in line
    assert "s_x" not in fn.cuda_source


def test_a_staging_that_costs_resident_blocks_is_dropped():
    # rows of 60 KB on an A100: exp's tile alone leaves two blocks per SM, with x's one
    x = te.placeholder((4, 15000), name="x")
    fn = polyfuse.compile([x], [ops.softmax(x, name="sm")], arch="sm_80", check_cuda=False)
    assert "x: not staged in shared memory: it leaves 1 block per SM, the kernel without it 2" in (
        str(fn.plan)
    )
    assert "s_x" not in fn.cuda_source and "s_sm_exp" in fn.cuda_source


def test_a_staging_whose_displaced_tile_cannot_be_recomputed_is_dropped(monkeypatch):
    monkeypatch.setattr(recompute, "recompute_candidates", lambda *a: [])
    ins, outs, _ = suite.build("batchnorm_train_relu", 64)
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    assert "x: not staged in shared memory: it spills d, which the kernel without it keeps" in (
        str(fn.plan)
    )
    assert "s_x" not in fn.cuda_source and "s_d" in fn.cuda_source


def test_a_later_part_reading_what_the_first_does_not_is_refused():
    x = te.placeholder((3, ROW), name="x")
    j = te.reduce_axis(ROW // 2, name="j")
    s = te.compute((3,), lambda b: te.sum(x[b, 2 * j], axis=[j]), name="s")
    y = te.compute((3, ROW), lambda b, k: x[b, k] - s[b], name="y")
    fn = polyfuse.compile([x], [y], arch="sm_90", check_cuda=False)
    assert "not staged: S_y reads elements S_s_update does not" in _placement(fn, "x")
    X = np.random.default_rng(1).standard_normal((3, ROW)).astype(np.float32)
    want = X.astype(np.float64) - X[:, ::2].astype(np.float64).sum(1, keepdims=True)
    np.testing.assert_allclose(_run(fn, [X])[0], want, rtol=1e-5, atol=1e-3)


def _np_layernorm(x, g, b):
    x, g, b = (a.astype(np.float64) for a in (x, g, b))
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _np_softmax(x):
    e = np.exp(x.astype(np.float64) - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("graph", ["softmax", "layernorm"])
def test_long_rows_staged_correct_in_race_modes(graph, dtype, monkeypatch):
    """Rows of 196 KB (3 rows, not a multiple of anything): softmax recomputes exp from the
    staged row, layer norm the centred row; bfloat16 rows are staged widened to float."""
    x = te.placeholder((3, ROW), dtype, name="x")
    rng = np.random.default_rng(7)
    np_dtype = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    if graph == "softmax":
        ins, y, want = [x], ops.softmax(x, axis=-1, name="sm"), _np_softmax
    else:
        g, b = te.placeholder((ROW,), dtype, name="g"), te.placeholder((ROW,), dtype, name="b")
        y = ops.layer_norm(x, g, b, axis=-1, eps=1e-5, name="ln")
        ins, want = [x, g, b], _np_layernorm
    arrays = [rng.standard_normal(t.shape).astype(np_dtype) for t in ins]
    fn = polyfuse.compile(ins, [y], arch="sm_90", check_cuda=False)
    assert "staged in shared memory" in _placement(fn, "x")
    assert _global_reads(fn.cuda_source, "x") == 1
    (got,) = _run(fn, arrays)
    tol = 1e-5 if dtype == "float32" else 2e-2
    np.testing.assert_allclose(got.astype(np.float64), want(*arrays), rtol=tol, atol=tol)
    _no_spills(fn, "sm_90")
    _unstaged(monkeypatch)
    plain = polyfuse.compile(ins, [y], arch="sm_90", check_cuda=False)
    # the recomputed centred row / exp may contract into other FMAs than the stored one
    np.testing.assert_allclose(got.astype(np.float64), _run(plain, arrays)[0].astype(np.float64),
                               rtol=tol, atol=tol)  # fmt: skip


def _modelled_us(fn, arch: str) -> float:
    from polyfuse.cuda.codegen.kernel_cost import describe_kernel
    from polyfuse.poly.costs import model_kernel
    from polyfuse.poly.device import device_for_arch

    (k,) = fn.kernels
    return model_kernel(describe_kernel(k), device_for_arch(arch)).us


def test_the_cost_model_prices_the_re_read_that_staging_removes(monkeypatch):
    """Full-size batch norm on an H100: the kernel that reads x twice carries x's bytes as
    re-read past the L1 (a third phase per block: modelled ~57 µs, the H100 measured 57.9 µs
    for it on 2026-11-26), the staged one none (~44 µs)."""
    ins, outs, _ = suite.build("batchnorm_train_relu", 1)
    x_bytes = 64 * 256 * 28 * 28 * 4
    staged = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    assert staged.kernels[0].reread_bytes == 0
    _unstaged(monkeypatch)
    plain = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    assert plain.kernels[0].reread_bytes == x_bytes
    fast, slow = _modelled_us(staged, "sm_90"), _modelled_us(plain, "sm_90")
    assert 40 < fast < 48 and 53 < slow < 62, (fast, slow)
    # on an A100 x is read by all three parts (d recomputed, no tile fits): two re-reads
    a100 = polyfuse.compile(ins, outs, arch="sm_80", check_cuda=False)
    assert a100.kernels[0].reread_bytes == 2 * x_bytes


def test_a_row_the_l1_keeps_is_not_priced_as_a_re_read():
    ins, outs, _ = suite.build("layernorm", 1)
    fn = polyfuse.compile(ins, outs, arch="sm_90", check_cuda=False)
    assert fn.kernels[0].reread_bytes == 0


def test_the_fuzzer_draws_long_rows_that_stage_and_pass():
    """``polyfuse fuzz`` family ``rows``: normalisations of 2-3 rows as long as
    ``--max-elements`` allows; at 100000 elements the 3-row graphs stage their input on the
    default A100 (rows of ~33000 floats), the 2-row ones' tiles do not fit."""
    from polyfuse.testing.build import build
    from polyfuse.testing.generate import draw
    from polyfuse.testing.rows import generate_rows
    from polyfuse.testing.run import check_spec

    assert "rows" in {draw(s).meta["family"] for s in range(200)}
    staged = {2: 0, 3: 0}
    for seed in range(6):
        spec = generate_rows(seed, max_elements=100000, prefix=f"g{seed}_")
        out = check_spec(spec)
        assert not out.failed, f"rows seed {seed}: {out.status}: {out.detail}"
        ins, outs, _ = build(spec)
        fn = polyfuse.compile(ins, outs, check_cuda=False)
        staged[spec.size(spec.inputs[0].shape)[0]] += "staged in shared memory" in str(fn.plan)
    assert staged[3] >= 1 and staged[2] == 0, staged
