"""Before/after tests of poly/guard.py on tiny isl calls: the same outcome in-process and in
the child, the budget lifted afterwards, and the reasons each limit gives."""

from __future__ import annotations

import time

import islpy as isl
import pytest

from polyfuse.poly import guard

IN_PROCESS = guard.Limits(1000, None)
IN_CHILD = guard.Limits(1000, 5.0, inline=0)


def _val(ctx):
    return lambda text: isl.Val(text, context=ctx)


@pytest.mark.parametrize("limits", [IN_PROCESS, IN_CHILD], ids=["in-process", "child"])
def test_result_none_and_isl_errors_alike_wherever_the_call_runs(limits):
    ctx = isl.Context()
    s = isl.Set("{ [i] : 0 <= i < 10 }", context=ctx)
    out = guard.bounded(ctx, s.count_val, limits, str, _val(ctx))
    assert out.value.to_python() == 10 and out.forked == (limits is IN_CHILD)
    assert guard.bounded(ctx, lambda: None, limits, str, str).value is None
    with pytest.raises(guard.Exhausted) as info:
        guard.bounded(ctx, lambda: isl.Set("{ [i] : i >= }", context=ctx), limits, str, str)
    assert info.value.limit == "error" and info.value.limits == limits
    assert info.value.reason.startswith("isl failed: call to isl_set_read_from_str failed")


def test_a_call_within_its_inline_operations_never_forks():
    ctx = isl.Context()
    s = isl.Set("{ [i] : 0 <= i < 10 }", context=ctx)
    out = guard.bounded(ctx, s.count_val, guard.Limits(10**6, 5.0, inline=10**5), str, _val(ctx))
    assert out.value.to_python() == 10 and not out.forked


def test_operation_budget_is_lifted_afterwards_even_on_error():
    ctx = isl.Context()
    with guard.operation_budget(ctx, 5):
        assert ctx.get_max_operations() == 5
    assert ctx.get_max_operations() == 0
    with pytest.raises(isl.Error), guard.operation_budget(ctx, 5):
        isl.Set("{ [i] : i >= }", context=ctx)
    assert ctx.get_max_operations() == 0


def test_the_deadline_stops_a_call_that_never_asks_isl_for_an_operation():
    ctx = isl.Context()
    t0 = time.perf_counter()
    with pytest.raises(guard.Exhausted) as info:
        guard.bounded(ctx, lambda: time.sleep(30), guard.Limits(1000, 0.3, inline=0), str, str)
    assert info.value.limit == "deadline" and time.perf_counter() - t0 < 5
    assert info.value.reason == "isl call stopped at its deadline of 0.3 s"


def test_limits_and_reasons_in_words():
    assert str(guard.Limits(100, None)) == "100 operations, no deadline"
    assert str(guard.Limits(100, 2.5, 10)) == "100 operations, 2.5 s"
    assert guard.Exhausted("operations", guard.Limits(10, 1.5)).reason == (
        "isl budget of 10 operations exhausted"
    )
