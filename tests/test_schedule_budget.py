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

import polyfuse
from polyfuse import te
from polyfuse.reference import evaluate

COMPILE_LIMIT_S = 60  # the fixed compile takes about a second; the hang took minutes

GRAPH = '''
from polyfuse import te


def build():
    """x0, x2 (7x257); t1 = x0^T; b3 = min(x0, x2); b4 = min(b3, x0); r5 = max of b3."""
    x0 = te.placeholder((7, 257), name="g2_x0")
    t1 = te.compute((257, 7), lambda i0, i1: x0[i1, i0], name="g2_t1")
    x2 = te.placeholder((7, 257), name="g2_x2")
    b3 = te.compute((7, 257), lambda i0, i1: te.minimum(x0[i0, i1], x2[i0, i1]), name="g2_b3")
    b4 = te.compute((7, 257), lambda i0, i1: te.minimum(b3[i0, i1], x0[i0, i1]), name="g2_b4")
    k0 = te.reduce_axis(7, name="g2_r5_k0")
    k1 = te.reduce_axis(257, name="g2_r5_k1")
    r5 = te.compute((1, 1), lambda i0, i1: te.max(b3[k0, k1], axis=[k0, k1]), name="g2_r5")
    return [x0, x2], [t1, b4, r5]
'''


def _build() -> tuple[list[te.Tensor], list[te.Tensor]]:
    scope: dict = {}
    exec(GRAPH, scope)  # noqa: S102 - the same source the subprocess compiles
    return scope["build"]()


def test_whole_component_schedule_of_fuzz_graph_finishes_and_is_correct():
    script = GRAPH + (
        "\nimport polyfuse\n"
        "ins, outs = build()\n"
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
