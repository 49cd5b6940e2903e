"""Shared helpers of the vectorisation tests (test_bandwidth, test_reduction_vector)."""

from __future__ import annotations

import re

import pytest

from polyfuse.base.decision import DecisionKind

V4_LOAD = re.compile(r"ld\.global(\.nc)?\.v4\.f32")
V4_STORE = re.compile(r"st\.global\.v4\.f32")


def require_nvrtc() -> None:
    """Skip the calling test when NVRTC is not installed."""
    from polyfuse.cuda.toolchain.compiler import available_compilers

    if "nvrtc" not in available_compilers():
        pytest.skip("NVRTC not installed")


def elements_per_thread(fn) -> list[dict]:
    """The elements-per-thread records of the plan's kernels (typed, packed kernels too)."""
    return [
        r.data
        for kp in fn.plan.kernel_plans
        for r in kp.layout
        if DecisionKind.ELEMENTS_PER_THREAD in r.kinds
    ]
