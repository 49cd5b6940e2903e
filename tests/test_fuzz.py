"""The differential fuzzer (polyfuse.testing) and regressions of the bugs it found."""

from __future__ import annotations

import numpy as np

from polyfuse import te
from polyfuse.reference import evaluate

# --------------------------------------------------------------------------- bugs found


def test_reference_erf_of_a_0d_tensor():
    """reference.evaluate crashed ('float' has no astype) on te.erf of a 0-d value."""
    x = te.placeholder((), name="x")
    y = te.compute((), lambda: te.erf(x[()]), name="y")
    (got,) = evaluate([y], {x: np.float32(0.5)})
    assert got.shape == () and abs(float(got) - 0.5204998778) < 1e-6
