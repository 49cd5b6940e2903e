"""The one ``pf_allreduce_*`` prelude helper (issue 21): parallel reductions of every
accumulator type — float32 and the wide types (float64, int32, int64), rows ("y") and
columns ("x") — call the same template, typed by its argument, and run right on the
emulator and compile with NVRTC."""

from __future__ import annotations

import numpy as np
import pytest

import polyfuse
from polyfuse import ops, te
from polyfuse.cuda.codegen.c_wide import WIDE_PRELUDE
from polyfuse.cuda.codegen.printer import PRELUDE
from polyfuse.cuda.toolchain.compiler import available_compilers, compile_cuda

#: (dtype, reduce op, shape, axis): rows of 256 (lanes over consecutive threads) and
#: columns of 256 (lane rows), wide and float
CASES = [
    ("float64", "sum", (4, 256), 1),
    ("float64", "max", (256, 8), 0),
    ("int32", "sum", (4, 256), 1),
    ("int64", "max", (4, 256), 1),
    ("int32", "sum", (256, 8), 0),
    ("float32", "sum", (4, 256), 1),
]


def _graph(dtype: str, op: str, shape: tuple[int, int], axis: int):
    x = te.placeholder(shape, dtype=dtype, name="x")
    y = (ops.reduce_sum if op == "sum" else ops.reduce_max)(x, axis=axis)
    return x, y


def _input(dtype: str, shape: tuple[int, int]) -> np.ndarray:
    rng = np.random.default_rng(7)
    if dtype.startswith("int"):
        return rng.integers(-50, 50, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def test_the_prelude_has_one_allreduce_pair():
    assert PRELUDE.count("PF_INLINE T pf_allreduce_y(T v, T* scratch)") == 1
    assert PRELUDE.count("PF_INLINE T pf_allreduce_x(T v, T* scratch)") == 1
    assert "allreduce" not in WIDE_PRELUDE


@pytest.mark.parametrize("dtype,op,shape,axis", CASES)
def test_every_accumulator_type_combines_through_the_one_helper(dtype, op, shape, axis):
    x, y = _graph(dtype, op, shape, axis)
    fn = polyfuse.compile([x], [y], check_cuda=False, cache=None, name=f"ar_{dtype}_{op}")
    src = fn.cuda_source
    form = "y" if axis == 1 else "x"
    assert f"pf_allreduce_{form}<" in src and "pf_w_allreduce" not in src
    if dtype != "float32":
        assert "pf_w_sum<" in src or "pf_w_maxop<" in src  # the typed functor
    a = _input(dtype, shape)
    got = np.asarray(fn(a, device="emulate"))
    want = a.sum(axis=axis) if op == "sum" else a.max(axis=axis)
    if dtype.startswith("int"):
        np.testing.assert_array_equal(got, want.astype(dtype))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5 if dtype == "float32" else 1e-12)


@pytest.mark.skipif("nvrtc" not in available_compilers(), reason="NVRTC not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_nvrtc_compiles_the_typed_helper_for_every_type(arch):
    for dtype, op, shape, axis in CASES:
        x, y = _graph(dtype, op, shape, axis)
        fn = polyfuse.compile([x], [y], arch=arch, check_cuda=False, cache=None)
        assert compile_cuda(fn.cuda_source, arch, compiler="nvrtc").image
