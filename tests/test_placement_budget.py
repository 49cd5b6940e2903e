"""Placing a kernel's tensors is bounded (issue 19's rule for every isl call that can blow up):
fuzz seed 790008 (``polyfuse fuzz --dtypes all --seed 790000``) fused an elementwise producer
into a 3-axis all-reduce over 512 lanes, and the register-fit test of its tensor
(``r.range().is_subset(w.range())`` on sets with a ``mod 512`` lane constraint) ran for more
than an hour. It now stops at :data:`~polyfuse.poly.kernel_map.PLACEMENT_BUDGET` operations
with a one-line ScheduleError naming the micrograph."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
from polyfuse import te
import polyfuse
x = te.placeholder((7, 97, 2), "float64", name="x")
b = te.compute((7, 97, 2), lambda i, j, k: x[i, j, k] * te.cast(x[i, j, k], "bool"),
               name="b", dtype="bfloat16")
k0, k1 = te.reduce_axis(7, name="k0"), te.reduce_axis(97, name="k1")
k2 = te.reduce_axis(2, name="k2")
r = te.compute((1, 1, 1), lambda i, j, k: te.sum(te.cast(b[k0, k1, k2], "int32"),
               axis=[k0, k1, k2]), name="r", dtype="float16")
try:
    polyfuse.compile([x], [r], check_cuda=False)
except polyfuse.PolyfuseError as e:
    print(type(e).__name__, e)
"""


def test_a_lane_layout_isl_cannot_project_stops_with_an_error_not_a_hang():
    try:
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=240
        )
    except subprocess.TimeoutExpired:
        raise AssertionError("compiling the fuzz graph of seed 790008 still hangs") from None
    assert out.returncode == 0, out.stderr[-2000:]
    line = out.stdout.strip()
    assert line.startswith("ScheduleError mg0: placing its tensors exceeded 1000000 isl"), line
    assert len(line.splitlines()) == 1
