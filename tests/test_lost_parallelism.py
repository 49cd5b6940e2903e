"""A fusion that shifts a dimension out of parallel is split (partition feedback).

An LSTM whose input projection is one GEMM over every time step (``P[t, b, j]``, as cuDNN
computes it) adds per step ``g = P[t] + bias + h @ W_h`` and reads the gates as slices of
``g`` at columns ``j``, ``j + H``, ``j + 2H``, ``j + 3H``. isl fused the gates with their
slices by shifting the slices' column loop, legal but no longer parallel along the columns:
each step ran in one block of 32 threads, each looping over 2048 columns (250-366 us a step
modelled at T 16, B 32, H 512, 5908 us for the model, against 386 without the hoisted
projection). The scheduler now refuses a reduction-free fusion whose parallel loops cover
fewer points than :data:`PARALLEL_POINTS` and than an eighth of its largest statement's, and
the partitioner splits it: 275 us modelled.
"""

from __future__ import annotations

import numpy as np
from isl_graphs import swin_tail
from lstm_graphs import lstm, lstm_reference

import polyfuse
from polyfuse import ops, te
from polyfuse.poly.schedule import PARALLEL_LOSS, PARALLEL_POINTS


def _hoisted_lstm(steps: int, batch: int, n_in: int, hidden: int):
    return lstm(steps, batch, n_in, hidden, hoisted=True)


def test_no_step_runs_in_one_block():
    """T 2, B 32, H 512: every kernel keeps its columns parallel (the gates' step kernel ran
    1 block of 32 threads before; the GEMMs' micro-tiles take 8 outputs a thread and more);
    the split is recorded with its reason."""
    ins, outs = _hoisted_lstm(2, 32, 64, 512)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    for k in fn.kernels:
        assert k.grid[0] * k.block[0] >= 32 * 512 // 8, (k.name, k.grid, k.block)
    assert "shifted out of parallel" in str(fn.plan), str(fn.plan)[:2000]


def test_split_steps_match_float64():
    """T 3, B 4, H 24 (the check fires at small sizes too: 4 parallel points of 384), every
    race mode."""
    steps, hidden = 3, 24
    ins, outs = _hoisted_lstm(steps, 4, 16, hidden)
    fn = polyfuse.compile(ins, outs)
    rng = np.random.default_rng(0)
    arrays = [0.5 * rng.standard_normal(t.shape).astype(np.float32) for t in ins]
    want = lstm_reference(arrays, steps, hidden)
    for mode in (False, True):
        got = fn(*arrays, device="emulate", race_check=mode)
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_parallel_fusion_stays_whole():
    """An elementwise chain over the same 32 x 2048 points keeps every point parallel: one
    kernel."""
    assert PARALLEL_POINTS > 32 * 8 and PARALLEL_LOSS > 1
    a = te.placeholder((32, 2048), name="a")
    b = te.compute((32, 2048), lambda i, j: te.sigmoid(a[i, j]), name="b")
    c = te.compute((32, 2048), lambda i, j: b[i, j] * te.tanh(a[i, j]), name="c")
    fn = polyfuse.compile([a], [c], check_cuda=False, arch="sm_90")
    (k,) = fn.kernels
    assert k.grid[0] * k.block[0] >= 32 * 2048 // 8


def test_a_per_row_statement_fused_with_its_columns_is_no_loss():
    """Layer norm's ``rstd`` (one per row) fused with the normalisation (one per element): the
    band's column member carries only the per-row statement's dependence, which the kernel
    keeps (a statement per row where every column reads it): not split."""
    x = te.placeholder((12, 72), name="x")
    g, b = te.placeholder((72,), name="g"), te.placeholder((72,), name="b")
    fn = polyfuse.compile([x, g, b], [ops.layer_norm(x, g, b)], check_cuda=False)
    assert "shifted out of parallel" not in str(fn.plan)


def test_a_roll_fused_with_its_producer_is_split():
    """Swin-T's LayerNorm -> pad -> roll (slices and a concat per axis) at 56 x 56 x 96: the
    roll along H fused with the pad ran H serially in 31 blocks (10.3 us modelled); split, it
    runs in 1891 (4.4 us)."""
    ins, outs = swin_tail(c=96, hw=56)
    fn = polyfuse.compile(ins, outs, check_cuda=False, arch="sm_90")
    assert min(k.grid[0] for k in fn.kernels) >= 300, [(k.name, k.grid) for k in fn.kernels]
    assert "shifted out of parallel" in str(fn.plan)
