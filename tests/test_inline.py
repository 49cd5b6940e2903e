"""``graph.inline``: a consumer that recomputes its producer (stitching's recompute) reads the
value the producer would have stored, in the producer's dtype.

Regression (suite ``batchnorm_train_relu`` in float16, after fuzz seed 840038): the producer's
body was substituted as is, so a float16 ``x - mu`` inlined into ``(x - mu) * rstd`` skipped
its rounding (one or two float16 units off the reference at 921 of 50176 elements).
"""

from __future__ import annotations

import numpy as np
import pytest

from polyfuse import reference, te
from polyfuse.graph.dtypes import numpy_dtype
from polyfuse.graph.expr import Cast
from polyfuse.graph.inline import inline


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_inlined_16_bit_producer_is_rounded_as_its_store_rounds_it(dtype):
    x = te.placeholder((256,), dtype, name="x")
    y = te.placeholder((256,), dtype, name="y")
    p = te.compute((256,), lambda i: x[i] - y[i], name="p", dtype=dtype)
    c = te.compute((256,), lambda i: p[i] * y[i], name="c", dtype=dtype)
    rng = np.random.default_rng(3)
    xv, yv = (rng.standard_normal(256).astype(numpy_dtype(dtype)) for _ in range(2))
    inlined = inline(c, p)
    assert isinstance(inlined.op.body.a, Cast) and inlined.op.body.a.dtype == dtype
    want = reference.evaluate([c], {x: xv, y: yv})[0]
    got = reference.evaluate([inlined], {x: xv, y: yv})[0]
    np.testing.assert_array_equal(got, want)


def test_a_producer_computed_in_its_own_dtype_is_substituted_without_a_cast():
    x = te.placeholder((4,), name="x")
    p = te.compute((4,), lambda i: x[i] + 1.0, name="p")
    c = te.compute((4,), lambda i: p[i] * 2.0, name="c")
    body = inline(c, p).op.body
    assert not isinstance(body.a, Cast) and repr(body.a) == repr(p.op.body)
