"""The isl scheduler always finishes: never a hang (regression of a graph found by the fuzzer).

isl's search for a non-trivial band row (``isl_tab_basic_set_non_trivial_lexmin``, reached
from the whole-component scheduler) does not count against the operation budget; with the
schedule coefficients bounded only by the loop extents it ran for ~420 s on the graph below
(seed 3 of ``polyfuse fuzz`` with tensor prefix ``g2_``: the names fix the statement order
that triggers it). poly/schedule.py bounds the coefficients (``MAX_COEFFICIENT``).

The compile runs in a subprocess with a timeout, since an isl call cannot be interrupted
in-thread; the results are then checked on the emulator.
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import polyfuse
import polyfuse.poly.schedule as schedule
from polyfuse import te
from polyfuse.reference import evaluate

COMPILE_LIMIT_S = 60  # the fixed compile takes about a second; the hang took minutes

GRAPH = '''
from polyfuse import te


def build(m=7, n=257):
    """x0, x2 (m x n); t1 = x0^T; b3 = min(x0, x2); b4 = min(b3, x0); r5 = max of b3."""
    x0 = te.placeholder((m, n), name="g2_x0")
    t1 = te.compute((n, m), lambda i0, i1: x0[i1, i0], name="g2_t1")
    x2 = te.placeholder((m, n), name="g2_x2")
    b3 = te.compute((m, n), lambda i0, i1: te.minimum(x0[i0, i1], x2[i0, i1]), name="g2_b3")
    b4 = te.compute((m, n), lambda i0, i1: te.minimum(b3[i0, i1], x0[i0, i1]), name="g2_b4")
    k0 = te.reduce_axis(m, name="g2_r5_k0")
    k1 = te.reduce_axis(n, name="g2_r5_k1")
    r5 = te.compute((1, 1), lambda i0, i1: te.max(b3[k0, k1], axis=[k0, k1]), name="g2_r5")
    return [x0, x2], [t1, b4, r5]
'''


def _build(m: int = 7, n: int = 257) -> tuple[list[te.Tensor], list[te.Tensor]]:
    scope: dict = {}
    exec(GRAPH, scope)  # noqa: S102 - the same source the subprocess compiles
    return scope["build"](m, n)


def _compile_in_subprocess(m: int, n: int) -> None:
    """Compile the graph in a child process; fail if it takes over COMPILE_LIMIT_S."""
    script = GRAPH + (
        "\nimport polyfuse\n"
        f"ins, outs = build({m}, {n})\n"
        "polyfuse.compile(ins, outs, check_cuda=False, name='fuzz')\n"
    )
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=COMPILE_LIMIT_S,
        )
    except subprocess.TimeoutExpired:
        raise AssertionError(
            f"compile did not finish in {COMPILE_LIMIT_S} s (isl scheduler hang)"
        ) from None
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert time.perf_counter() - t0 < COMPILE_LIMIT_S


def test_whole_component_schedule_of_fuzz_graph_finishes_and_is_correct():
    _compile_in_subprocess(7, 257)
    inputs, outputs = _build()
    fn = polyfuse.compile(inputs, outputs, check_cuda=False, name="fuzz")
    rng = np.random.default_rng(3)
    feeds = [
        rng.uniform(0.5, 2.5, (7, 257)).astype(np.float32),
        rng.standard_normal((7, 257)).astype(np.float32),
    ]
    got = fn(*feeds, device="emulate", race_check=False)
    want = evaluate(outputs, dict(zip(inputs, feeds, strict=True)))
    for t, g, w in zip(outputs, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=t.name)


def test_whole_component_retry_runs_under_its_own_small_budget(monkeypatch):
    """The retry's pivots grow expensive with the loop extents: it gets bounds of its own."""
    calls: list[tuple[schedule.Limits, bool]] = []
    run = schedule._run_scheduler

    def spy(sc, ctx, limits, whole_component):
        calls.append((limits, whole_component))
        return run(sc, ctx, limits, whole_component)

    monkeypatch.setattr(schedule, "_run_scheduler", spy)
    inputs, outputs = _build()
    polyfuse.compile(inputs, outputs, check_cuda=False, name="fuzz")
    retries = [lim for lim, whole in calls if whole]
    assert retries and all(lim.operations <= schedule.WHOLE_COMPONENT_BUDGET for lim in retries)
    assert all(lim.seconds <= schedule.WHOLE_COMPONENT_DEADLINE_S for lim in retries)
    assert all(lim.inline == 0 for lim in retries)  # always where the deadline holds
    firsts = [lim for lim, whole in calls if not whole]
    assert firsts and all(lim.operations == schedule.DEFAULT_BUDGET for lim in firsts)


@pytest.mark.slow
def test_whole_component_retry_with_wide_loops_finishes():
    """With 4099-wide loops even the coefficient bound leaves the retry slow: its budget ends it."""
    _compile_in_subprocess(7, 4099)
