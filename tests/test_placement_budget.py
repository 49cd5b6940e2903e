"""A reduction isl skews, and a kernel whose tensor placement exceeds its isl budget.

Fuzz seed 790008 (``polyfuse fuzz --dtypes all --seed 790000``) fused an elementwise producer
into a ``sum`` over a 7x97x2 tensor. isl scheduled the reduced loops as ``(r1, r1 + r2)`` (a
skew that keeps the band permutable under the accumulator's dependences); flattened onto 512
lanes, that band gave the placement sets a ``(-l0 - 222 r0 + 99 r1 + r2) mod 512`` constraint,
and the register-fit test ran for more than an hour. A skewed reduction now keeps its original
loop order (alone) or goes back to the partitioner (fused), and placement itself runs under
:data:`~polyfuse.poly.kernel_map.PLACEMENT_BUDGET` isl operations: past it a fused micrograph
is split like a schedule over budget, and a kernel that cannot be split ends in a one-line
ScheduleError.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import polyfuse
import polyfuse.poly.kernel_map as kernel_map
from polyfuse import te
from polyfuse.cuda.toolchain.compiler import available_compilers
from polyfuse.errors import ScheduleError
from polyfuse.poly.guard import operation_budget
from polyfuse.reference import evaluate


def _sum_all(x, dtype: str, out_dtype: str):
    ks = [te.reduce_axis(n, name=f"k{i}") for i, n in enumerate(x.shape)]
    one = (1,) * len(x.shape)
    body = x[tuple(ks)] if dtype == x.dtype else te.cast(x[tuple(ks)], dtype)
    return te.compute(one, lambda *_: te.sum(body, axis=ks), name="r", dtype=out_dtype)


def _check(fn, ins, outs, feeds):
    """Emulator results against the reference (plain and race-check), and every kernel
    compiled for sm_80 and sm_90 without spills where a CUDA compiler is installed."""
    if available_compilers():
        for arch in ("sm_80", "sm_90"):
            binary = fn.check_cuda(arch)
            for k in fn.kernels:
                assert binary.resources[k.function].spill_stores == 0
    elif os.environ.get("CI"):
        pytest.fail("CI must have NVRTC or nvcc (pip install 'polyfuse[nvrtc]')")
    ref = evaluate(outs, dict(zip(ins, feeds, strict=True)))
    for race_check in (False, True):
        got = fn(*feeds, device="emulate", race_check=race_check)
        got = got if isinstance(got, (list, tuple)) else [got]
        for g, r in zip(got, ref, strict=True):
            np.testing.assert_allclose(np.asarray(g, np.float64), r, rtol=1e-5, atol=1e-4)


def test_fuzz_790008_compiles_in_two_kernels_and_matches_the_reference():
    x = te.placeholder((7, 97, 2), "float64", name="x")
    b = te.compute(
        (7, 97, 2),
        lambda i, j, k: x[i, j, k] * te.cast(x[i, j, k], "bool"),
        name="b",
        dtype="bfloat16",
    )
    r = _sum_all(b, "int32", "float16")
    fn = polyfuse.compile([x], [r], check_cuda=False)
    (event,) = fn.plan.feedback
    assert "isl skewed a reduction's loops" in str(event) and "split into [b | r]" in str(event)
    assert len(fn.kernels) == 2
    xv = np.random.default_rng(0).standard_normal((7, 97, 2)) * 4
    _check(fn, [x], [r], [xv])


@pytest.mark.parametrize("shape", [(7, 97, 2), (8, 96, 2), (7, 97, 2, 1)])
def test_a_reduction_isl_skews_keeps_its_original_loop_order(shape):
    x = te.placeholder(shape, "float32", name="x")
    r = _sum_all(x, "float32", "float32")
    fn = polyfuse.compile([x], [r], check_cuda=False)
    notes = [n for sm in fn.plan.scheduled for n in sm.notes]
    assert any("isl skewed a reduction's loops" in n and "original loop order" in n for n in notes)
    xv = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    _check(fn, [x], [r], [xv])


def _tight_when_fused(monkeypatch):
    """Placement of a micrograph of several primitives runs out of isl operations at once
    (a real isl quota error); kernels of one primitive keep the real budget."""
    real = kernel_map.place_tensors

    def place(mm):
        if len(mm.parts[0].model.micrograph.prims) > 1:
            with operation_budget(mm.scheduled.model.ctx, 1):
                return real(mm)
        return real(mm)

    monkeypatch.setattr(kernel_map, "place_tensors", place)


def test_placement_over_budget_splits_the_micrograph(monkeypatch):
    _tight_when_fused(monkeypatch)
    x = te.placeholder((64, 200), "float32", name="x")
    e = te.compute((64, 200), lambda i, j: te.exp(x[i, j]), name="e")
    k = te.reduce_axis(200, name="k")
    s = te.compute((64,), lambda i: te.sum(e[i, k], axis=k), name="s")
    fn = polyfuse.compile([x], [s], check_cuda=False, stitch=False)
    (event,) = fn.plan.feedback
    assert "placing its tensors exceeded" in str(event) and "split into [e | s]" in str(event)
    assert len(fn.kernels) == 2
    xv = np.random.default_rng(2).standard_normal((64, 200)).astype(np.float32)
    _check(fn, [x], [s], [xv])


def test_placement_over_budget_of_one_primitive_is_a_one_line_error(monkeypatch):
    monkeypatch.setattr(kernel_map, "PLACEMENT_BUDGET", 1)
    x = te.placeholder((64, 200), "float32", name="x")
    k = te.reduce_axis(200, name="k")
    s = te.compute((64,), lambda i: te.sum(x[i, k], axis=k), name="s")
    with pytest.raises(ScheduleError) as err:
        polyfuse.compile([x], [s], check_cuda=False)
    msg = str(err.value)
    assert msg.startswith("mg0: placing its tensors exceeded 1 isl operations"), msg
    assert "\n" not in msg
